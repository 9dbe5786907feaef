"""The package across processes: ranks under weftrun (ranks.py holds each
rank's side)."""
import os
import re
import signal
import time

import pytest

from conftest import RANKS, TOP, check_oks, run_job, start_job

pytest.importorskip("numpy")


def test_every_operation_blocking_and_nonblocking(ranks):
    # Every operation, blocking then non-blocking, over the ten dtypes,
    # counts 0, 1, odd and 1M elements, in place and not; other buffers.
    ranks(3, "ops", timeout=120)


def test_every_operation_two_ranks(ranks):
    ranks(2, "ops", timeout=120)


def test_rooted_collectives_and_all_to_alls(ranks):
    # reduce, gather, scatter, all_to_all(v): every root, blocking and not.
    ranks(3, "rooted", timeout=120)


def test_bad_arguments_raise_and_leave_the_comm_usable(ranks):
    ranks(3, "errors")


def test_tags_and_any_source(ranks):
    ranks(3, "tags")


def test_timeout_carries_last_error_and_releases_the_gil(ranks):
    out = ranks(2, "timeout")
    assert "WEFT_ETIMEDOUT: rank 0:" in out, out


def test_dead_peer_blocking(ranks):
    # The last rank exits (0, so weftrun lets the job run on): the two
    # survivors print their error and "ok".
    out = ranks(3, "dead", ok_ranks=2)
    assert out.count("after ") == 2, out


def test_dead_peer_nonblocking(ranks):
    out = ranks(3, "dead-nb", ok_ranks=2)
    assert out.count("after ") == 2, out


def test_shrink_after_a_dead_rank(ranks):
    out = ranks(4, "shrink", ok_ranks=3)
    assert out.count("after shrink: 3 of 4") == 3, out


def test_callbacks_and_dropped_requests(ranks):
    ranks(2, "callbacks")


def test_example_numpy_allreduce():
    example = os.path.join(TOP, "examples", "numpy_allreduce.py")
    out = run_job(4, [example], ok_ranks=0)
    assert "[rank 0] 4 ranks: x[0..4] = [ 0. 10. 20. 30.  0.]" in out, out


# Ctrl-C. A 2-core CI machine may be slow to schedule the ranks, hence 2 s;
# the call itself returns within milliseconds of weft_abort.
INTERRUPT_S = 2.0


def signal_rank_1(job, pattern=r"blocking in \S+"):
    """Sends SIGINT to rank 1 once it said pattern (and a pid), well into
    the call that follows; returns when it was sent."""
    pid = int(job.expect(r"^\[rank 1\] %s, pid (\d+)$" % pattern,
                         30).group(1))
    time.sleep(0.3)
    sent = time.monotonic()
    os.kill(pid, signal.SIGINT)
    return sent


@pytest.mark.parametrize("kind", ["recv", "wait", "all_reduce", "wait_all"])
def test_ctrl_c_in_a_blocking_call(kind):
    with start_job(2, [RANKS, "sigint", kind],
                   weftrun_args=("--timeout-ms", "20000")) as job:
        sent = signal_rank_1(job)
        m = job.expect(r"^\[rank 1\] KeyboardInterrupt at ([\d.]+)", 30)
        took = float(m.group(1)) - sent
        assert took < INTERRUPT_S, (
            "KeyboardInterrupt %.3f s after SIGINT in %s (at most %.1f s):"
            "\n%s" % (took, kind, INTERRUPT_S, job.output))
        rc = job.wait(30)
        out = job.output
    assert rc == 0, "weftrun exited %d:\n%s" % (rc, out)
    check_oks(out, 2)
    assert "[rank 1] then: WEFT_EABORTED" in out, out
    assert re.search(r"^\[rank 0\] PeerError after", out, re.M), out
    print("%s: KeyboardInterrupt %.1f ms after SIGINT" % (kind, took * 1e3))


def test_ctrl_c_with_the_applications_handler():
    # A handler that sets a flag and raises nothing: the call still ends
    # (weft.AbortedError), and the handler ran.
    with start_job(2, [RANKS, "sigint-handler"],
                   weftrun_args=("--timeout-ms", "20000")) as job:
        sent = signal_rank_1(job)
        m = job.expect(r"^\[rank 1\] AbortedError at ([\d.]+)", 30)
        took = float(m.group(1)) - sent
        rc = job.wait(30)
        out = job.output
    assert took < INTERRUPT_S, "AbortedError %.3f s after SIGINT:\n%s" % (
        took, out)
    assert rc == 0, "weftrun exited %d:\n%s" % (rc, out)
    check_oks(out, 2)


def test_ctrl_c_ignored_aborts_nothing():
    # SIG_IGN: the call runs to its deadline (1.5 s) as if nothing came.
    with start_job(2, [RANKS, "sigint-ignored"],
                   weftrun_args=("--timeout-ms", "20000")) as job:
        signal_rank_1(job)
        rc = job.wait(30)
        out = job.output
    assert rc == 0, "weftrun exited %d:\n%s" % (rc, out)
    check_oks(out, 2)
    assert "[rank 1] TimeoutError after" in out, out


def test_ctrl_c_outside_weft_aborts_nothing():
    with start_job(2, [RANKS, "sigint-outside"],
                   weftrun_args=("--timeout-ms", "20000")) as job:
        signal_rank_1(job, "sleeping")
        rc = job.wait(30)
        out = job.output
    assert rc == 0, "weftrun exited %d:\n%s" % (rc, out)
    check_oks(out, 2)
    assert "[rank 1] KeyboardInterrupt in sleep" in out, out


def test_ctrl_c_to_weftrun_ends_the_ranks_at_once():
    # weftrun forwards SIGINT to every rank; a rank still running after
    # --grace-ms (10 s here) would be killed with SIGKILL, and the deadline
    # is 20 s: the ranks must end on their own, well before either.
    with start_job(2, [RANKS, "sigint-job"], grace_ms=10000,
                   weftrun_args=("--timeout-ms", "20000")) as job:
        for r in (0, 1):
            job.expect(r"^\[rank %d\] blocking in recv" % r, 30)
        time.sleep(0.3)
        sent = time.monotonic()
        job.p.send_signal(signal.SIGINT)
        rc = job.wait(30)
        took = time.monotonic() - sent
        out = job.output
    assert took < INTERRUPT_S, (
        "weftrun ended %.3f s after SIGINT (at most %.1f s):\n%s" %
        (took, INTERRUPT_S, out))
    assert rc == 128 + signal.SIGINT, "weftrun exited %d:\n%s" % (rc, out)
    assert "SIGKILL" not in out, out
    # weftrun signals the ranks one after another: a rank whose peer took
    # its SIGINT, aborted and left before this rank's own came may find
    # its receive ended by that leaving (PeerError naming the peer that
    # closed), as it was; never both, and never anything else.
    interrupted = 0
    for r in (0, 1):
        if "[rank %d] KeyboardInterrupt" % r in out:
            interrupted += 1
        else:
            assert re.search(r"^\[rank %d\] weft\.PeerError: WEFT_EPEER: "
                             r"rank %d: peer %d .*closed its connection"
                             % (r, r, 1 - r), out, re.M), out
        m = re.search(r"^\[rank %d\] left recv at ([\d.]+)" % r, out, re.M)
        assert m and float(m.group(1)) - sent < INTERRUPT_S, out
    assert interrupted >= 1, out
    print("weftrun ended %.1f ms after SIGINT (%d of 2 ranks interrupted)" %
          (took * 1e3, interrupted))
