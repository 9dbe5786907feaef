"""A small model trained with DistributedDataParallel on weft.

    weftrun -n 4 -- python3 examples/torch_ddp.py
    torchrun --nproc_per_node 4 examples/torch_ddp.py   # works too

(In the build tree: PYTHONPATH=python.) Each rank trains on its quarter of
every batch; DDP's gradient all_reduces run on weft. Rank 0 prints the loss,
and every rank checks at the end that its parameters equal rank 0's.
"""

import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import weft.torch  # noqa: F401  registers the "weft" backend


def main():
    dist.init_process_group("weft", timeout=datetime.timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model on every rank
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    # y = sum of x's first 8 features: learnable by the model.
    g = torch.Generator().manual_seed(1)
    per_rank = 64
    for step in range(200):
        x = torch.randn(per_rank * size, 32, generator=g)
        y = x[:, :8].sum(dim=1, keepdim=True)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
        opt.zero_grad()
        loss.backward()  # gradients averaged over the ranks, on weft
        opt.step()
        if rank == 0 and step % 50 == 0:
            print("step %3d  loss %.4f" % (step, loss.item()), flush=True)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    assert torch.equal(flat, ref), "parameters differ from rank 0's"
    if rank == 0:
        print("final loss %.4f; parameters identical on %d ranks" % (loss.item(), size))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
