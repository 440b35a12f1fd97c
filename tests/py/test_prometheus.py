"""Prometheus against cairn: its Consul service discovery finds a
registered service as a scrape target with its `__meta_consul_*` labels,
and it scrapes cairn's own /v1/agent/metrics?format=prometheus.

Prometheus calls /v1/agent/self, then /v1/catalog/services and
/v1/health/service/:s as blocking queries (with ?stale). Skipped when the
prometheus binary is absent (Debian package `prometheus`); the discovery
test also when the binary lacks Consul SD (Debian's does)."""

import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

from conftest import free_port, get, put

PROMETHEUS = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus") or "/usr/bin/prometheus"

pytestmark = pytest.mark.skipif(
    not os.path.exists(PROMETHEUS), reason=f"prometheus binary not found ({PROMETHEUS})"
)


def run_prometheus(config):
    """Starts Prometheus on `config`; yields (url, tmp dir), or skips when
    this build lacks Consul SD and the config needs it."""
    tmp = tempfile.mkdtemp(prefix="cairn-prom-")
    port = free_port()
    with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
        f.write(config)
    log = open(os.path.join(tmp, "prometheus.log"), "w")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/data",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/-/ready", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    if proc.poll() is not None:
        log.close()
        text = open(os.path.join(tmp, "prometheus.log")).read()
        shutil.rmtree(tmp, ignore_errors=True)
        if "consul_sd_configs not found" in text:
            # Debian builds Prometheus with Consul SD disabled ("until its
            # Debian package is back in shape"): nothing to test against.
            pytest.skip(f"{PROMETHEUS} is built without Consul service discovery")
        pytest.fail("prometheus exited at start:\n" + text[-4000:])
    yield url, tmp
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def prometheus(cairn):
    yield from run_prometheus(f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: cairn-services
    consul_sd_configs:
      - server: "{cairn.addr}"
        refresh_interval: 2s
""")


@pytest.fixture
def prometheus_scraping_cairn(cairn):
    # No Consul SD here, so this runs on Debian's build too.
    yield from run_prometheus(f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: cairn-self
    metrics_path: /v1/agent/metrics
    params:
      format: [prometheus]
    static_configs:
      - targets: ["{cairn.addr}"]
""")


def test_prometheus_scrapes_cairn_metrics(cairn, prometheus_scraping_cairn):
    """cairn's /v1/agent/metrics scraped as Prometheus scrapes Consul's
    (`format=prometheus`; without it the endpoint answers JSON)."""
    prom, tmp = prometheus_scraping_cairn
    query = urllib.parse.quote('cairn_raft_is_leader{job="cairn-self"}')
    deadline = time.time() + 60
    result = []
    while not result and time.time() < deadline:
        try:
            result = get(f"{prom}/api/v1/query?query={query}")["data"]["result"]
        except OSError:
            result = []
        if not result:
            time.sleep(1)
    if not result:
        targets = get(prom + "/api/v1/targets")["data"]["activeTargets"]
        pytest.fail(f"prometheus scraped no cairn_raft_is_leader within 60s; targets: {targets}")
    assert result[0]["value"][1] == "1"


def test_prometheus_discovers_registered_service(cairn, prometheus):
    prom, tmp = prometheus
    assert put(cairn.url + "/v1/catalog/register", {
        "Node": "prom-node", "Address": "127.0.0.1", "NodeMeta": {"rack": "r1"},
        "Service": {"ID": "metrics-1", "Service": "metrics", "Port": 19999,
                    "Tags": ["scrape", "v2"], "Meta": {"team": "core"}},
        "Check": {"CheckID": "metrics-alive", "Name": "alive", "ServiceID": "metrics-1",
                  "Status": "passing"},
    }) is True

    deadline = time.time() + 60
    found = None
    while time.time() < deadline and found is None:
        try:
            targets = get(prom + "/api/v1/targets")["data"]["activeTargets"]
        except OSError:
            targets = []
        for t in targets:
            if t["discoveredLabels"].get("__meta_consul_service") == "metrics":
                found = t
        if found is None:
            time.sleep(1)
    if found is None:
        log = open(os.path.join(tmp, "prometheus.log")).read()
        pytest.fail("prometheus did not discover the service within 60s; log:\n" + log[-4000:])

    labels = found["discoveredLabels"]
    assert labels["__address__"] == "127.0.0.1:19999"
    assert labels["__meta_consul_service_id"] == "metrics-1"
    assert labels["__meta_consul_node"] == "prom-node"
    assert labels["__meta_consul_dc"] == "dc1"
    assert labels["__meta_consul_service_port"] == "19999"
    assert labels["__meta_consul_tags"] == ",scrape,v2,"
    assert labels["__meta_consul_service_metadata_team"] == "core"
    assert labels["__meta_consul_metadata_rack"] == "r1"
    assert labels["__meta_consul_health"] == "passing"
    assert found["scrapePool"] == "cairn-services"
