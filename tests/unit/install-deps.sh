#!/bin/sh
# make check: scripts/quickstart installs only what building needs (its
# benchmark uses no torch, no qemu, no kernel image: installing those took
# most of its three minutes on a fresh machine), and scripts/test
# everything the tests use, a superset of that. Nothing is installed: each
# script's install-deps line runs with --print, which lists the packages,
# and apt-get, dpkg-query and sudo are stubs that fail the test if called.
top=$(cd "${srcdir:-.}" && pwd) || exit 1

if ! command -v bash >/dev/null 2>&1; then
    echo "SKIP: no bash (scripts/install-deps is a bash script)"
    exit 77
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
for stub in apt-get apt dpkg-query sudo; do
    printf '#!/bin/sh\necho "%s $*" >>"%s"\nexit 1\n' "$stub" \
        "$tmp/called" >"$tmp/bin/$stub"
    chmod +x "$tmp/bin/$stub"
done

status=0
fail() {
    echo "FAIL: $*"
    status=1
}

# The packages that scripts/$1's call of install-deps would install.
packages_of() {
    line=$(grep -E '^[[:space:]]*scripts/install-deps([[:space:]]|$)' \
        "$top/scripts/$1")
    if [ "$(printf '%s\n' "$line" | grep -c .)" -ne 1 ]; then
        fail "scripts/$1 does not call scripts/install-deps once: '$line'"
        return 1
    fi
    echo "scripts/$1 runs: $line"
    (cd "$top" && PATH="$tmp/bin:$PATH" && eval "$line --print") |
        sort -u >"$tmp/$1" || fail "'$line --print' failed"
}

packages_of quickstart
packages_of test
(cd "$top" && PATH="$tmp/bin:$PATH" scripts/install-deps --print) |
    sort -u >"$tmp/default"
if [ -e "$tmp/called" ]; then
    fail "--print ran a package tool:"
    head -n 5 "$tmp/called"
fi

[ -s "$tmp/quickstart" ] || fail "the quickstart's set is empty"
for p in build-essential autoconf automake libtool pkg-config libuv1-dev \
    libjansson-dev; do
    grep -qx "$p" "$tmp/quickstart" || fail "the quickstart's set lacks $p"
done
# Only the tests use these.
heavy='^(python3-torch|libtorch-dev|qemu-.*|linux-image-.*)$'
if grep -Eq "$heavy" "$tmp/quickstart"; then
    fail "the quickstart's set holds packages only the tests use:" \
        $(grep -E "$heavy" "$tmp/quickstart")
fi
# scripts/test installs all of that and what the tests need besides.
missing=$(comm -23 "$tmp/quickstart" "$tmp/test")
[ -z "$missing" ] || fail "the test set lacks the quickstart's" $missing
for want in '^python3-torch$' '^libtorch-dev$' '^qemu-' '^linux-image-' \
    '^libcriterion-dev$' '^python3-pytest$'; do
    grep -Eq "$want" "$tmp/test" || fail "the test set has no $want"
done
cmp -s "$tmp/default" "$tmp/test" ||
    fail "install-deps without a mode is not the test set"

if [ $status -eq 0 ]; then
    echo "ok: quickstart installs $(wc -l <"$tmp/quickstart") packages," \
        "scripts/test $(wc -l <"$tmp/test")"
fi
exit $status
