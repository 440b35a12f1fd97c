"""Consul service discovery by a real scraper, VictoriaMetrics (single
node, Debian package `victoria-metrics`): its `consul_sd_configs` finds a
service registered in cairn and gives the target Prometheus's
`__meta_consul_*` labels.

Debian's `prometheus` is built without Consul SD (test_prometheus.py skips
there); VictoriaMetrics implements it itself: /v1/agent/self for the
datacenter, then /v1/catalog/services and /v1/health/service/:s as blocking
queries. Skipped when the binary is absent."""

import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

from conftest import free_port, get, put

VM = (os.environ.get("VICTORIA_METRICS_BIN") or shutil.which("victoria-metrics")
      or shutil.which("victoria-metrics-prod") or "/usr/bin/victoria-metrics")

pytestmark = pytest.mark.skipif(
    not os.path.exists(VM),
    reason=f"victoria-metrics binary not found ({VM}); apt-get install victoria-metrics",
)


@pytest.fixture
def victoria(cairn):
    tmp = tempfile.mkdtemp(prefix="cairn-vm-")
    port = free_port()
    config = f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: cairn-services
    consul_sd_configs:
      - server: "{cairn.addr}"
  # cairn's own metrics, scraped as Prometheus scrapes Consul's.
  - job_name: cairn-self
    metrics_path: /v1/agent/metrics
    params:
      format: [prometheus]
    static_configs:
      - targets: ["{cairn.addr}"]
"""
    with open(os.path.join(tmp, "scrape.yml"), "w") as f:
        f.write(config)
    log = open(os.path.join(tmp, "vm.log"), "w")
    proc = subprocess.Popen(
        [VM, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={tmp}/data",
         f"-promscrape.config={tmp}/scrape.yml", "-promscrape.consulSDCheckInterval=1s",
         "-loggerLevel=WARN"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    if proc.poll() is not None:
        log.close()
        text = open(os.path.join(tmp, "vm.log")).read()
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.fail("victoria-metrics exited at start:\n" + text[-4000:])
    yield url, tmp
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)


def test_victoria_metrics_discovers_registered_service(cairn, victoria):
    vm, tmp = victoria
    assert put(cairn.url + "/v1/catalog/register", {
        "Node": "vm-node", "Address": "127.0.0.1", "NodeMeta": {"rack": "r1"},
        "Service": {"ID": "vmetrics-1", "Service": "vmetrics", "Port": 19998,
                    "Tags": ["scrape", "v2"], "Meta": {"team": "core"}},
        "Check": {"CheckID": "vmetrics-alive", "Name": "alive", "ServiceID": "vmetrics-1",
                  "Status": "passing"},
    }) is True

    def find():
        try:
            targets = get(vm + "/api/v1/targets")["data"]["activeTargets"]
        except OSError:
            return None
        for t in targets:
            if t["discoveredLabels"].get("__meta_consul_service") == "vmetrics":
                return t
        return None

    deadline = time.time() + 60
    found = find()
    while found is None and time.time() < deadline:
        time.sleep(1)
        found = find()
    if found is None:
        log = open(os.path.join(tmp, "vm.log")).read()
        pytest.fail("victoria-metrics did not discover the service within 60s; log:\n"
                    + log[-4000:])

    labels = found["discoveredLabels"]
    assert labels["__address__"] == "127.0.0.1:19998"
    assert labels["__meta_consul_service_id"] == "vmetrics-1"
    assert labels["__meta_consul_node"] == "vm-node"
    assert labels["__meta_consul_address"] == "127.0.0.1"
    assert labels["__meta_consul_dc"] == "dc1"
    assert labels["__meta_consul_service_port"] == "19998"
    assert labels["__meta_consul_tags"] == ",scrape,v2,"
    assert labels["__meta_consul_service_metadata_team"] == "core"
    assert labels["__meta_consul_metadata_rack"] == "r1"
    assert labels["__meta_consul_health"] == "passing"
    assert found["scrapePool"] == "cairn-services"

    # A deregistered service leaves the targets (blocking queries wake up).
    assert put(cairn.url + "/v1/catalog/deregister",
               {"Node": "vm-node", "ServiceID": "vmetrics-1"}) is True
    deadline = time.time() + 60
    while find() is not None and time.time() < deadline:
        time.sleep(1)
    assert find() is None, "the deregistered service is still a target after 60s"


def test_victoria_metrics_scrapes_cairn_metrics(cairn, victoria):
    """/v1/agent/metrics?format=prometheus is text a real scraper ingests
    (without the parameter the endpoint answers Consul's JSON)."""
    vm, tmp = victoria
    query = urllib.parse.quote('cairn_raft_is_leader{job="cairn-self"}')
    deadline = time.time() + 60
    result = []
    while not result and time.time() < deadline:
        try:
            result = get(f"{vm}/api/v1/query?query={query}")["data"]["result"]
        except OSError:
            result = []
        if not result:
            time.sleep(1)
    if not result:
        log = open(os.path.join(tmp, "vm.log")).read()
        pytest.fail("victoria-metrics scraped no cairn_raft_is_leader within 60s; log:\n"
                    + log[-4000:])
    assert result[0]["value"][1] == "1"
