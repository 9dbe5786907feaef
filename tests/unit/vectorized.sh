#!/bin/sh
# make check wrapper: the reduction loops must stay vectorised at -O2/-O3.
exec "${srcdir:-.}/scripts/check-vectorized" "${srcdir:-.}"
