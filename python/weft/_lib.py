"""Finding and loading libweft, and the C prototypes.

libweft is loaded with ctypes.CDLL, not PyDLL: CDLL releases the GIL for
the length of every foreign call, so a rank blocked in weft_recv or
weft_wait leaves the interpreter's other threads running, and weft's
progress thread can take the GIL to run a completion callback while the
caller waits. (PyDLL would hold the GIL across the call, and a callback
needing it would deadlock.)

Where libweft is looked for, first match wins:
1. WEFT_LIBRARY, a path (when set, nothing else is tried);
2. libweft.so beside this package (a copy or link put there by hand);
3. the build tree's .libs/libweft.so, when this package is the source
   tree's python/weft and weft was built in that tree;
4. the libdir that `make install` recorded in _libpath.py;
5. the soname, through ld.so's own search (LD_LIBRARY_PATH, ld.so.cache);
6. ctypes.util.find_library("weft").
"""
import ctypes
import ctypes.util
import os

# Makefile.am links libweft with -version-info 0:0:0: soname libweft.so.0
# (current minus age). Change both together.
SONAME = "libweft.so.0"

_c_int, _c_size, _vp = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
_vpp = ctypes.POINTER(ctypes.c_void_p)

# weft_callback: void (*)(weft_request *req, int result, void *arg).
CALLBACK = ctypes.CFUNCTYPE(None, _vp, _c_int, _vp)


class Config(ctypes.Structure):
    """weft_config, field for field as include/weft.h declares it."""
    _fields_ = [
        ("rank", _c_int),
        ("size", _c_int),
        ("hostfile_text", ctypes.c_char_p),
        ("addrs", ctypes.POINTER(ctypes.c_char_p)),
        ("listener", _vp),
        ("token", ctypes.c_char_p),
        ("timeout_ms", _c_int),
        ("connect_timeout_ms", _c_int),
        ("wires", _c_int),
        ("transport", ctypes.c_char_p),
        ("topology", ctypes.c_char_p),
    ]


class WireInfo(ctypes.Structure):
    """weft_wire_info, field for field as include/weft.h declares it."""
    _fields_ = [
        ("total", _c_int),
        ("up", _c_int),
        ("lost", ctypes.c_uint),
        ("back", ctypes.c_uint),
    ]


# name: (restype, argtypes). Every libweft this package supports has these.
_PROTOS = {
    "weft_strerror": (ctypes.c_char_p, [_c_int]),
    "weft_err_name": (ctypes.c_char_p, [_c_int]),
    "weft_last_error": (ctypes.c_char_p, [_vp]),
    "weft_dtype_size": (_c_size, [_c_int]),
    "weft_init": (_c_int, [_vpp]),
    "weft_finalize": (_c_int, [_vp]),
    "weft_rank": (_c_int, [_vp]),
    "weft_size": (_c_int, [_vp]),
    "weft_set_timeout": (_c_int, [_vp, _c_int]),
    "weft_abort": (_c_int, [_vp]),
    "weft_all_reduce": (_c_int, [_vp, _vp, _vp, _c_size, _c_int, _c_int]),
    "weft_all_gather": (_c_int, [_vp, _vp, _vp, _c_size, _c_int]),
    "weft_reduce_scatter": (_c_int, [_vp, _vp, _vp, _c_size, _c_int, _c_int]),
    "weft_broadcast": (_c_int, [_vp, _vp, _c_size, _c_int, _c_int]),
    "weft_send": (_c_int, [_vp, _vp, _c_size, _c_int, _c_int]),
    "weft_recv": (_c_int, [_vp, _vp, _c_size, _c_int, _c_int]),
    "weft_sendrecv": (_c_int,
                      [_vp, _vp, _c_int, _vp, _c_int, _c_size, _c_int]),
    "weft_barrier": (_c_int, [_vp]),
    "weft_iall_reduce": (_c_int,
                         [_vp, _vp, _vp, _c_size, _c_int, _c_int, _vpp]),
    "weft_iall_gather": (_c_int, [_vp, _vp, _vp, _c_size, _c_int, _vpp]),
    "weft_ireduce_scatter": (_c_int,
                             [_vp, _vp, _vp, _c_size, _c_int, _c_int, _vpp]),
    "weft_ibroadcast": (_c_int, [_vp, _vp, _c_size, _c_int, _c_int, _vpp]),
    "weft_isend": (_c_int, [_vp, _vp, _c_size, _c_int, _c_int, _vpp]),
    "weft_irecv": (_c_int, [_vp, _vp, _c_size, _c_int, _c_int, _vpp]),
    "weft_isendrecv": (_c_int,
                       [_vp, _vp, _c_int, _vp, _c_int, _c_size, _c_int, _vpp]),
    "weft_ibarrier": (_c_int, [_vp, _vpp]),
    "weft_test": (_c_int, [_vp, ctypes.POINTER(_c_int)]),
    "weft_wait": (_c_int, [_vp]),
    "weft_wait_all": (_c_int, [_vpp, _c_size]),
    "weft_request_free": (_c_int, [_vp]),
    "weft_request_on_complete": (_c_int, [_vp, CALLBACK, _vp]),
    # The rooted collectives and the all-to-alls.
    "weft_reduce": (_c_int,
                    [_vp, _vp, _vp, _c_size, _c_int, _c_int, _c_int]),
    "weft_gather": (_c_int, [_vp, _vp, _vp, _c_size, _c_int, _c_int]),
    "weft_scatter": (_c_int, [_vp, _vp, _vp, _c_size, _c_int, _c_int]),
    "weft_all_to_all": (_c_int, [_vp, _vp, _vp, _c_size, _c_int]),
    "weft_all_to_allv": (_c_int, [_vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                  _c_int]),
    "weft_ireduce": (_c_int,
                     [_vp, _vp, _vp, _c_size, _c_int, _c_int, _c_int, _vpp]),
    "weft_igather": (_c_int,
                     [_vp, _vp, _vp, _c_size, _c_int, _c_int, _vpp]),
    "weft_iscatter": (_c_int,
                      [_vp, _vp, _vp, _c_size, _c_int, _c_int, _vpp]),
    "weft_iall_to_all": (_c_int, [_vp, _vp, _vp, _c_size, _c_int, _vpp]),
    "weft_iall_to_allv": (_c_int, [_vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                   _c_int, _vpp]),
}

# Newer than some libweft builds: bound on first use (optional()), so that
# the rest of the package works with a library that lacks them.
_OPTIONAL = {
    "weft_listener_open": (_c_int, [_vpp, ctypes.c_char_p, ctypes.c_char_p,
                                    _c_size]),
    "weft_listener_close": (_c_int, [_vp]),
    "weft_init_config": (_c_int, [_vpp, ctypes.POINTER(Config)]),
    "weft_info": (ctypes.c_char_p, [_vp]),
    "weft_peer_wires": (_c_int, [_vp, _c_int, ctypes.POINTER(WireInfo)]),
    "weft_comm_shrink": (_c_int, [_vp, _vpp]),
    "weft_comm_split": (_c_int, [_vp, _c_int, _c_int, _vpp]),
    "weft_comm_origin_rank": (_c_int, [_vp, _c_int]),
    # Tagged point to point and receives from any source.
    "weft_isend_tag": (_c_int,
                       [_vp, _vp, _c_size, _c_int, _c_int, _c_int, _vpp]),
    "weft_irecv_tag": (_c_int,
                       [_vp, _vp, _c_size, _c_int, _c_int, _c_int, _vpp]),
    "weft_request_source": (_c_int, [_vp]),
}


def _candidates():
    """(path, why it is tried) in the order of the module docstring."""
    env = os.environ.get("WEFT_LIBRARY")
    if env:
        return [(env, "WEFT_LIBRARY")]
    here = os.path.dirname(os.path.abspath(__file__))
    found = [(os.path.join(here, "libweft.so"), "beside the package")]
    top = os.path.dirname(os.path.dirname(here))
    if os.path.isfile(os.path.join(top, "include", "weft.h")):
        found.append((os.path.join(top, ".libs", "libweft.so"),
                      "the build tree"))
    try:
        from weft._libpath import LIBDIR
        found.append((os.path.join(LIBDIR, SONAME), "make install's libdir"))
    except ImportError:
        pass
    found.append((SONAME, "the ld.so search path"))
    return found


def _load():
    tried = []
    for path, why in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("%s (%s: no such file)" % (path, why))
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s: %s)" % (path, why, e))
    if "WEFT_LIBRARY" not in os.environ:
        # Last, since it may run ldconfig or the compiler to search.
        name = ctypes.util.find_library("weft")
        if name is not None:
            try:
                return ctypes.CDLL(name), name
            except OSError as e:
                tried.append("%s (find_library: %s)" % (name, e))
    raise ImportError(
        "weft: cannot load libweft; tried: " + "; ".join(tried) +
        ". Set WEFT_LIBRARY to the library's path (a build tree's "
        ".libs/libweft.so, or PREFIX/lib/" + SONAME + ").")


def _bind(cdll, name, proto):
    fn = getattr(cdll, name)
    fn.restype, fn.argtypes = proto
    return fn


class _Lib:
    """libweft's functions as attributes, prototypes set."""

    def __init__(self):
        self.cdll, self.path = _load()
        missing = []
        for name, proto in _PROTOS.items():
            try:
                setattr(self, name, _bind(self.cdll, name, proto))
            except AttributeError:
                missing.append(name)
        if missing:
            raise ImportError("weft: %s lacks %s: it is older than this "
                              "package" % (self.path, ", ".join(missing)))
        self._optional = {}

    def has(self, name):
        """Whether the loaded library exports the C function name."""
        if name in _PROTOS or name in self._optional:
            return True
        try:
            getattr(self.cdll, name)
        except AttributeError:
            return False
        return True

    def optional(self, name):
        """The function name of _OPTIONAL, bound on first use; NotSupported
        where the loaded library does not have it."""
        fn = self._optional.get(name)
        if fn is None:
            try:
                fn = _bind(self.cdll, name, _OPTIONAL[name])
            except AttributeError:
                from weft._errors import NotSupported
                raise NotSupported(
                    "%s has no %s(): it needs a newer libweft" %
                    (self.path, name)) from None
            self._optional[name] = fn
        return fn


lib = _Lib()


def text(ptr_bytes):
    """A C string that ctypes gave as bytes (or None) as str."""
    return "" if ptr_bytes is None else ptr_bytes.decode("utf-8", "replace")
