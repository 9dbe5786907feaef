"""numpy_allreduce: the Python counterpart of hello_allreduce.c.

    weftrun -n 4 -- python3 examples/numpy_allreduce.py

Every rank contributes x[i] = (rank + 1) * (i % 4); after the sum each rank
holds (i % 4) * n(n+1)/2 (small integers, so the float sum is exact). Then
the same all_reduce non-blocking, overlapped with other work.
"""
import sys

import numpy as np

import weft


def main():
    # weftrun (or mpirun, Slurm, torchrun) sets the environment; a failure
    # raises weft.ConfigError saying what to set.
    with weft.init() as comm:
        n = comm.size
        x = (comm.rank + 1) * (np.arange(1024) % 4).astype(np.float32)
        expected = (np.arange(1024) % 4) * (n * (n + 1) // 2)

        comm.all_reduce(x)                 # in place; weft.SUM by default
        if comm.rank == 0:
            print("%d ranks: x[0..4] = %s" % (n, x[:5]))

        y = np.full(1024, comm.rank, dtype=np.int64)
        req = comm.iall_reduce(y, op=weft.MAX)
        busy = sum(range(100000))          # y is weft's until req completes
        req.wait()                         # raises weft.Error on failure

        ok = np.array_equal(x, expected) and (y == n - 1).all()
        if not ok:
            print("rank %d: wrong result" % comm.rank, file=sys.stderr)
        return 0 if ok and busy > 0 else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except weft.Error as e:
        # e.name is the code (WEFT_ETIMEDOUT, ...), e.message
        # weft_last_error(): which rank, peer and deadline.
        print("weft: %s" % e, file=sys.stderr)
        sys.exit(1)
