"""What torch's test utilities (torch.testing._internal.common_utils) take
from the expecttest package, which Debian does not ship: its ACCEPT flag
and its TestCase base. torch_suite puts this directory on the path only
where `import expecttest` fails. distributed_test.py makes no inline-expect
assertion; one made here fails, naming why, rather than passing."""

import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):
        raise AssertionError("assertExpectedInline: the expecttest package "
                             "is not installed (torch_suite's stand-in)")

    def assertExpectedRaisesInline(self, exc_type, callable, expect, *args,
                                   **kwargs):
        raise AssertionError("assertExpectedRaisesInline: the expecttest "
                             "package is not installed (torch_suite's "
                             "stand-in)")
