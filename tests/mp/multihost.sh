#!/bin/sh
# make check: the multi-host ring test over network namespaces, for 2, 3 and
# 4 hosts with 1 to 3 links per neighbouring pair (and 2 wires on 2 links),
# plus a full mesh of 3 hosts, and the fault cases on 3 hosts. Exit 77 (SKIP, with the reason) where network
# namespaces cannot be made.
ringtest="${srcdir:-.}/tests/multihost/ring-test"
fail=0
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
"$ringtest" -H 3 -L 1 --mesh || fail=1
# The fault cases: a cut link, a killed rank, a stopped rank, foreign
# connections.
"$ringtest" -H 3 -L 2 -W 2 --mode faults || fail=1
exit $fail
