"""The package in this process: loading, errors, buffers and requests on a
one-rank communicator, and init_config (communicators without the
environment)."""
import array
import builtins
import operator
import os
import pickle
import re
import secrets
import threading

import pytest

import weft
from weft import _comm
from weft._lib import SONAME, lib

try:
    import numpy as np
except ImportError:
    np = None
needs_numpy = pytest.mark.skipif(np is None, reason="numpy is not installed")
needs_init_config = pytest.mark.skipif(
    not weft.has_function("weft_init_config"),
    reason="this libweft has no weft_init_config yet (%s)" %
    weft.LIBRARY_PATH)


# ---- loading and errors ----

def test_library_is_the_one_asked_for():
    want = os.environ.get("WEFT_LIBRARY")
    if want:
        assert weft.LIBRARY_PATH == want
    libs = os.path.dirname(weft.LIBRARY_PATH)
    if os.path.basename(libs) == ".libs":
        # A build tree: the soname this package falls back to is there.
        assert os.path.exists(os.path.join(libs, SONAME)), (
            "Makefile.am's -version-info and _lib.SONAME disagree")


def test_a_missing_library_is_a_clear_import_error(tmp_path):
    import subprocess
    import sys
    env = dict(os.environ, WEFT_LIBRARY=str(tmp_path / "nope.so"))
    p = subprocess.run([sys.executable, "-c", "import weft"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert "ImportError: weft: cannot load libweft" in p.stderr, p.stderr
    assert "nope.so (WEFT_LIBRARY: no such file)" in p.stderr, p.stderr


ERRORS = [
    (weft.InvalidArgument, -1, "WEFT_EINVAL", ValueError),
    (weft.OutOfMemory, -2, "WEFT_ENOMEM", MemoryError),
    (weft.ConfigError, -3, "WEFT_ECONFIG", None),
    (weft.TimeoutError, -4, "WEFT_ETIMEDOUT", builtins.TimeoutError),
    (weft.PeerError, -5, "WEFT_EPEER", ConnectionError),
    (weft.MismatchError, -6, "WEFT_EMISMATCH", None),
    (weft.AbortedError, -7, "WEFT_EABORTED", None),
    (weft.TransportError, -8, "WEFT_ETRANSPORT", None),
    (weft.AuthError, -9, "WEFT_EAUTH", None),
    (weft.NotSupported, -10, "WEFT_ENOTSUP", NotImplementedError),
]


@pytest.mark.parametrize("cls,code,name,builtin", ERRORS)
def test_error_classes_match_the_library(cls, code, name, builtin):
    assert issubclass(cls, weft.Error)
    assert cls.code == code and cls.name == name
    assert lib.weft_err_name(code).decode() == name
    assert weft.strerror(code)
    if builtin is not None:
        assert issubclass(cls, builtin)
    e = _comm.from_code(code, "rank 0: details")
    assert type(e) is cls and str(e) == name + ": rank 0: details"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and back.message == e.message


def test_an_unknown_code_is_a_plain_error():
    e = _comm.from_code(-99, "what")
    assert type(e) is weft.Error and e.code == -99 and "what" in str(e)


def test_init_without_environment_is_a_config_error(clean_env):
    with pytest.raises(weft.ConfigError) as info:
        weft.init()
    e = info.value
    assert e.code == -3 and e.name == "WEFT_ECONFIG"
    # weft_last_error(NULL): what to set.
    assert "WEFT_RANK" in e.message and e.message in str(e)


def test_contradictory_environment_names_the_variable(clean_env):
    clean_env.setenv("WEFT_RANK", "3")
    clean_env.setenv("WEFT_SIZE", "2")
    with pytest.raises(weft.ConfigError, match="WEFT_RANK"):
        weft.init()


# ---- buffers ----

@needs_numpy
@pytest.mark.parametrize("dt,want", [
    ("int8", weft.INT8), ("uint8", weft.UINT8), ("int32", weft.INT32),
    ("uint32", weft.UINT32), ("int64", weft.INT64), ("uint64", weft.UINT64),
    ("float16", weft.FLOAT16), ("float32", weft.FLOAT32),
    ("float64", weft.FLOAT64), ("longlong", weft.INT64),
    ("ulonglong", weft.UINT64), ("intc", weft.INT32)])
def test_dtype_from_numpy(dt, want):
    from weft._buffers import Buf
    b = Buf(np.zeros(6, dt), "x", True)
    assert b.dtype is want and b.count == 6
    assert weft.DType[want.name].itemsize == np.dtype(dt).itemsize


@pytest.mark.parametrize("code,want", [
    ("b", weft.INT8), ("B", weft.UINT8), ("i", weft.INT32),
    ("I", weft.UINT32), ("q", weft.INT64), ("Q", weft.UINT64),
    ("f", weft.FLOAT32), ("d", weft.FLOAT64)])
def test_dtype_from_array_module(code, want):
    from weft._buffers import Buf
    b = Buf(array.array(code, [1, 2, 3]), "x", True)
    assert b.dtype is want and b.count == 3


def test_dtype_names():
    from weft._buffers import as_dtype, as_op
    assert as_dtype("bfloat16") is weft.BFLOAT16
    assert as_dtype(7) is weft.BFLOAT16
    assert as_op("max") is weft.MAX and as_op(1) is weft.PROD
    if np is not None:
        assert as_dtype(np.float16) is weft.FLOAT16
        assert as_dtype(np.dtype("uint32")) is weft.UINT32
    with pytest.raises(weft.InvalidArgument, match="not a weft dtype"):
        as_dtype("int16")


def test_buffers_without_numpy(solo):
    b = bytearray(b"\x01\x02\x03")
    assert solo.all_reduce(b) is b and b == bytearray(b"\x01\x02\x03")
    a = array.array("i", [5, -6])
    out = array.array("i", [0, 0])
    assert solo.all_reduce(a, out, weft.MIN) is out and list(out) == [5, -6]
    g = bytearray(4)
    solo.all_gather(b"wxyz", g)        # read-only bytes as the send side
    assert g == bytearray(b"wxyz")
    m = memoryview(bytearray(8)).cast("d")
    solo.broadcast(m)
    e = bytearray()
    assert solo.all_reduce(e) is e       # count 0
    # A read-only memoryview is read through a copy.
    r = bytearray(2)
    solo.all_reduce(memoryview(b"\x07\x08"), r)
    assert r == bytearray(b"\x07\x08")


def test_a_request_pins_its_buffer_until_complete(solo):
    b = bytearray(16)
    req = solo.iall_reduce(b)
    with pytest.raises(BufferError):
        b.extend(b"x")                   # weft may still be writing it
    req.wait()
    b.extend(b"x")                       # the caller's again
    req.free()


@needs_numpy
def test_bfloat16_over_uint16(solo):
    bits = np.array([0x3F80, 0x4000], np.uint16)   # 1.0, 2.0
    out = np.zeros(2, np.uint16)
    solo.all_reduce(bits, out, dtype=weft.BFLOAT16)
    assert (out == bits).all()
    with pytest.raises(weft.InvalidArgument, match="does not convert"):
        solo.all_reduce(np.zeros(2, np.float32), dtype=weft.BFLOAT16)
    # Raw bytes may be read as any dtype.
    solo.all_reduce(bytearray(4), dtype="bfloat16")


@needs_numpy
@pytest.mark.parametrize("call,words", [
    (lambda c: c.all_reduce(np.zeros(8)[::2]), "not contiguous"),
    (lambda c: c.all_reduce(np.zeros(2), np.zeros(2)[:1]), "match"),
    (lambda c: c.recv(b"12", 0), "read-only"),
    (lambda c: c.all_reduce(np.zeros(2, np.int16)), "int16"),
    (lambda c: c.all_reduce(np.zeros(2, np.float32), np.zeros(2)),
     "FLOAT64"),
    (lambda c: c.all_gather(np.zeros(2), np.zeros(3)), "size*count"),
    (lambda c: c.reduce_scatter(np.zeros(3), np.zeros(2)), "size*recvcount"),
    (lambda c: c.all_reduce(np.zeros(2), op="avg"), "reduction"),
    (lambda c: c.all_reduce(None), "None"),
    (lambda c: c.all_reduce(3.0), "not a buffer"),
    (lambda c: c.iall_reduce(np.zeros(8)[::2]), "not contiguous"),
    (lambda c: c.send(np.zeros(2), 1), "peer"),      # refused by libweft
    (lambda c: c.ibroadcast(np.zeros(2), 2), "root"),
])
def test_bad_arguments(solo, call, words):
    with pytest.raises(weft.InvalidArgument, match=re.escape(words)) as info:
        call(solo)
    assert isinstance(info.value, ValueError)
    x = np.ones(3)
    solo.all_reduce(x)                   # still usable
    assert (x == 1).all()


# ---- communicator and requests ----

def test_comm_basics(solo):
    assert solo.rank == 0 and solo.size == 1 and not solo.closed
    assert solo.last_error == ""
    solo.set_timeout(5000)
    with pytest.raises(weft.InvalidArgument, match="timeout"):
        solo.set_timeout(-1)
    assert "timeout" in solo.last_error
    solo.barrier()
    solo.ibarrier().wait()
    assert "rank 0 of 1" in repr(solo)


def test_close_is_idempotent_and_final(clean_env):
    clean_env.setenv("WEFT_RANK", "0")
    clean_env.setenv("WEFT_SIZE", "1")
    with weft.init() as comm:
        comm.barrier()
    assert comm.closed and "closed" in repr(comm)
    comm.close()
    comm.abort()                         # a no-op once closed
    with pytest.raises(weft.InvalidArgument, match="closed"):
        comm.barrier()


def test_abort_fails_later_calls(solo):
    solo.abort()
    with pytest.raises(weft.AbortedError):
        solo.barrier()
    with pytest.raises(weft.AbortedError):
        solo.ibarrier()


def test_request_api(solo):
    b = bytearray(b"\x01\x02")
    req = solo.iall_reduce(b)
    assert req.wait() is b and req.result() is b
    assert req.done() and req.test() and req.exception() is None
    assert "done" in repr(req)
    req.free()
    req.free()
    with solo.iall_gather(bytearray(1), bytearray(1)) as r2:
        pass
    assert r2.done()
    r3 = solo.ibarrier()
    r3.wait()
    r3.free()
    assert r3.wait() is None             # the result outlives the free
    assert weft.wait_all([]) == []
    reqs = [solo.iall_reduce(bytearray([i])) for i in range(5)]
    assert [bytes(x) for x in weft.wait_all(reqs)] == [bytes([i])
                                                      for i in range(5)]


def test_done_callbacks(solo):
    seen = []
    req = solo.iall_reduce(bytearray(4))
    req.add_done_callback(lambda r: seen.append(("a", r)))
    req.wait()
    req.add_done_callback(lambda r: seen.append(("b", r)))
    assert seen == [("a", req), ("b", req)]


def test_a_done_callback_cannot_call_weft(solo):
    # It runs in the thread that completes requests; a blocking call there
    # would stop that thread, so weft refuses it with a RuntimeError.
    seen = []

    def cb(r):
        try:
            solo.all_reduce(bytearray(4))
        except RuntimeError as e:
            seen.append(str(e))

    req = solo.iall_reduce(bytearray(4))
    req.add_done_callback(cb)
    req.wait()
    assert len(seen) == 1 and "done callback" in seen[0]
    solo.all_reduce(bytearray(4))        # outside it, still usable


def test_threads_share_a_comm(solo):
    # Posts from several threads are serialised by the Comm's lock.
    errors = []

    def work():
        try:
            for _ in range(200):
                b = bytearray(b"\x02" * 64)
                solo.all_reduce(b)
                solo.iall_reduce(b).wait()
        except Exception as e:       # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


# ---- integer arguments ----
# Every integer the package hands to libweft is checked in one place: a
# value that is not an integer, or that a C int cannot hold, is refused
# with weft.InvalidArgument naming the argument, before libweft is called
# (ctypes kept the low 32 bits: peer 2**32 + 1 was rank 1, a float was
# truncated). libweft itself refuses ints out of their narrower meaning
# (a peer that is no rank), so those messages are weft_last_error().

class Index:
    """Any object with __index__ is an integer (numpy's are)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v

    def __repr__(self):
        return "Index(%d)" % self.v


NOT_INTEGERS = [1.7, 1.0, -0.0, "1", b"1", None, True, False, 1j,
                [1]] + ([np.float64(1.0), np.bool_(True)] if np else [])
# 2**32 + k, -2**32 + k and 2**64 + k were k after the cast.
OUT_OF_RANGE = [2**31, 2**32, 2**32 + 1, 2**32 + 5000, 2**63, 2**64 + 1,
                -2**31 - 1, -2**32 + 1, Index(2**32 + 1)]

# (name of the call, argument, call(comm, value)): every int argument of
# every method.
INT_ARGS = [
    ("set_timeout", "timeout_ms", lambda c, v: c.set_timeout(v)),
    ("broadcast", "root", lambda c, v: c.broadcast(bytearray(4), v)),
    ("broadcast", "root", lambda c, v: c.broadcast(bytearray(4), root=v)),
    ("ibroadcast", "root", lambda c, v: c.ibroadcast(bytearray(4), v)),
    ("send", "peer", lambda c, v: c.send(bytearray(4), v)),
    ("isend", "peer", lambda c, v: c.isend(bytearray(4), v)),
    ("recv", "peer", lambda c, v: c.recv(bytearray(4), v)),
    ("irecv", "peer", lambda c, v: c.irecv(bytearray(4), v)),
    ("sendrecv", "dst",
     lambda c, v: c.sendrecv(bytearray(4), v, bytearray(4), 0)),
    ("sendrecv", "src",
     lambda c, v: c.sendrecv(bytearray(4), 0, bytearray(4), v)),
    ("isendrecv", "dst",
     lambda c, v: c.isendrecv(bytearray(4), v, bytearray(4), 0)),
    ("isendrecv", "src",
     lambda c, v: c.isendrecv(bytearray(4), 0, bytearray(4), v)),
]
# op= and dtype= take enum members, names, or the C enum's int values.
for _name in ("all_reduce", "iall_reduce", "reduce_scatter",
              "ireduce_scatter"):
    INT_ARGS.append((_name, "op", lambda c, v, _n=_name:
                     getattr(c, _n)(bytearray(4), bytearray(4), op=v)))
for _name, _call in [
        ("all_reduce", lambda c, v: c.all_reduce(bytearray(4), dtype=v)),
        ("iall_reduce", lambda c, v: c.iall_reduce(bytearray(4), dtype=v)),
        ("all_gather", lambda c, v: c.all_gather(bytearray(4), dtype=v)),
        ("iall_gather", lambda c, v: c.iall_gather(bytearray(4), dtype=v)),
        ("reduce_scatter",
         lambda c, v: c.reduce_scatter(bytearray(4), dtype=v)),
        ("ireduce_scatter",
         lambda c, v: c.ireduce_scatter(bytearray(4), dtype=v)),
        ("broadcast", lambda c, v: c.broadcast(bytearray(4), dtype=v)),
        ("ibroadcast", lambda c, v: c.ibroadcast(bytearray(4), dtype=v)),
        ("send", lambda c, v: c.send(bytearray(4), 1, dtype=v)),
        ("isend", lambda c, v: c.isend(bytearray(4), 1, dtype=v)),
        ("recv", lambda c, v: c.recv(bytearray(4), 1, dtype=v)),
        ("irecv", lambda c, v: c.irecv(bytearray(4), 1, dtype=v)),
        ("sendrecv", lambda c, v: c.sendrecv(bytearray(4), 1, bytearray(4),
                                             1, dtype=v)),
        ("isendrecv", lambda c, v: c.isendrecv(bytearray(4), 1,
                                               bytearray(4), 1, dtype=v))]:
    INT_ARGS.append((_name, "dtype", _call))
INT_IDS = ["%s-%s-%d" % (n, a, i) for i, (n, a, _) in enumerate(INT_ARGS)]


def refused_before_weft(comm, call, value, *words):
    """call(comm, value) raises InvalidArgument naming words, and libweft
    was never called: its last error and the dropped requests are as they
    were, and the communicator still works."""
    with pytest.raises(weft.InvalidArgument):
        comm.set_timeout(-7)     # a last error of libweft's to compare
    before, orphans = comm.last_error, _comm.pending_orphans()
    with pytest.raises(weft.InvalidArgument) as info:
        call(comm, value)
    e = info.value
    assert isinstance(e, ValueError) and e.code == -1, repr(e)
    for w in words:
        assert w in e.message, (w, e.message)
    assert comm.last_error == before, (
        "libweft was called with %r: %s" % (value, comm.last_error))
    assert _comm.pending_orphans() == orphans
    b = bytearray(b"\x03")
    comm.all_reduce(b)
    assert b == bytearray(b"\x03")
    return e


@pytest.mark.parametrize("value", NOT_INTEGERS, ids=repr)
@pytest.mark.parametrize("name,arg,call", INT_ARGS, ids=INT_IDS)
def test_an_int_argument_that_is_no_integer(solo, name, arg, call, value):
    if arg == "dtype" and value is None:
        pytest.skip("dtype=None is the default: the buffer's dtype")
    # The messages name the operation without its i, as those of buffers.
    refused_before_weft(solo, call, value, name.lstrip("i"), arg)


@pytest.mark.parametrize("value", OUT_OF_RANGE, ids=repr)
@pytest.mark.parametrize("name,arg,call", INT_ARGS, ids=INT_IDS)
def test_an_int_argument_out_of_range(solo, name, arg, call, value):
    e = refused_before_weft(solo, call, value, name.lstrip("i"), arg)
    if arg not in ("op", "dtype"):
        assert str(operator.index(value)) in e.message, e.message


def accepted_by_python(comm, call, value):
    """call(comm, value) gets to libweft: it works, or libweft refuses it
    (a message of its own, such as "peer 0 is this rank")."""
    try:
        req = call(comm, value)
    except weft.InvalidArgument as e:
        assert e.message == comm.last_error, (
            "refused by the package: %s" % e.message)
    else:
        if isinstance(req, weft.Request):
            req.wait()


@pytest.mark.parametrize("name,arg,call", INT_ARGS, ids=INT_IDS)
def test_an_int_argument_takes_any_integer_type(solo, name, arg, call):
    good = {"timeout_ms": 5000, "op": int(weft.MAX),
            "dtype": int(weft.UINT8)}.get(arg, 0)
    values = [good, Index(good)]
    if np is not None:
        values += [np.int64(good), np.int32(good), np.uint16(good),
                   np.array(good)]          # 0-d
    for v in values:
        accepted_by_python(solo, call, v)


def test_the_cases_of_issue_30(solo):
    x = bytearray(8)
    # Once rank 1 (2**32 + 1), rank 1 (1.7), root 0, a 5 ms deadline.
    refused_before_weft(solo, lambda c, v: c.send(x, v), 2**32 + 1, "peer",
                        "4294967297")
    refused_before_weft(solo, lambda c, v: c.send(x, v), 1.7, "peer",
                        "float")
    refused_before_weft(solo, lambda c, v: c.broadcast(x, root=v), 2**32,
                        "root", "4294967296")
    refused_before_weft(solo, lambda c, v: c.set_timeout(v), 2**32 + 5,
                        "timeout_ms", "4294967301")


# ---- communicators without the environment ----

@pytest.mark.skipif(weft.has_function("weft_init_config"),
                    reason="this libweft has weft_init_config")
def test_init_config_missing_is_not_supported():
    with pytest.raises(weft.NotSupported, match="weft_init_config"):
        weft.init_config(rank=0, size=1)


@needs_init_config
def test_listener():
    with weft.Listener() as lst:
        host, port = lst.addr.rsplit(":", 1)
        assert host == "127.0.0.1" and 0 < int(port) < 65536
    assert lst.closed
    lst.close()


@needs_init_config
def test_init_config_one_rank(clean_env):
    with weft.init_config(rank=0, size=1, timeout_ms=5000) as comm:
        assert comm.rank == 0 and comm.size == 1
        b = bytearray(b"\x05")
        comm.all_reduce(b)
        assert b == bytearray(b"\x05")


@needs_init_config
def test_init_config_refuses_bad_arguments(clean_env):
    with pytest.raises(weft.Error) as info:
        weft.init_config(rank=2, size=2)
    assert isinstance(info.value, (weft.ConfigError, weft.InvalidArgument))
    assert "rank" in info.value.message
    lst = weft.Listener()
    # Refused here, before weft: the listener stays the caller's.
    with pytest.raises(weft.InvalidArgument, match="addrs holds 1"):
        weft.init_config(rank=0, size=2, addrs=[lst.addr], listener=lst)
    assert not lst.closed
    # Refused by weft: taken over even so.
    with pytest.raises(weft.Error):
        weft.init_config(rank=0, size=2, addrs=[lst.addr, lst.addr],
                         hostfile_text='{"hosts": []}', listener=lst)
    assert lst.closed


@needs_init_config
@needs_numpy
def test_two_communicators_in_one_process(clean_env):
    """One process, two ranks (threads), each from init_config: the
    environment is not read and both live at once."""
    size = 2
    listeners = [weft.Listener() for _ in range(size)]
    addrs = [lst.addr for lst in listeners]
    token = secrets.token_hex(16)
    results, errors = [None] * size, []

    def rank(r):
        try:
            with weft.init_config(rank=r, size=size, addrs=addrs,
                                  listener=listeners[r], token=token,
                                  timeout_ms=10000,
                                  connect_timeout_ms=10000) as comm:
                x = np.full(1001, r + 1, np.float32)
                comm.all_reduce(x)
                g = np.zeros(2 * size, np.int64)
                comm.iall_gather(np.full(2, r, np.int64), g).wait()
                results[r] = (comm.rank, x, g)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    for r, (got_rank, x, g) in enumerate(results):
        assert got_rank == r
        assert (x == 3).all()
        assert list(g) == [0, 0, 1, 1]
    assert all(lst.closed for lst in listeners)


INIT_CONFIG_INTS = ["rank", "size", "timeout_ms", "connect_timeout_ms",
                    "wires"]


def init_config_refused(**kw):
    args = dict(rank=0, size=1)
    args.update(kw)
    try:
        comm = weft.init_config(**args)
    except weft.InvalidArgument as e:
        return e
    comm.close()
    raise AssertionError("init_config(%s) made %r" % (kw, comm))


@needs_init_config
@pytest.mark.parametrize("value", NOT_INTEGERS + OUT_OF_RANGE, ids=repr)
@pytest.mark.parametrize("field", INIT_CONFIG_INTS)
def test_init_config_int_fields(clean_env, field, value):
    e = init_config_refused(**{field: value})
    assert "init_config" in e.message and field in e.message, e.message


@needs_init_config
def test_init_config_the_case_of_issue_30(clean_env):
    # Was rank 0 of 1 with a 7 ms deadline.
    e = init_config_refused(rank=2**32, size=2**32 + 1, timeout_ms=2**32 + 7)
    assert "4294967296" in e.message, e.message


@needs_init_config
def test_init_config_takes_any_integer_type(clean_env):
    one = np.int64(1) if np is not None else Index(1)
    with weft.init_config(rank=Index(0), size=one, timeout_ms=Index(5000),
                          connect_timeout_ms=Index(5000),
                          wires=Index(1)) as comm:
        assert comm.rank == 0 and comm.size == 1


# ---- Ctrl-C and the signal wakeup fd ----
# (Ctrl-C in blocking calls is tested across ranks, in test_ranks.py.)

def run_python(code, timeout=30):
    """code in a fresh interpreter with this package, as a rank of one."""
    import subprocess
    import sys
    env = dict(os.environ, WEFT_RANK="0", WEFT_SIZE="1")
    for var in ("WEFT_HOSTFILE", "WEFT_HOSTFILE_TEXT"):
        env.pop(var, None)
    p = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (
        "exit %d:\n%s%s" % (p.returncode, p.stdout, p.stderr))
    return p.stdout


def test_asyncio_signal_handlers_still_run():
    # asyncio's add_signal_handler works through the wakeup fd; weft takes
    # it over and feeds asyncio's too.
    run_python('''if True:
        import asyncio, os, signal, weft
        async def main():
            loop = asyncio.get_running_loop()
            got = asyncio.Event()
            loop.add_signal_handler(signal.SIGINT, got.set)
            with weft.init() as comm:
                os.kill(os.getpid(), signal.SIGINT)
                await asyncio.wait_for(got.wait(), 10)
                comm.barrier()       # not aborted: no weft call ran
        asyncio.run(main())
        print("ok")
    ''')


def test_a_wakeup_fd_set_before_is_fed():
    run_python('''if True:
        import os, signal, socket, weft
        a, b = socket.socketpair()
        a.setblocking(False)
        signal.set_wakeup_fd(a.fileno())
        signal.signal(signal.SIGINT, lambda *args: None)
        comm = weft.init()
        assert signal.set_wakeup_fd(-1) != a.fileno()   # weft's now
        signal.set_wakeup_fd(a.fileno())
        comm2 = weft.init()          # takes it back, and feeds a
        os.kill(os.getpid(), signal.SIGINT)
        b.settimeout(10)
        assert b.recv(16) == bytes([signal.SIGINT])
        comm.barrier()
        comm2.barrier()
        # Closed, its number reused: weft stops feeding it.
        fd = a.fileno()
        a.close()
        c, d = socket.socketpair()
        os.kill(os.getpid(), signal.SIGINT)
        if fd in (c.fileno(), d.fileno()):
            (c if d.fileno() == fd else d).settimeout(1)
            try:
                (c if d.fileno() == fd else d).recv(16)
                raise AssertionError("a reused fd was fed")
            except socket.timeout:
                pass
        comm.barrier()
        print("ok")
    ''')


def test_a_forked_child_gets_the_wakeup_fd_back():
    # The child has no watcher thread: the wakeup fd is what it was before
    # weft's, and a communicator made there watches again.
    run_python('''if True:
        import os, signal, weft
        with weft.init():
            pass
        pid = os.fork()
        if pid == 0:
            code = 0 if signal.set_wakeup_fd(-1) == -1 else 1
            signal.set_wakeup_fd(-1)
            with weft.init() as comm:
                code |= 0 if signal.set_wakeup_fd(-1) != -1 else 2
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("ok")
    ''')


def test_info_shows_settings_and_table():
    """comm.info() is weft_info(): the settings, then the tuning table in
    WEFT_ALGO's form."""
    comm = weft.init_config(rank=0, size=1)
    try:
        text = comm.info()
        assert "ranks=1" in text
        assert "algo=all_reduce:" in text
    finally:
        comm.close()
    with pytest.raises(weft.InvalidArgument):
        comm.info()
