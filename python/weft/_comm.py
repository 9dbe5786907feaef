"""Communicators, requests and listeners over libweft.

Threads. libweft lets one thread at a time post on a communicator; here
each Comm has a lock that its operations take, so Python threads that
share a Comm are serialised instead of breaking that rule. abort() takes
no such lock (it exists to end a call blocked in another thread), and
close() aborts a call that another thread is blocked in before it
finalizes, so it returns promptly.

Requests and their buffers. A posted operation borrows its buffers until
it completes, so a Request holds them (see _buffers) until then. A Request
dropped while its operation is still pending is not waited for (that
could block a garbage collection for the whole deadline): its C request
and its buffers move to a module-level table of orphans, and each later
post, wait_all or close frees those that have completed since. At exit
every communicator still open is closed, which completes (aborts) what is
pending, and the orphans are freed.

Callbacks. Request.add_done_callback runs the function through
weft_request_on_complete, in whichever thread completes the request:
usually weft's progress thread, which ctypes gives the GIL for the
callback. The function must be short and must not call weft (a blocking
call there would stop the thread that completes requests); the methods of
this module refuse to be called from it.

Ctrl-C. SIGINT while the main thread is blocked in weft aborts the
communicators of that call and raises KeyboardInterrupt at once, instead
of at the call's deadline (see _Sigint).
"""
import atexit
import ctypes
import itertools
import logging
import mmap
import operator
import os
import signal
import threading
import weakref

from weft import _errors
from weft._buffers import Buf, Op, as_c_int, as_op, same_dtype
from weft._errors import InvalidArgument, from_code
from weft._lib import CALLBACK, Config, WireInfo, lib, text

_log = logging.getLogger("weft")
_tls = threading.local()


def _in_callback():
    return getattr(_tls, "in_callback", False)


def _refuse_in_callback(what):
    if _in_callback():
        raise RuntimeError("weft: %s called from a done callback, which runs "
                           "in the thread that completes requests and must "
                           "not call weft" % what)


def _init_error(rc):
    """The exception of a failed weft_init-like call (message from
    weft_last_error(NULL), which is per thread: this one)."""
    msg = text(lib.weft_last_error(None)) or text(lib.weft_strerror(rc))
    return from_code(rc, msg)


def strerror(code):
    """weft_strerror: the static text of a code."""
    return text(lib.weft_strerror(code))


# ---- Ctrl-C in a blocking call ----

class _Sigint:
    """What the SIGINT watcher and the blocking calls share.

    Python runs signal handlers in the main thread between bytecodes, so
    SIGINT during a call blocked in libweft (ctypes lets go of the GIL, but
    the thread waits in C) was raised only when the call returned: at its
    deadline. Python's C-level handler also writes the signal's number to
    the wakeup fd (signal.set_wakeup_fd), and a daemon thread (the watcher)
    wakes on that: if the main thread is in a blocking call, it aborts that
    call's communicators (weft_abort works from any thread, and the call
    returns at once). The call then finds the interrupt recorded (hit) and
    runs the signal handlers itself, so that its caller gets
    KeyboardInterrupt (or whatever the application's handler raises) and
    not weft.AbortedError. Only a Python-level SIGINT handler counts: with
    SIG_IGN (or SIG_DFL) Python writes nothing, and nothing is aborted.

    A SIGINT that came before the call must abort nothing: Python has
    handled it (KeyboardInterrupt, caught by the application, which then
    called weft), or handles it before the call blocks. The watcher cannot
    tell by itself: it may get the GIL only once the main thread, having
    handled the signal, enters its next call. So the wakeup fd is a file in
    memory (a memfd, mapped here as slots): Python's handler writes the
    signal's number into the next slot before it returns, and a blocking
    call, once registered (calls), claims the slots written since the last
    claim (seen) without a system call. The watcher wakes through inotify
    on that file, and aborts only for slots nobody claimed. Both claim
    under the GIL, so each slot is claimed once. Where the system has no
    memfd or inotify, nothing is watched (Ctrl-C waits for the deadline)."""

    def __init__(self):
        self.main = None      # the main thread's ident, once watching
        self.calls = None     # the Comm (or tuple of them) of the main
                              # thread's blocking call
        self.hit = False      # a call of the main thread was aborted
        self.slots = None     # the memfd, a byte per signal (memoryview)
        self.seen = 0         # the first slot not claimed
        self.fed = 0          # the first slot not passed on to chained
        self.wfd = self.ifd = -1   # the wakeup fd; the inotify fd
        self.thread = None
        # The wakeup fd that was set before ours (asyncio's, say), and its
        # (st_dev, st_ino) then: the signals are written there too, as long
        # as that fd is still the same file.
        self.chained = -1
        self.chained_id = None


# Slots for 1M signals: the memfd is sparse (a page of memory per 4096
# signals). Past them, the watcher stops.
_SLOTS = 1 << 20
_IN_MODIFY = 0x2            # inotify(7)
_sigint = _Sigint()
_sigint_hooks = []           # called on SIGINT too (weft.torch's waits)
_get_ident = threading.get_ident
# A function object of our own (pythonapi's attributes are shared). ctypes
# raises the exception that a handler run by it raised.
try:
    _check_signals = ctypes.pythonapi["PyErr_CheckSignals"]
except (AttributeError, TypeError):   # not CPython
    _check_signals = None


def _fd_id(fd):
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _sigint_slots(w):
    """Makes w's memfd, its mapping, the wakeup fd onto it and the inotify
    fd that watches it; False where the system lacks one of them."""
    fds = []
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mfd = os.memfd_create("weft-sigint", os.MFD_CLOEXEC)
        fds.append(mfd)
        os.ftruncate(mfd, _SLOTS)
        path = "/proc/self/fd/%d" % mfd
        # Its own file offset, which Python's handler advances a slot per
        # signal.
        wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        fds.append(wfd)
        ifd = libc.inotify_init1(os.O_CLOEXEC)
        if ifd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        fds.append(ifd)
        if libc.inotify_add_watch(ifd, path.encode(), _IN_MODIFY) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")
        slots = memoryview(mmap.mmap(mfd, _SLOTS))
    except (AttributeError, OSError, ValueError) as e:
        _log.debug("weft: Ctrl-C will not interrupt calls: %s", e)
        for fd in fds:
            os.close(fd)
        return False
    os.close(mfd)       # the mapping and wfd keep the file
    w.slots, w.wfd, w.ifd = slots, wfd, ifd
    return True


def watch_sigint():
    """Makes SIGINT interrupt the main thread's blocking calls: called by
    Comm() (weft.init, init_config) and weft.torch, in the main thread (in
    any other, a no-op). Again later, it takes the wakeup fd back from
    whatever replaced it, feeding that one too."""
    w = _sigint
    if threading.current_thread() is not threading.main_thread():
        return
    if w.slots is None and not _sigint_slots(w):
        return
    try:
        old = signal.set_wakeup_fd(w.wfd)
    except (ValueError, OSError):     # not the main interpreter
        return
    if old != w.wfd:
        w.chained, w.chained_id = old, _fd_id(old) if old >= 0 else None
    if w.thread is None:
        w.thread = threading.Thread(target=_sigint_watcher, args=(w,),
                                    name="weft-sigint", daemon=True)
        w.thread.start()
        w.main = threading.get_ident()


def _written(w, start):
    """The end of the slots written from start on."""
    end, slots = start, w.slots
    while end < _SLOTS - 1 and slots[end]:    # the last one stays 0
        end += 1
    return end


def _sigint_watcher(w):
    while w.fed < _SLOTS - 4096:
        try:
            os.read(w.ifd, 4096)      # events: the slots were written
        except OSError:
            return
        end = _written(w, w.fed)
        _feed_chained(w, bytes(w.slots[w.fed:end]))
        w.fed = end
        if w.seen < end:
            new = bytes(w.slots[w.seen:end])
            w.seen = end
            if signal.SIGINT in new:  # a byte per signal: its number
                try:
                    _on_sigint(w)
                except Exception:
                    _log.exception("weft: handling SIGINT failed")
    w.main = None     # the slots are used up: calls register no more


def _feed_chained(w, data):
    fd = w.chained
    if fd < 0 or not data:
        return
    if _fd_id(fd) != w.chained_id:    # closed, or its number reused
        w.chained = -1
        return
    try:
        os.write(fd, data)
    except OSError:
        pass      # full or gone: dropped, as Python's own handler does


def _on_sigint(w):
    if not callable(signal.getsignal(signal.SIGINT)):
        return                # SIG_IGN, SIG_DFL: nothing runs in Python
    comms = w.calls
    if comms is not None:
        w.hit = True
        for c in comms if type(comms) is tuple else (comms,):
            c.abort()
    for hook in list(_sigint_hooks):
        hook()


def _run_signal_handlers():
    """Runs the handlers of the signals that came, now rather than at the
    interpreter's next check: KeyboardInterrupt is raised here."""
    if _check_signals is None:
        raise KeyboardInterrupt
    _check_signals()


def _claim(w):
    """Claims the signals that came before the blocking call being made
    (they abort nothing) and runs their handlers if Python has not yet."""
    w.seen = _written(w, w.seen)
    _run_signal_handlers()


def sigint_check():
    """For a blocking call of the main thread that just registered (the
    waits of weft.torch): claims the signals that came before it."""
    w = _sigint
    if w.slots is not None and w.slots[w.seen]:
        _claim(w)


def _blocking(comms, fn, first, args):
    """fn(first, *args): a libweft call that may block on comms (a Comm, or
    a tuple of them). From the main thread, SIGINT aborts them and the call
    raises what the SIGINT handler raises (see _Sigint)."""
    w = _sigint
    if _get_ident() != w.main:
        return fn(first, *args)
    w.calls = comms
    try:
        if w.slots[w.seen]:
            _claim(w)
        rc = fn(first, *args)
    finally:
        w.calls = None
    if w.hit or (rc != 0 and w.slots[w.seen]):
        # The handler may raise nothing (an application's that sets a
        # flag): then the call fails as aborted, which it was.
        _interrupted(w)
    return rc


def _interrupted(w):
    """After a blocking call that the watcher aborted (hit), or that failed
    while a signal came the watcher has not seen yet (a peer that took the
    same Ctrl-C ended first, so this call failed for its leaving before
    this rank's watcher ran): claims those signals and runs their
    handlers, so that the caller gets KeyboardInterrupt, not the error."""
    w.hit = False
    _claim(w)


def _sigint_after_fork():
    # The child of a fork has no watcher thread, and shares the slots'
    # file offset with its parent: the wakeup fd goes back to what had it
    # before, and the child's next communicator watches anew.
    global _sigint
    w = _sigint
    if w.slots is None:
        return
    _sigint = _Sigint()
    try:
        fd = signal.set_wakeup_fd(-1)
        if fd == w.wfd:
            fd = w.chained if _fd_id(w.chained) == w.chained_id else -1
        signal.set_wakeup_fd(fd)
    except (ValueError, OSError):
        pass
    for fd in (w.wfd, w.ifd):
        try:
            os.close(fd)
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_sigint_after_fork)


# ---- orphans: requests dropped while pending ----

_orphans = {}                 # C request address -> what pins its buffers
_GONE = object()
_deferred = []                # communicators to finalize outside a callback
_orphans_lock = threading.Lock()


def _request_done(handle):
    done = ctypes.c_int(0)
    rc = lib.weft_test(handle, ctypes.byref(done))
    return done.value != 0, rc


def _orphan(handle, keep):
    with _orphans_lock:
        _orphans[handle] = keep


def _sweep():
    """Frees the orphans that have completed, and finalizes communicators
    that were dropped inside a callback."""
    with _orphans_lock:
        handles = list(_orphans)
    for handle in handles:
        if _request_done(handle)[0]:
            with _orphans_lock:
                mine = _orphans.pop(handle, _GONE) is not _GONE
            if mine:  # another thread's sweep may have taken it
                lib.weft_request_free(handle)
    if _deferred and not _in_callback():
        while _deferred:
            lib.weft_finalize(_deferred.pop())


def pending_orphans():
    """How many dropped requests are still held (for tests)."""
    with _orphans_lock:
        return len(_orphans)


# ---- requests ----

# A receive's peer: whichever rank sends a message of its tag first.
ANY_SOURCE = -1

class _ReqState:
    """What a Request owns: the C request, the buffers it pins, and what
    the operation returns. Separate from Request so that a half-made
    request (an exception between the post and the Request) still frees
    itself, and so that callbacks can keep the Request alive.

    A thread that uses the C request (wait, test) holds it with use() and
    unuse(); free() from another thread meanwhile is carried out by the
    last user, so the C request is never freed under a waiting thread."""

    def __init__(self, comm, keep, result):
        self.handle = ctypes.c_void_p()
        self.comm = comm
        self.keep = keep
        self.result = result
        self.rc = None            # the operation's result, once known
        self.lock = threading.Lock()
        self.users = 0
        self.freed = False        # free() was called
        self.callbacks = None     # list, once a callback was registered
        self.source = None        # a receive's sender, once read

    def done(self, rc):
        """Records completion and unpins the buffers (the data is in)."""
        if self.rc is None:
            self.rc = rc
        self.keep = None

    def use(self):
        """The C request (an int), held until unuse(); None once freed."""
        with self.lock:
            h = None if self.freed else self.handle.value
            if h:
                self.users += 1
            return h

    def unuse(self):
        with self.lock:
            self.users -= 1
            last = self.users == 0 and self.freed
        if last:
            self._free()

    def poll(self):
        """Asks weft (never blocks); True once complete."""
        if self.rc is None:
            h = self.use()
            if h:
                try:
                    done, rc = _request_done(h)
                    if done:
                        self.done(rc)
                finally:
                    self.unuse()
        return self.rc is not None

    def release(self):
        """free(): frees the C request now if it has completed, else
        orphans it; deferred to the last user while a thread uses it."""
        with self.lock:
            if self.freed:
                return
            self.freed = True
            if self.users > 0:
                return
        self._free()

    def _free(self):
        with self.lock:
            h, self.handle = self.handle.value, ctypes.c_void_p()
        if not h:
            return
        if self.rc is None:
            done, rc = _request_done(h)
            if not done:
                _orphan(h, self.keep)
                self.keep = None
                return
            self.done(rc)
        self.read_source(h)
        lib.weft_request_free(h)

    def read_source(self, h):
        """Keeps weft_request_source of the completed C request h."""
        if self.source is None and self.rc is not None:
            self.source = lib.optional("weft_request_source")(h)

    def error(self):
        return from_code(self.rc, self.comm._message(self.rc))

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass  # interpreter shutdown: the module may be half gone


class Request:
    """A pending operation (returned by Comm.i* methods).

    wait() (or result()) blocks until it completes and returns the result
    buffer (None for send and barrier) or raises the operation's weft.Error;
    test() never blocks. The Request holds its buffers until the operation
    completes; leave them alone until then. free() (or leaving a `with`
    block, which waits first) releases the C request; a Request dropped
    while pending is not waited for, and its buffers are kept until it
    completes (see the module docstring).
    """

    def __init__(self, state, what):
        self._st = state
        self._what = what

    def __repr__(self):
        st = self._st
        if st.freed and st.rc is None:
            state = "freed"
        elif st.rc is None:
            state = "pending"
        else:
            state = "done" if st.rc == 0 else _errors._NAMES.get(st.rc, st.rc)
        return "<weft.Request %s %s>" % (self._what, state)

    def _outcome(self):
        st = self._st
        if st.rc != 0:
            raise st.error()
        return st.result

    @property
    def source(self):
        """The rank a completed receive's message came from (for a
        receive from weft.ANY_SOURCE, the sender it matched); -1 while
        pending, for a failed receive, a send or anything else."""
        st = self._st
        if st.source is None and st.poll():
            h = st.use()
            if h:
                try:
                    st.read_source(h)
                finally:
                    st.unuse()
        return -1 if st.source is None else st.source

    def wait(self):
        """Blocks until the operation completes; returns its result buffer
        or raises its weft.Error (again on every later call)."""
        st = self._st
        if st.rc is None:
            _refuse_in_callback("Request.wait")
            h = st.use()
            if not h:
                raise InvalidArgument("%r was freed before it completed" %
                                      self)
            try:
                st.done(_blocking(st.comm, lib.weft_wait, h, ()))
            finally:
                st.unuse()
        return self._outcome()

    result = wait

    def test(self):
        """True once complete (raising the operation's error if it failed),
        False while pending. Never blocks."""
        if not self._st.poll():
            return False
        self._outcome()
        return True

    def done(self):
        """Whether the operation has completed (successfully or not)."""
        return self._st.poll()

    def exception(self):
        """Waits, then returns the operation's weft.Error or None."""
        try:
            self.wait()
        except _errors.Error as e:
            return e
        return None

    def free(self):
        """Releases the request. Pending, it is not waited for: the
        operation still completes and its buffers stay held until then."""
        self._st.release()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.wait()
            else:
                # Already failing: wait quietly, so the buffers are the
                # caller's again when the block is left.
                self.exception()
        finally:
            self.free()

    def add_done_callback(self, fn):
        """Calls fn(request) once the operation completes: at once, in this
        thread, if it has; else in the thread that completes it (usually
        weft's progress thread). fn must be short and must not call weft;
        an exception it raises is logged (logger "weft") and dropped."""
        st = self._st
        h = st.use()
        try:
            with st.lock:
                if st.rc is None and h and st.callbacks is not None:
                    st.callbacks.append(fn)
                    return
                register = st.rc is None and h is not None
                if register:
                    st.callbacks = [fn]
            if not register:
                if st.rc is None:
                    raise InvalidArgument("%r was freed" % self)
                _run_callback(fn, self)
                return
            key = next(_cb_keys)
            # The registry keeps this Request (and so its buffers) alive
            # until the callback has run.
            _cb_registry[key] = self
            rc = lib.weft_request_on_complete(h, _on_complete, key)
            if rc != 0:
                _cb_registry.pop(key, None)
                with st.lock:
                    st.callbacks = None
                raise from_code(rc, "weft_request_on_complete failed")
        finally:
            if h:
                st.unuse()


def _run_callback(fn, req):
    try:
        fn(req)
    except Exception:
        _log.exception("weft: exception in a done callback of %r", req)


_cb_keys = itertools.count(1)
_cb_registry = {}


def _complete(req_ptr, result, key):
    """Runs in the completing thread, with the GIL (ctypes takes it)."""
    prev = _in_callback()
    _tls.in_callback = True
    try:
        req = _cb_registry.pop(key, None)
        if req is not None:
            st = req._st
            with st.lock:
                if st.rc is None:
                    st.done(result)
                fns, st.callbacks = st.callbacks, []
            for fn in fns or ():
                _run_callback(fn, req)
        # Drop the references here, while in_callback is still set: the
        # last one to a Comm must not finalize it from its own progress
        # thread (Comm.__del__ defers that).
        req = st = fns = None
    except BaseException:
        _log.exception("weft: done callback machinery failed")
    finally:
        _tls.in_callback = prev


# One trampoline for the life of the process: libweft may call it until
# the last request completes, so it must never be collected.
_on_complete = CALLBACK(_complete)


def wait_all(requests):
    """Waits for every request; returns their results in order, or raises
    the first failure in order (as weft_wait_all)."""
    reqs = list(requests)
    held = []
    try:
        for r in reqs:
            if r._st.rc is not None:
                continue
            h = r._st.use()
            if not h:
                raise InvalidArgument("%r was freed before it completed" % r)
            held.append((r._st, h))
        if held:
            _refuse_in_callback("wait_all")
            arr = (ctypes.c_void_p * len(held))(*[h for _, h in held])
            comms = tuple({id(st.comm): st.comm for st, _ in held}.values())
            _blocking(comms, lib.weft_wait_all, arr, (len(held),))
            for st, h in held:
                st.done(_request_done(h)[1])
    finally:
        for st, _ in held:
            st.unuse()
    _sweep()
    return [r._outcome() for r in reqs]


# ---- communicators ----

_live = weakref.WeakSet()


class Comm:
    """A communicator: from weft.init() or weft.init_config().

    Every operation is named as its C function without the prefix and
    takes buffers (numpy arrays, bytearray, memoryview, array.array; see
    _buffers); the dtype comes from the buffer unless dtype= is given, the
    count is the whole buffer. Blocking operations return the result buffer;
    the i* variants return a Request. A failure raises a weft.Error whose
    message is weft_last_error(); after a timeout or a peer failure the
    communicator is failed (every later call raises weft.AbortedError) and
    close() plus a new weft.init() recover.
    """

    def __init__(self, handle):
        if not handle:
            raise InvalidArgument("Comm needs a weft_comm handle; use "
                                  "weft.init() or weft.init_config()")
        self._h = handle
        self._rank = lib.weft_rank(handle)
        self._size = lib.weft_size(handle)
        self._op_lock = threading.Lock()
        self._life_lock = threading.Lock()   # abort and messages vs close
        self._final_error = ""
        _live.add(self)
        watch_sigint()

    # -- properties and life cycle --

    @property
    def rank(self):
        return self._rank

    @property
    def size(self):
        return self._size

    @property
    def closed(self):
        return self._h is None

    @property
    def handle(self):
        """The weft_comm * as an int (None once closed), for code that
        calls libweft through ctypes itself."""
        return self._h

    def __repr__(self):
        return "<weft.Comm rank %d of %d%s>" % (
            self._rank, self._size, " closed" if self._h is None else "")

    @property
    def last_error(self):
        """weft_last_error(): the first cause once failed, else the last
        bad argument; "" if nothing failed."""
        with self._life_lock:
            if self._h is None:
                return self._final_error
            return text(lib.weft_last_error(self._h))

    def _message(self, rc):
        return self.last_error or strerror(rc)

    def info(self):
        """weft_info(): the settings this communicator runs with, then
        its tuning table in WEFT_ALGO's form (after "algo=")."""
        fn = lib.optional("weft_info")
        with self._life_lock:
            if self._h is None:
                raise InvalidArgument("%r is closed" % self)
            return text(fn(self._h))

    def peer_wires(self, peer):
        """weft_peer_wires(): the wires over cables between this rank and
        peer, as a dict: total (links x wires per link; 0 for a peer
        reached through shared memory or a relay), up (carrying traffic
        now), lost (since the communicator was made), back (returned)."""
        fn = lib.optional("weft_peer_wires")
        info = WireInfo()
        peer = as_c_int(peer, "peer_wires: peer")
        with self._life_lock:
            if self._h is None:
                raise InvalidArgument("%r is closed" % self)
            rc = fn(self._h, peer, ctypes.byref(info))
        if rc != 0:
            raise InvalidArgument(
                "peer_wires: peer %d is not another rank of this "
                "communicator" % peer)
        return {"total": info.total, "up": info.up, "lost": info.lost,
                "back": info.back}

    def _make(self, what, fn, args):
        """A new Comm from fn(handle, *args, &out) (shrink, split); None
        where fn gave none (split's color < 0)."""
        _refuse_in_callback("Comm." + what)
        out = ctypes.c_void_p()
        with self._op_lock:
            if self._h is None:
                self._live_handle()  # raises
            rc = fn(self._h, *args, ctypes.byref(out))
        if rc != 0:
            raise _init_error(rc)
        return Comm(out.value) if out.value else None

    def shrink(self):
        """weft_comm_shrink: a new Comm of the ranks that call it and are
        alive (this one failed, typically after a weft.PeerError), in the
        old order, renumbered from 0. This Comm is failed afterwards and
        must still be closed."""
        return self._make("shrink", lib.optional("weft_comm_shrink"), ())

    def split(self, color, key=None):
        """weft_comm_split, collective: the ranks of one color (>= 0) form
        a new Comm, ordered by key (default: this rank), then rank; a
        negative color gives None. This Comm stays usable."""
        color = as_c_int(color, "split: color")
        key = as_c_int(self._rank if key is None else key, "split: key")
        return self._make("split", lib.optional("weft_comm_split"),
                          (color, key))

    def origin_rank(self, rank):
        """weft_comm_origin_rank: the rank member rank had in the Comm that
        weft.init() or init_config() made, which this one was shrunk or
        split from."""
        fn = lib.optional("weft_comm_origin_rank")
        rank = as_c_int(rank, "origin_rank: rank")
        with self._life_lock:
            if self._h is None:
                raise InvalidArgument("%r is closed" % self)
            r = fn(self._h, rank)
        if r < 0:
            raise InvalidArgument("origin_rank: rank %d is not a rank of "
                                  "this communicator" % rank)
        return r

    def set_timeout(self, timeout_ms):
        """Per-operation deadline of later calls, in milliseconds (> 0)."""
        self._call(lib.weft_set_timeout,
                   (as_c_int(timeout_ms, "set_timeout: timeout_ms"),))

    def abort(self):
        """Ends a call blocked on this communicator (in any thread) with
        weft.AbortedError; every later call fails the same way."""
        with self._life_lock:
            if self._h is not None:
                lib.weft_abort(self._h)

    def close(self):
        """weft_finalize: frees everything, promptly even on a failed
        communicator. Pending requests complete with weft.AbortedError; a
        call blocked in another thread is aborted first. Idempotent."""
        _refuse_in_callback("Comm.close")
        if self._h is None:
            return
        if not self._op_lock.acquire(blocking=False):
            self.abort()
            self._op_lock.acquire()
        try:
            self._finalize()
        finally:
            self._op_lock.release()
        _sweep()

    finalize = close

    def _finalize(self):
        with self._life_lock:
            h = self._h
            if h is None:
                return
            self._final_error = text(lib.weft_last_error(h))
            self._h = None
        # Outside _life_lock: weft_finalize runs the callbacks of the
        # requests it aborts, and they may read last_error.
        lib.weft_finalize(h)

    def _close_at_exit(self):
        self.abort()
        if self._op_lock.acquire(timeout=10):
            try:
                self._finalize()
            finally:
                self._op_lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        h = getattr(self, "_h", None)
        if h is None:
            return
        self._h = None
        try:
            if _in_callback():
                _deferred.append(h)
            else:
                lib.weft_finalize(h)
        except Exception:
            pass  # interpreter shutdown

    # -- calling weft --

    def _live_handle(self):
        if self._h is None:
            raise InvalidArgument("%r is closed" % self)
        return self._h

    def _raise(self, rc):
        raise from_code(rc, text(lib.weft_last_error(self._h)) or
                        strerror(rc))

    def _call(self, fn, args):
        if getattr(_tls, "in_callback", False):
            _refuse_in_callback("Comm")
        with self._op_lock:
            h = self._h
            if h is None:
                self._live_handle()  # raises
            # _blocking(self, fn, h, args), written out: this is the path
            # of every blocking operation, where calling it would add
            # another 1% to a small all_reduce.
            w = _sigint
            if _get_ident() != w.main:
                rc = fn(h, *args)
            else:
                w.calls = self
                try:
                    if w.slots[w.seen]:
                        _claim(w)
                    rc = fn(h, *args)
                finally:
                    w.calls = None
                if w.hit or (rc != 0 and w.slots[w.seen]):
                    _interrupted(w)
            if rc != 0:
                self._raise(rc)

    def _post(self, fn, args, keep, result, what):
        """Posts fn(comm, *args, &req) and returns its Request, which pins
        the Bufs in keep until the operation completes. (weft.torch may
        post through it with its own buffers.)"""
        _refuse_in_callback("Comm")
        _sweep()
        st = _ReqState(self, keep, result)
        with self._op_lock:
            h = self._live_handle()
            rc = fn(h, *args, ctypes.byref(st.handle))
            if rc != 0:
                self._raise(rc)
        return Request(st, what)

    # -- argument sets, shared by the blocking and non-blocking forms --

    # Every int is checked by as_c_int() (or as_op) before anything else,
    # and before libweft is called: a ctypes argument would keep its low
    # 32 bits.

    def _all_reduce_args(self, sendbuf, recvbuf, op, dtype):
        op = as_op(op, "all_reduce: op")
        if recvbuf is None:
            s = r = Buf(sendbuf, "all_reduce sendbuf (in place)", True, dtype)
        else:
            s = Buf(sendbuf, "all_reduce sendbuf", False, dtype)
            r = Buf(recvbuf, "all_reduce recvbuf", True, dtype)
            same_dtype(s, r, "all_reduce")
            if r.count != s.count:
                raise InvalidArgument(
                    "all_reduce: recvbuf holds %d elements, sendbuf %d; "
                    "they must match" % (r.count, s.count))
        result = sendbuf if recvbuf is None else recvbuf
        return (s.ptr, r.ptr, s.count, s.dtype, op), (s, r), result

    def _blocks(self, buf, what):
        """Elements per rank of a buffer that holds one block per rank."""
        if buf.count % self._size != 0:
            raise InvalidArgument(
                "%s holds %d elements, not a block for each of the %d "
                "ranks" % (what, buf.count, self._size))
        return buf.count // self._size

    def _all_gather_args(self, sendbuf, recvbuf, dtype):
        if recvbuf is None:
            # In place: sendbuf holds size*count, this rank's data first.
            r = Buf(sendbuf, "all_gather buffer (in place)", True, dtype)
            count = self._blocks(r, "all_gather buffer (in place)")
            return (r.ptr, r.ptr, count, r.dtype), (r,), sendbuf
        s = Buf(sendbuf, "all_gather sendbuf", False, dtype)
        r = Buf(recvbuf, "all_gather recvbuf", True, dtype)
        same_dtype(s, r, "all_gather")
        if r.count != self._size * s.count:
            raise InvalidArgument(
                "all_gather: recvbuf holds %d elements but must hold "
                "size*count = %d*%d = %d" %
                (r.count, self._size, s.count, self._size * s.count))
        return (s.ptr, r.ptr, s.count, s.dtype), (s, r), recvbuf

    def _reduce_scatter_args(self, sendbuf, recvbuf, op, dtype):
        op = as_op(op, "reduce_scatter: op")
        if recvbuf is None:
            # In place: the result lands in sendbuf's first block.
            s = Buf(sendbuf, "reduce_scatter buffer (in place)", True, dtype)
            count = self._blocks(s, "reduce_scatter buffer (in place)")
            return (s.ptr, s.ptr, count, s.dtype, op), (s,), sendbuf
        s = Buf(sendbuf, "reduce_scatter sendbuf", False, dtype)
        r = Buf(recvbuf, "reduce_scatter recvbuf", True, dtype)
        same_dtype(s, r, "reduce_scatter")
        if s.count != self._size * r.count:
            raise InvalidArgument(
                "reduce_scatter: sendbuf holds %d elements but must hold "
                "size*recvcount = %d*%d = %d" %
                (s.count, self._size, r.count, self._size * r.count))
        return (s.ptr, r.ptr, r.count, r.dtype, op), (s, r), recvbuf

    def _broadcast_args(self, buf, root, dtype):
        root = as_c_int(root, "broadcast: root")
        # The root only reads: a read-only buffer will do there.
        b = Buf(buf, "broadcast buf", root != self._rank, dtype)
        return (b.ptr, b.count, b.dtype, root), (b,), buf

    def _send_args(self, buf, peer, dtype):
        peer = as_c_int(peer, "send: peer")
        b = Buf(buf, "send buf", False, dtype)
        return (b.ptr, b.count, b.dtype, peer), (b,), None

    def _recv_args(self, buf, peer, dtype):
        peer = as_c_int(peer, "recv: peer")
        b = Buf(buf, "recv buf", True, dtype)
        return (b.ptr, b.count, b.dtype, peer), (b,), buf

    def _sendrecv_args(self, sendbuf, dst, recvbuf, src, dtype):
        dst = as_c_int(dst, "sendrecv: dst")
        src = as_c_int(src, "sendrecv: src")
        s = Buf(sendbuf, "sendrecv sendbuf", False, dtype)
        r = Buf(recvbuf, "sendrecv recvbuf", True, dtype)
        same_dtype(s, r, "sendrecv")
        if r.count != s.count:
            raise InvalidArgument(
                "sendrecv: recvbuf holds %d elements, sendbuf %d; they "
                "must match" % (r.count, s.count))
        return ((s.ptr, dst, r.ptr, src, s.count, s.dtype),
                (s, r), recvbuf)

    # -- blocking operations --

    def all_reduce(self, sendbuf, recvbuf=None, op=Op.SUM, *, dtype=None):
        """Reduces sendbuf over the ranks into recvbuf (None: in place, into
        sendbuf); returns the buffer holding the result."""
        args, keep, result = self._all_reduce_args(sendbuf, recvbuf, op, dtype)
        self._call(lib.weft_all_reduce, args)
        return result

    def all_gather(self, sendbuf, recvbuf=None, *, dtype=None):
        """Gathers every rank's sendbuf into recvbuf (size*count elements,
        rank r's at r*count). recvbuf None: in place, sendbuf holds
        size*count with this rank's data first. (NCCL's in-place form,
        this rank's block at rank*count, is all_gather(buf[rank*n:
        (rank+1)*n], buf).)"""
        args, keep, result = self._all_gather_args(sendbuf, recvbuf, dtype)
        self._call(lib.weft_all_gather, args)
        return result

    def reduce_scatter(self, sendbuf, recvbuf=None, op=Op.SUM, *, dtype=None):
        """Reduces sendbuf (size*recvcount elements) over the ranks; rank r
        gets block r in recvbuf. recvbuf None: in place, the result in
        sendbuf's first block."""
        args, keep, result = self._reduce_scatter_args(sendbuf, recvbuf, op,
                                                       dtype)
        self._call(lib.weft_reduce_scatter, args)
        return result

    def broadcast(self, buf, root=0, *, dtype=None):
        """Copies root's buf into buf on every rank."""
        args, keep, result = self._broadcast_args(buf, root, dtype)
        self._call(lib.weft_broadcast, args)
        return result

    def send(self, buf, peer, *, dtype=None, tag=0):
        """Sends buf to peer as a message of tag (>= 0); returns once the
        data has left buf."""
        if tag != 0:
            self.isend(buf, peer, dtype=dtype, tag=tag).wait()
            return
        args, keep, _ = self._send_args(buf, peer, dtype)
        self._call(lib.weft_send, args)

    def recv(self, buf, peer, *, dtype=None, tag=0):
        """Receives the next message of tag from peer into buf (its size
        is the count). For peer weft.ANY_SOURCE use irecv, whose request
        says the sender."""
        if tag != 0 or peer == ANY_SOURCE:
            return self.irecv(buf, peer, dtype=dtype, tag=tag).wait()
        args, keep, result = self._recv_args(buf, peer, dtype)
        self._call(lib.weft_recv, args)
        return result

    def sendrecv(self, sendbuf, dst, recvbuf, src, *, dtype=None):
        """Sends sendbuf to dst while receiving recvbuf from src."""
        args, keep, result = self._sendrecv_args(sendbuf, dst, recvbuf, src,
                                                 dtype)
        self._call(lib.weft_sendrecv, args)
        return result

    def barrier(self):
        """Returns once every rank has called it."""
        self._call(lib.weft_barrier, ())

    # -- non-blocking operations --

    def iall_reduce(self, sendbuf, recvbuf=None, op=Op.SUM, *, dtype=None):
        return self._post(lib.weft_iall_reduce,
                          *self._all_reduce_args(sendbuf, recvbuf, op, dtype),
                          "all_reduce")

    def iall_gather(self, sendbuf, recvbuf=None, *, dtype=None):
        return self._post(lib.weft_iall_gather,
                          *self._all_gather_args(sendbuf, recvbuf, dtype),
                          "all_gather")

    def ireduce_scatter(self, sendbuf, recvbuf=None, op=Op.SUM, *,
                        dtype=None):
        return self._post(lib.weft_ireduce_scatter,
                          *self._reduce_scatter_args(sendbuf, recvbuf, op,
                                                     dtype),
                          "reduce_scatter")

    def ibroadcast(self, buf, root=0, *, dtype=None):
        return self._post(lib.weft_ibroadcast,
                          *self._broadcast_args(buf, root, dtype), "broadcast")

    def isend(self, buf, peer, *, dtype=None, tag=0):
        if tag != 0:
            return self._post_tag("weft_isend_tag",
                                  self._send_args(buf, peer, dtype), tag,
                                  "send")
        return self._post(lib.weft_isend, *self._send_args(buf, peer, dtype),
                          "send")

    def irecv(self, buf, peer, *, dtype=None, tag=0):
        """Posts a receive of the next message of tag from peer, or from
        whichever rank sends one first with peer weft.ANY_SOURCE (the
        request's `source` says which, once complete)."""
        if tag != 0 or peer == ANY_SOURCE:
            if peer == ANY_SOURCE:
                b = Buf(buf, "recv buf", True, dtype)
                args = ((b.ptr, b.count, b.dtype, ANY_SOURCE), (b,), buf)
            else:
                args = self._recv_args(buf, peer, dtype)
            return self._post_tag("weft_irecv_tag", args, tag, "recv")
        return self._post(lib.weft_irecv, *self._recv_args(buf, peer, dtype),
                          "recv")

    def _post_tag(self, name, args, tag, what):
        """Posts the tagged form name of a send or receive (args as
        _send_args or _recv_args give them)."""
        tag = as_c_int(tag, what + ": tag")
        a, keep, result = args
        return self._post(lib.optional(name), a + (tag,), keep, result, what)

    def isendrecv(self, sendbuf, dst, recvbuf, src, *, dtype=None):
        return self._post(lib.weft_isendrecv,
                          *self._sendrecv_args(sendbuf, dst, recvbuf, src,
                                               dtype),
                          "sendrecv")

    def ibarrier(self):
        return self._post(lib.weft_ibarrier, (), (), None, "barrier")

    # -- the rooted collectives and the all-to-alls: argument sets --

    def _root(self, root, what):
        root = as_c_int(root, what + ": root")
        if not 0 <= root < self._size:
            raise InvalidArgument("%s: root %d out of range [0, %d)" %
                                  (what, root, self._size))
        return root

    def _reduce_args(self, sendbuf, recvbuf, op, root, dtype):
        op = as_op(op, "reduce: op")
        root = self._root(root, "reduce")
        s = Buf(sendbuf, "reduce sendbuf", recvbuf is None and
                root == self._rank, dtype)
        if root != self._rank:
            # Only the root receives: recvbuf is not looked at elsewhere.
            return (s.ptr, None, s.count, s.dtype, op, root), (s,), None
        if recvbuf is None:     # in place on the root
            return (s.ptr, s.ptr, s.count, s.dtype, op, root), (s,), sendbuf
        r = Buf(recvbuf, "reduce recvbuf", True, dtype)
        same_dtype(s, r, "reduce")
        if r.count != s.count:
            raise InvalidArgument(
                "reduce: recvbuf holds %d elements, sendbuf %d; they must "
                "match" % (r.count, s.count))
        return (s.ptr, r.ptr, s.count, s.dtype, op, root), (s, r), recvbuf

    def _gather_args(self, sendbuf, recvbuf, root, dtype):
        root = self._root(root, "gather")
        s = Buf(sendbuf, "gather sendbuf", False, dtype)
        if root != self._rank:
            return (s.ptr, None, s.count, s.dtype, root), (s,), None
        if recvbuf is None:
            raise InvalidArgument("gather: the root (rank %d) needs a "
                                  "recvbuf of size*count elements" % root)
        r = Buf(recvbuf, "gather recvbuf", True, dtype)
        same_dtype(s, r, "gather")
        if r.count != self._size * s.count:
            raise InvalidArgument(
                "gather: recvbuf holds %d elements but must hold "
                "size*count = %d*%d = %d" %
                (r.count, self._size, s.count, self._size * s.count))
        return (s.ptr, r.ptr, s.count, s.dtype, root), (s, r), recvbuf

    def _scatter_args(self, sendbuf, recvbuf, root, dtype):
        root = self._root(root, "scatter")
        r = Buf(recvbuf, "scatter recvbuf", True, dtype)
        if root != self._rank:
            return (None, r.ptr, r.count, r.dtype, root), (r,), recvbuf
        if sendbuf is None:
            raise InvalidArgument("scatter: the root (rank %d) needs a "
                                  "sendbuf of size*count elements" % root)
        s = Buf(sendbuf, "scatter sendbuf", False, dtype)
        same_dtype(s, r, "scatter")
        if s.count != self._size * r.count:
            raise InvalidArgument(
                "scatter: sendbuf holds %d elements but must hold "
                "size*count = %d*%d = %d" %
                (s.count, self._size, r.count, self._size * r.count))
        return (s.ptr, r.ptr, r.count, r.dtype, root), (s, r), recvbuf

    def _all_to_all_args(self, sendbuf, recvbuf, dtype):
        if recvbuf is None:
            b = Buf(sendbuf, "all_to_all buffer (in place)", True, dtype)
            count = self._blocks(b, "all_to_all buffer (in place)")
            return (b.ptr, b.ptr, count, b.dtype), (b,), sendbuf
        s = Buf(sendbuf, "all_to_all sendbuf", False, dtype)
        r = Buf(recvbuf, "all_to_all recvbuf", True, dtype)
        same_dtype(s, r, "all_to_all")
        if r.count != s.count:
            raise InvalidArgument(
                "all_to_all: recvbuf holds %d elements, sendbuf %d; they "
                "must match" % (r.count, s.count))
        count = self._blocks(s, "all_to_all sendbuf")
        return (s.ptr, r.ptr, count, s.dtype), (s, r), recvbuf

    def _v_counts(self, counts, displs, buf, what):
        """counts and displs (None: packed in rank order) as C arrays of
        size_t, each block checked to lie within buf."""
        n = self._size
        counts = list(counts)
        if len(counts) != n:
            raise InvalidArgument("all_to_allv: %s has %d entries, not one "
                                  "per rank (%d)" % (what, len(counts), n))
        counts = [as_c_size(c, "all_to_allv: " + what) for c in counts]
        if displs is None:
            displs = list(itertools.accumulate([0] + counts[:-1]))
        else:
            displs = list(displs)
            if len(displs) != n:
                raise InvalidArgument(
                    "all_to_allv: the displacements of %s have %d entries, "
                    "not %d" % (what, len(displs), n))
            displs = [as_c_size(d, "all_to_allv: displacement") for d in
                      displs]
        for p in range(n):
            if counts[p] and displs[p] + counts[p] > buf.count:
                raise InvalidArgument(
                    "all_to_allv: %s[%d] = %d elements at %d pass the end "
                    "of its buffer (%d elements)" %
                    (what, p, counts[p], displs[p], buf.count))
        return (ctypes.c_size_t * n)(*counts), (ctypes.c_size_t * n)(*displs)

    def _all_to_allv_args(self, sendbuf, sendcounts, recvbuf, recvcounts,
                          sdispls, rdispls, dtype):
        s = Buf(sendbuf, "all_to_allv sendbuf", False, dtype)
        r = Buf(recvbuf, "all_to_allv recvbuf", True, dtype)
        same_dtype(s, r, "all_to_allv")
        sc, sd = self._v_counts(sendcounts, sdispls, s, "sendcounts")
        rc, rd = self._v_counts(recvcounts, rdispls, r, "recvcounts")
        return ((s.ptr, sc, sd, r.ptr, rc, rd, s.dtype),
                (s, r, sc, sd, rc, rd), recvbuf)

    # -- the rooted collectives and the all-to-alls --

    def reduce(self, sendbuf, recvbuf=None, op=Op.SUM, root=0, *,
               dtype=None):
        """Reduces sendbuf over the ranks into the root's recvbuf (None on
        the root: in place, into sendbuf; ignored elsewhere); returns the
        result on the root, None elsewhere."""
        args, keep, result = self._reduce_args(sendbuf, recvbuf, op, root,
                                               dtype)
        self._call(lib.weft_reduce, args)
        return result

    def gather(self, sendbuf, recvbuf=None, root=0, *, dtype=None):
        """Gathers every rank's sendbuf into the root's recvbuf (size*count
        elements, rank r's at r*count; ignored elsewhere); returns it on
        the root, None elsewhere."""
        args, keep, result = self._gather_args(sendbuf, recvbuf, root, dtype)
        self._call(lib.weft_gather, args)
        return result

    def scatter(self, sendbuf, recvbuf, root=0, *, dtype=None):
        """Block r of the root's sendbuf (size*count elements; ignored, and
        may be None, elsewhere) lands in rank r's recvbuf; returns
        recvbuf."""
        args, keep, result = self._scatter_args(sendbuf, recvbuf, root,
                                                dtype)
        self._call(lib.weft_scatter, args)
        return result

    def all_to_all(self, sendbuf, recvbuf=None, *, dtype=None):
        """Block p of sendbuf (size blocks of count elements) goes to rank
        p, and rank p's block for this rank lands at block p of recvbuf
        (None: in place, in sendbuf); returns the result."""
        args, keep, result = self._all_to_all_args(sendbuf, recvbuf, dtype)
        self._call(lib.weft_all_to_all, args)
        return result

    def all_to_allv(self, sendbuf, sendcounts, recvbuf, recvcounts,
                    sdispls=None, rdispls=None, *, dtype=None):
        """sendcounts[p] elements at sdispls[p] of sendbuf go to rank p, and
        recvcounts[p] from rank p land at rdispls[p] of recvbuf (in
        elements; displacements None: blocks packed in rank order). Rank
        i's sendcounts[j] must be rank j's recvcounts[i]
        (weft.MismatchError on every rank otherwise). Returns recvbuf."""
        args, keep, result = self._all_to_allv_args(
            sendbuf, sendcounts, recvbuf, recvcounts, sdispls, rdispls, dtype)
        self._call(lib.weft_all_to_allv, args)
        return result

    def ireduce(self, sendbuf, recvbuf=None, op=Op.SUM, root=0, *,
                dtype=None):
        return self._post(lib.weft_ireduce,
                          *self._reduce_args(sendbuf, recvbuf, op, root,
                                             dtype), "reduce")

    def igather(self, sendbuf, recvbuf=None, root=0, *, dtype=None):
        return self._post(lib.weft_igather,
                          *self._gather_args(sendbuf, recvbuf, root, dtype),
                          "gather")

    def iscatter(self, sendbuf, recvbuf, root=0, *, dtype=None):
        return self._post(lib.weft_iscatter,
                          *self._scatter_args(sendbuf, recvbuf, root, dtype),
                          "scatter")

    def iall_to_all(self, sendbuf, recvbuf=None, *, dtype=None):
        return self._post(lib.weft_iall_to_all,
                          *self._all_to_all_args(sendbuf, recvbuf, dtype),
                          "all_to_all")

    def iall_to_allv(self, sendbuf, sendcounts, recvbuf, recvcounts,
                     sdispls=None, rdispls=None, *, dtype=None):
        return self._post(lib.weft_iall_to_allv,
                          *self._all_to_allv_args(sendbuf, sendcounts,
                                                  recvbuf, recvcounts,
                                                  sdispls, rdispls, dtype),
                          "all_to_allv")


# Non-blocking forms share their blocking form's documentation.
for _name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
              "send", "recv", "sendrecv", "barrier", "reduce", "gather",
              "scatter", "all_to_all", "all_to_allv"):
    getattr(Comm, "i" + _name).__doc__ = (
        "Posts %s and returns a Request at once (its buffers are weft's "
        "until it completes).\n\n" % _name + getattr(Comm, _name).__doc__)


def as_c_size(value, what):
    """value as a Python int that a C size_t holds (a count or a
    displacement), for the argument named what."""
    if type(value) is not int:
        if isinstance(value, bool):
            raise InvalidArgument("%s must be an integer, not a bool" % what)
        try:
            value = operator.index(value)
        except TypeError:
            raise InvalidArgument("%s must be an integer, not %r" %
                                  (what, value)) from None
    if not 0 <= value < 1 << 62:
        raise InvalidArgument("%s: %d is not a count (0 or more)" %
                              (what, value))
    return value


def init():
    """weft_init: a communicator from the environment (weftrun, mpirun,
    Slurm, torchrun; see the README). Raises weft.ConfigError saying what
    to set when the environment is missing or contradictory."""
    out = ctypes.c_void_p()
    rc = lib.weft_init(ctypes.byref(out))
    if rc != 0:
        raise _init_error(rc)
    return Comm(out.value)


class Listener:
    """weft_listener_open: a listening socket on host (None: 127.0.0.1) at
    a port the system picks. Send .addr ("addr:port") to the other ranks
    and pass the Listener to init_config, which takes it over."""

    def __init__(self, host=None):
        fn = lib.optional("weft_listener_open")
        lib.optional("weft_listener_close")
        out = ctypes.c_void_p()
        addr = ctypes.create_string_buffer(64)
        rc = fn(ctypes.byref(out), None if host is None else host.encode(),
                addr, len(addr))
        if rc != 0:
            raise _init_error(rc)
        self._h = out.value
        self.addr = addr.value.decode()

    def __repr__(self):
        return "<weft.Listener %s%s>" % (
            self.addr, "" if self._h else " closed")

    @property
    def closed(self):
        return self._h is None

    def _take(self):
        h, self._h = self._h, None
        return h

    def close(self):
        """Closes the socket; a no-op once closed or taken over."""
        h = self._take()
        if h:
            lib.optional("weft_listener_close")(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _opt_str(value, name):
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise InvalidArgument("%s must be a str, not %s" %
                          (name, type(value).__name__))


def init_config(rank, size, hostfile_text=None, addrs=None, listener=None,
                token=None, timeout_ms=0, connect_timeout_ms=0, wires=0,
                transport=None, topology=None):
    """weft_init_config: a communicator from these arguments instead of the
    environment (a field left 0/None comes from the environment variable
    weft_init reads for it). addrs: `size` "addr:port" strings in rank
    order, this rank's being listener.addr; listener is taken over (closed
    by weft), even on failure. Any number of communicators may live in one
    process. Raises weft.NotSupported with a libweft that lacks it."""
    fn = lib.optional("weft_init_config")
    cfg = Config()
    try:
        # weft_config's int fields: a Config field set to 2**32 + 1 would
        # hold 1.
        for field, value in (("rank", rank), ("size", size),
                             ("timeout_ms", timeout_ms),
                             ("connect_timeout_ms", connect_timeout_ms),
                             ("wires", wires)):
            setattr(cfg, field, as_c_int(value, "init_config: " + field))
        cfg.hostfile_text = _opt_str(hostfile_text, "hostfile_text")
        cfg.token = _opt_str(token, "token")
        cfg.transport = _opt_str(transport, "transport")
        cfg.topology = _opt_str(topology, "topology")
        if addrs is not None:
            if isinstance(addrs, (str, bytes)):
                raise InvalidArgument("addrs must be a list of \"addr:port\""
                                      " strings, one per rank")
            enc = [_opt_str(a, "addrs[%d]" % i) for i, a in enumerate(addrs)]
            # weft reads exactly size entries: a shorter list would be read
            # past its end.
            if len(enc) != cfg.size or None in enc:
                raise InvalidArgument(
                    "addrs holds %d addresses but size is %d: give one "
                    "\"addr:port\" per rank" % (len(enc), cfg.size))
            cfg.addrs = (ctypes.c_char_p * (len(enc) + 1))(*enc, None)
        if listener is not None:
            if not isinstance(listener, Listener):
                raise InvalidArgument("listener must be a weft.Listener")
            if listener.closed:
                raise InvalidArgument("%r was closed or already used" %
                                      listener)
    except (TypeError, ValueError) as e:
        if isinstance(e, InvalidArgument):
            raise
        raise InvalidArgument("init_config: %s" % e) from None
    if listener is not None:
        # Taken over by weft_init_config from here on, even on failure.
        cfg.listener = listener._take()
    out = ctypes.c_void_p()
    rc = fn(ctypes.byref(out), ctypes.byref(cfg))
    if rc != 0:
        raise _init_error(rc)
    return Comm(out.value)


@atexit.register
def _close_all():
    # Before the interpreter goes: pending operations end (their callbacks
    # run while Python can still run them) and progress threads stop.
    for c in list(_live):
        try:
            c._close_at_exit()
        except Exception:
            pass
    try:
        _sweep()
    except Exception:
        pass
