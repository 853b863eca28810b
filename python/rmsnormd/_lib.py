# SPDX-License-Identifier: MIT
"""Loading libclient (librmsnorm_client.so) and its C declarations for ctypes.

The structures below mirror client/rmsnorm_client.h field by field, in the
same order and with the same C types, so ctypes lays them out as the C
compiler does.  python/tests/test_layout.py compiles a small C program against
the real header and checks every size and offset, so a change on either side
that is not made on the other fails the tests.

Where the library comes from, first match wins:
  1. $RMSNORMD_LIBCLIENT (a path to the .so);
  2. the build folder of the checkout this package lives in
     (<repo>/build/librmsnorm_client.so.0, or $RN_BUILD's when set);
  3. an installed library: the SONAME through the dynamic loader's search
     (ld.so.cache, which `make install` refreshes), then
     ctypes.util.find_library("rmsnorm_client");
  4. the libdir of the prefix this package is installed under
     (<prefix>/lib/pythonX.Y/site-packages/rmsnormd gives <prefix>/lib and
     its multiarch subfolder), then sys.prefix's: where `make install
     PREFIX=/opt/rn` put the library and no loader path names it.
"""

import ctypes
import ctypes.util
import os
import struct
import sys
import sysconfig
import threading

# Sizes of the fixed arrays (rmsnorm_client.h).
NAME_LEN = 64
UUID_LEN = 16
MAX_REASONS = 8
REASON_LEN = 120
MAX_STATS = 96
MAX_HISTS = 8
STAT_NAME_LEN = 48
MAX_BUCKETS = 64
ERRMSG_LEN = 256

# rn_dtype wire values (proto/rn_wire.h).
DTYPE_NONE = 0
DTYPE_F32 = 1
DTYPE_F16 = 2
DTYPE_BF16 = 3

# Health states.
HEALTH_OK = 0
HEALTH_DEGRADED = 1
HEALTH_FAILING = 2

SONAME = "librmsnorm_client.so.0"
# Reserved words at the end of the structs the library fills in.
RESERVED_WORDS = 8


class _Sized(ctypes.Structure):
    # A struct the caller fills in: struct_size says which layout it has.

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        if not self.struct_size:
            self.struct_size = ctypes.sizeof(self)


class ConnectOpts(_Sized):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("endpoint", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int),
        ("client_name", ctypes.c_char_p),
        ("path", ctypes.c_int),  # 0.2; a 0.1 library reads no further than client_name
    ]


class BwdArgs(_Sized):
    """rn_bwd_args: one backward pass.  Pointers are plain integers (addresses)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("m", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("x_dtype", ctypes.c_int),
        ("dy_dtype", ctypes.c_int),
        ("dx_dtype", ctypes.c_int),
        ("w_dtype", ctypes.c_int),
        ("dres_dtype", ctypes.c_int),
        ("dw_dtype", ctypes.c_int),
        ("x", ctypes.c_void_p),
        ("x_stride", ctypes.c_int64),
        ("dy", ctypes.c_void_p),
        ("dy_stride", ctypes.c_int64),
        ("dx", ctypes.c_void_p),
        ("dx_stride", ctypes.c_int64),
        ("w", ctypes.c_void_p),
        ("rstd", ctypes.c_void_p),
        ("dres", ctypes.c_void_p),
        ("dres_stride", ctypes.c_int64),
        ("dw", ctypes.c_void_p),
        ("eps", ctypes.c_float),
        ("weight_offset", ctypes.c_float),
    ]


def _struct_format(cls):
    # The struct module's native ("@") format of a ctypes Structure whose
    # fields are plain scalars: the same sizes, alignment and padding.
    codes = {ctypes.c_size_t: "N", ctypes.c_int64: "q", ctypes.c_int: "i",
             ctypes.c_void_p: "P", ctypes.c_float: "f"}
    return "@" + "".join(codes[t] for _, t in cls._fields_)


# BwdArgs as one struct.Struct: BWD_PACK.pack(*values) with the values of
# every field in BwdArgs._fields_ order (struct_size first, BWD_SIZE; None
# is not accepted for a pointer, 0 is) gives the struct's bytes in one call,
# where setting twenty fields one by one costs several times as much
# (bench/bench_torch_host.py); BwdArgs.from_buffer_copy turns them into a
# BwdArgs.  python/tests/test_layout.py checks that both agree.
BWD_PACK = struct.Struct(_struct_format(BwdArgs))
BWD_SIZE = ctypes.sizeof(BwdArgs)
if BWD_PACK.size != BWD_SIZE:  # pragma: no cover - a platform ctypes lays out otherwise
    BWD_PACK = None


class Timing(ctypes.Structure):
    _fields_ = [
        ("queue_ns", ctypes.c_uint64),
        ("compute_ns", ctypes.c_uint64),
        ("total_ns", ctypes.c_uint64),
    ]


class HealthInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("mps", ctypes.c_int),
        ("backend", ctypes.c_char * NAME_LEN),
        ("nreasons", ctypes.c_uint),
        ("reasons", (ctypes.c_char * REASON_LEN) * MAX_REASONS),
        ("reserved", ctypes.c_uint64 * RESERVED_WORDS),
    ]


class Stat(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * STAT_NAME_LEN),
        ("value", ctypes.c_uint64),
    ]


class Hist(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * STAT_NAME_LEN),
        ("count", ctypes.c_uint64),
        ("p50", ctypes.c_uint64),
        ("p90", ctypes.c_uint64),
        ("p99", ctypes.c_uint64),
        ("max", ctypes.c_uint64),
    ]


class StatsInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("backend", ctypes.c_char * NAME_LEN),
        ("device", ctypes.c_char * NAME_LEN),
        ("nstats", ctypes.c_uint),
        ("stats", Stat * MAX_STATS),
        ("nhists", ctypes.c_uint),
        ("hists", Hist * MAX_HISTS),
        ("reserved", ctypes.c_uint64 * RESERVED_WORDS),
    ]


class Bucket(ctypes.Structure):
    _fields_ = [
        ("le_ns", ctypes.c_uint64),
        ("count", ctypes.c_uint64),
    ]


class HistBuckets(ctypes.Structure):
    # The buckets and sum of one histogram (rn_stats_hist_buckets), beside
    # StatsInfo's Hist of the same index.
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char * STAT_NAME_LEN),
        ("present", ctypes.c_int),
        ("nbuckets", ctypes.c_uint),
        ("count", ctypes.c_uint64),
        ("sum_ns", ctypes.c_uint64),
        ("buckets", Bucket * MAX_BUCKETS),
        ("reserved", ctypes.c_uint64 * RESERVED_WORDS),
    ]


class ServerInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("endpoint", ctypes.c_char * 256),
        ("daemon_version", ctypes.c_char * NAME_LEN),
        ("backend", ctypes.c_char * NAME_LEN),
        ("device_name", ctypes.c_char * NAME_LEN),
        ("device_uuid", ctypes.c_uint8 * UUID_LEN),
        ("sm_count", ctypes.c_uint),
        ("cc_major", ctypes.c_uint),
        ("cc_minor", ctypes.c_uint),
        ("mps", ctypes.c_int),
        ("protocol_version", ctypes.c_uint),
        ("max_sessions", ctypes.c_uint),
        ("max_regions", ctypes.c_uint),
        ("max_inflight", ctypes.c_uint),
        ("max_inflight_total", ctypes.c_uint),
        ("max_m", ctypes.c_uint64),
        ("max_n", ctypes.c_uint),
        ("max_msg", ctypes.c_uint),
        ("event_slots", ctypes.c_uint),
        ("reserved", ctypes.c_uint64 * RESERVED_WORDS),
    ]


# Every mirrored struct, by its C name, for the layout test.
STRUCTS = {
    "rn_connect_opts": ConnectOpts,
    "rn_bwd_args": BwdArgs,
    "rn_timing": Timing,
    "rn_health_info": HealthInfo,
    "rn_stat": Stat,
    "rn_hist": Hist,
    "rn_stats_info": StatsInfo,
    "rn_bucket": Bucket,
    "rn_hist_buckets": HistBuckets,
    "struct rn_server_info": ServerInfo,
}

_P = ctypes.POINTER
_CLIENT = ctypes.c_void_p  # rn_client * is opaque here

# name: (restype, argtypes)
_PROTOTYPES = {
    "rn_connect": (ctypes.c_int, [_P(ConnectOpts), _P(_CLIENT)]),
    "rn_close": (None, [_CLIENT]),
    "rn_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "rn_err_name": (ctypes.c_char_p, [ctypes.c_int]),
    "rn_last_error": (ctypes.c_char_p, [_CLIENT]),
    "rn_default_endpoint": (ctypes.c_char_p, [ctypes.c_char_p, ctypes.c_size_t]),
    "rn_buffer_alloc": (ctypes.c_int, [_CLIENT, ctypes.c_size_t, _P(ctypes.c_void_p)]),
    "rn_buffer_free": (ctypes.c_int, [_CLIENT, ctypes.c_void_p]),
    "rn_rmsnorm_bwd_host": (ctypes.c_int, [_CLIENT, _P(BwdArgs), _P(Timing)]),
    "rn_rmsnorm_bwd": (ctypes.c_int, [_CLIENT, _P(BwdArgs), ctypes.c_void_p]),
    "rn_rmsnorm_bwd_sync": (ctypes.c_int, [_CLIENT, _P(BwdArgs), ctypes.c_void_p, _P(Timing)]),
    "rn_ping": (ctypes.c_int, [_CLIENT, _P(ctypes.c_uint64)]),
    "rn_health": (ctypes.c_int, [_CLIENT, _P(HealthInfo)]),
    "rn_stats": (ctypes.c_int, [_CLIENT, _P(StatsInfo)]),
    "rn_stats_hist_buckets": (ctypes.c_int, [_CLIENT, _P(StatsInfo), _P(HistBuckets),
                                             ctypes.c_uint]),
    "rn_server_info": (ctypes.c_int, [_CLIENT, _P(ServerInfo)]),
    "rn_version": (ctypes.c_char_p, []),
    "rn_rmsnorm_bwd_host_async": (ctypes.c_int, [_CLIENT, _P(BwdArgs)]),
    "rn_sync": (ctypes.c_int, [_CLIENT]),
    "rn_check": (ctypes.c_int, [_CLIENT]),
    "rn_client_path": (ctypes.c_int, [_CLIENT]),
}

# Calls that a 0.1 library does not have.
_ADDED_AFTER_0_1 = {"rn_stats_hist_buckets", "rn_rmsnorm_bwd_host_async", "rn_sync",
                    "rn_check", "rn_client_path"}


class LibraryNotFound(ImportError):
    """libclient could not be found or loaded."""


def _libdirs(prefix):
    # <prefix>/lib, lib64 and their multiarch subfolders, as library paths.
    multiarch = sysconfig.get_config_var("MULTIARCH")
    out = []
    for d in ("lib", "lib64"):
        if multiarch:
            out.append(os.path.join(prefix, d, multiarch, SONAME))
        out.append(os.path.join(prefix, d, SONAME))
    return out


def _own_prefix():
    # The prefix this package is installed under, or None:
    # <prefix>/lib/pythonX.Y/{site,dist}-packages/rmsnormd.
    parts = os.path.dirname(os.path.abspath(__file__)).split(os.sep)
    if (len(parts) >= 5 and parts[-2] in ("site-packages", "dist-packages")
            and parts[-3].startswith("python") and parts[-4] in ("lib", "lib64")):
        return os.sep.join(parts[:-4]) or os.sep
    return None


def _candidates():
    env = os.environ.get("RMSNORMD_LIBCLIENT")
    if env:
        # An explicit choice is the only one tried: a wrong path must fail
        # loudly rather than silently load another copy.
        return [env], True
    out = []
    build = os.environ.get("RN_BUILD")
    if build:
        out.append(os.path.join(build, SONAME))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out.append(os.path.join(repo, "build", SONAME))
    # The library installed with this package: the same PREFIX.
    own = _own_prefix()
    if own:
        out.extend(_libdirs(own))
    # A bare name: the dynamic loader searches its own path and ld.so.cache.
    out.append(SONAME)
    found = ctypes.util.find_library("rmsnorm_client")
    if found:
        out.append(found)
    # sys.prefix's, and the Makefile's default PREFIX.
    for p in (sys.prefix, "/usr/local"):
        out.extend(d for d in _libdirs(p) if d not in out)
    return out, False


_lock = threading.Lock()
_lib = None


def lib():
    """The loaded library, with prototypes set (loaded on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        paths, explicit = _candidates()
        errors = []
        for p in paths:
            if not explicit and os.path.sep in p and not os.path.exists(p):
                continue
            try:
                handle = ctypes.CDLL(p)
            except OSError as e:
                errors.append("%s: %s" % (p, e))
                continue
            for name, (res, args) in _PROTOTYPES.items():
                # A call added after 0.1 may be missing from an older
                # library; the binding still loads, without that call.
                if name in _ADDED_AFTER_0_1 and not hasattr(handle, name):
                    continue
                fn = getattr(handle, name)
                fn.restype = res
                fn.argtypes = args
            handle.path = p
            _lib = handle
            return _lib
        why = "; ".join(errors) if errors else "tried " + ", ".join(paths or ["nothing"])
        raise LibraryNotFound(
            "rmsnormd: cannot load libclient (%s). Install it (`make install` as root "
            "runs ldconfig), build it with `make`, or set RMSNORMD_LIBCLIENT to the path "
            "of librmsnorm_client.so.0" % why
        )


def cstr(b):
    """A NUL-terminated char array or c_char_p value as str."""
    if b is None:
        return ""
    if isinstance(b, (bytes, bytearray)):
        return bytes(b).split(b"\0", 1)[0].decode("utf-8", "replace")
    return b.value.decode("utf-8", "replace")
