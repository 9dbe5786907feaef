"""One rank of the Python package's multi-rank tests, run under weftrun by
test_ranks.py: `weftrun -n N -- python3 ranks.py CASE`.

Each case checks what it does against numpy computed locally (every rank
can compute every rank's input), raises AssertionError on a difference
(weftrun then fails the job) and prints "ok CASE" at the end.
"""
import builtins
import gc
import os
import sys
import threading
import time

import numpy as np

import weft
from weft import _comm

DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64,
          np.float16, np.float32, np.float64, "bf16"]
OPS = [weft.SUM, weft.PROD, weft.MIN, weft.MAX]
BIG = 1 << 20   # past the pipeline frame (256 KiB), so it is chunked


def bf16_bits(f32):
    return (np.asarray(f32, np.float32).view(np.uint32) >> 16).astype(
        np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def make(rank, count, dt, seed=0):
    """Rank's input: small integers (every sum and product exact in every
    dtype, float16 and bfloat16 included), non-negative for unsigned."""
    v = (np.arange(count, dtype=np.int64) * 7 + rank * 3 + seed) % 5
    if dt == "bf16":
        return bf16_bits((v - 2).astype(np.float32))
    if np.dtype(dt).kind != "u":
        v = v - 2
    return v.astype(dt)


def reduce_ref(arrays, op, dt):
    if dt == "bf16":
        vals = np.stack([bf16_value(a).astype(np.float64) for a in arrays])
    else:
        wide = np.float64 if np.dtype(dt).kind == "f" else np.int64
        vals = np.stack([a.astype(wide) for a in arrays])
    res = {weft.SUM: vals.sum(0), weft.PROD: vals.prod(0),
           weft.MIN: vals.min(0), weft.MAX: vals.max(0)}[op]
    if dt == "bf16":
        return bf16_bits(res.astype(np.float32))
    return res.astype(dt)


def kw(dt):
    return {"dtype": weft.BFLOAT16} if dt == "bf16" else {}


def npdt(dt):
    return np.uint16 if dt == "bf16" else dt


def garbage(count, dt):
    return np.full(count, 3, dtype=npdt(dt))


class Runner:
    """Calls an operation blocking, or posts its i-form and checks it
    after one wait_all, so one list of cases serves both."""

    def __init__(self, comm, blocking):
        self.comm, self.blocking = comm, blocking
        self.reqs, self.checks = [], []

    def call(self, name, *args, result=None, **kwargs):
        if self.blocking:
            got = getattr(self.comm, name)(*args, **kwargs)
            assert got is result, "%s returned %r" % (name, type(got))
        else:
            req = getattr(self.comm, "i" + name)(*args, **kwargs)
            self.reqs.append((req, result, name))

    def expect(self, label, got, want):
        self.checks.append((label, got, want))

    def finish(self):
        if self.reqs:
            results = weft.wait_all([r for r, _, _ in self.reqs])
            for (req, result, name), got in zip(self.reqs, results):
                assert got is result, "i%s: %r" % (name, req)
                assert req.done() and req.test()
                req.free()
        for label, got, want in self.checks:
            assert got.dtype == want.dtype, (label, got.dtype, want.dtype)
            if not np.array_equal(got, want):
                bad = np.flatnonzero(got != want)
                raise AssertionError(
                    "%s (%s): %d wrong elements, first at %d: got %r want %r"
                    % (label, "blocking" if self.blocking else "non-blocking",
                       bad.size, bad[0], got[bad[0]], want[bad[0]]))
        self.reqs, self.checks = [], []


def all_reduce_cases(t, r, n):
    cases = [(dt, op, c) for dt in DTYPES for op in OPS for c in (1, 7)]
    cases += [(dt, weft.SUM, c) for dt in DTYPES for c in (0, 1001)]
    cases += [(np.float32, weft.SUM, BIG), (np.int64, weft.MAX, BIG)]
    for i, (dt, op, count) in enumerate(cases):
        label = "all_reduce %s %s count %d" % (dt if dt == "bf16" else
                                               np.dtype(dt).name, op.name,
                                               count)
        want = reduce_ref([make(q, count, dt, i) for q in range(n)], op, dt)
        send = make(r, count, dt, i)
        if i % 2 == 0:
            recv = garbage(count, dt)
            t.call("all_reduce", send, recv, op, result=recv, **kw(dt))
            t.expect(label, recv, want)
            t.expect(label + " (sendbuf kept)", send, make(r, count, dt, i))
        else:
            # In place, with the op as a string for variety.
            t.call("all_reduce", send, op=op.name.lower(), result=send,
                   **kw(dt))
            t.expect(label + " in place", send, want)


def all_gather_cases(t, r, n):
    for i, (dt, count) in enumerate(
            [(dt, c) for dt in (np.uint8, np.float16, np.int64, "bf16")
             for c in (0, 1, 7, 1001)] + [(np.float32, BIG // n)]):
        label = "all_gather %s count %d" % (dt, count)
        want = np.concatenate([make(q, count, dt, i) for q in range(n)])
        send = make(r, count, dt, i)
        recv = garbage(n * count, dt)
        t.call("all_gather", send, recv, result=recv, **kw(dt))
        t.expect(label, recv, want)
        # In place, this rank's data first.
        buf = garbage(n * count, dt)
        buf[:count] = send
        t.call("all_gather", buf, result=buf, **kw(dt))
        t.expect(label + " in place", buf, want)
        # NCCL's in place: this rank's block at rank*count, as a view.
        buf2 = garbage(n * count, dt)
        buf2[r * count:(r + 1) * count] = send
        t.call("all_gather", buf2[r * count:(r + 1) * count], buf2,
               result=buf2, **kw(dt))
        t.expect(label + " in place (NCCL)", buf2, want)


def reduce_scatter_cases(t, r, n):
    cases = [(dt, weft.SUM, c) for dt in DTYPES for c in (0, 1, 7)]
    cases += [(dt, op, 5) for dt in (np.int32, np.float64, "bf16")
              for op in OPS]
    cases += [(np.float32, weft.SUM, BIG // n)]
    for i, (dt, op, count) in enumerate(cases):
        label = "reduce_scatter %s %s count %d" % (dt, op.name, count)
        full = reduce_ref([make(q, n * count, dt, i) for q in range(n)], op,
                          dt)
        want = full[r * count:(r + 1) * count]
        send = make(r, n * count, dt, i)
        recv = garbage(count, dt)
        t.call("reduce_scatter", send, recv, op, result=recv, **kw(dt))
        t.expect(label, recv, want)
        buf = send.copy()
        t.call("reduce_scatter", buf, None, op, result=buf, **kw(dt))
        t.expect(label + " in place", buf[:count], want)


def broadcast_cases(t, r, n):
    for i, (dt, count, root) in enumerate(
            [(np.uint8, 0, 0), (np.float16, 1, 1), (np.int64, 7, n - 1),
             ("bf16", 1001, 1), (np.float64, BIG, 1)]):
        label = "broadcast %s count %d root %d" % (dt, count, root)
        if r == root:
            buf = make(root, count, dt, i)
            buf.setflags(write=False)   # the root only reads
        else:
            buf = garbage(count, dt)
        t.call("broadcast", buf, root, result=buf, **kw(dt))
        t.expect(label, buf, make(root, count, dt, i))


def p2p_cases(t, r, n):
    """Rank 0 sends to each rank in turn, each answers; then a ring of
    sendrecv. (The order keeps large sends from waiting on each other.)"""
    for i, (dt, count) in enumerate([(np.uint8, 0), (np.float16, 1),
                                     (np.int64, 7), ("bf16", 1001),
                                     (np.float32, BIG)]):
        label = "send/recv %s count %d" % (dt, count)
        if r == 0:
            for q in range(1, n):
                t.call("send", make(0, count, dt, i + q), q, **kw(dt))
            for q in range(1, n):
                back = garbage(count, dt)
                t.call("recv", back, q, result=back, **kw(dt))
                t.expect(label + " from %d" % q, back, make(q, count, dt, i))
        else:
            got = garbage(count, dt)
            t.call("recv", got, 0, result=got, **kw(dt))
            t.expect(label, got, make(0, count, dt, i + r))
            t.call("send", make(r, count, dt, i), 0, **kw(dt))
        dst, src = (r + 1) % n, (r - 1) % n
        recv = garbage(count, dt)
        t.call("sendrecv", make(r, count, dt, i), dst, recv, src,
               result=recv, **kw(dt))
        t.expect("sendrecv " + label, recv, make(src, count, dt, i))
    t.call("barrier")


def other_buffers(comm, r, n):
    """Buffers that are not numpy arrays, and numpy arrays of other
    shapes: the dtype and count come from the buffer."""
    import array
    total = n * (n - 1) // 2
    a = array.array("d", [r, 1.5])
    comm.all_reduce(a)
    assert list(a) == [total, 1.5 * n], a
    b = bytearray([r, 2])
    comm.all_reduce(b, op=weft.MAX)
    assert list(b) == [n - 1, 2], b
    c = np.arange(6, dtype=np.int32).reshape(2, 3) + r
    out = np.zeros((3, 2), np.int32)
    comm.all_reduce(memoryview(c), out)
    assert (out.ravel() == (np.arange(6) * n + total)).all(), out
    s = np.full((), r, np.float64)            # a 0-d array
    comm.all_reduce(s)
    assert s == total, s
    g = bytearray(n * 2)
    comm.all_gather(bytes([r, r]), g)          # bytes: read-only, send side
    assert list(g) == [q for q in range(n) for _ in (0, 1)], g


def case_ops(comm):
    r, n = comm.rank, comm.size
    for blocking in (True, False):
        t = Runner(comm, blocking)
        for cases in (all_reduce_cases, all_gather_cases,
                      reduce_scatter_cases, broadcast_cases, p2p_cases):
            cases(t, r, n)
            t.finish()
    other_buffers(comm, r, n)
    # Request forms: wait(), test() polling, a with block, ibarrier.
    x = make(r, 1001, np.float32)
    want = reduce_ref([make(q, 1001, np.float32) for q in range(n)],
                      weft.SUM, np.float32)
    req = comm.iall_reduce(x)
    assert req.wait() is x and np.array_equal(x, want)
    assert req.wait() is x      # again: the same result
    y = make(r, 7, np.int64)
    req = comm.iall_reduce(y, op=weft.MIN)
    while not req.test():
        pass
    assert np.array_equal(y, reduce_ref([make(q, 7, np.int64)
                                         for q in range(n)], weft.MIN,
                                        np.int64))
    z = make(r, 7, np.int64)
    with comm.iall_reduce(z, op=weft.MAX):
        pass
    assert np.array_equal(z, reduce_ref([make(q, 7, np.int64)
                                         for q in range(n)], weft.MAX,
                                        np.int64))
    comm.ibarrier().wait()
    comm.barrier()
    # The wires to each peer: shared memory (these ranks share a host)
    # has none; this rank is not a peer.
    if n > 1:
        shm = (os.environ.get("WEFT_SHM", "1") != "0" and
               os.environ.get("WEFT_TRANSPORT", "tcp") != "ibverbs")
        w = comm.peer_wires((r + 1) % n)
        assert w["up"] == w["total"] and w["lost"] == 0 and w["back"] == 0, w
        assert (w["total"] == 0) == shm, w
    try:
        comm.peer_wires(r)
        raise AssertionError("peer_wires(this rank) did not raise")
    except weft.InvalidArgument:
        pass


def case_errors(comm):
    """Bad arguments raise weft.InvalidArgument (a ValueError) before
    anything is sent, and the communicator stays usable."""
    r, n = comm.rank, comm.size
    x = np.zeros(4, np.float32)
    ro = np.zeros(4, np.float32)
    ro.setflags(write=False)

    def refused(fn, *words):
        try:
            fn()
        except weft.InvalidArgument as e:
            assert isinstance(e, ValueError) and e.code == -1, repr(e)
            assert e.name == "WEFT_EINVAL", e.name
            for w in words:
                assert w in str(e), (w, str(e))
            return e
        raise AssertionError("no InvalidArgument from %s" % fn)

    refused(lambda: comm.all_reduce(np.zeros(8, np.float32)[::2]),
            "not contiguous")
    refused(lambda: comm.iall_reduce(np.zeros((4, 4), np.float32)[:, 1]),
            "not contiguous")
    refused(lambda: comm.all_reduce(x, ro), "read-only")
    refused(lambda: comm.recv(ro, (r + 1) % n), "read-only")
    refused(lambda: comm.all_reduce(ro), "read-only")   # in place
    refused(lambda: comm.all_gather(x, np.zeros(4 * n - 1, np.float32)),
            "size*count")
    refused(lambda: comm.iall_gather(x, np.zeros(4, np.float32)),
            "size*count")
    refused(lambda: comm.reduce_scatter(np.zeros(4 * n + 1, np.float32),
                                        np.zeros(4, np.float32)),
            "size*recvcount")
    refused(lambda: comm.all_reduce(x, np.zeros(5, np.float32)), "match")
    refused(lambda: comm.all_reduce(x, np.zeros(4, np.float64)), "FLOAT64")
    for dt in (np.int16, np.bool_, np.complex64, np.longdouble):
        refused(lambda: comm.all_reduce(np.zeros(4, dt)), "not a weft dtype")
    refused(lambda: comm.all_reduce(np.zeros(4, ">f4")), "byte order")
    refused(lambda: comm.all_reduce(x, dtype=weft.BFLOAT16), "convert")
    refused(lambda: comm.all_reduce(x, dtype="complex"), "not a weft dtype")
    refused(lambda: comm.all_reduce(x, op="xor"), "reduction")
    refused(lambda: comm.all_reduce([1.0, 2.0]), "not a buffer")
    # Refused by libweft itself: the message is weft_last_error().
    e = refused(lambda: comm.send(x, n), "peer")
    assert e.message == comm.last_error, (e.message, comm.last_error)
    refused(lambda: comm.isend(x, -1))
    refused(lambda: comm.broadcast(x, root=n))
    refused(lambda: comm.ibroadcast(x, root=-1))
    refused(lambda: comm.sendrecv(x, r, np.zeros(4, np.float32), r))
    refused(lambda: comm.set_timeout(0), "timeout")
    # Integers a C int cannot hold, and non-integers, are refused here,
    # before anything is sent: ctypes kept the low 32 bits, so peer
    # 2**32 + 1 was rank 1 and 1.7 was 1. The check at the end finds a
    # message that went out anyway.
    nxt = (r + 1) % n
    for v in (2**32 + nxt, -2**32 + nxt, 2**64 + nxt, nxt + 0.7,
              float(nxt), str(nxt)):
        refused(lambda: comm.send(x, v), "send", "peer")
        refused(lambda: comm.isend(x, v), "send", "peer")
        refused(lambda: comm.sendrecv(x, v, np.zeros(4, np.float32), nxt),
                "sendrecv", "dst")
        refused(lambda: comm.isendrecv(x, nxt, np.zeros(4, np.float32), v),
                "sendrecv", "src")
        refused(lambda: comm.broadcast(x, root=v), "broadcast", "root")
        refused(lambda: comm.ibroadcast(x, v), "broadcast", "root")
        refused(lambda: comm.recv(np.zeros(4, np.float32), v), "recv",
                "peer")
    refused(lambda: comm.set_timeout(2**32 + 5), "timeout_ms")
    # Still usable.
    y = np.full(3, r + 1, np.int32)
    comm.all_reduce(y, op=weft.PROD)
    assert (y == np.prod(np.arange(1, n + 1))).all(), y
    comm.iall_reduce(y, op=weft.MIN).wait()
    assert (y == y[0]).all()
    # The first message from the previous rank is this one: nothing else
    # was sent. (A 5 ms deadline from set_timeout would fail this too.)
    got = np.zeros(4, np.float32)
    prv = (r - 1) % n
    comm.sendrecv(np.full(4, 100 + r, np.float32), nxt, got, prv)
    assert (got == 100 + prv).all(), got


def ticker():
    """A Python thread counting while the main thread is inside weft: it
    runs only if the foreign call released the GIL."""
    state = {"ticks": 0, "stop": False}

    def run():
        while not state["stop"]:
            state["ticks"] += 1
            time.sleep(0.002)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return state, th


def case_timeout(comm):
    """A recv nobody sends to: weft.TimeoutError at the deadline, carrying
    weft_last_error, while another Python thread keeps running; then the
    communicator is failed; then a fresh one forms in the same process."""
    r = comm.rank
    timeout_s = 1.0
    for blocking in (True, False):
        if r == 0:
            comm.set_timeout(int(timeout_s * 1000))
            state, th = ticker()
            time.sleep(0.05)
            ticks0, t0 = state["ticks"], time.monotonic()
            try:
                buf = np.zeros(16, np.float32)
                if blocking:
                    comm.recv(buf, 1)
                else:
                    req = comm.irecv(buf, 1)
                    req.wait()
                raise AssertionError("recv returned without a sender")
            except weft.TimeoutError as e:
                elapsed = time.monotonic() - t0
                ticks = state["ticks"] - ticks0
                state["stop"] = True
                th.join()
                assert isinstance(e, builtins.TimeoutError), type(e).__mro__
                assert e.code == -4 and e.name == "WEFT_ETIMEDOUT", repr(e)
                assert e.message and e.message == comm.last_error, (
                    e.message, comm.last_error)
                assert e.message in str(e), str(e)
                assert timeout_s * 0.9 <= elapsed < 2 * timeout_s, elapsed
                # 2 ms ticks: a thread held off by the GIL would count ~0.
                assert ticks > 50, "other thread ran %d ticks" % ticks
                print("timed out after %.2f s (%s): %s; other thread: %d "
                      "ticks" % (elapsed, "blocking" if blocking else
                                 "non-blocking", e, ticks), flush=True)
            cause = comm.last_error
            t0 = time.monotonic()
            try:
                comm.all_reduce(np.zeros(4, np.float32))
                raise AssertionError("a failed communicator worked")
            except weft.AbortedError:
                assert time.monotonic() - t0 < 0.5
            try:
                comm.iall_reduce(np.zeros(4, np.float32))
                raise AssertionError("a failed communicator posted")
            except weft.AbortedError:
                pass
            assert comm.last_error == cause
        else:
            # Sends nothing; stays alive (not in weft) past the deadline.
            time.sleep(2.5 * timeout_s)
        comm.close()
        assert comm.closed
        comm = weft.init()   # recovery: a fresh communicator
    x = np.full(5, r + 1.0)
    comm.all_reduce(x)
    assert (x == 3.0).all(), x
    return comm


def case_shrink(comm):
    """The last rank dies; the survivors shrink, check the new Comm's ranks
    and origin ranks, reduce on it, and split it by parity."""
    r, n = comm.rank, comm.size
    comm.set_timeout(2000)
    comm.barrier()
    if r == n - 1:
        os._exit(0)      # no finalize: its sockets just close
    try:
        comm.all_reduce(np.ones(1024, np.float32))
        raise AssertionError("all_reduce succeeded without a rank")
    except (weft.PeerError, weft.TimeoutError):
        pass
    s = comm.shrink()
    assert (s.rank, s.size) == (r, n - 1), s
    assert [s.origin_rank(i) for i in range(s.size)] == list(range(n - 1))
    x = np.full(1000, r + 1, np.int64)
    s.all_reduce(x)
    assert (x == sum(range(1, n))).all(), x[:4]
    try:
        comm.barrier()
        raise AssertionError("the shrunk Comm still works")
    except weft.AbortedError:
        pass
    half = s.split(r % 2, key=-r)
    mine = [q for q in range(n - 1) if q % 2 == r % 2][::-1]
    assert half.size == len(mine) and half.rank == mine.index(r), half
    assert [half.origin_rank(i) for i in range(half.size)] == mine
    y = np.array([r], np.int32)
    half.all_reduce(y)
    assert y[0] == sum(mine), y
    assert s.split(-1) is None
    half.close()
    s.close()
    print("after shrink: %d of %d" % (s.size, n))


def case_dead(comm, blocking):
    """A rank that dies: the survivors get weft.PeerError or
    weft.TimeoutError within twice the deadline, then AbortedError."""
    r, n = comm.rank, comm.size
    timeout_s = 2.0
    comm.set_timeout(int(timeout_s * 1000))
    comm.barrier()
    if r == n - 1:
        os._exit(0)      # no finalize: its sockets just close
    x = np.ones(1 << 16, np.float32)
    t0 = time.monotonic()
    try:
        if blocking:
            comm.all_reduce(x)
            raise AssertionError("all_reduce succeeded without a rank")
        first = comm.iall_reduce(x)
        try:
            second = comm.iall_reduce(x.copy())
        except weft.AbortedError:
            second = None       # the first has failed the comm already
        try:
            first.wait()
            raise AssertionError("iall_reduce succeeded without a rank")
        finally:
            # Pending behind the failure: completed with AbortedError.
            if second is not None:
                e = second.exception()
                assert isinstance(e, weft.AbortedError), repr(e)
    except (weft.PeerError, weft.TimeoutError) as e:
        elapsed = time.monotonic() - t0
        assert isinstance(e, (ConnectionError, builtins.TimeoutError))
        assert e.message, repr(e)
        assert elapsed < 2 * timeout_s, elapsed
        print("after %.2f s: %s" % (elapsed, e), flush=True)
    try:
        comm.barrier()
        raise AssertionError("a failed communicator worked")
    except weft.AbortedError:
        pass


def case_callbacks(comm):
    """add_done_callback, and requests dropped or freed while pending."""
    r = comm.rank
    main = threading.get_ident()
    if r == 0:
        time.sleep(0.3)       # rank 1's receives are pending meanwhile
        for i in range(3):
            comm.send(np.full(1000, i + 5, np.int32), 1)
    else:
        calls = []
        buf = np.zeros(1000, np.int32)
        req = comm.irecv(buf, 0)

        def cb(q):
            calls.append((q, threading.get_ident(), q.done(), buf[0]))
            try:
                comm.barrier()
            except RuntimeError as e:
                calls.append(e)
            raise ValueError("raised by a callback: logged and dropped")

        req.add_done_callback(cb)
        req.add_done_callback(lambda q: calls.append("second"))
        assert not req.done()
        # Dropped while pending: its buffer stays held until it completes.
        dropped = np.full(1000, -1, np.int32)
        comm.irecv(dropped, 0)
        gc.collect()
        assert _comm.pending_orphans() == 1, _comm.pending_orphans()
        freed = np.full(1000, -1, np.int32)
        f = comm.irecv(freed, 0)
        f.free()
        assert "freed" in repr(f)
        try:
            f.wait()
            raise AssertionError("wait on a freed request")
        except weft.InvalidArgument:
            pass
        # Polled for (weft_test never runs the queue itself), so the
        # progress thread completes it and runs its callbacks; a wait that
        # found nobody driving would run the queue, and the callbacks, in
        # this thread (API.md: "in whichever thread completes it").
        end = time.monotonic() + 10
        while not req.done() and time.monotonic() < end:
            time.sleep(0.001)
        assert req.wait() is buf
        comm.barrier()
        # The dropped and the freed receive complete on their own: a
        # collective does not wait for point-to-point requests posted
        # before it.
        end = time.monotonic() + 10
        while not ((dropped == 6).all() and (freed == 7).all()) and \
                time.monotonic() < end:
            time.sleep(0.001)
        assert (buf == 5).all() and (dropped == 6).all() and \
            (freed == 7).all()
        q, tid, done, first = calls[0]
        assert q is req and done and first == 5, calls
        assert tid != main, "callback ran in the waiting thread"
        assert isinstance(calls[1], RuntimeError), calls
        assert calls[2] == "second", calls
        # Already complete: runs at once, here.
        late = []
        req.add_done_callback(lambda q: late.append(threading.get_ident()))
        assert late == [main], late
        comm.ibarrier().wait()       # a post frees completed orphans
        assert _comm.pending_orphans() == 0, _comm.pending_orphans()
        return
    comm.barrier()
    comm.ibarrier().wait()


def blocking_call(comm, kind, peer):
    """A call of kind that blocks until peer does what it never does."""
    buf = np.zeros(4, np.float32)
    if kind == "recv":
        return lambda: comm.recv(buf, peer)
    if kind == "wait":
        req = comm.irecv(buf, peer)
        return req.wait
    if kind == "all_reduce":          # the peer calls no collective
        return lambda: comm.all_reduce(buf)
    if kind == "wait_all":
        reqs = [comm.irecv(buf, peer), comm.irecv(buf.copy(), peer)]
        return lambda: weft.wait_all(reqs)
    raise SystemExit("unknown kind " + kind)


def case_sigint(comm, kind):
    """Ctrl-C while blocked in weft: test_ranks.py sends SIGINT to rank 1
    while it waits for rank 0, which sends nothing (the deadline is 20 s).
    Rank 1 gets KeyboardInterrupt at once, and its communicator is
    aborted; rank 0, blocked in a receive from rank 1, gets PeerError once
    rank 1 has closed it."""
    r = comm.rank
    comm.barrier()
    if r == 1:
        call = blocking_call(comm, kind, 0)
        print("blocking in %s, pid %d" % (kind, os.getpid()), flush=True)
        t0 = time.monotonic()
        try:
            call()
            raise AssertionError("%s returned" % kind)
        except KeyboardInterrupt:
            t1 = time.monotonic()
        # test_ranks.py measures from when it sent the signal: the same
        # clock (CLOCK_MONOTONIC is the system's).
        print("KeyboardInterrupt at %.6f, %.3f s into %s" % (t1, t1 - t0,
                                                            kind),
              flush=True)
        expect_aborted(comm)
    else:
        expect_peer_error(comm, 1)


def expect_aborted(comm):
    t0 = time.monotonic()
    try:
        comm.barrier()
        raise AssertionError("an interrupted communicator worked")
    except weft.AbortedError as e:
        assert time.monotonic() - t0 < 0.5, time.monotonic() - t0
        print("then: %s" % e, flush=True)


def expect_peer_error(comm, peer):
    """A receive from peer, which never sends, ends once peer closes."""
    t0 = time.monotonic()
    try:
        comm.recv(np.zeros(4, np.float32), peer)
        raise AssertionError("recv returned")
    except weft.PeerError as e:
        print("PeerError after %.2f s: %s" % (time.monotonic() - t0, e),
              flush=True)


def case_sigint_handler(comm):
    """An application's SIGINT handler that raises nothing (it sets a
    flag) still counts: the call is aborted, the handler runs once, and
    the call raises weft.AbortedError, since it did not complete."""
    import signal
    seen = []
    signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    comm.barrier()
    if comm.rank == 1:
        print("blocking in recv, pid %d" % os.getpid(), flush=True)
        t0 = time.monotonic()
        try:
            comm.recv(np.zeros(4, np.float32), 0)
            raise AssertionError("recv returned")
        except weft.AbortedError as e:
            t1 = time.monotonic()
            print("AbortedError at %.6f, %.3f s into recv: %s" %
                  (t1, t1 - t0, e), flush=True)
        assert seen == [signal.SIGINT], seen
        expect_aborted(comm)
    else:
        expect_peer_error(comm, 1)


def case_sigint_ignored(comm):
    """SIGINT ignored (SIG_IGN): nothing happens to the call, which runs
    to its deadline (1.5 s)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    comm.barrier()
    if comm.rank == 1:
        comm.set_timeout(1500)
        print("blocking in recv, pid %d" % os.getpid(), flush=True)
        t0 = time.monotonic()
        try:
            comm.recv(np.zeros(4, np.float32), 0)
            raise AssertionError("recv returned")
        except weft.TimeoutError as e:
            elapsed = time.monotonic() - t0
            print("TimeoutError after %.3f s: %s" % (elapsed, e), flush=True)
            assert elapsed > 1.4, elapsed
    else:
        expect_peer_error(comm, 1)


def case_sigint_outside(comm):
    """Ctrl-C while no weft call runs: KeyboardInterrupt as always, and the
    communicator is left alone, even by a call made at once (before weft's
    SIGINT watcher has had the GIL, likely)."""
    comm.barrier()
    x = np.full(3, comm.rank + 1.0)
    if comm.rank == 1:
        print("sleeping, pid %d" % os.getpid(), flush=True)
        try:
            time.sleep(20)
            raise AssertionError("no KeyboardInterrupt")
        except KeyboardInterrupt:
            comm.all_reduce(x)
        print("KeyboardInterrupt in sleep", flush=True)
    else:
        comm.all_reduce(x)    # waits for rank 1
    assert (x == 3).all(), x
    comm.barrier()


def case_sigint_job(comm):
    """Every rank blocked in a receive nobody sends; weftrun gets SIGINT
    (test_ranks.py sends it) and forwards it to every rank. The
    KeyboardInterrupt is not caught: the rank ends as Python ends on one."""
    r, n = comm.rank, comm.size
    comm.barrier()
    call = blocking_call(comm, "recv", (r + 1) % n)
    print("blocking in recv, pid %d" % os.getpid(), flush=True)
    t0 = time.monotonic()
    try:
        call()
    finally:
        t1 = time.monotonic()
        print("left recv at %.6f, %.3f s into it" % (t1, t1 - t0),
              flush=True)


def case_rooted(comm):
    """reduce, gather, scatter, all_to_all, all_to_allv, blocking then
    non-blocking, every root, against numpy; then their argument checks."""
    r, n = comm.rank, comm.size
    for blocking in (True, False):
        t = Runner(comm, blocking)
        for i, (dt, op, count) in enumerate(
                [(np.int32, weft.SUM, 0), (np.float32, weft.PROD, 7),
                 ("bf16", weft.MAX, 1001), (np.uint8, weft.MIN, BIG // 4)]):
            for root in range(n):
                seed = i * 16 + root
                label = "reduce %s %s count %d root %d" % (dt, op.name,
                                                           count, root)
                send = make(r, count, dt, seed)
                if r == root:
                    recv = garbage(count, dt)
                    t.call("reduce", send, recv, op, root, result=recv,
                           **kw(dt))
                    t.expect(label, recv, reduce_ref(
                        [make(q, count, dt, seed) for q in range(n)], op, dt))
                else:
                    t.call("reduce", send, None, op, root, result=None,
                           **kw(dt))
                label = "gather %s count %d root %d" % (dt, count, root)
                if r == root:
                    g = garbage(n * count, dt)
                    t.call("gather", send, g, root, result=g, **kw(dt))
                    t.expect(label, g, np.concatenate(
                        [make(q, count, dt, seed) for q in range(n)]))
                else:
                    t.call("gather", send, root=root, result=None, **kw(dt))
                label = "scatter %s count %d root %d" % (dt, count, root)
                full = make(root, n * count, dt, seed)
                got = garbage(count, dt)
                t.call("scatter", full if r == root else None, got, root,
                       result=got, **kw(dt))
                t.expect(label, got, full[r * count:(r + 1) * count])
            label = "all_to_all %s count %d" % (dt, count)
            send = make(r, n * count, dt, i)
            recv = garbage(n * count, dt)
            t.call("all_to_all", send, recv, result=recv, **kw(dt))
            t.expect(label, recv, np.concatenate(
                [make(q, n * count, dt, i)[r * count:(r + 1) * count]
                 for q in range(n)]))
            # all_to_allv: rank q sends (q + p + i) % 3 * count // 3 + p
            # elements to p, packed.
            def vc(q, p):
                return (q + p + i) % 3 * (count // 3) + p
            sc = [vc(r, p) for p in range(n)]
            rc = [vc(q, r) for q in range(n)]
            send = make(r, sum(sc), dt, i)
            recv = garbage(sum(rc), dt)
            t.call("all_to_allv", send, sc, recv, rc, result=recv, **kw(dt))
            want = []
            for q in range(n):
                off = sum(vc(q, p) for p in range(r))
                want.append(make(q, sum(vc(q, p) for p in range(n)), dt,
                                 i)[off:off + vc(q, r)])
            t.expect("all_to_allv %s count %d" % (dt, count), recv,
                     np.concatenate(want))
        t.finish()
    # Argument checks, before anything moves; the comm still works.
    x = np.zeros(4, np.int32)
    for bad in (lambda: comm.reduce(x, root=n),
                lambda: comm.igather(x, root=-1),
                lambda: comm.gather(x, None, root=r),
                lambda: comm.scatter(None, x, root=r),
                lambda: comm.scatter(x, x, root=r),
                lambda: comm.all_to_all(np.zeros(n * 2 + 1, np.int32)),
                lambda: comm.all_to_allv(x, [1] * (n + 1), x, [1] * n),
                lambda: comm.all_to_allv(x, [5] * n, x, [0] * n),
                lambda: comm.iall_to_allv(x, [-1] * n, x, [0] * n)):
        try:
            bad()
        except weft.InvalidArgument:
            pass
        else:
            raise AssertionError("a bad argument was not refused")
    y = np.full(3, r, np.int64)
    assert comm.all_to_all(np.repeat(y, n)) is not None
    z = comm.reduce(y, op=weft.MAX, root=0)
    assert (r != 0 and z is None) or (z is y and (y == n - 1).all()), y
def case_tags(comm):
    """Tags out of order, receives from any source (source), tag 0
    unchanged, and bad tags."""
    r, n = comm.rank, comm.size
    if r == 0:
        a, b = np.zeros(5, np.int32), np.zeros(5, np.int32)
        q2 = comm.irecv(b, 1, tag=2)
        q1 = comm.irecv(a, 1, tag=1)
        q2.wait()
        q1.wait()
        assert (a == 1).all() and (b == 2).all(), (a, b)
        assert q1.source == 1 and q2.source == 1
        got = []
        for _ in range(n - 1):
            x = np.zeros(5, np.int32)
            q = comm.irecv(x, weft.ANY_SOURCE, tag=7)
            q.wait()
            assert (x == q.source).all(), (x, q.source)
            got.append(q.source)
        assert sorted(got) == list(range(1, n)), got
        y = np.zeros(5, np.int32)
        comm.recv(y, 1, tag=3)
        assert (y == 3).all(), y
        comm.recv(y, 1)
        assert (y == 4).all(), y
        for bad in (-1, 2**31):
            try:
                comm.isend(y, 1, tag=bad)
            except (weft.InvalidArgument, OverflowError, ValueError):
                pass
            else:
                raise AssertionError("tag %d accepted" % bad)
    else:
        if r == 1:
            s1 = comm.isend(np.full(5, 1, np.int32), 0, tag=1)
            s2 = comm.isend(np.full(5, 2, np.int32), 0, tag=2)
            s1.wait()
            s2.wait()
            assert s1.source == -1
        comm.send(np.full(5, r, np.int32), 0, tag=7)
        if r == 1:
            comm.send(np.full(5, 3, np.int32), 0, tag=3)
            comm.send(np.full(5, 4, np.int32), 0)
    comm.barrier()


def main():
    case = sys.argv[1]
    comm = weft.init()
    if case == "ops":
        case_ops(comm)
    elif case == "errors":
        case_errors(comm)
    elif case == "rooted":
        case_rooted(comm)
    elif case == "timeout":
        comm = case_timeout(comm)
    elif case == "dead":
        case_dead(comm, True)
    elif case == "shrink":
        case_shrink(comm)
    elif case == "dead-nb":
        case_dead(comm, False)
    elif case == "callbacks":
        case_callbacks(comm)
    elif case == "tags":
        case_tags(comm)
    elif case == "sigint":
        case_sigint(comm, sys.argv[2])
    elif case == "sigint-job":
        case_sigint_job(comm)
    elif case == "sigint-handler":
        case_sigint_handler(comm)
    elif case == "sigint-ignored":
        case_sigint_ignored(comm)
    elif case == "sigint-outside":
        case_sigint_outside(comm)
    else:
        raise SystemExit("unknown case " + case)
    comm.close()
    print("ok " + case, flush=True)


if __name__ == "__main__":
    main()
