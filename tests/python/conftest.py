"""Fixtures of the Python package's tests (make check runs them through
tests/python/run.sh; by hand, in a built tree:
`PYTHONPATH=python python3 -m pytest tests/python`)."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

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


def _job_command(n, args, weftrun_args, grace_ms=500):
    """The command and environment of `weftrun -n N ... -- python ARGS...`
    with this interpreter and the libweft this process loaded."""
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
    cmd = [weftrun, "-n", str(n), "--grace-ms", str(grace_ms),
           *weftrun_args, "--", sys.executable, *args]
    return cmd, env


def run_job(n, args, timeout=60, weftrun_args=(), ok_ranks=None):
    """Runs `weftrun -n N ... -- python ARGS...` with this interpreter and
    the libweft this process loaded; returns its output. Fails unless it
    exits 0 and ok_ranks (default all) ranks printed their "ok" line."""
    cmd, env = _job_command(n, args, weftrun_args)
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
    check_oks(out, n if ok_ranks is None else ok_ranks)
    return out


def check_oks(out, want):
    oks = re.findall(r"^\[rank \d+\] ok \S+$", out, re.M)
    assert len(oks) == want, "%d ranks said ok, not %d:\n%s" % (
        len(oks), want, out)


class Job:
    """A weftrun job whose output is read while it runs (start_job), for
    tests that act on it meanwhile, such as sending signals."""

    def __init__(self, cmd, env):
        self.cmd = cmd
        self.lines = []
        self._cond = threading.Condition()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, env=env,
                                  text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.p.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self.lines.append(None)          # end of output
            self._cond.notify_all()

    @property
    def output(self):
        with self._cond:
            return "".join(x for x in self.lines if x is not None)

    def expect(self, pattern, timeout):
        """The match of the first output line that matches pattern;
        fails (killing the job) if none comes within timeout seconds."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if line is None:
                        break
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                left = end - time.monotonic()
                if (seen and self.lines[-1] is None) or left <= 0:
                    break
                self._cond.wait(left)
        self.kill()
        pytest.fail("%s: no line matching %r within %d s:\n%s" %
                    (" ".join(self.cmd), pattern, timeout, self.output))

    def wait(self, timeout):
        """weftrun's exit status; fails (killing the job) if it runs past
        timeout seconds."""
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("%s: no exit within %d s:\n%s" %
                        (" ".join(self.cmd), timeout, self.output))
        self._reader.join(10)
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.p.poll() is None:
            self.kill()

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()
        self._reader.join(10)


def start_job(n, args, weftrun_args=(), grace_ms=500):
    """Starts `weftrun -n N ... -- python ARGS...` as run_job does, and
    returns its Job at once."""
    return Job(*_job_command(n, args, weftrun_args, grace_ms))


@pytest.fixture
def ranks():
    """ranks(n, case, ...): runs tests/python/ranks.py CASE on n ranks."""
    def run(n, case, **kw):
        kw.setdefault("weftrun_args", ("--timeout-ms", "20000"))
        return run_job(n, [RANKS, case], **kw)
    return run
