#!/bin/sh
# make check: the ibverbs transport, tested for real. Boots the Soft-RoCE
# qemu guest (tests/rdma/run-in-guest) with four links (veth pairs with an
# rxe device on each end), and runs tests/rdma/guest-tests there on this
# build's binaries: collectives across two hosts for 2, 3 and 4 ranks, 1 to
# 3 wires and 1 and 2 links, four hosts in a ring with relayed send/recv, the
# errors for a missing device or GID, a rank killed and a rank stopped
# mid-all_reduce, a link lost under traffic (failover) and every link lost,
# reduce, gather, scatter and the all-to-alls across the hosts, and the
# multi-process suites over ibverbs. Builds nothing.
#
# Exits with the tests' status; 77 (SKIP, with the reason) where configure
# built no ibverbs transport, or qemu, the kernel or the packages the guest
# needs are missing (the runner says which). Without the transport it first
# checks that asking for it is WEFT_ENOTSUP with a message that says why.
#
# Environment: WEFT_RUN_IN_GUEST (the runner; default: next to this
# script), WEFT_RDMA_SECTIONS (guest-tests sections, default all),
# WEFT_RDMA_CPUS (guest vCPUs, default 2), WEFT_RDMA_MP_FILTER (narrows the
# multi-process suites; '*' runs them all), the WEFTRUN, WEFT_BENCH,
# WEFT_TEST_FAILPROG and WEFT_FIXTURES that make check sets, and
# ASAN_OPTIONS, UBSAN_OPTIONS, LSAN_OPTIONS (passed on into the guest).
if [ -n "${WEFT_SKIP_RDMA:-}" ]; then echo "SKIP: WEFT_SKIP_RDMA is set"; exit 77; fi
here=$(cd "$(dirname "$0")" && pwd)
top=$(pwd) # make check runs tests in the build directory
runner=${WEFT_RUN_IN_GUEST:-$here/run-in-guest}
WEFTRUN=${WEFTRUN:-$top/weftrun}
WEFT_BENCH=${WEFT_BENCH:-$top/weft-bench}
FAILPROG=${WEFT_TEST_FAILPROG:-$top/tests/mp/failprog}
NBPROG=${WEFT_TEST_NBPROG:-$top/tests/mp/nbprog}

skip() {
    echo "SKIP: $*"
    exit 77
}

[ -x "$WEFT_BENCH" ] && [ -x "$WEFTRUN" ] ||
    skip "no weftrun or weft-bench in $top (run make first)"

if ! grep -q '^#define WEFT_HAVE_IBVERBS 1' "$top/config.h" 2>/dev/null; then
    # Without the transport, asking for it must say so: WEFT_ENOTSUP.
    out=$(WEFT_TRANSPORT=ibverbs WEFT_RANK=0 WEFT_SIZE=1 \
        "$WEFT_BENCH" -o all_reduce -b 8 -e 8 -n 1 -w 0 2>&1)
    case $out in
    *WEFT_ENOTSUP*ibverbs*libibverbs*) ;;
    *)
        echo "FAIL: --transport ibverbs in a build without it did not give"
        echo "WEFT_ENOTSUP with a message naming libibverbs; it printed:"
        echo "$out"
        exit 1
        ;;
    esac
    skip "configure found no libibverbs-dev: the ibverbs transport is not built (WEFT_ENOTSUP checked)"
fi
[ -x "$runner" ] || skip "no guest runner at $runner"

set -- --file "$WEFTRUN" --file "$WEFT_BENCH" --file "$here/guest-tests"
[ -x "$FAILPROG" ] && set -- "$@" --file "$FAILPROG"
[ -x "$NBPROG" ] && set -- "$@" --file "$NBPROG"
for t in test_collectives test_p2p test_failures test_rooted; do
    [ -x "$top/tests/mp/$t" ] && set -- "$@" --file "$top/tests/mp/$t"
done
if [ -n "${WEFT_FIXTURES-}" ] && [ -d "$WEFT_FIXTURES" ]; then
    set -- "$@" --file "$WEFT_FIXTURES=/work/fixtures" \
        --env WEFT_FIXTURES=/work/fixtures
fi
[ -z "${WEFT_RDMA_MP_FILTER-}" ] ||
    set -- "$@" --env "WEFT_RDMA_MP_FILTER=$WEFT_RDMA_MP_FILTER"
# A sanitizer build's options (CI's ASan+UBSan stage) hold in the guest too.
for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS; do
    eval "val=\${$v-}"
    [ -z "$val" ] || set -- "$@" --env "$v=$val"
done

# Five links: two hosts joined by two cables, four hosts in a ring, and
# the ring with a second cable between two of its hosts.
# shellcheck disable=SC2086
exec "$runner" --links 5 --cpus "${WEFT_RDMA_CPUS:-2}" --mem 1536 \
    --timeout 1500 "$@" -- /work/guest-tests ${WEFT_RDMA_SECTIONS-}
