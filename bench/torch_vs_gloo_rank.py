"""One rank of bench/torch-vs-gloo: dist.all_reduce busbw over sizes on the
backend named by argv[1] ("weft" or "gloo"), or, with "ddp", the DDP step
time of a ~10M-parameter MLP on both. Rank 0 prints one JSON object per
measurement.

  torch_vs_gloo_rank.py BACKEND MINBYTES MAXBYTES STEPS [FACTOR [ITERS]]

STEPS is the number of timed DDP steps per model ("ddp" only; the
others ignore it); FACTOR (default 4) steps the sizes; ITERS > 0
times every size with that many iterations instead of iters_for's (bench/
vs-peers uses both, for its all_reduce-only runs).

"ddp" runs in one set of processes, weft the default group and gloo a
group of the same ranks, four models stepped in turn: DDP on weft, DDP on
gloo, the same model without DDP ("none"), and DDP with a hook that
communicates nothing ("ddp-nocomm": DDP's own bucket copies, the floor any
backend's DDP step stays above). Steps in turn see the same machine, where two
runs minutes apart differ by more than the backends do."""

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
    return max(20, min(300, (64 << 20) // max(nbytes, 1) // 8))


def bench_allreduce(rank, size, lo, hi, out, factor=4, iters=0):
    for nbytes in sizes(lo, hi, factor):
        n = max(1, nbytes // 4)
        t = torch.ones(n, dtype=torch.float32)
        it = iters if iters > 0 else iters_for(nbytes)
        for _ in range(max(5, it // 10)):
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


def _no_comm(state, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def bench_ddp(rank, size, steps, out):
    """DDP on weft (the default group), DDP on gloo, no DDP, and DDP whose
    hook communicates nothing, in turn."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = dist.new_group(backend="gloo")
    models = {"weft": DDP(mlp()), "gloo": DDP(mlp(), process_group=gloo), "none": mlp(),
              "ddp-nocomm": DDP(mlp())}
    # DDP's own work (copying gradients into its buckets and back) with a
    # hook that communicates nothing: the floor for a DDP step.
    models["ddp-nocomm"].register_comm_hook(None, _no_comm)
    nparams = sum(p.numel() for p in models["none"].parameters())
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}
    x = torch.randn(32, 1024)
    y = torch.randn(32, 512)
    times = {k: [] for k in models}
    order = list(models)
    for step in range(steps + 3):
        # Each step starts the rotation one further on, so no backend
        # always follows the same one.
        for k in order[step % len(order):] + order[:step % len(order)]:
            dist.barrier()
            t0 = time.perf_counter()
            opts[k].zero_grad()
            torch.nn.functional.mse_loss(models[k](x), y).backward()
            opts[k].step()
            if step >= 3:
                times[k].append(time.perf_counter() - t0)
    for k in order:
        d = torch.tensor(times[k], dtype=torch.float64)
        dist.all_reduce(d, op=dist.ReduceOp.MAX)
        if rank == 0:
            out.append({"kind": "ddp", "params": nparams, "step_ms": d.median().item() * 1e3,
                        "backend": k})


def main():
    backend, lo, hi, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    factor = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    iters = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    if backend in ("weft", "ddp"):
        import weft.torch  # noqa: F401
    dist.init_process_group("weft" if backend == "ddp" else backend,
                            timeout=datetime.timedelta(seconds=300))
    rank, size = dist.get_rank(), dist.get_world_size()
    # One thread per rank for torch's own kernels, so ranks do not fight
    # over the cores (the same for both backends).
    torch.set_num_threads(1)
    out = []
    if backend == "ddp":
        bench_ddp(rank, size, steps, out)
    else:
        bench_allreduce(rank, size, lo, hi, out, factor, iters)
    dist.destroy_process_group()
    for o in out:
        o.setdefault("backend", backend)
        o["ranks"] = size
        print(json.dumps(o), flush=True)


if __name__ == "__main__":
    main()
