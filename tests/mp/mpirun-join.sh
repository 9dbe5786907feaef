#!/bin/sh
# make check: ranks started by Open MPI's mpirun (not weftrun) join a weft
# job: weft_init takes rank and size from OMPI_COMM_WORLD_RANK/SIZE and the
# hosts from WEFT_HOSTFILE. SKIP (77) where mpirun is not installed.
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun (openmpi-bin) is not installed"; exit 77; }
prog=${WEFT_TEST_FAILPROG:?WEFT_TEST_FAILPROG is not set (make check sets it)}
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
# Two ports that are free now, from the kernel's own choice.
ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(",".join(str(x.getsockname()[1]) for x in s))' 2>/dev/null) ||
    ports="$((20000 + $$ % 20000)),$((20001 + $$ % 20000)),$((20002 + $$ % 20000))"
printf '{"hosts": [{"name": "localhost", "ranks": 3, "ports": [%s]}]}\n' "$ports" >"$dir/hosts.json"
timeout -s KILL 120 mpirun --allow-run-as-root --oversubscribe -np 3 \
    --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    -x WEFT_HOSTFILE="$dir/hosts.json" -x WEFT_TIMEOUT_MS=20000 \
    "$prog" ok >"$dir/out" 2>&1
st=$?
cat "$dir/out"
[ $st = 0 ] && [ "$(grep -c '^done$' "$dir/out")" = 3 ] || { echo "FAIL: mpirun job exited $st"; exit 1; }
echo "PASS: 3 ranks started by mpirun formed a weft job"
