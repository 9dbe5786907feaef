"""PyTorch's own distributed test suite (DistributedTest._DistTestBase of
torch/testing/_internal/distributed/distributed_test.py), unchanged, in
the harness torch's test_distributed_spawn.py gives it: every test in
WORLD_SIZE fresh processes (spawned), a file:// init method, TEMP_DIR.

tests/python/torch_suite runs this module, once per backend and world
size; by hand: BACKEND=weft WORLD_SIZE=2 TEMP_DIR=$(mktemp -d)
python3 torch_suite_case.py [-k PATTERN] [--shard I/N].

BACKEND is what distributed_test.py is told (its skips follow it):
- "weft": the backend as a new user registers it, a plugin like any
  other (DistTestCases.backend_feature["plugin"], the suite's own hook
  for third-party backends);
- "gloo" with WEFT_SUITE_AS=weft: the suite believes it runs gloo, so that
  its gloo-only tests run too, and every process group it makes (the
  default group, new_group with or without backend="gloo") is weft's;
- "gloo" alone: gloo itself, the reference.
Each test's outcome is printed as one line "RESULT <name> <outcome>"
(pass, fail, skip) for the driver to count.
"""

import os
import sys
import unittest

# torch's test utilities parse sys.argv when imported: ours are read here.
ARGV, sys.argv[1:] = sys.argv[1:], []

os.environ.setdefault("TEMP_DIR", "/tmp")
AS = os.environ.get("WEFT_SUITE_AS", "")
USES_WEFT = os.environ["BACKEND"] == "weft" or AS == "weft"

if USES_WEFT:
    import weft.torch  # noqa: F401  registers "weft", in every process

import torch.distributed as dist  # noqa: E402
from torch.testing._internal.common_distributed import (  # noqa: E402
    DistTestCases)

if os.environ["BACKEND"] == "weft":
    DistTestCases.backend_feature["plugin"].add("weft")

if AS == "weft":
    # Every group the suite asks gloo for is weft's (the suite reads
    # torch.distributed's attributes at call time).
    _init, _new_group = dist.init_process_group, dist.new_group

    def _to_weft(backend):
        if backend is not None and str(backend).lower() == "gloo":
            return "weft"
        return backend

    def init_process_group(*args, **kwargs):
        if args:
            args = (_to_weft(args[0]),) + args[1:]
        if "backend" in kwargs:
            kwargs["backend"] = _to_weft(kwargs["backend"])
        return _init(*args, **kwargs)

    def new_group(*args, **kwargs):
        if len(args) >= 3:
            args = args[:2] + (_to_weft(args[2]),) + args[3:]
        if "backend" in kwargs:
            kwargs["backend"] = _to_weft(kwargs["backend"])
        return _new_group(*args, **kwargs)

    dist.init_process_group = init_process_group
    dist.new_group = new_group

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestSuite(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


class _Result(unittest.TextTestResult):
    def _say(self, test, outcome):
        name = test.id().split(".")[-1]
        self.stream.write("RESULT %s %s\n" % (name, outcome))
        self.stream.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        self._say(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._say(test, "fail")

    def addError(self, test, err):
        super().addError(test, err)
        self._say(test, "fail")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._say(test, "skip")

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._say(test, "pass")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._say(test, "fail")


def main(argv):
    import fnmatch
    import re
    patterns, shard = [], (0, 1)
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "-k":
            patterns.append(args.pop(0))
        elif a == "--shard":
            i, n = args.pop(0).split("/")
            shard = (int(i), int(n))
        else:
            raise SystemExit("torch_suite_case.py: unknown argument %r" % a)
    names = sorted(unittest.TestLoader().getTestCaseNames(TestSuite))
    if patterns:
        names = [n for n in names
                 if any(re.search(p, n) or fnmatch.fnmatch(n, p)
                        for p in patterns)]
    names = names[shard[0]::shard[1]]
    suite = unittest.TestSuite(TestSuite(n) for n in names)
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=0,
                                     resultclass=_Result)
    runner.run(suite)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGV))
