"""The package across processes: ranks under weftrun (ranks.py holds each
rank's side)."""
import os

import pytest

from conftest import TOP, run_job

pytest.importorskip("numpy")


def test_every_operation_blocking_and_nonblocking(ranks):
    # Every operation, blocking then non-blocking, over the ten dtypes,
    # counts 0, 1, odd and 1M elements, in place and not; other buffers.
    ranks(3, "ops", timeout=120)


def test_every_operation_two_ranks(ranks):
    ranks(2, "ops", timeout=120)


def test_bad_arguments_raise_and_leave_the_comm_usable(ranks):
    ranks(3, "errors")


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


def test_callbacks_and_dropped_requests(ranks):
    ranks(2, "callbacks")


def test_example_numpy_allreduce():
    example = os.path.join(TOP, "examples", "numpy_allreduce.py")
    out = run_job(4, [example], ok_ranks=0)
    assert "[rank 0] 4 ranks: x[0..4] = [ 0. 10. 20. 30.  0.]" in out, out
