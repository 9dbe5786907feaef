"""weft's error codes as Python exceptions.

The codes are those of WEFT_ERRNO_MAP in include/weft.h (fixed by the
public contract). Every exception is a weft.Error carrying the code, its
symbolic name and the detailed message of weft_last_error(); each code also
derives from the builtin exception a Python caller would expect to catch
(a timeout is a TimeoutError, a bad argument a ValueError), so code that
knows nothing of weft still handles it sensibly.
"""
import builtins

__all__ = [
    "Error", "InvalidArgument", "OutOfMemory", "ConfigError", "TimeoutError",
    "PeerError", "MismatchError", "AbortedError", "TransportError",
    "AuthError", "NotSupported",
]


class Error(Exception):
    """A failed weft call.

    code: the negative WEFT_E* code; name: its symbol ("WEFT_EPEER");
    message: what weft_last_error() said (which rank, peer, wire, deadline),
    or the reason a bad argument was refused before calling weft.
    """

    code = 0
    name = "WEFT_E?"

    def __init__(self, message="", code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
            self.name = _NAMES.get(code, "WEFT_E%d" % code)

    def __str__(self):
        return "%s: %s" % (self.name, self.message)

    def __reduce__(self):
        # Rebuilt from the code, so that a pickled error (multiprocessing)
        # comes back as the same class with the same code.
        return (from_code, (self.code, self.message))


def _define(pyname, cname, code, *bases):
    cls = type(pyname, (Error,) + bases, {
        "code": code,
        "name": "WEFT_" + cname,
        "__doc__": "WEFT_%s (%d)." % (cname, code),
        "__module__": "weft",
    })
    _CLASSES[code] = cls
    _NAMES[code] = "WEFT_" + cname
    return cls


_CLASSES = {}
_NAMES = {}
InvalidArgument = _define("InvalidArgument", "EINVAL", -1, ValueError)
OutOfMemory = _define("OutOfMemory", "ENOMEM", -2, MemoryError)
ConfigError = _define("ConfigError", "ECONFIG", -3)
TimeoutError = _define("TimeoutError", "ETIMEDOUT", -4, builtins.TimeoutError)
PeerError = _define("PeerError", "EPEER", -5, ConnectionError)
MismatchError = _define("MismatchError", "EMISMATCH", -6)
AbortedError = _define("AbortedError", "EABORTED", -7)
TransportError = _define("TransportError", "ETRANSPORT", -8)
AuthError = _define("AuthError", "EAUTH", -9)
NotSupported = _define("NotSupported", "ENOTSUP", -10, NotImplementedError)
Error.__module__ = "weft"


def from_code(code, message=""):
    """The exception for a WEFT_E* code (weft.Error for a code this
    package does not know)."""
    cls = _CLASSES.get(code)
    if cls is None:
        return Error(message, code)
    return cls(message)
