"""torch.distributed backend "weft".

``import weft.torch`` registers the backend, so that
``torch.distributed.init_process_group("weft", ...)`` runs every collective
of the group on weft: under weftrun (which also sets torchrun's RANK,
WORLD_SIZE, MASTER_ADDR, ...), under torchrun or under any launcher torch
accepts.

The backend is a C++ extension (csrc/process_group.cpp) built with
torch.utils.cpp_extension against the torch that imports it, the first time
it is imported (about a minute), and cached in torch's extension directory
(TORCH_EXTENSIONS_DIR) after that. One source serves torch 1.13, where a
backend is a ProcessGroup, and torch 2.x, where it is a Backend.

How a group finds its peers: the first group that spans a job started by
weftrun uses weftrun's hostfile (WEFT_HOSTFILE: its cables and wires);
every other group, and every group under other launchers, publishes each
rank's address in the store torch hands the backend (the address that
reaches MASTER_ADDR's host, or WEFT_LISTEN_ADDR). The ``timeout`` of
init_process_group / new_group is weft's deadline for every operation and
for connecting.

Failures raise RuntimeError subclasses carrying weft's message:
``weft.torch.WeftError`` and, per weft code, ``TimeoutError``,
``PeerError``, ``MismatchError``, ``AbortedError``, ``InvalidArgument``, ...
(each also a subclass of the matching ``weft`` exception where the weft
package defines one).

Ctrl-C during a wait of the main thread (``work.wait()``, and so a blocking
``dist.recv``, ``dist.all_reduce``, ``dist.barrier``, ...) aborts the group
and raises KeyboardInterrupt at once, as in the weft package (weft/_comm.py,
_Sigint): its SIGINT watcher calls the extension's _interrupt_main_wait.
"""

import atexit
import os
import threading

import torch
import torch.distributed as dist

from . import _comm
from ._buffers import as_c_int
from ._lib import lib as _libweft

__all__ = ["WeftError", "is_available", "shrink"]

_HERE = os.path.dirname(os.path.abspath(__file__))

# weft's error codes (include/weft.h) and the Python names they take here.
_CODES = {
    -1: "InvalidArgument",
    -2: "OutOfMemory",
    -3: "ConfigError",
    -4: "TimeoutError",
    -5: "PeerError",
    -6: "MismatchError",
    -7: "AbortedError",
    -8: "TransportError",
    -9: "AuthError",
    -10: "NotSupported",
}


class WeftError(RuntimeError):
    """A weft failure raised through torch.distributed: weft's message
    (the operation, the code's name, weft_last_error), and its code."""

    code = 0

    def __init__(self, message=""):
        RuntimeError.__init__(self, message)
        self.message = message
        self.name = getattr(type(self), "name", "WEFT_E?")

    def __str__(self):
        return self.message

    def __reduce__(self):
        return (type(self), (self.message,))


def _make_errors():
    import weft as _weft

    classes = {}
    for code, name in _CODES.items():
        bases = [WeftError]
        parent = getattr(_weft, name, None)
        if isinstance(parent, type) and issubclass(parent, BaseException):
            bases.append(parent)
        try:
            cls = type(name, tuple(bases), {"__module__": __name__})
        except TypeError:  # incompatible layouts: RuntimeError alone
            cls = type(name, (WeftError,), {"__module__": __name__})
        cls.code = code
        classes[code] = cls
        globals()[name] = cls
        __all__.append(name)
    return classes


def _include_dir():
    """Where weft.h is: WEFT_INCLUDE_DIR, the source tree this package sits
    in, or the includedir make install recorded."""
    env = os.environ.get("WEFT_INCLUDE_DIR")
    if env:
        return env
    top = os.path.dirname(os.path.dirname(_HERE))
    if os.path.isfile(os.path.join(top, "include", "weft.h")):
        return os.path.join(top, "include")
    try:
        from ._libpath import INCLUDEDIR
        return INCLUDEDIR
    except ImportError:
        return "/usr/include"


def _build():
    """The compiled extension: built here (cached by torch) on first use,
    against the libweft the package loaded."""
    from torch.utils import cpp_extension

    include = _include_dir()
    libdir = os.path.dirname(os.path.realpath(_libweft.path))
    if not os.path.isfile(os.path.join(include, "weft.h")):
        raise ImportError("weft.torch: no weft.h in %s; set WEFT_INCLUDE_DIR "
                          "to the directory that holds it" % include)
    version = "%d_%d" % tuple(int(x) for x in torch.__version__.split(".")[:2])
    return cpp_extension.load(
        name="weft_torch_" + version,
        sources=[os.path.join(_HERE, "csrc", "process_group.cpp")],
        extra_include_paths=[include],
        extra_cflags=["-O2"],
        # The library itself, by path: the one this package loaded, whatever
        # its name (libweft.so, or the soname where only that is installed).
        extra_ldflags=[os.path.realpath(_libweft.path), "-Wl,-rpath," + libdir],
        verbose=os.environ.get("WEFT_TORCH_VERBOSE") == "1",
    )


_C = _build()
# Free every group's communicator while the interpreter still runs (see
# ProcessGroupWeft::finalize_all).
atexit.register(_C._finalize_all)
_ERRORS = _make_errors()
_C._set_error_classes(_ERRORS)
_C._watch_main_thread(threading.main_thread().ident, _comm.sigint_check)
_comm._sigint_hooks.append(_C._interrupt_main_wait)


def _create(store, rank, size, timeout):
    # torch calls this from init_process_group or new_group: in the main
    # thread, usually, which is where the SIGINT watcher can start.
    _comm.watch_sigint()
    return _C.ProcessGroupWeft(store, as_c_int(rank, "weft.torch: rank"),
                               as_c_int(size, "weft.torch: size"), timeout)


def _backend_of(group):
    """The ProcessGroupWeft behind a process group (torch 1.13: the group
    itself; torch 2.x: its CPU backend)."""
    if isinstance(group, _C.ProcessGroupWeft):
        return group
    get = getattr(group, "_get_backend", None)
    if get is not None:
        b = get(torch.device("cpu"))
        if isinstance(b, _C.ProcessGroupWeft):
            return b
    raise ValueError("weft.torch.shrink: %r is not a weft process group"
                     % (group,))


_shrinks = [0]


def shrink(group=None):
    """weft_comm_shrink for torch: after a rank died (a collective raised
    weft.torch.PeerError or TimeoutError), every surviving rank calls it
    and gets a process group of the ranks alive, in their old order,
    renumbered from 0: usable as DDP's process_group= and as group= of
    every torch.distributed call. group (default: the default group) is
    failed afterwards; leave it to torch to destroy."""
    from torch.distributed import distributed_c10d as c10d

    old = group if group is not None else c10d._get_default_group()
    new = _backend_of(old)._shrink()
    rank, size = new.rank(), new.size()
    pg = new
    if int(torch.__version__.split(".")[0]) >= 2:
        # torch 2.x: a ProcessGroup over the backend, as its own groups.
        pg = dist.ProcessGroup(dist.HashStore(), rank, size)
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"),
                             dist.ProcessGroup.BackendType.CUSTOM, new)
    # Known to c10d as its own groups are: get_rank(group=), get_world_size
    # and the collectives' group= find it.
    world = getattr(c10d, "_world", None)
    ranks = {new._origin_rank(i): i for i in range(size)}
    _shrinks[0] += 1
    name = "weft_shrink_%d" % _shrinks[0]
    if world is not None and hasattr(world, "pg_group_ranks"):
        world.pg_group_ranks[pg] = ranks
        world.pg_map[pg] = ("weft", None)
        world.pg_names[pg] = name
    else:
        c10d._pg_group_ranks[pg] = ranks
        c10d._pg_map[pg] = ("weft", None)
        c10d._pg_names[pg] = name
    return pg


def is_available():
    return "WEFT" in dist.Backend._plugins


if not is_available():
    if int(torch.__version__.split(".")[0]) >= 2:
        dist.Backend.register_backend("weft", _create, devices=["cpu"])
    else:
        dist.Backend.register_backend("weft", _create)
