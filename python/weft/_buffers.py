"""From Python buffers to the (address, count, dtype) that weft's C calls
take.

Any object with the buffer protocol works: numpy arrays, memoryview,
bytearray, array.array, bytes (send side only). The dtype comes from the
buffer's format unless dtype= names it; the count is the whole buffer.
Every check that can be made here is made before weft is called, so a bad
argument never reaches the wires and the message says what was wrong.

A buffer's memory is pinned by holding an export of it (a memoryview and a
ctypes array made from_buffer): while one is held, a bytearray cannot be
resized nor a numpy array's memory freed. Holding the Buf object holds
them; a request holds its Bufs until its operation has completed.
"""
import ctypes
import enum
import operator
import sys

from weft._errors import InvalidArgument


class DType(enum.IntEnum):
    """weft_dtype."""
    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    BFLOAT16 = 7
    FLOAT32 = 8
    FLOAT64 = 9

    @property
    def itemsize(self):
        """Bytes per element."""
        return _ITEMSIZE[self]


_ITEMSIZE = {DType.INT8: 1, DType.UINT8: 1, DType.INT32: 4, DType.UINT32: 4,
             DType.INT64: 8, DType.UINT64: 8, DType.FLOAT16: 2,
             DType.BFLOAT16: 2, DType.FLOAT32: 4, DType.FLOAT64: 8}


class Op(enum.IntEnum):
    """weft_redop."""
    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3


_SUPPORTED = ("int8, uint8, int32, uint32, int64, uint64, float16, float32, "
              "float64, and bfloat16 as dtype=weft.BFLOAT16 over 2-byte items")

# struct-module format characters (native sizes): the signedness and kind
# come from the character, the width from memoryview.itemsize, since 'l'
# is 4 or 8 bytes depending on the platform.
_SIGNED = "bhilq"
_UNSIGNED = "BHILQ"
_INT_BY_SIZE = {1: DType.INT8, 4: DType.INT32, 8: DType.INT64}
_UINT_BY_SIZE = {1: DType.UINT8, 4: DType.UINT32, 8: DType.UINT64}
_FLOAT_BY_CHAR = {"e": DType.FLOAT16, "f": DType.FLOAT32, "d": DType.FLOAT64}
_NATIVE = "<" if sys.byteorder == "little" else ">"


# The range of a C int. ctypes passes a Python int as a C int by keeping
# its low bits, so that 2**32 + 1 arrived as 1 (and int() had truncated
# floats): every integer the package gives libweft goes through as_c_int().
# (Counts are not among them: they come from the buffers' sizes.)
_INT_BITS = 8 * ctypes.sizeof(ctypes.c_int)
_INT_MIN, _INT_MAX = -2**(_INT_BITS - 1), 2**(_INT_BITS - 1) - 1


def as_c_int(value, what):
    """value as a Python int that a C int holds, for the argument named
    what ("send: peer"); weft.InvalidArgument, naming it, for anything
    else. Integers are what operator.index() takes: int, numpy's integer
    scalars, any object with __index__. Floats are refused rather than
    truncated (1.7 is no rank), and so are bools: True where a rank or a
    timeout belongs is a mistake, not rank 1. Ranges narrower than a C
    int's (a peer that is a rank) are libweft's to check."""
    if type(value) is not int:      # the common case costs one test
        if isinstance(value, bool) or (hasattr(value, "dtype") and
                                       getattr(value.dtype, "kind", "")
                                       == "b"):
            raise InvalidArgument("%s must be an integer, not a bool (%r)" %
                                  (what, value))
        try:
            value = operator.index(value)
        except TypeError:
            raise InvalidArgument("%s must be an integer, not %s (%r)" %
                                  (what, type(value).__name__, value)) \
                from None
    if not _INT_MIN <= value <= _INT_MAX:
        raise InvalidArgument("%s %d is out of the range of a C int (%d .. "
                              "%d)" % (what, value, _INT_MIN, _INT_MAX))
    return value


def as_op(op, what="op"):
    """An Op from an Op, its int value or its name ("sum", "MAX"); what
    names the argument in the message ("all_reduce: op")."""
    if type(op) is Op:
        return op
    if isinstance(op, str):
        try:
            return Op[op.upper()]
        except KeyError:
            pass
    else:
        try:
            return Op(as_c_int(op, what))
        except ValueError:  # InvalidArgument too: one message for both
            pass
    raise InvalidArgument("%s %r is not a weft reduction: weft.SUM, "
                          "weft.PROD, weft.MIN, weft.MAX or their names" %
                          (what, op))


def as_dtype(dtype, what="dtype"):
    """A DType from a DType, its int value, its name ("float32",
    "bfloat16") or a numpy dtype or type; what names the argument in the
    message ("send buf: dtype")."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        try:
            return DType[dtype.upper()]
        except KeyError:
            pass
    elif hasattr(dtype, "__index__") and not isinstance(dtype, type):
        try:
            return DType(as_c_int(dtype, what))
        except ValueError:  # InvalidArgument too: one message for both
            pass
    else:
        name = getattr(dtype, "name", None)      # a numpy dtype
        if name is None:
            name = getattr(dtype, "__name__", None)  # numpy.float32
        if isinstance(name, str) and name.upper() in DType.__members__:
            return DType[name.upper()]
    raise InvalidArgument("%s %r is not a weft dtype; weft takes %s" %
                          (what, dtype, _SUPPORTED))


def _from_format(fmt, itemsize):
    """The DType of a struct format, or None."""
    if fmt[:1] in "@=" + _NATIVE:
        fmt = fmt[1:]
    if len(fmt) != 1:
        return None
    if fmt in _SIGNED:
        return _INT_BY_SIZE.get(itemsize)
    if fmt in _UNSIGNED:
        return _UINT_BY_SIZE.get(itemsize)
    if fmt in _FLOAT_BY_CHAR and _ITEMSIZE[_FLOAT_BY_CHAR[fmt]] == itemsize:
        return _FLOAT_BY_CHAR[fmt]
    return None


def _describe(obj, mv):
    """How to name the buffer's element type in a message."""
    dt = getattr(obj, "dtype", None)
    if dt is not None:
        return "dtype %s" % (dt,)
    return "format %r (%d-byte items)" % (mv.format, mv.itemsize)


_FORMATS = {}  # (format, itemsize) -> DType, filled as formats are seen


def _infer(obj, mv, what):
    key = (mv.format, mv.itemsize)
    found = _FORMATS.get(key)
    if found is not None:
        return found
    found = _from_format(*key)
    if found is not None:
        _FORMATS[key] = found
        return found
    # numpy extension dtypes (ml_dtypes' bfloat16) may export an unhelpful
    # format; their name says what they are.
    name = getattr(getattr(obj, "dtype", None), "name", None)
    if name == "bfloat16" and mv.itemsize == 2:
        return DType.BFLOAT16
    if mv.format[:1] in "<>!" and mv.format[:1] != _NATIVE:
        raise InvalidArgument(
            "%s has non-native byte order (%s): weft moves native "
            "values; convert it (numpy: x.astype(x.dtype.newbyteorder"
            "('='))" % (what, _describe(obj, mv)))
    raise InvalidArgument(
        "%s has %s, which is not a weft dtype; weft takes %s" %
        (what, _describe(obj, mv), _SUPPORTED))


class Buf:
    """One buffer argument, resolved: ptr (an int, or None for an empty
    buffer), count, dtype, and the exports that keep its memory pinned."""

    __slots__ = ("obj", "ptr", "nbytes", "count", "dtype", "_keep")

    def __init__(self, obj, what, writable, dtype=None):
        if obj is None:
            raise InvalidArgument("%s is None" % what)
        try:
            mv = memoryview(obj)
        except (TypeError, ValueError, BufferError) as e:
            raise InvalidArgument(
                "%s: a %s is not a buffer weft can use (a numpy array, "
                "bytearray, memoryview, array.array): %s" %
                (what, type(obj).__name__, e)) from None
        if writable and mv.readonly:
            raise InvalidArgument(
                "%s is read-only, and weft writes into it" % what)
        if not mv.c_contiguous:
            raise InvalidArgument(
                "%s is not contiguous (shape %s, strides %s): weft needs "
                "its elements next to each other; pass a contiguous copy "
                "(numpy.ascontiguousarray), and for a result copy it back" %
                (what, mv.shape, mv.strides))
        if dtype is None:
            dt = _infer(obj, mv, what)
        else:
            dt = as_dtype(dtype, what + ": dtype")
            # Raw bytes may be read as any dtype; wider items must match,
            # since weft reinterprets and never converts (float32 data
            # passed as BFLOAT16 would be garbage, not rounded).
            if mv.itemsize != 1 and mv.itemsize != dt.itemsize:
                raise InvalidArgument(
                    "%s has %s but dtype=%s has %d-byte elements: weft "
                    "does not convert; pass a buffer of %d-byte items "
                    "(for bfloat16, numpy uint16)" %
                    (what, _describe(obj, mv), dt.name, dt.itemsize,
                     dt.itemsize))
        if mv.nbytes % dt.itemsize != 0:
            raise InvalidArgument(
                "%s holds %d bytes, not a whole number of %s elements" %
                (what, mv.nbytes, dt.name))
        self.obj = obj
        self.nbytes = mv.nbytes
        self.count = mv.nbytes // dt.itemsize
        self.dtype = dt
        self.ptr, keep = _address(obj, mv)
        self._keep = (mv, keep)


def _address(obj, mv):
    """The address of mv's first byte and what keeps it valid."""
    if mv.nbytes == 0:
        return None, None        # count 0: NULL is legal
    if not mv.readonly:
        # One c_char over the first byte: it keeps the buffer exported as
        # an array over all of it would, and costs a third of one.
        c = ctypes.c_char.from_buffer(mv)
        return ctypes.addressof(c), c
    # ctypes can take the address of writable buffers only; read-only ones
    # are send buffers, which weft only reads.
    ai = getattr(obj, "__array_interface__", None)
    if isinstance(ai, dict) and isinstance(ai.get("data"), tuple):
        return ai["data"][0], obj
    if isinstance(obj, bytes):
        p = ctypes.c_char_p(obj)
        return ctypes.cast(p, ctypes.c_void_p).value, (obj, p)
    # Anything else read-only (a read-only memoryview, say) is copied once.
    copy = bytearray(mv)
    c = (ctypes.c_char * len(copy)).from_buffer(copy)
    return ctypes.addressof(c), (copy, c)


def same_dtype(a, b, what):
    """Both Bufs carry one dtype (send and receive sides of one call)."""
    if a.dtype != b.dtype:
        raise InvalidArgument("%s: sendbuf is %s but recvbuf is %s; pass "
                              "dtype= to read both as one" %
                              (what, a.dtype.name, b.dtype.name))
