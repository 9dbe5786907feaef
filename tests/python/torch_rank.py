"""One rank of a torch.distributed job on the "weft" backend (test_torch.py).

Usage: torch_rank.py MODE [ARGS]. Rank and size come from the environment
(RANK/WORLD_SIZE with MASTER_ADDR/MASTER_PORT, as torchrun or weftrun set
them). Prints "PASS" last and exits 0 when every check held; any failure
raises.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import weft.torch  # noqa: F401  registers "weft"

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.int8, torch.uint8, torch.int32, torch.int64]


def init(timeout_s=30):
    if timeout_s >= 30:
        dist.init_process_group("weft", timeout=datetime.timedelta(seconds=timeout_s))
    else:
        # A short timeout is for the collectives: the rendezvous gets 60 s
        # (a loaded host may take seconds to start a rank's Python).
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              size, rank == 0, timeout=datetime.timedelta(seconds=60))
        dist.init_process_group("weft", store=store, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def expect_equal(got, want, what):
    if not torch.equal(got, want):
        raise AssertionError("%s: got %s, expected %s" % (what, got[:8].tolist(), want[:8].tolist()))


def values(rank, n, dtype, salt=0):
    """Small integers, exact in every dtype (sums of a few ranks stay
    below 127 and in float16's exact range)."""
    return ((torch.arange(n) * 7 + rank * 3 + salt) % 5 + rank).to(dtype)


def wait(work, async_op):
    if async_op:
        fut = work.get_future()
        work.wait()
        fut.wait()
        if not work.is_completed():
            raise AssertionError("work not completed after wait")


def ops(rank, size):
    n = 1037  # odd, and more than one frame of small dtypes
    for async_op in (False, True):
        for dt in DTYPES:
            tag = "%s async=%s" % (dt, async_op)
            ins = [values(r, n, dt) for r in range(size)]
            ops_ = [(dist.ReduceOp.SUM, lambda xs: sum(x.to(torch.int64) for x in xs)),
                    (dist.ReduceOp.PRODUCT, None),
                    (dist.ReduceOp.MIN, lambda xs: torch.stack([x.to(torch.int64) for x in xs]).min(0).values),
                    (dist.ReduceOp.MAX, lambda xs: torch.stack([x.to(torch.int64) for x in xs]).max(0).values)]
            for op, ref in ops_:
                if ref is None:  # product of values kept at 1 or 2
                    pins = [(values(r, n, dt) % 2 + 1).to(dt) for r in range(size)]
                    t = pins[rank].clone()
                    want = torch.ones(n, dtype=torch.int64)
                    for p in pins:
                        want = want * p.to(torch.int64)
                else:
                    t = ins[rank].clone()
                    want = ref(ins)
                w = dist.all_reduce(t, op=op, async_op=async_op)
                wait(w, async_op)
                expect_equal(t, want.to(dt), "all_reduce %s %s" % (op, tag))
            if dt.is_floating_point:
                t = ins[rank].clone()
                w = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=async_op)
                wait(w, async_op)
                want = (sum(x.to(torch.float64) for x in ins) / size).to(dt)
                if not torch.allclose(t.to(torch.float64), want.to(torch.float64), rtol=1e-2):
                    raise AssertionError("avg %s" % tag)
            # broadcast from the last rank
            t = values(rank, n, dt, salt=1)
            wait(dist.broadcast(t, src=size - 1, async_op=async_op), async_op)
            expect_equal(t, values(size - 1, n, dt, salt=1), "broadcast " + tag)
            # all_gather (a list) and all_gather_into_tensor
            outs = [torch.empty(n, dtype=dt) for _ in range(size)]
            wait(dist.all_gather(outs, ins[rank], async_op=async_op), async_op)
            for r in range(size):
                expect_equal(outs[r], ins[r], "all_gather[%d] %s" % (r, tag))
            flat = torch.empty(n * size, dtype=dt)
            gather_base = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
            wait(gather_base(flat, ins[rank], async_op=async_op), async_op)
            expect_equal(flat, torch.cat(ins), "all_gather_into_tensor " + tag)
            # reduce_scatter (a list) and reduce_scatter_tensor
            chunks = [[values(r, n, dt, salt=10 + k) for k in range(size)] for r in range(size)]
            out = torch.empty(n, dtype=dt)
            wait(dist.reduce_scatter(out, chunks[rank], async_op=async_op), async_op)
            want = sum(chunks[r][rank].to(torch.int64) for r in range(size)).to(dt)
            expect_equal(out, want, "reduce_scatter " + tag)
            scatter_base = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
            out = torch.empty(n, dtype=dt)
            wait(scatter_base(out, torch.cat(chunks[rank]), async_op=async_op), async_op)
            expect_equal(out, want, "reduce_scatter_tensor " + tag)
            if dt.is_floating_point:
                mean = (want.to(torch.float64) / size).to(dt)
                for rs, name in ((dist.reduce_scatter, "reduce_scatter"),
                                 (scatter_base, "reduce_scatter_tensor")):
                    out = torch.empty(n, dtype=dt)
                    inp = chunks[rank] if name == "reduce_scatter" else torch.cat(chunks[rank])
                    wait(rs(out, inp, op=dist.ReduceOp.AVG, async_op=async_op), async_op)
                    if not torch.allclose(out.to(torch.float64), mean.to(torch.float64), rtol=1e-2):
                        raise AssertionError("%s avg %s" % (name, tag))
            # send/recv around the ring (even ranks send first)
            nxt, prv = (rank + 1) % size, (rank - 1) % size
            got = torch.empty(n, dtype=dt)
            mine = values(rank, n, dt, salt=20)
            if size > 1:
                if async_op:
                    ws = dist.isend(mine, nxt)
                    wr = dist.irecv(got, prv)
                    ws.wait()
                    wr.wait()
                elif rank % 2 == 0:
                    dist.send(mine, nxt)
                    dist.recv(got, prv)
                else:
                    dist.recv(got, prv)
                    dist.send(mine, nxt)
                expect_equal(got, values(prv, n, dt, salt=20), "send/recv " + tag)
            wait(dist.barrier(async_op=async_op), async_op)
    # Large: pipelined over frames.
    t = torch.full((3 << 20,), float(rank + 1))
    dist.all_reduce(t)
    expect_equal(t, torch.full((3 << 20,), float(size * (size + 1) // 2)), "large all_reduce")
    # Bad arguments: clear errors, the group still usable.
    # (bool and non-contiguous tensors are taken now: more_ops checks them.)
    for bad, op, what in ((torch.zeros(3, dtype=torch.int16), dist.ReduceOp.SUM,
                           "reduction of Short"),
                          (torch.ones(3), dist.ReduceOp.BAND, "BAND, BOR and BXOR need"),
                          (torch.ones(3, dtype=torch.int32), dist.ReduceOp.AVG, "AVG of Int")):
        try:
            dist.all_reduce(bad, op=op)
        except RuntimeError as e:
            if what not in str(e) or not isinstance(e, weft.torch.InvalidArgument):
                raise AssertionError("error for %s: %r" % (what, e))
        else:
            raise AssertionError("no error for " + what)
    # A root a C int cannot hold is refused (a cast made 2**32 root 0).
    for src in (2**32, 2**32 + size - 1, -2**32):
        try:
            dist.broadcast(torch.ones(3), src=src)
        except weft.torch.InvalidArgument as e:
            if "root" not in str(e) or str(src) not in str(e):
                raise AssertionError("error for src=%d: %r" % (src, e))
        else:
            raise AssertionError("no error for broadcast src=%d" % src)
    t = torch.ones(5)
    dist.all_reduce(t)
    expect_equal(t, torch.full((5,), float(size)), "all_reduce after errors")


def backend_of(group=None):
    """weft's ProcessGroupWeft behind a group (torch 2.x wraps it)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if hasattr(pg, "_get_backend"):
        return pg._get_backend(torch.device("cpu"))
    return pg


def groups(rank, size):
    """new_group over a subset and over everyone, used side by side."""
    sub = dist.new_group(list(range(size - 1)))
    every = dist.new_group(list(range(size)))
    t = torch.ones(100)
    if rank < size - 1:
        dist.all_reduce(t, group=sub)
        expect_equal(t, torch.full((100,), float(size - 1)), "subgroup all_reduce")
    print("bootstrap default=%s sub=%s every=%s" % (
        backend_of()._bootstrap, backend_of(sub)._bootstrap if rank < size - 1 else "-",
        backend_of(every)._bootstrap), flush=True)
    t = torch.ones(100)
    dist.all_reduce(t, group=every)
    expect_equal(t, torch.full((100,), float(size)), "second world group")
    t = torch.ones(100)
    dist.all_reduce(t)
    expect_equal(t, torch.full((100,), float(size)), "default group")


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 4)).double()


def batches(steps, global_batch):
    g = torch.Generator().manual_seed(99)
    return [(torch.randn(global_batch, 16, generator=g, dtype=torch.float64),
             torch.randn(global_batch, 4, generator=g, dtype=torch.float64))
            for _ in range(steps)]


def ddp(rank, size, steps=20, kill_at=None, timeout_s=30):
    """DDP on weft against one process training on the whole batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    per = 6
    data = batches(steps, per * size)
    model = DDP(make_model(), bucket_cap_mb=0.01)  # several buckets
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref = make_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    t0 = time.monotonic()
    for step, (x, y) in enumerate(data):
        if kill_at is not None and step == kill_at and rank == size - 1:
            print("rank %d exits at step %d" % (rank, step), flush=True)
            os._exit(3)
        if kill_at is not None and step == kill_at:
            t0 = time.monotonic()
        opt.zero_grad()
        lo, hi = rank * per, (rank + 1) * per
        loss = torch.nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi])
        try:
            loss.backward()
            opt.step()
        except RuntimeError as e:
            dt = time.monotonic() - t0
            print("rank %d raised at step %d after %.2f s: %s" % (rank, step, dt, str(e)[:300]), flush=True)
            if kill_at is None or dt > 2 * timeout_s:
                raise
            print("PASS", flush=True)
            os._exit(0)  # the group is failed; nothing more to tear down
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    if kill_at is not None:
        raise AssertionError("rank %d never saw the failure" % rank)
    flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    ref_flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    every = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(every, flat)
    for r in range(size):
        if not torch.equal(every[r], flat):
            raise AssertionError("rank %d's parameters differ from rank %d's" % (r, rank))
    diff = (flat - ref_flat).abs().max().item()
    print("max |ddp - one process| = %.3g" % diff, flush=True)
    if diff > 1e-5:
        raise AssertionError("DDP drifted from one process by %g" % diff)


def sequence_number():
    """The default group's sequence number: torch 2's ProcessGroup asks
    only its own backends (gloo, nccl, ucc) for one, so there weft's
    backend is asked itself."""
    pg = dist.group.WORLD
    try:
        return pg._get_sequence_number_for_group()
    except RuntimeError:
        return pg._get_backend(torch.device("cpu"))._get_sequence_number_for_group()


def more_ops(rank, size):
    """The operations of issue 34: reduce, gather, scatter, all_to_all (even
    and uneven), the coalesced forms, tags, receives from any source,
    bitwise reductions, bool and dtypes weft moves as bytes, non-contiguous
    tensors, sequence numbers, sparse all_reduce, each checked against what
    it must give."""
    n = 517
    root = size - 1
    seq0 = sequence_number()
    for dt in DTYPES + [torch.bool, torch.int16, torch.complex64]:
        tag = str(dt)
        ins = [values(r, n, dt) if dt != torch.bool else (values(r, n, torch.int64) % 2 == 0)
               for r in range(size)]
        wide = [x.to(torch.int64) if not dt.is_complex else x for x in ins]
        # reduce (SUM, where weft reduces the dtype; MAX): the root's tensor
        # takes the result, the others' stay as they were
        ops_ = [(dist.ReduceOp.SUM, lambda xs: sum(xs))]
        if not dt.is_complex:
            ops_.append((dist.ReduceOp.MAX, lambda xs: torch.stack(xs).max(0).values))
        if dt != torch.int16:
            for op, ref in ops_:
                t = ins[rank].clone()
                dist.reduce(t, dst=root, op=op)
                want = ref(wide)
                want = (want != 0) if dt == torch.bool else want.to(dt)
                expect_equal(t, want if rank == root else ins[rank], "reduce %s %s" % (op, tag))
        # gather, scatter (to and from root)
        outs = [torch.empty_like(ins[0]) for _ in range(size)] if rank == root else None
        dist.gather(ins[rank], outs, dst=root)
        if rank == root:
            for r in range(size):
                expect_equal(outs[r], ins[r], "gather[%d] %s" % (r, tag))
        got = torch.empty_like(ins[0])
        dist.scatter(got, [x.clone() for x in ins] if rank == root else None, src=root)
        expect_equal(got, ins[rank], "scatter " + tag)
        # all_to_all_single, even
        blocks = [torch.full((3,), 10 * rank + p).to(dt) for p in range(size)]
        out = torch.empty(3 * size, dtype=dt)
        dist.all_to_all_single(out, torch.cat(blocks))
        expect_equal(out, torch.cat([torch.full((3,), 10 * p + rank).to(dt) for p in range(size)]),
                     "all_to_all_single " + tag)
    # all_to_all_single with uneven splits: rank r sends r + p + 1 rows of
    # 3 to rank p, each row (r, p, i)
    def rows(src, dst):
        k = src + dst + 1
        return torch.stack([torch.tensor([src, dst, i]) for i in range(k)]).to(torch.float32)
    inp = torch.cat([rows(rank, p) for p in range(size)])
    want = torch.cat([rows(p, rank) for p in range(size)])
    out = torch.empty_like(want)
    splits = [rank + p + 1 for p in range(size)]
    dist.all_to_all_single(out, inp, output_split_sizes=splits, input_split_sizes=splits)
    expect_equal(out, want, "all_to_all_single with splits")
    # all_to_all of lists, each block its own size
    ins = [torch.arange(rank + p + 1, dtype=torch.int64) + 100 * rank for p in range(size)]
    outs = [torch.empty(p + rank + 1, dtype=torch.int64) for p in range(size)]
    dist.all_to_all(outs, ins)
    for p in range(size):
        expect_equal(outs[p], torch.arange(p + rank + 1, dtype=torch.int64) + 100 * p,
                     "all_to_all from %d" % p)
    # the coalesced forms
    ts = [torch.full((5,), float(rank + 1)), torch.full((2, 3), float(2 * rank))]
    dist.all_reduce_coalesced(ts)
    expect_equal(ts[0], torch.full((5,), float(sum(range(1, size + 1)))), "all_reduce_coalesced 0")
    expect_equal(ts[1], torch.full((2, 3), float(2 * sum(range(size)))), "all_reduce_coalesced 1")
    ins = [torch.full((4,), float(rank)), torch.full((2, 2), rank + 0.5), torch.zeros(0)]
    outs = [[torch.empty_like(t) for t in ins] for _ in range(size)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(size):
        expect_equal(outs[r][0], torch.full((4,), float(r)), "all_gather_coalesced")
        expect_equal(outs[r][1], torch.full((2, 2), r + 0.5), "all_gather_coalesced")
    # bitwise reductions (weft folds gathered tensors), on int32 and bool
    bits = [torch.tensor([1 << r, 0xff ^ r, 3 * r + 1], dtype=torch.int32) for r in range(size)]
    for op, f in ((dist.ReduceOp.BAND, torch.bitwise_and), (dist.ReduceOp.BOR, torch.bitwise_or),
                  (dist.ReduceOp.BXOR, torch.bitwise_xor)):
        want = bits[0]
        for b in bits[1:]:
            want = f(want, b)
        t = bits[rank].clone()
        dist.all_reduce(t, op=op)
        expect_equal(t, want, "all_reduce %s" % op)
        t = bits[rank].clone()
        dist.reduce(t, dst=0, op=op)
        expect_equal(t, want if rank == 0 else bits[rank], "reduce %s" % op)
        b = torch.tensor([rank == 0, True, False, rank % 2 == 1])
        bs = [torch.tensor([r == 0, True, False, r % 2 == 1]) for r in range(size)]
        want = bs[0]
        for x in bs[1:]:
            want = f(want, x)
        dist.all_reduce(b, op=op)
        expect_equal(b, want, "all_reduce bool %s" % op)
    # non-contiguous tensors: copied in, and back out
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) + rank
    t = base.t()
    dist.all_reduce(t)
    expect_equal(t, (torch.arange(24, dtype=torch.float32).reshape(4, 6) * size
                     + sum(range(size))).t(), "all_reduce of a transposed tensor")
    strided = torch.zeros(10)
    dist.broadcast(strided[::2], src=0) if rank != 0 else dist.broadcast(
        torch.arange(10, dtype=torch.float32)[::2], src=0)
    if rank != 0:
        expect_equal(strided, torch.tensor([0., 0, 2, 0, 4, 0, 6, 0, 8, 0]), "broadcast strided")
    # tags: rank 0 sends tag 7, then tag 3; rank 1 receives 3 first
    if rank == 0:
        dist.send(torch.full((3,), 7.0), 1, tag=7)
        dist.send(torch.full((3,), 3.0), 1, tag=3)
    elif rank == 1:
        a, b = torch.empty(3), torch.empty(3)
        dist.recv(b, 0, tag=3)
        dist.recv(a, 0, tag=7)
        expect_equal(a, torch.full((3,), 7.0), "tag 7")
        expect_equal(b, torch.full((3,), 3.0), "tag 3")
    # receives from any source: every other rank sends rank 0 its rank
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            t = torch.empty(2, dtype=torch.int64)
            src = dist.recv(t, tag=5)
            expect_equal(t, torch.full((2,), src, dtype=torch.int64), "any source from %d" % src)
            seen.add(src)
        if seen != set(range(1, size)):
            raise AssertionError("any source: got from %s" % sorted(seen))
    else:
        dist.send(torch.full((2,), rank, dtype=torch.int64), 0, tag=5)
    # a subgroup of the first and last rank: reduce and gather in it
    ranks = [0, size - 1]
    g = dist.new_group(ranks)
    if rank in ranks:
        t = torch.full((4,), float(rank + 1))
        dist.reduce(t, dst=size - 1, group=g)
        if rank == size - 1:
            expect_equal(t, torch.full((4,), float(size + 1)), "reduce in a subgroup")
        outs = [torch.empty(2) for _ in ranks] if rank == 0 else None
        dist.gather(torch.full((2,), float(rank)), outs, dst=0, group=g)
        if rank == 0:
            expect_equal(torch.stack(outs), torch.tensor([[0.0, 0], [size - 1, size - 1]]),
                         "gather in a subgroup")
    # sparse all_reduce (SUM): rank r holds r + 1 at rows r and r + 1 of a
    # 2-d sparse tensor with a dense column pair; some rows meet, one rank
    # holds nothing; a dense reference gives the sum
    def sparse_of(r):
        rows = [] if r == 1 else [r, r + 1]
        i = torch.tensor([rows, [0] * len(rows)], dtype=torch.int64)
        v = torch.full((len(rows), 2), float(r + 1))
        return torch.sparse_coo_tensor(i, v, (size + 1, 3, 2))
    sp = sparse_of(rank)
    dist.all_reduce(sp)
    want = sum(sparse_of(r).to_dense() for r in range(size))
    expect_equal(sp.to_dense(), want, "sparse all_reduce")
    try:
        dist.all_reduce(sparse_of(rank), op=dist.ReduceOp.MAX)
        raise AssertionError("sparse all_reduce by MAX did not raise")
    except (RuntimeError, ValueError) as e:
        if "SUM only" not in str(e):
            raise
    # sequence numbers: every collective counted, the same on every rank
    seq = sequence_number()
    if seq <= seq0:
        raise AssertionError("sequence number %d after %d" % (seq, seq0))
    every = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(every, torch.tensor([seq], dtype=torch.int64))
    if any(int(e) != seq for e in every):
        raise AssertionError("sequence numbers differ: %s" % [int(e) for e in every])


def shm_segments():
    """weft's shared-memory segments this process maps (one per local
    peer of each communicator)."""
    with open("/proc/self/maps") as f:
        return sum("memfd:weft-shm" in line for line in f)


def sigint(rank, kind):
    """Ctrl-C in a wait: test_torch.py sends SIGINT to rank 1, blocked in a
    receive from rank 0 (which never sends) or in a collective rank 0 never
    calls, with a 20 s deadline. Rank 1 gets KeyboardInterrupt at once and
    its group is aborted; rank 0, in a receive from rank 1, gets an error
    once rank 1 has gone."""
    t = torch.zeros(4)
    if kind == "outside":
        # Ctrl-C while no weft call runs: KeyboardInterrupt, and the group
        # is left alone, even by a collective at once.
        if rank == 1:
            print("blocking in sleep", flush=True)
            try:
                time.sleep(20)
                raise AssertionError("no KeyboardInterrupt")
            except KeyboardInterrupt:
                dist.all_reduce(t + 1)
            print("KeyboardInterrupt at %.6f, in sleep" % time.monotonic(), flush=True)
        else:
            dist.all_reduce(t + 1)       # waits for rank 1
        dist.barrier()
        return
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.recv(t, 1)
        except RuntimeError as e:
            print("raised %s after %.2f s: %s" % (type(e).__name__, time.monotonic() - t0,
                                                  str(e)[:200]), flush=True)
            if not isinstance(e, weft.torch.PeerError):
                raise
            return
        raise AssertionError("recv returned")
    calls = {"recv": lambda: dist.recv(t, 0),
             "wait": lambda: dist.irecv(t, 0).wait(),
             "all_reduce": lambda: dist.all_reduce(t)}
    print("blocking in %s" % kind, flush=True)
    t0 = time.monotonic()
    try:
        calls[kind]()
        raise AssertionError("%s returned" % kind)
    except KeyboardInterrupt:
        t1 = time.monotonic()
    # test_torch.py measures from when it sent the signal (CLOCK_MONOTONIC
    # is the system's).
    print("KeyboardInterrupt at %.6f, %.3f s into %s" % (t1, t1 - t0, kind), flush=True)
    try:
        dist.all_reduce(t)
    except weft.torch.AbortedError as e:
        print("then: %s" % str(e)[:200], flush=True)
    else:
        raise AssertionError("an interrupted group worked")


def main():
    mode = sys.argv[1]
    if mode == "ops":
        rank, size = init()
        # Ranks of one host talk through shared memory, however they
        # bootstrapped (the store's addresses or weftrun's hostfile).
        print("shm segments=%d" % shm_segments(), flush=True)
        ops(rank, size)
        groups(rank, size)
        dist.destroy_process_group()
    elif mode == "more":
        rank, size = init()
        more_ops(rank, size)
        dist.destroy_process_group()
    elif mode == "reinit":
        # destroy_process_group, then a new one in the same process.
        for round_ in range(2):
            os.environ["MASTER_PORT"] = sys.argv[2 + round_]
            rank, size = init()
            t = torch.full((10,), float(rank + round_))
            dist.all_reduce(t)
            want = float(sum(range(size)) + size * round_)
            expect_equal(t, torch.full((10,), want), "round %d" % round_)
            dist.destroy_process_group()
    elif mode == "ddp":
        rank, size = init()
        ddp(rank, size)
        dist.destroy_process_group()
    elif mode == "ddp_kill":
        rank, size = init(timeout_s=3)
        ddp(rank, size, kill_at=5, timeout_s=3)
    elif mode == "timeout":
        # The last rank never joins the collective: the others raise
        # weft's TimeoutError (a RuntimeError) within twice the timeout.
        rank, size = init(timeout_s=2)
        if rank == size - 1:
            time.sleep(3)
        else:
            t0 = time.monotonic()
            try:
                dist.all_reduce(torch.ones(10))
            except RuntimeError as e:
                dt = time.monotonic() - t0
                print("raised %s after %.2f s: %s" % (type(e).__name__, dt, e), flush=True)
                # torch's tests and tooling look for "Timed out".
                if isinstance(e, weft.torch.TimeoutError) and " Timed out " not in str(e):
                    raise AssertionError("a timeout that does not say Timed out")
                if dt > 4.0:
                    raise AssertionError("raised after %.2f s" % dt)
            else:
                raise AssertionError("no error")
    elif mode == "sigint":
        rank, size = init(timeout_s=20)
        sigint(rank, sys.argv[2])
        dist.destroy_process_group()
    else:
        raise SystemExit("unknown mode " + mode)
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
