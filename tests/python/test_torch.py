"""torch.distributed on the "weft" backend, as a user runs it: ranks as
separate processes started the way torchrun starts them, under weftrun and
under torchrun itself. Each case runs torch_rank.py in every rank, under a
deadline; a rank that outlives it is killed and the case fails naming it.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import Job

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_PY = os.path.join(HERE, "torch_rank.py")
DEADLINE_S = 150


@pytest.fixture(scope="module", autouse=True)
def extension_built():
    """Compiles the extension once, before ranks race to."""
    import weft.torch  # noqa: F401


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finish(procs, names, deadline_s):
    """Waits for every process (each a session leader); kills what is left
    at the deadline. Returns [(rc, output)]."""
    end = time.monotonic() + deadline_s
    outs = []
    for p, name in zip(procs, names):
        try:
            out, _ = p.communicate(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for q in procs:
                q.communicate()
            pytest.fail("%s still running after %d s" % (name, deadline_s))
        outs.append((p.returncode, out))
    return outs


def launch(n, *args, env=None, deadline_s=DEADLINE_S):
    """n ranks with torchrun's variables, as any launcher torch accepts."""
    port = free_port()
    procs = []
    for r in range(n):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                 LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port))
        for k in ("WEFT_HOSTFILE", "WEFT_HOSTFILE_TEXT", "WEFT_RANK", "WEFT_SIZE"):
            e.pop(k, None)
        e.update(env or {})
        procs.append(subprocess.Popen([sys.executable, RANK_PY] + list(args), env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    return finish(procs, ["rank %d" % r for r in range(n)], deadline_s)


def passed(outs):
    for r, (rc, out) in enumerate(outs):
        assert rc == 0 and out.rstrip().endswith("PASS"), "rank %d (exit %d):\n%s" % (r, rc, out[-3000:])


@pytest.mark.parametrize("n", [2, 3])
def test_every_operation_and_dtype(n):
    outs = launch(n, "ops")
    passed(outs)
    # Without weftrun's hostfile every group bootstraps from the store, and
    # the store's addresses of one host still give shared memory.
    assert "bootstrap default=store" in outs[0][1]
    for r, (_, out) in enumerate(outs):
        assert "shm segments=%d" % (n - 1) in out, "rank %d:\n%s" % (r, out[-3000:])


@pytest.mark.parametrize("n", [2, 3])
def test_rooted_all_to_all_coalesced_tags(n):
    """reduce, gather, scatter, all_to_all(_single, with splits), the
    coalesced forms, tags, any-source receives, bitwise reductions, bool,
    int16 and complex, non-contiguous tensors, sequence numbers."""
    passed(launch(n, "more"))


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_matches_one_process(n):
    passed(launch(n, "ddp"))


def test_rank_killed_mid_training():
    t0 = time.monotonic()
    outs = launch(3, "ddp_kill", deadline_s=60)
    victim_rc, victim_out = outs[2]
    assert victim_rc == 3, victim_out
    for r in (0, 1):
        rc, out = outs[r]
        assert rc == 0 and "raised at step 5" in out and "PASS" in out, out[-3000:]
    # The survivors raised within 2x the 3 s timeout (checked in the rank)
    # and every process is gone: finish() reaped them all.
    assert time.monotonic() - t0 < 60


def test_timeout_raises_weft_timeout_error():
    outs = launch(3, "timeout", deadline_s=60)
    passed(outs)
    for r in (0, 1):
        assert "raised TimeoutError" in outs[r][1] or "raised PeerError" in outs[r][1], outs[r][1]


def test_destroy_then_init_again():
    passed(launch(2, "reinit", str(free_port()), str(free_port())))


def test_under_weftrun():
    weftrun = os.environ.get("WEFTRUN")
    if not weftrun:
        pytest.skip("WEFTRUN is not set (make check sets it)")
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.Popen([weftrun, "-n", "3", "--", sys.executable, RANK_PY, "ops"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    (rc, out), = finish([p], ["weftrun"], DEADLINE_S)
    assert rc == 0 and out.count("PASS") == 3, out[-3000:]
    # The world group uses weftrun's hostfile; a subgroup and a second
    # world group, the store.
    assert out.count("bootstrap default=hostfile") == 3, out[-3000:]
    assert out.count("shm segments=2") == 3, out[-3000:]
    assert "every=store" in out


def test_a_rank_or_size_a_c_int_cannot_hold():
    import datetime
    import weft
    import weft.torch
    for rank, size in ((2**32, 2), (0, 2**32 + 1), (0.0, 1), (0, True)):
        with pytest.raises(weft.InvalidArgument) as info:
            weft.torch._create(None, rank, size, datetime.timedelta(seconds=5))
        assert "rank" in str(info.value) or "size" in str(info.value)


@pytest.mark.parametrize("kind", ["recv", "wait", "all_reduce", "outside"])
def test_ctrl_c_in_a_wait(kind):
    """SIGINT to a rank blocked in torch's wait on weft: KeyboardInterrupt
    within 2 s (it comes in milliseconds; a 2-core machine may be slow to
    schedule), not at the 20 s deadline. "outside": SIGINT while the rank
    sleeps, and a collective right after aborts nothing."""
    port = free_port()
    jobs = []
    try:
        for r in range(2):
            e = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                     LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            for k in ("WEFT_HOSTFILE", "WEFT_HOSTFILE_TEXT", "WEFT_RANK", "WEFT_SIZE"):
                e.pop(k, None)
            jobs.append(Job([sys.executable, RANK_PY, "sigint", kind], e))
        jobs[1].expect(r"^blocking in", 120)
        time.sleep(0.3)
        sent = time.monotonic()
        jobs[1].p.send_signal(signal.SIGINT)
        m = jobs[1].expect(r"^KeyboardInterrupt at ([\d.]+)", 60)
        took = float(m.group(1)) - sent
        rcs = [j.wait(60) for j in jobs]
        outs = [j.output for j in jobs]
    finally:
        for j in jobs:
            if j.p.poll() is None:
                j.kill()
    assert took < 2.0, "KeyboardInterrupt %.3f s after SIGINT in %s:\n%s" % (took, kind, outs[1])
    for r in (0, 1):
        assert rcs[r] == 0 and outs[r].rstrip().endswith("PASS"), (
            "rank %d (exit %d):\n%s" % (r, rcs[r], outs[r][-3000:]))
    if kind != "outside":
        assert "then: weft: " in outs[1] and "WEFT_EABORTED" in outs[1], outs[1]
        assert "raised PeerError" in outs[0], outs[0]
    print("%s: KeyboardInterrupt %.1f ms after SIGINT" % (kind, took * 1e3))


def test_under_torchrun():
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_port", str(free_port())]
    # torch 1.13's torchrun needs its output redirected on Python 3.11.
    args += ["--redirects", "2", "--tee", "2", RANK_PY, "ops"]
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "WEFT_HOSTFILE"):
        env.pop(k, None)
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    (rc, out), = finish([p], ["torchrun"], DEADLINE_S)
    assert rc == 0 and out.count("PASS") == 2, out[-3000:]


def test_example_torch_ddp():
    weftrun = os.environ.get("WEFTRUN")
    if not weftrun:
        pytest.skip("WEFTRUN is not set (make check sets it)")
    example = os.path.join(HERE, "..", "..", "examples", "torch_ddp.py")
    p = subprocess.Popen([weftrun, "-n", "2", "--", sys.executable, example],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    (rc, out), = finish([p], ["weftrun"], DEADLINE_S)
    assert rc == 0 and "parameters identical on 2 ranks" in out, out[-3000:]


def test_example_elastic_ddp_survives_a_killed_rank():
    weftrun = os.environ.get("WEFTRUN")
    if not weftrun:
        pytest.skip("WEFTRUN is not set (make check sets it)")
    example = os.path.join(HERE, "..", "..", "examples", "elastic_ddp.py")
    p = subprocess.Popen([weftrun, "-n", "3", "--keep-going", "--", sys.executable, example,
                          "--steps", "12", "--kill-step", "5"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    (rc, out), = finish([p], ["weftrun"], DEADLINE_S)
    # The killed rank makes weftrun fail; the two others shrink and finish.
    assert rc != 0 and "rank 2 (pid" in out and "SIGKILL" in out, out[-3000:]
    for r in (0, 1):
        assert "rank %d: now rank %d of 2" % (r, r) in out, out[-3000:]
        assert "rank %d: time lost" % r in out, out[-3000:]
        assert "rank %d: PASS, final loss" % r in out, out[-3000:]
