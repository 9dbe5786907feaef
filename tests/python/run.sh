#!/bin/sh
# make check: the Python package (python/weft) with pytest, against the
# libweft this build made, ranks started by this build's weftrun.
# SKIP (77), saying why, where that cannot run: no Python, no numpy or
# pytest for it, or no shared libweft (a --disable-shared build, as CI's
# sanitizer builds: Python can load only a shared library) or one built
# with a sanitizer (its runtime would have to be preloaded into Python).
skip() {
    echo "SKIP: $*"
    exit 77
}
top=$(cd "${srcdir:-.}" && pwd) || exit 1
py=${PYTHON:-python3}
[ "$py" = ":" ] &&
    skip "configure found no Python 3 (configure PYTHON=/path/to/python3)"
lib=${WEFT_TEST_LIBWEFT:-$top/.libs/libweft.so}
[ -f "$lib" ] ||
    skip "no $lib: this build makes no shared libweft (--disable-shared)"
if command -v ldd >/dev/null 2>&1 &&
    ldd "$lib" 2>/dev/null | grep -q 'lib[at]san'; then
    skip "$lib is built with a sanitizer, which Python cannot load"
fi
"$py" -c 'import numpy' 2>/dev/null ||
    skip "$py cannot import numpy (apt-get install python3-numpy," \
        "or configure PYTHON=...)"
"$py" -c 'import pytest' 2>/dev/null ||
    skip "$py cannot import pytest (apt-get install python3-pytest)"

WEFT_LIBRARY=$lib
PYTHONPATH=$top/python${PYTHONPATH:+:$PYTHONPATH}
# No __pycache__ or .pytest_cache: make distcheck's source tree is
# read-only, and a checkout's should stay clean.
PYTHONDONTWRITEBYTECODE=1
# weft.torch compiles its extension once per build tree, here.
TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$(pwd)/_torch_extensions}
export WEFT_LIBRARY PYTHONPATH PYTHONDONTWRITEBYTECODE TORCH_EXTENSIONS_DIR
# timeout(1) bounds the whole suite; each job in it has its own deadline.
exec timeout -s KILL 900 "$py" -m pytest -q -rs -p no:cacheprovider \
    "$top/tests/python"
