"""weft: collective communication over several direct links per peer.

Python bindings of libweft, through ctypes (no compiled code here)::

    import numpy as np, weft

    with weft.init() as comm:            # under weftrun, mpirun, torchrun
        x = np.full(1024, comm.rank, dtype=np.float32)
        comm.all_reduce(x)               # in place: x is the sum
        req = comm.iall_reduce(x, op=weft.MAX)
        ...                              # compute; x is weft's until done
        req.wait()

Operations are named as the C ones without the prefix and take numpy
arrays or any buffer; failures raise weft.Error subclasses carrying
weft_last_error(). The contract is include/weft.h; the README's "Python"
section is the tour.
"""
from weft._buffers import DType, Op
from weft._comm import (ANY_SOURCE, Comm, Listener, Request, init,
                        init_config, strerror, wait_all)
from weft import _errors
from weft._errors import (AbortedError, AuthError, ConfigError, Error,
                          InvalidArgument, MismatchError, NotSupported,
                          OutOfMemory, PeerError, TransportError)
from weft._lib import lib as _lib

__version__ = "0.1.0"

#: The path (or name) libweft was loaded from.
LIBRARY_PATH = _lib.path

INT8, UINT8, INT32, UINT32, INT64, UINT64 = (
    DType.INT8, DType.UINT8, DType.INT32, DType.UINT32, DType.INT64,
    DType.UINT64)
FLOAT16, BFLOAT16, FLOAT32, FLOAT64 = (
    DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64)
SUM, PROD, MIN, MAX = Op.SUM, Op.PROD, Op.MIN, Op.MAX


def has_function(name):
    """Whether the loaded libweft exports the C function name (such as
    "weft_init_config", which older builds lack)."""
    return _lib.has(name)


# weft.TimeoutError derives from the builtin TimeoutError. It is not in
# __all__: `from weft import *` would shadow the builtin, and `except
# TimeoutError` would stop catching socket timeouts.
TimeoutError = _errors.TimeoutError

__all__ = [
    "init", "init_config", "Comm", "Request", "Listener", "wait_all",
    "strerror", "has_function", "LIBRARY_PATH", "DType", "Op",
    "INT8", "UINT8", "INT32", "UINT32", "INT64", "UINT64", "FLOAT16",
    "BFLOAT16", "FLOAT32", "FLOAT64", "SUM", "PROD", "MIN", "MAX",
    "Error", "InvalidArgument", "OutOfMemory", "ConfigError", "PeerError",
    "MismatchError", "AbortedError", "TransportError", "AuthError",
    "NotSupported", "ANY_SOURCE",
]
