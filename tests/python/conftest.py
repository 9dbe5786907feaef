"""Fixtures of the Python package's tests (make check runs them through
tests/python/run.sh; by hand, in a built tree:
`PYTHONPATH=python python3 -m pytest tests/python`)."""
import os
import re
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
RANKS = os.path.join(HERE, "ranks.py")

# Rank variables of every launcher weft_init reads: a test that wants no
# environment (or its own) starts from none of them.
LAUNCHER_VARS = ("WEFT_RANK", "WEFT_SIZE", "WEFT_HOSTFILE",
                 "WEFT_HOSTFILE_TEXT", "WEFT_JOB_TOKEN",
                 "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                 "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "RANK",
                 "WORLD_SIZE")


@pytest.fixture
def clean_env(monkeypatch):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.fixture
def solo(clean_env):
    """A communicator of one rank (no peers, no hostfile needed)."""
    import weft
    clean_env.setenv("WEFT_RANK", "0")
    clean_env.setenv("WEFT_SIZE", "1")
    comm = weft.init()
    yield comm
    comm.close()


def _weftrun():
    path = os.environ.get("WEFTRUN") or os.path.join(TOP, "weftrun")
    return path if os.access(path, os.X_OK) else None


def run_job(n, args, timeout=60, weftrun_args=(), ok_ranks=None):
    """Runs `weftrun -n N ... -- python ARGS...` with this interpreter and
    the libweft this process loaded; returns its output. Fails unless it
    exits 0 and ok_ranks (default all) ranks printed their "ok" line."""
    import weft
    weftrun = _weftrun()
    if weftrun is None:
        pytest.skip("no weftrun: set WEFTRUN (make check does) or build "
                    "in this tree")
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(weft.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        [pkg] + [p for p in [env.get("PYTHONPATH")] if p])
    if os.sep in weft.LIBRARY_PATH:
        env["WEFT_LIBRARY"] = weft.LIBRARY_PATH
    for var in LAUNCHER_VARS:
        env.pop(var, None)
    cmd = [weftrun, "-n", str(n), "--grace-ms", "500", *weftrun_args, "--",
           sys.executable, *args]
    # Its own session, so that a timeout kills the ranks with weftrun.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env=env, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail("%s: no exit within %d s:\n%s" %
                    (" ".join(cmd), timeout, out))
    assert p.returncode == 0, "%s exited %d:\n%s" % (" ".join(cmd),
                                                     p.returncode, out)
    oks = re.findall(r"^\[rank \d+\] ok \S+$", out, re.M)
    want = n if ok_ranks is None else ok_ranks
    assert len(oks) == want, "%d ranks said ok, not %d:\n%s" % (
        len(oks), want, out)
    return out


@pytest.fixture
def ranks():
    """ranks(n, case, ...): runs tests/python/ranks.py CASE on n ranks."""
    def run(n, case, **kw):
        kw.setdefault("weftrun_args", ("--timeout-ms", "20000"))
        return run_job(n, [RANKS, case], **kw)
    return run
