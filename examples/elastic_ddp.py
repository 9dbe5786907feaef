"""DistributedDataParallel on weft that survives a dead rank.

    weftrun -n 4 --keep-going -- python3 examples/elastic_ddp.py [--steps 60] [--kill-step 20]

(In the build tree: PYTHONPATH=python.) The last rank kills itself
(SIGKILL, as the kernel's OOM killer or a crashed node would) at step
--kill-step. The others see the error in that step's backward pass
(weft.torch.PeerError), shrink the process group to the ranks alive
(weft.torch.shrink), rebuild DDP on it from the model and optimizer they
hold in memory (no checkpoint), redo the step, and finish the run. Each
survivor prints the time the job lost: from the error to the end of the
first step on the new group. --keep-going keeps weftrun from stopping
the others when a rank dies; it still exits non-zero, naming the rank.
"""

import argparse
import copy
import datetime
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import weft.torch


def batch(step, rank, size, per_rank=32):
    """The step's global batch (the same on every rank), and this rank's
    share of it: the data are re-split over whoever is left."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(per_rank * 4, 32, generator=g)
    y = x[:, :8].sum(dim=1, keepdim=True)
    mine = torch.arange(rank, x.shape[0], size)
    return x[mine], y[mine]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kill-step", type=int, default=20)
    args = ap.parse_args()

    dist.init_process_group("weft", timeout=datetime.timedelta(seconds=10))
    world_rank, world = dist.get_rank(), dist.get_world_size()
    victim = world - 1

    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    group = None  # the default group, then the shrunk ones
    ddp = DDP(model, process_group=group)
    failed_at = None
    step = 0
    while step < args.steps:
        if world_rank == victim and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        rank = dist.get_rank(group)
        size = dist.get_world_size(group)
        x, y = batch(step, rank, size)
        try:
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()  # gradients averaged over the group, on weft
            opt.step()
        except RuntimeError as e:
            # A rank died during the step (DDP's reducer raises what weft
            # said as a RuntimeError). The model and optimizer are as they
            # were before the step: opt.step() did not run.
            failed_at = time.monotonic()
            print("rank %d: step %d failed: %s" % (world_rank, step, str(e).splitlines()[0][:160]),
                  flush=True)
            group = weft.torch.shrink(group)
            # A new module and optimizer with the same values: the old DDP
            # keeps its hooks on the old parameters.
            model = copy.deepcopy(model)
            state = opt.state_dict()
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            opt.load_state_dict(state)
            ddp = DDP(model, process_group=group)
            print("rank %d: now rank %d of %d" % (world_rank, dist.get_rank(group),
                                                  dist.get_world_size(group)), flush=True)
            continue  # the same step again, on the ranks left
        if failed_at is not None:
            print("rank %d: time lost %.3f s (error to the end of the first step after it)"
                  % (world_rank, time.monotonic() - failed_at), flush=True)
            failed_at = None
        if world_rank == 0 and step % 20 == 0:
            print("step %3d  loss %.4f  ranks %d" % (step, loss.item(), size), flush=True)
        step += 1

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0, group=group)  # src: a global rank
    assert torch.equal(flat, ref), "parameters differ from rank 0's"
    print("rank %d: PASS, final loss %.4f on %d ranks" % (world_rank, loss.item(),
                                                         dist.get_world_size(group)), flush=True)


if __name__ == "__main__":
    main()
