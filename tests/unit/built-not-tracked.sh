#!/bin/sh
# make check: every program the build makes is ignored by git and tracked by
# none of its commits' trees, so that building never dirties the work tree
# (a libtool wrapper script committed by mistake is rewritten by each build).
# SKIP (77) outside a git work tree, as in a release tarball.
top=${srcdir:-.}

if ! command -v git >/dev/null 2>&1; then
    echo "SKIP: no git"
    exit 77
fi
if ! toplevel=$(git -C "$top" rev-parse --show-toplevel 2>/dev/null); then
    echo "SKIP: $top is not in a git work tree"
    exit 77
fi
# A tarball unpacked inside a checkout (make distcheck) is not the checkout.
if ! [ "$toplevel" -ef "$top" ]; then
    echo "SKIP: $top is not the top of its git work tree"
    exit 77
fi
if [ -z "$WEFT_BUILT_PROGRAMS" ]; then
    echo "FAIL: WEFT_BUILT_PROGRAMS is not set (make check sets it)"
    exit 1
fi

status=0
for prog in $WEFT_BUILT_PROGRAMS; do
    if git -C "$top" ls-files --error-unmatch -- "$prog" >/dev/null 2>&1; then
        echo "FAIL: $prog is built by make but tracked by git" \
            "(git rm --cached $prog, and ignore it)"
        status=1
    elif ! git -C "$top" check-ignore -q -- "$prog"; then
        echo "FAIL: $prog is built by make but not ignored (.gitignore)"
        status=1
    else
        echo "ok: $prog"
    fi
done
exit $status
