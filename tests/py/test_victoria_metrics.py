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
import tempfile
import time

import pytest

from conftest import free_port, put
from scrapers import (
    discovers_registered_service, find_target, scrape_config, scraped_leader_gauge, serve,
)

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
    # cairn's catalog by Consul SD, and its own metrics.
    config = scrape_config(cairn.addr, services=[], own=True)
    with open(os.path.join(tmp, "scrape.yml"), "w") as f:
        f.write(config)
    yield from serve(
        [VM, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={tmp}/data",
         f"-promscrape.config={tmp}/scrape.yml", "-promscrape.consulSDCheckInterval=1s",
         "-loggerLevel=WARN"],
        tmp, port, "/health", "vm.log",
    )


def test_victoria_metrics_discovers_registered_service(cairn, victoria):
    vm, tmp = victoria
    found = discovers_registered_service(cairn, vm, os.path.join(tmp, "vm.log"),
                                         "vmetrics", 19998)
    assert found["discoveredLabels"]["__meta_consul_address"] == "127.0.0.1"

    # A deregistered service leaves the targets (blocking queries wake up).
    assert put(cairn.url + "/v1/catalog/deregister",
               {"Node": "vmetrics-node", "ServiceID": "vmetrics-1"}) is True
    deadline = time.time() + 60
    while find_target(vm, "vmetrics") is not None and time.time() < deadline:
        time.sleep(1)
    assert find_target(vm, "vmetrics") is None, \
        "the deregistered service is still a target after 60s"


def test_victoria_metrics_scrapes_cairn_metrics(cairn, victoria):
    """/v1/agent/metrics?format=prometheus is text a real scraper ingests
    (without the parameter the endpoint answers Consul's JSON)."""
    vm, tmp = victoria
    assert scraped_leader_gauge(vm, os.path.join(tmp, "vm.log"), "cairn-self") == "1"
