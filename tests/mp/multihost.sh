#!/bin/sh
# make check: the multi-host test over network namespaces, for rings of 2,
# 3 and 4 hosts with 1 to 3 links per neighbouring pair (and 2 wires on 2
# links), full meshes of 3 and 4 hosts, hosts of two ranks each, and the
# fault cases around a ring and in a mesh (WEFT_CHECK_QUICK=1: a few of
# them, below). Exit 77 (SKIP, with the reason) where network namespaces
# cannot be made.
ringtest="${srcdir:-.}/tests/multihost/ring-test"
fail=0
# WEFT_CHECK_QUICK=1 (CI's make distcheck and sanitizer builds, which run
# after the whole of this in the plain build): one of each kind, a ring of
# 4 hosts with 2 wires on 2 links (relays), hosts of two ranks
# (hierarchical), the fault cases around that ring and among hosts of
# two ranks, and the shrink around a ring of 4 hosts of two ranks.
if [ "${WEFT_CHECK_QUICK-}" = 1 ]; then
    "$ringtest" -H 4 -L 2 -W 2
    st=$?
    [ $st = 77 ] && exit 77
    [ $st = 0 ] || fail=1
    "$ringtest" -H 3 -R 2 || fail=1
    "$ringtest" -H 4 -L 2 -W 2 --mode faults || fail=1
    "$ringtest" -H 3 -R 2 -L 2 -W 2 --mode faults || fail=1
    "$ringtest" -H 4 -R 2 --mode shrink || fail=1
    exit $fail
fi
for h in 2 3 4; do
    for l in 1 2 3; do
        w=1
        [ "$l" = 2 ] && w=2
        "$ringtest" -H "$h" -L "$l" -W "$w"
        st=$?
        [ $st = 77 ] && exit 77
        [ $st = 0 ] || fail=1
    done
done
# 2 and 3 hosts in a ring are full meshes too, so the loop above ran them
# as meshes (topology auto); here the ring algorithms on them, and full
# meshes of 3 and 4 hosts.
"$ringtest" -H 3 -L 2 -W 2 -T ring || fail=1
"$ringtest" -H 3 -L 1 --mesh -T mesh || fail=1
"$ringtest" -H 4 -L 1 --mesh || fail=1
"$ringtest" -H 4 -L 2 -W 2 --mesh || fail=1
# Hosts of two ranks each: all_reduce runs hierarchically (within the hosts,
# across them by the mesh or the ring, within them) from 64 KiB, which the
# checked sizes span.
"$ringtest" -H 2 -R 2 || fail=1
"$ringtest" -H 3 -R 2 || fail=1
"$ringtest" -H 3 -R 2 -T ring || fail=1
# ... with their phases within the hosts by one-copy reads.
"$ringtest" -H 3 -R 2 --reads || fail=1
# The fault cases: a cut link, a killed rank, a stopped rank, foreign
# connections; around a ring of 4 hosts and in a mesh of 3.
"$ringtest" -H 4 -L 2 -W 2 --mode faults || fail=1
"$ringtest" -H 3 -L 2 -W 2 --mode faults || fail=1
# ... between two hosts joined by 3 links, a wire on each (a link lost
# leaves two; the survivor of the shrink is alone).
"$ringtest" -H 2 -L 3 --mode faults || fail=1
# ... and between two hosts whose 2 links run through a switch (a bridge):
# a host's end set down leaves the far end's carrier up, so only the
# first end's word (a nudge over the other link) tells the far end.
"$ringtest" -H 2 -L 2 --switch --mode faults || fail=1
# ... and among hosts of two ranks each, across them by the mesh and the
# ring (one rank of the last host killed or stopped).
"$ringtest" -H 3 -R 2 -L 2 -W 2 --mode faults || fail=1
"$ringtest" -H 3 -R 2 -T ring --mode faults || fail=1
"$ringtest" -H 3 -R 2 --mode faults --reads || fail=1
# The shrink around a ring of 4 hosts of two ranks: host 2's ranks reach
# the lowest rank through those of hosts 1 and 3, one of which leaves as
# the shrink starts; then the last host lost, which leaves a chain.
"$ringtest" -H 4 -R 2 --mode shrink || fail=1
# ... and around a ring of 5 hosts, the last lost: host 3 reaches the
# lowest rank through hosts 2 and 1, and the chain's step from host 3 to
# host 0 runs through both.
"$ringtest" -H 5 --mode shrink || fail=1
exit $fail
