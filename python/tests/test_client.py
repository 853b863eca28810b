# SPDX-License-Identifier: MIT
"""The Client against a real CPU-backend daemon: connect, observation calls,
context management and the mapping of failures to RNError."""

import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import rmsnormd

PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_does_not_import_torch():
    # A fresh interpreter: the package and its Client load without PyTorch,
    # and without even loading libclient until it is first needed.
    code = ("import sys, rmsnormd; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert rmsnormd._lib._lib is None, 'libclient loaded at import'; "
            "print(rmsnormd.version())")
    env = dict(os.environ, PYTHONPATH=PYDIR)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().count(".") == 2


def test_torch_names_without_torch_say_why():
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="rmsnormd.torch needs PyTorch"):
            rmsnormd.RMSNorm
    else:
        pytest.skip("PyTorch is installed here; the message for its absence cannot be seen")


def test_rnerror_pickles_whole():
    # multiprocessing sends a worker's exception to its parent by pickle: an
    # RNError that could not be rebuilt stopped the pool's result thread.
    import pickle
    e = rmsnormd.RNError(402, "UNREACHABLE", "endpoint ipc:///x", op="connect")
    back = pickle.loads(pickle.dumps(e))
    assert (back.code, back.name, back.message, back.op, str(back)) == \
        (e.code, e.name, e.message, e.op, str(e))


def test_copies_of_a_client_are_the_client(client):
    import copy
    assert copy.copy(client) is client
    assert copy.deepcopy({"c": client})["c"] is client


def test_version_and_error_names():
    assert rmsnormd.version().count(".") == 2
    assert rmsnormd.err_name(0) == "OK"
    assert rmsnormd.err_name(402) == "UNREACHABLE"
    assert rmsnormd.err_name(101) == "OUT_OF_BOUNDS"
    assert "unreachable" in rmsnormd.strerror(402)


def test_default_endpoint_follows_environment(monkeypatch):
    monkeypatch.setenv("RMSNORMD_ENDPOINT", "ipc:///tmp/somewhere.sock")
    assert rmsnormd.default_endpoint() == "ipc:///tmp/somewhere.sock"


def test_connect_uses_default_endpoint(daemon, monkeypatch):
    monkeypatch.setenv("RMSNORMD_ENDPOINT", daemon.endpoint)
    with rmsnormd.Client() as c:
        assert c.server_info().endpoint == daemon.endpoint


def test_server_info_reports_the_daemons_limits(daemon_factory):
    d = daemon_factory("--max-n", "4096", "--max-sessions", "7", "--max-inflight", "5")
    with rmsnormd.Client(d.endpoint) as c:
        i = c.server_info()
    assert i.endpoint == d.endpoint
    assert i.backend == "cpu"
    assert i.daemon_version == rmsnormd.version()
    assert i.protocol_version >= 1
    assert i.max_n == 4096
    assert i.max_sessions == 7
    assert i.max_inflight == 5
    assert i.device_uuid == bytes(16)
    assert i.sm_count == 2  # the fixture's --threads 2
    assert i.cc == (0, 0)


def test_health_is_ok(client):
    h = client.health()
    assert h.ok and h.state == rmsnormd.HEALTH_OK and h.state_name == "ok"
    assert h.backend == "cpu"
    assert h.reasons == ()


def test_ping_and_stats_count_requests(client):
    before = client.stats()
    assert before.backend == "cpu"
    rtts = [client.ping() for _ in range(3)]
    assert all(r > 0 for r in rtts)
    after = client.stats()
    assert after.get("requests.ping") == before.get("requests.ping") + 3
    # Observation needs no session: this client holds none.
    assert after.get("sessions.active") == 0
    assert after.get("no.such.counter", 42) == 42
    assert set(after.histograms) >= {"queue", "compute", "total"}


def test_close_ends_the_session(daemon):
    with rmsnormd.Client(daemon.endpoint, name="watcher") as watcher:
        base = watcher.stats().get("sessions.active")
        with rmsnormd.Client(daemon.endpoint) as c:
            c.ping()
            # The first call that needs a session opens it.
            assert watcher.stats().get("sessions.active") == base
            c.server_info()
            assert watcher.stats().get("sessions.active") == base + 1
        assert c.closed
        assert watcher.stats().get("sessions.active") == base
        with pytest.raises(ValueError, match="closed"):
            c.ping()
        c.close()  # idempotent


def test_unreachable_endpoint(tmp_path):
    ep = "ipc://%s/nobody.sock" % tmp_path
    with pytest.raises(rmsnormd.RNError) as ei:
        rmsnormd.Client(ep, timeout=2)
    e = ei.value
    assert (e.code, e.name) == (402, "UNREACHABLE")
    assert "nobody.sock" in e.message
    assert e.op == "connect"
    assert "UNREACHABLE (402)" in str(e)


@pytest.mark.parametrize("endpoint, fragment", [
    ("tcp://127.0.0.1:5555", "ipc://"),
    ("ipc://", "empty"),
    ("ipc:///tmp/" + "x" * 120 + ".sock", "shorter than 108"),
])
def test_bad_endpoint(endpoint, fragment):
    with pytest.raises(rmsnormd.RNError) as ei:
        rmsnormd.Client(endpoint)
    assert ei.value.name == "ENDPOINT" and ei.value.code == 404
    assert fragment in ei.value.message


def test_bad_timeout_is_refused_before_connecting():
    with pytest.raises(ValueError, match="timeout"):
        rmsnormd.Client("ipc:///tmp/x.sock", timeout=0)
    with pytest.raises(ValueError, match="timeout"):
        rmsnormd.Client("ipc:///tmp/x.sock", timeout=-3)


def test_daemon_gone(daemon):
    c = rmsnormd.Client(daemon.endpoint, timeout=1.5)
    try:
        c.ping()
        assert daemon.stop() == 0
        with pytest.raises(rmsnormd.RNError) as ei:
            c.ping()
        assert ei.value.name in ("UNREACHABLE", "TIMEOUT")
        assert ei.value.message
        assert c.last_error() == ei.value.message
    finally:
        c.close()


def test_daemon_restart_is_survived(daemon):
    # The same endpoint, a new daemon: the client opens a new session by itself.
    with rmsnormd.Client(daemon.endpoint, timeout=5) as c:
        c.ping()
        assert daemon.stop() == 0
        daemon.start()
        assert c.ping() > 0
        assert c.health().ok


def test_stopped_daemon_connect_honours_timeout(daemon):
    # A stopped daemon accepts no connections; once its listen backlog is
    # full a connect() waits for it.  Client(timeout=1) must still give up
    # after about a second, every time.  The connects run in a thread so that
    # one that blocks fails the test instead of hanging it.
    results = []

    def connect_many():
        for _ in range(16):
            t0 = time.monotonic()
            try:
                rmsnormd.Client(daemon.endpoint, timeout=1).close()
                results.append(("connected", time.monotonic() - t0))
            except rmsnormd.RNError as e:
                results.append((e.name, time.monotonic() - t0))

    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        t = threading.Thread(target=connect_many, daemon=True)
        t.start()
        t.join(16 * 2.0 + 10)
        assert not t.is_alive(), "Client(timeout=1) blocked: %r" % (results,)
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    assert len(results) == 16
    for name, took in results:
        assert name in ("TIMEOUT", "UNREACHABLE")
        assert took < 2.0
    # Continued, the daemon serves again.
    with rmsnormd.Client(daemon.endpoint, timeout=10) as c:
        assert c.health().ok


def test_wait_forever_timeout_accepted(client, daemon):
    with rmsnormd.Client(daemon.endpoint, timeout=math.inf) as c:
        assert c.ping() > 0


def test_client_refuses_use_after_fork(client):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:
                client.ping()
            except RuntimeError as e:
                code = 0 if "after fork" in str(e) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert client.ping() > 0


def test_fork_while_another_thread_holds_the_client(client):
    # A parent thread inside a call at the fork holds the client's lock, which
    # stays held in the child: the child's use must raise, not wait for it
    # (it hung), and its close must return.
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            client.ping()

    t = threading.Thread(target=busy)
    t.start()
    try:
        time.sleep(0.1)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(10)  # (a hang ends here)
                try:
                    client.ping()
                except RuntimeError as e:
                    code = 0 if "after fork" in str(e) else 2
                client.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        stop.set()
        t.join()
    assert client.ping() > 0


def test_connect_in_child_of_a_process_with_a_client(client, daemon):
    # nanomsg cannot run in a child forked while a client was open: the
    # child's connect fails at once and says why (it hung).
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(10)
            try:
                rmsnormd.Client(daemon.endpoint, timeout=2)
            except rmsnormd.RNError as e:
                code = 0 if e.name == "UNSUPPORTED" and "spawn" in str(e) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
