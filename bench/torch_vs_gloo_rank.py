"""One rank of bench/torch-vs-gloo: dist.all_reduce busbw over sizes, and
the DDP step time of a ~10M-parameter MLP, on the backend named by argv[1]
("weft" or "gloo"). Rank 0 prints one JSON object per measurement.

  torch_vs_gloo_rank.py BACKEND MINBYTES MAXBYTES STEPS [FACTOR [ITERS]]

STEPS 0 skips the DDP step; FACTOR (default 4) steps the sizes; ITERS > 0
times every size with that many iterations instead of iters_for's (bench/
vs-peers uses both, for its all_reduce-only runs)."""

import datetime
import json
import sys
import time

import torch
import torch.distributed as dist


def sizes(lo, hi, factor=4):
    """lo, 4 lo, 16 lo, ... below hi, then hi (factor 4 by default)."""
    s = lo
    while s < hi:
        yield s
        s *= factor
    yield hi


def iters_for(nbytes):
    # About the same time per size: many small calls, a few large ones.
    return max(5, min(300, (64 << 20) // max(nbytes, 1) // 8))


def bench_allreduce(rank, size, lo, hi, out, factor=4, iters=0):
    for nbytes in sizes(lo, hi, factor):
        n = max(1, nbytes // 4)
        t = torch.ones(n, dtype=torch.float32)
        it = iters if iters > 0 else iters_for(nbytes)
        for _ in range(max(2, it // 10)):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(it):
            dist.all_reduce(t)
        dt = (time.perf_counter() - t0) / it
        # The slowest rank's time is the call's time.
        d = torch.tensor([dt], dtype=torch.float64)
        dist.all_reduce(d, op=dist.ReduceOp.MAX)
        dt = d.item()
        busbw = 2 * (size - 1) / size * n * 4 / dt / 1e9
        if rank == 0:
            out.append({"kind": "all_reduce", "bytes": n * 4, "us": dt * 1e6,
                        "busbw": busbw, "iters": it})


def mlp():
    torch.manual_seed(0)
    dims = [1024, 2048, 2048, 1536, 512]
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def bench_ddp(rank, size, steps, out):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(mlp())
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 1024)
    y = torch.randn(32, 512)
    times = []
    for step in range(steps + 3):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step >= 3:
            times.append(time.perf_counter() - t0)
    d = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(d, op=dist.ReduceOp.MAX)
    med = d.median().item()
    if rank == 0:
        out.append({"kind": "ddp", "params": nparams, "step_ms": med * 1e3})


def main():
    backend, lo, hi, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    factor = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    iters = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    if backend == "weft":
        import weft.torch  # noqa: F401
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    rank, size = dist.get_rank(), dist.get_world_size()
    # One thread per rank for torch's own kernels, so ranks do not fight
    # over the cores (the same for both backends).
    torch.set_num_threads(1)
    out = []
    bench_allreduce(rank, size, lo, hi, out, factor, iters)
    if steps > 0:
        bench_ddp(rank, size, steps, out)
    dist.destroy_process_group()
    for o in out:
        o.update(backend=backend, ranks=size)
        print(json.dumps(o), flush=True)


if __name__ == "__main__":
    main()
