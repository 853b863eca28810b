# SPDX-License-Identifier: MIT
"""rmsnormctl as an operator meets it: the Prometheus output parsed by
prometheus_client (instance labels that keep two daemons' series apart,
HELP lines, no unaggregatable quantile="1", latency as real histograms), the usage errors (one line, a
hint, exit 64), --version, an endpoint given as a socket path, and bench
against a dead daemon."""

import os
import subprocess

import pytest

from conftest import BUILD

CTL = os.path.join(BUILD, "rmsnormctl")
EXIT_USAGE = 64


def ctl(*args, timeout=120):
    env = dict(os.environ)
    env.pop("RMSNORMD_ENDPOINT", None)
    return subprocess.run([CTL] + list(args), capture_output=True, text=True, timeout=timeout,
                          env=env)


def _families(text):
    parser = pytest.importorskip(
        "prometheus_client.parser",
        reason="prometheus_client is not installed for this interpreter (make deps installs it)")
    return list(parser.text_string_to_metric_families(text))


def _prom(daemon):
    # Some traffic first, so that every histogram has samples.
    r = ctl("-e", daemon.endpoint, "bench", "-k", "1", "-r", "5", "--m", "4", "--n", "64", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    r = ctl("-e", daemon.endpoint, "stats", "--prometheus")
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_prometheus_parses_with_instance_labels(daemon_factory):
    d1, d2 = daemon_factory(), daemon_factory()
    seen = {}
    for d in (d1, d2):
        fams = _families(_prom(d))
        names = {f.name: f for f in fams}
        assert "rmsnormd_latency_seconds" in names
        assert names["rmsnormd_latency_seconds"].type == "histogram"
        assert names["rmsnormd_latency_max_seconds"].type == "gauge"
        for f in fams:
            assert f.documentation and "The daemon's counter" not in f.documentation, f.name
            for s in f.samples:
                assert s.labels.get("endpoint") == d.endpoint, s
                # quantile="1" (the maximum) cannot be aggregated; it is a gauge of its own.
                assert s.labels.get("quantile") != "1", s
                key = (s.name, tuple(sorted(s.labels.items())))
                assert key not in seen, "series %s of %s also in %s" % (key, d.endpoint,
                                                                        seen.get(key))
                seen[key] = d.endpoint
    # Both files together, as node_exporter's textfile collector reads them:
    # every series is unique.
    assert len(seen) > 20


def test_prometheus_latency_histograms(daemon):
    fams = {f.name: f for f in _families(_prom(daemon))}
    lat = fams["rmsnormd_latency_seconds"]
    assert lat.type == "histogram"
    stages = {}
    for s in lat.samples:
        assert s.labels["endpoint"] == daemon.endpoint, s
        stages.setdefault(s.labels["stage"], []).append(s)
    assert set(stages) == {"queue", "compute", "total"}
    for stage, samples in stages.items():
        buckets = [s for s in samples if s.name == "rmsnormd_latency_seconds_bucket"]
        count = [s.value for s in samples if s.name == "rmsnormd_latency_seconds_count"]
        total = [s.value for s in samples if s.name == "rmsnormd_latency_seconds_sum"]
        assert len(count) == 1 and len(total) == 1, (stage, samples)
        assert count[0] >= 5, (stage, count)  # the bench's requests at least
        # Bounds ascend and end in +Inf; counts are cumulative; +Inf is the count.
        bounds = [float(s.labels["le"]) for s in buckets]
        assert len(buckets) >= 2, (stage, buckets)
        assert buckets[-1].labels["le"] == "+Inf"
        assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds), bounds
        values = [s.value for s in buckets]
        assert values == sorted(values), values
        assert values[-1] == count[0]
        # The same fixed bounds for every daemon (so that series add up):
        # 2^e - 1 ns for e = 10 .. 37, then +Inf.
        assert bounds[:-1] == pytest.approx([(2**e - 1) / 1e9 for e in range(10, 38)]), bounds
        assert total[0] > 0
        # The sum lies between the smallest and the largest possible total.
        assert total[0] <= bounds[-2] * count[0]
    # The maximum stays a gauge of its own, one per stage.
    mx = fams["rmsnormd_latency_max_seconds"]
    assert mx.type == "gauge"
    assert {s.labels["stage"] for s in mx.samples} == {"queue", "compute", "total"}


def test_stats_json_has_buckets(daemon):
    import json
    _prom(daemon)
    r = ctl("-e", daemon.endpoint, "stats", "--json")
    assert r.returncode == 0, r.stderr
    h = json.loads(r.stdout)["histograms"]["total"]
    assert h["count"] >= 5 and h["sum_ns"] > 0
    les = [b["le_ns"] for b in h["buckets"]]
    assert les == sorted(les) and les[-1] >= h["max_ns"]
    assert sum(b["count"] for b in h["buckets"]) == h["count"]


def test_stats_json_has_endpoint(daemon):
    import json
    r = ctl("-e", daemon.endpoint, "stats", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["endpoint"] == daemon.endpoint
    assert j["gpu_uuid"] == ""  # the CPU backend


def test_endpoint_as_a_path(daemon):
    r = ctl("-e", daemon.sock_path, "health", "-q")
    assert r.returncode == 0, r.stderr
    r = ctl("-e", os.path.relpath(daemon.sock_path), "ping", "-c", "2")
    assert r.returncode == 0, r.stderr


def test_version_option():
    for opt in ("--version", "-V"):
        r = ctl(opt)
        assert r.returncode == 0
        assert r.stdout.startswith("rmsnormctl ")


@pytest.mark.parametrize("args", [
    [], ["--bogus"], ["-e"], ["nosuchcommand"], ["stats", "--json", "--prometheus"],
    ["stats", "--frobnicate"], ["ping", "-c", "x"], ["bench", "--what"], ["stats", "-o"],
])
def test_usage_errors_are_short(args):
    r = ctl(*args)
    assert r.returncode == EXIT_USAGE, (args, r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, r.stderr
    assert r.stdout == ""


def test_help_names_the_exit_codes():
    r = ctl("--help")
    assert r.returncode == 0
    assert "64 usage error" in r.stdout


def test_bench_against_a_dead_daemon(tmp_path):
    r = ctl("-e", "ipc://%s/none.sock" % tmp_path, "bench", "-k", "2", "-r", "3")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "", r.stdout  # no header after the error
    assert "UNREACHABLE" in r.stderr


def test_info_explains_event_slots(daemon):
    r = ctl("-e", daemon.endpoint, "info")
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("event slots")][0]
    assert "none on this backend" in line


def test_table_says_which_percentiles_are_bounds(daemon):
    _prom(daemon)
    r = ctl("-e", daemon.endpoint, "stats")
    assert r.returncode == 0, r.stderr
    assert "upper bounds of log-scale buckets" in r.stdout


def test_no_driver_message(daemon_factory):
    """On a host without an NVIDIA driver, --backend auto says so in those
    words, not with cudart's "driver version is insufficient"."""
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this host has an NVIDIA driver (libcuda.so.1)")
    except OSError:
        pass
    d = daemon_factory(backend="auto")
    log = d.log()
    if "cuda" not in subprocess.run(["strings", os.path.join(BUILD, "rmsnormd")],
                                    capture_output=True, text=True).stdout.lower():
        pytest.skip("rmsnormd was built without CUDA")
    assert "no NVIDIA driver (libcuda.so.1 not found): using the CPU backend" in log, log
    assert "insufficient" not in log, log


def test_stats_file_says_when_the_daemon_is_down(daemon, tmp_path):
    # A textfile left at its last values was exported as if the daemon were
    # up: the file now carries rmsnormd_up, 1 with the statistics and, when
    # they cannot be read, 0 alone.
    out = tmp_path / "rmsnormd.prom"
    r = ctl("-e", daemon.endpoint, "stats", "--prometheus", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert 'rmsnormd_up{endpoint="%s"} 1' % daemon.endpoint in out.read_text()
    gone = "ipc://%s/none.sock" % tmp_path
    r = ctl("-e", gone, "stats", "--prometheus", "-o", str(out))
    assert r.returncode == 2
    text = out.read_text()
    assert 'rmsnormd_up{endpoint="%s"} 0' % gone in text
    assert "rmsnormd_requests_total" not in text
    fams = {f.name: f for f in _families(text)}
    assert fams["rmsnormd_up"].samples[0].value == 0
