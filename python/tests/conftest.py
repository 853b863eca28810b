# SPDX-License-Identifier: MIT
"""pytest fixtures: a real rmsnormd per test, on a fresh endpoint.

The daemon is $RN_BUILD/rmsnormd (tests/run.sh sets RN_BUILD; else the
checkout's build/).  Readiness is its READY=1 on a notify socket this fixture
owns (AF_UNIX datagrams), never a sleep; the test ends with SIGTERM and a
check that the daemon exited 0.  When a test fails, the daemon's log is
attached to the report.
"""

import ctypes
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("RN_BUILD") or os.path.join(REPO, "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(REPO, BUILD)

# The package under test loads the libclient of the same build as the daemon.
os.environ.setdefault("RMSNORMD_LIBCLIENT", os.path.join(BUILD, "librmsnorm_client.so.0"))



def _sanitizer_problem():
    """Why libclient cannot be loaded into this interpreter, or None.  A
    sanitizer build's library needs the ASan runtime loaded first, which only
    LD_PRELOAD can do for a Python process (tests/run.sh sets it)."""
    try:
        with open(os.environ["RMSNORMD_LIBCLIENT"], "rb") as f:
            asan = b"libasan.so" in f.read()
    except OSError:
        return None
    if asan and "libasan" not in os.environ.get("LD_PRELOAD", ""):
        return ("libclient is an ASan build: run with LD_PRELOAD=$(cc -print-file-name="
                "libasan.so) ASAN_OPTIONS=detect_leaks=0 (tests/run.sh does)")
    return None


def pytest_collection_modifyitems(config, items):
    why = _sanitizer_problem()
    if why:
        # Loading the library now would abort the interpreter: skip instead.
        for item in items:
            item.add_marker(pytest.mark.skip(reason=why))


def daemon_env(**extra):
    """The environment for a daemon: the preloaded ASan runtime and the
    interpreter's relaxed ASAN_OPTIONS are this process's, not the daemon's
    (a sanitizer-built daemon links its runtime and keeps leak checking)."""
    env = dict(os.environ, **extra)
    if "libasan" in env.get("LD_PRELOAD", ""):
        env.pop("LD_PRELOAD")
        env.pop("ASAN_OPTIONS", None)
    env.pop("RMSNORMD_ENDPOINT", None)
    return env


def _die_with_parent():
    # Runs in the child between fork and exec: a test run that is killed
    # (timeout, ^C) takes its daemons with it instead of leaving them behind.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


READY_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0


class Daemon:
    """One rmsnormd process on ipc://<dir>/d.sock."""

    def __init__(self, args=(), backend="cpu"):
        # A short directory under /tmp: ipc:// paths must stay below 108 bytes.
        self.dir = tempfile.mkdtemp(prefix="rnpy-", dir="/tmp")
        self.sock_path = os.path.join(self.dir, "d.sock")
        self.endpoint = "ipc://" + self.sock_path
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.args = list(args)
        self.backend = backend
        self.proc = None
        self.notices = []
        self.exit_code = None

    def start(self):
        binary = os.path.join(BUILD, "rmsnormd")
        if not os.access(binary, os.X_OK):
            pytest.fail("no daemon at %s (run make first)" % binary)
        notify_path = os.path.join(self.dir, "notify")
        ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            if os.path.exists(notify_path):  # a restart of the same daemon
                os.unlink(notify_path)
            ns.bind(notify_path)
            env = daemon_env(NOTIFY_SOCKET=notify_path)
            # An empty configuration file of its own, so that a system-wide
            # /etc/rmsnormd/rmsnormd.conf never changes what a test sees.
            conf = os.path.join(self.dir, "empty.conf")
            open(conf, "w").close()
            cmd = [binary, "--backend", self.backend, "--endpoint", self.endpoint,
                   "--config", conf, "--threads", "2"]
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(cmd + self.args, stdout=log, stderr=log, env=env,
                                             stdin=subprocess.DEVNULL,
                                             preexec_fn=_die_with_parent)
            self._wait_ready(ns)
        finally:
            ns.close()
        return self

    def _wait_ready(self, ns):
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.proc.kill()
                self.proc.wait()
                pytest.fail("daemon not ready within %.0f s\n%s" % (READY_TIMEOUT, self.log()))
            # Wait on the notify socket in slices so that a daemon dying before
            # READY=1 is noticed at once rather than at the deadline.
            r, _, _ = select.select([ns], [], [], min(left, 0.2))
            if r:
                msg = ns.recv(4096).decode("utf-8", "replace")
                self.notices.append(msg)
                if "READY=1" in msg.split("\n"):
                    return
            elif self.proc.poll() is not None:
                pytest.fail("daemon exited with %d before READY=1\n%s"
                            % (self.proc.returncode, self.log()))

    def stop(self):
        """SIGTERM, wait; returns the exit status (killing it if it overstays)."""
        if self.proc is None:
            return self.exit_code
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.exit_code = -1
                self.proc = None
                return self.exit_code
        self.exit_code = self.proc.returncode
        self.proc = None
        return self.exit_code

    def log(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        return "---- rmsnormd log (%s) ----\n%s---- notify: %r" % (self.log_path, text,
                                                                  self.notices)

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def _run_daemon(request, args=(), backend="cpu"):
    d = Daemon(args, backend).start()
    yield d
    code = d.stop()
    log = d.log()
    d.cleanup()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        # Shown with the failure: what the daemon said while the test ran.
        print(log)
    assert code == 0, "rmsnormd exited with %r after SIGTERM\n%s" % (code, log)


@pytest.fixture
def daemon(request):
    """A started CPU-backend daemon; stopped (and checked to exit 0) after the test."""
    yield from _run_daemon(request)


@pytest.fixture
def daemon_factory(request):
    """Start daemons with extra flags: daemon_factory("--max-n", "4096")."""
    started = []

    def make(*args, backend="cpu"):
        d = Daemon(args, backend).start()
        started.append(d)
        return d

    yield make
    results = []
    for d in started:
        code = d.stop()
        results.append((code, d.log()))
        d.cleanup()
    for code, log in results:
        assert code == 0, "rmsnormd exited with %r\n%s" % (code, log)


@pytest.fixture
def client(daemon):
    import rmsnormd
    with rmsnormd.Client(daemon.endpoint, timeout=10) as c:
        yield c
