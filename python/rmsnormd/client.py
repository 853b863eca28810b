# SPDX-License-Identifier: MIT
"""The Client: one connection to rmsnormd through libclient.

Every failing call raises RNError carrying the status code, its symbolic
name and the one-line message libclient kept (the daemon's own message when
the daemon refused the request).  Nothing here needs PyTorch.
"""

import ctypes
import dataclasses
import math
import os
import threading
import warnings
import weakref

from . import _lib

# Fork detection without a getpid() per call: every child forked through
# Python (os.fork, multiprocessing, subprocess with preexec_fn) runs this
# hook, so a Client compares one integer with the generation it was opened
# in; only when they differ does it ask os.getpid().
_fork_gen = 0


def _forked():
    global _fork_gen
    _fork_gen += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def fork_generation():
    """How many fork()s through Python lie between this process and the
    interpreter's start; a Client made in another generation is the parent's."""
    return _fork_gen


class RNError(Exception):
    """A call to rmsnormd failed.

    code: the rn_status code (e.g. 402); name: its symbolic name
    ("UNREACHABLE"); message: the one-line message naming the field at fault.
    """

    def __init__(self, code, name, message, op=None):
        self.code = code
        self.name = name
        self.message = message
        self.op = op
        text = "%s (%d)" % (name, code)
        if op:
            text = "%s: %s" % (op, text)
        if message:
            text += ": " + message
        super().__init__(text)

    def __reduce__(self):
        # (pickled whole: multiprocessing sends a worker's error to its parent)
        return (type(self), (self.code, self.name, self.message, self.op))


def err_name(code):
    """The symbolic name of a status code ("OUT_OF_BOUNDS")."""
    return _lib.cstr(_lib.lib().rn_err_name(code))


def strerror(code):
    """The generic text of a status code."""
    return _lib.cstr(_lib.lib().rn_strerror(code))


def version():
    """libclient's version, "MAJOR.MINOR.PATCH"."""
    return _lib.cstr(_lib.lib().rn_version())


def default_endpoint():
    """The endpoint a client uses when none is given (see rn_default_endpoint)."""
    buf = ctypes.create_string_buffer(512)
    if _lib.lib().rn_default_endpoint(buf, len(buf)) is None:
        raise RNError(100, "INVALID_ARGUMENT", "default endpoint: longer than 511 bytes")
    return buf.value.decode()


def _raise(code, handle, op):
    msg = _lib.cstr(_lib.lib().rn_last_error(handle))
    raise RNError(code, err_name(code), msg, op)


def _timeout_ms(timeout):
    """Seconds (float) to libclient's timeout_ms: None = library default,
    math.inf = wait forever."""
    if timeout is None:
        return 0
    if timeout == math.inf:
        return -1
    if not (timeout > 0):
        raise ValueError("timeout: must be > 0 seconds, math.inf or None (got %r)" % (timeout,))
    return max(1, min(int(round(timeout * 1000)), 2**31 - 1))


@dataclasses.dataclass(frozen=True)
class Health:
    state: int            # HEALTH_OK, HEALTH_DEGRADED or HEALTH_FAILING
    state_name: str       # "ok", "degraded" or "failing"
    mps: bool
    backend: str
    reasons: tuple

    @property
    def ok(self):
        return self.state == _lib.HEALTH_OK


@dataclasses.dataclass(frozen=True)
class Histogram:
    name: str
    count: int
    p50: int   # nanoseconds
    p90: int
    p99: int
    max: int
    # The non-empty buckets as (le_ns, count) pairs, le_ns ascending, each
    # count the bucket's own (not cumulative), and the sum of the values;
    # None for both when the daemon (older than 0.2) or the library sends
    # no buckets.
    buckets: tuple = None
    sum_ns: int = None

    def cumulative(self):
        """(le_ns, values <= le_ns) pairs, as Prometheus histograms count."""
        out, total = [], 0
        for le, n in self.buckets or ():
            total += n
            out.append((le, total))
        return out


@dataclasses.dataclass(frozen=True)
class Stats:
    backend: str
    device: str
    counters: dict   # name -> value, in the daemon's order
    histograms: dict  # name -> Histogram

    def get(self, name, default=0):
        return self.counters.get(name, default)


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    endpoint: str
    daemon_version: str
    backend: str
    device_name: str
    device_uuid: bytes
    sm_count: int
    cc: tuple
    mps: bool
    protocol_version: int
    max_sessions: int
    max_regions: int
    max_inflight: int
    max_inflight_total: int
    max_m: int
    max_n: int
    max_msg: int
    event_slots: int


@dataclasses.dataclass(frozen=True)
class Timing:
    queue_ns: int
    compute_ns: int
    total_ns: int


_STATE_NAMES = {0: "ok", 1: "degraded", 2: "failing"}


class HostBuffer:
    """Memory shared with the daemon (CPU backend): a POSIX shared-memory
    object that libclient mapped here and registered.  `address` is the
    pointer to put into BwdArgs; `view()` is a writable memoryview of it.
    The buffer belongs to its Client: free() it, or Client.close() does.
    Both release the views it gave: using one then raises ValueError (it
    touched unmapped memory before).  free() refuses with BufferError, as
    mmap.close() does, while an object holds an export of a view (a numpy
    array made from it, say).  What cannot be tracked must not outlive the
    buffer: slices of a view, tensors of torch.frombuffer (which hold no
    export), and objects holding an export when close() runs."""

    def __init__(self, client, address, nbytes):
        self._client_ref = weakref.ref(client)
        self.address = address
        self.nbytes = nbytes
        self._views = []   # weakref.refs (a writable memoryview is not hashable)

    def view(self):
        """A writable memoryview of the whole buffer (bytes)."""
        self._check()
        arr = (ctypes.c_char * self.nbytes).from_address(self.address)
        v = memoryview(arr).cast("B")
        self._views = [r for r in self._views if r() is not None]
        self._views.append(weakref.ref(v))
        return v

    def _release_views(self):
        """Release every view; False if one is still exported (left as is)."""
        ok = True
        for r in self._views:
            v = r()
            try:
                if v is not None:
                    v.release()
            except BufferError:
                ok = False
        return ok

    @property
    def _client(self):
        c = self._client_ref()
        if c is None:  # (its close() set address None first)
            raise ValueError("buffer: its client is gone")
        return c

    def _check(self):
        if self.address is None:
            raise ValueError("buffer: already freed")
        self._client._handle_or_raise()

    def free(self):
        """Unregister, unmap and unlink the buffer.  A second free is a no-op."""
        if self.address is None:
            return
        c = self._client
        if c._gen != _fork_gen and os.getpid() != c._pid:
            self.address = None  # (the parent's: forgotten, its lock not taken)
            return
        with c._lock:
            if c._handle is not None:
                # After fork() the buffer is the parent's: freeing it here
                # would unlink the parent's memory behind its back.
                c._handle_or_raise()
                if not self._release_views():
                    raise BufferError("buffer: an object made from its view() (a numpy array, "
                                      "a tensor) still uses it; drop that before free()")
                rv = _lib.lib().rn_buffer_free(c._handle, self.address)
                self.address = None
                c._buffers.discard(self)
                if rv != 0:
                    _raise(rv, c._handle, "buffer_free")
            self.address = None


class Client:
    """A connection to rmsnormd.  Its session opens with the first call that
    needs one (buffers, backward calls, server_info); ping, health and stats
    need none, so they work at the daemon's session limit too.

    Client(endpoint=None, timeout=None, name=None):
      endpoint  "ipc:///path"; None: default_endpoint()
      timeout   seconds per request, and for connecting (float); None:
                libclient's default (10 s); math.inf: wait forever
      name      shown in the daemon's log; None: "pid <pid>"
      path      "classic", "fast" (the fast path's ring, PROTOCOL.md section
                13) or "auto" (stream calls on the fast path where the
                daemon offers it, host calls on the classic path); None:
                $RMSNORMD_PATH, else "auto"

    A Client may be shared by threads (libclient serialises its calls).  It
    must not be used in a child process after fork(): open a new one there.
    Use it as a context manager, or call close(); call sync() before, to see
    the errors of calls still running (close() warns of any error of a
    finished call not yet reported).  copy.copy and copy.deepcopy of a
    Client (of a model holding one) give the Client itself: it is a shared
    connection.
    """

    _PATHS = {None: 0, "classic": 1, "fast": 2, "auto": 3}

    def __init__(self, endpoint=None, timeout=None, name=None, path=None):
        if path not in self._PATHS:
            raise ValueError("path: must be None, 'classic', 'fast' or 'auto' (got %r)" % (path,))
        lib = _lib.lib()
        self._handle = None
        self._pid = os.getpid()
        self._gen = _fork_gen
        # (a buffer's reference to its client is weak: no cycle, so a client
        # dropped closes at once, not at a cyclic collection, which may never
        # come; its buffers are freed with it)
        self._buffers = set()
        # Held across every C call (see _call); re-entrant, so that code run
        # while a thread holds it (a finaliser, say) cannot deadlock that thread.
        self._lock = threading.RLock()
        opts = _lib.ConnectOpts()
        opts.endpoint = endpoint.encode() if endpoint is not None else None
        opts.timeout_ms = _timeout_ms(timeout)
        opts.client_name = name.encode() if name is not None else None
        opts.path = self._PATHS[path]
        out = ctypes.c_void_p()
        rv = lib.rn_connect(ctypes.byref(opts), ctypes.byref(out))
        if rv != 0:
            _raise(rv, None, "connect")
        self._handle = out

    # ---- lifetime -----------------------------------------------------------

    def close(self):
        """End the session and free every buffer.  Idempotent."""
        if self._gen != _fork_gen and os.getpid() != self._pid:
            # A forked child: the parent's client is only forgotten, and its
            # lock is not taken (a parent thread may have held it at the
            # fork, and would hold it in the child for ever).
            self._handle = None
            for b in list(self._buffers):
                b.address = None
            self._buffers.clear()
            return
        # Under the lock that every call holds: another thread's call must
        # not be inside libclient while the client is freed.
        with self._lock:
            h, self._handle = self._handle, None
            if h is None:
                return
            for b in list(self._buffers):
                b._release_views()
                b.address = None
            self._buffers.clear()
            # A forked child does not own the parent's connection: closing it
            # here would tear down state that belongs to the parent.
            if os.getpid() == self._pid:
                lib = _lib.lib()
                if hasattr(lib, "rn_check") and lib.rn_check(h) != 0:
                    try:
                        warnings.warn("rmsnormd: closing a client whose call failed unseen: "
                                      + _lib.cstr(lib.rn_last_error(h)), RuntimeWarning, 2)
                    except Exception:
                        pass  # (at interpreter exit)
                lib.rn_close(h)

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle_or_raise(self):
        h = self._handle
        if h is None:
            raise ValueError("client: closed")
        if os.getpid() != self._pid:
            raise RuntimeError(
                "client: opened in process %d and used in %d after fork(); "
                "open a new Client in the child (possible where no client was open in "
                "the parent at the fork; else start children with spawn or forkserver)"
                % (self._pid, os.getpid()))
        return h

    def _call(self, op, fn, *args):
        # Held across the C call so that close() cannot free the client under
        # it; libclient serialises the calls of one client anyway.  The
        # checks of _handle_or_raise, cheaply: it runs (and raises) only when
        # the client is closed or a fork() happened since it was opened.
        if self._gen != _fork_gen:
            self._handle_or_raise()  # (before the lock: a parent thread may have held it at the fork)
        with self._lock:
            h = self._handle
            if h is None or self._gen != _fork_gen:
                h = self._handle_or_raise()
            rv = fn(h, *args)
            if rv != 0:
                _raise(rv, h, op)

    @property
    def handle(self):
        """The rn_client * as a ctypes.c_void_p (for other ctypes code)."""
        return self._handle_or_raise()

    def last_error(self):
        """The one-line message of the last failed call on this client."""
        if self._gen != _fork_gen:
            self._handle_or_raise()
        with self._lock:
            return _lib.cstr(_lib.lib().rn_last_error(self._handle_or_raise()))

    # ---- observation ----------------------------------------------------------

    def ping(self):
        """One round trip; returns its duration in nanoseconds."""
        rtt = ctypes.c_uint64()
        self._call("ping", _lib.lib().rn_ping, ctypes.byref(rtt))
        return rtt.value

    def health(self):
        h = _lib.HealthInfo()
        self._call("health", _lib.lib().rn_health, ctypes.byref(h))
        n = min(h.nreasons, _lib.MAX_REASONS)
        return Health(
            state=h.state,
            state_name=_STATE_NAMES.get(h.state, "state %d" % h.state),
            mps=bool(h.mps),
            backend=_lib.cstr(h.backend),
            reasons=tuple(_lib.cstr(h.reasons[i]) for i in range(n)),
        )

    def stats(self):
        s = _lib.StatsInfo()
        lib = _lib.lib()
        b = None
        if hasattr(lib, "rn_stats_hist_buckets"):
            # One STATS request for both, so that the counts agree.
            b = (_lib.HistBuckets * _lib.MAX_HISTS)()
            self._call("stats", lib.rn_stats_hist_buckets, ctypes.byref(s), b, _lib.MAX_HISTS)
        else:
            self._call("stats", lib.rn_stats, ctypes.byref(s))
        counters = {}
        for i in range(min(s.nstats, _lib.MAX_STATS)):
            counters[_lib.cstr(s.stats[i].name)] = s.stats[i].value
        hists = {}
        for i in range(min(s.nhists, _lib.MAX_HISTS)):
            x = s.hists[i]
            name = _lib.cstr(x.name)
            buckets = sum_ns = None
            if b is not None and b[i].present:
                buckets = tuple(
                    (b[i].buckets[j].le_ns, b[i].buckets[j].count)
                    for j in range(min(b[i].nbuckets, _lib.MAX_BUCKETS))
                )
                sum_ns = b[i].sum_ns
            hists[name] = Histogram(name, x.count, x.p50, x.p90, x.p99, x.max, buckets, sum_ns)
        return Stats(_lib.cstr(s.backend), _lib.cstr(s.device), counters, hists)

    def server_info(self):
        i = _lib.ServerInfo()
        self._call("server_info", _lib.lib().rn_server_info, ctypes.byref(i))
        return ServerInfo(
            endpoint=_lib.cstr(i.endpoint),
            daemon_version=_lib.cstr(i.daemon_version),
            backend=_lib.cstr(i.backend),
            device_name=_lib.cstr(i.device_name),
            device_uuid=bytes(i.device_uuid),
            sm_count=i.sm_count,
            cc=(i.cc_major, i.cc_minor),
            mps=bool(i.mps),
            protocol_version=i.protocol_version,
            max_sessions=i.max_sessions,
            max_regions=i.max_regions,
            max_inflight=i.max_inflight,
            max_inflight_total=i.max_inflight_total,
            max_m=i.max_m,
            max_n=i.max_n,
            max_msg=i.max_msg,
            event_slots=i.event_slots,
        )

    # ---- buffers and the backward pass ---------------------------------------------

    def alloc(self, nbytes):
        """A HostBuffer of nbytes (> 0) shared with the daemon, zero filled."""
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError("nbytes: must be a positive int (got %r)" % (nbytes,))
        p = ctypes.c_void_p()
        self._call("buffer_alloc", _lib.lib().rn_buffer_alloc, ctypes.c_size_t(nbytes),
                   ctypes.byref(p))
        b = HostBuffer(self, p.value, nbytes)
        self._buffers.add(b)
        return b

    def bwd_host(self, args):
        """Run the backward pass on host buffers (CPU backend) and wait for it.
        args: a BwdArgs whose pointers lie in this client's HostBuffers.
        Returns Timing."""
        t = _lib.Timing()
        self._call("rmsnorm_bwd_host", _lib.lib().rn_rmsnorm_bwd_host, ctypes.byref(args),
                   ctypes.byref(t))
        return Timing(t.queue_ns, t.compute_ns, t.total_ns)

    def bwd_host_async(self, args):
        """On the fast path: publish the backward pass and return without
        waiting (on the classic path: as bwd_host).  The outputs are written
        once sync() has returned."""
        self._call("rmsnorm_bwd_host_async", _lib.lib().rn_rmsnorm_bwd_host_async,
                   ctypes.byref(args))

    def sync(self):
        """Wait for every call made so far; raise the first error not yet
        reported (RNError)."""
        self._call("sync", _lib.lib().rn_sync)

    def check(self):
        """Raise the first error of the calls finished so far that was not yet
        reported (RNError); never waits."""
        self._call("check", _lib.lib().rn_check)

    @property
    def path(self):
        """"classic", "fast" or "auto"."""
        lib = _lib.lib()
        if not hasattr(lib, "rn_client_path"):
            return "classic"  # (a libclient 0.1: it has no other path)
        with self._lock:
            h = self._handle_or_raise()
            return {1: "classic", 2: "fast", 3: "auto"}.get(lib.rn_client_path(h), "classic")

    def bwd(self, args, stream):
        """Enqueue the backward pass on a CUDA stream (an int cudaStream_t; 0 is
        the legacy default stream) on device pointers; returns at once."""
        # A BwdArgs passes by reference and an int as a void * through the
        # prototype's own conversions: no byref or c_void_p object per call.
        self._call("rmsnorm_bwd", _lib.lib().rn_rmsnorm_bwd, args, stream)

    def bwd_sync(self, args, stream):
        """As bwd(), but returns after completion, with Timing."""
        t = _lib.Timing()
        self._call("rmsnorm_bwd_sync", _lib.lib().rn_rmsnorm_bwd_sync, ctypes.byref(args),
                   ctypes.c_void_p(stream), ctypes.byref(t))
        return Timing(t.queue_ns, t.compute_ns, t.total_ns)


def connect(endpoint=None, timeout=None, name=None, path=None):
    """Client(endpoint, timeout, name, path)."""
    return Client(endpoint, timeout, name, path)
