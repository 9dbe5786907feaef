#!/bin/sh
# The tables of variables in README.md and docs/reference.md are the ones
# the configuration loader's table (src/topo/params.c) makes: run
# scripts/gen-docs after changing it.
set -eu
src=${srcdir:-.}
prog=${PARAMS_DOC:-./tests/unit/params_doc}
fail=0
check() { # file, which rows
    want=$("$prog" "$2")
    have=$(sed -n '/^<!-- variables: made by scripts\/gen-docs -->$/,/^<!-- end of variables -->$/p' \
        "$src/$1" | sed '1d;$d')
    if [ "$want" != "$have" ]; then
        echo "$1: the table of variables differs from src/topo/params.c's;" \
            "run scripts/gen-docs" >&2
        printf '%s\n' "$want" >/tmp/want.$$
        printf '%s\n' "$have" | diff /tmp/want.$$ - >&2 || true
        rm -f /tmp/want.$$
        fail=1
    fi
}
check README.md user
check docs/reference.md all
exit $fail
