"""Prometheus against cairn: its Consul service discovery finds a
registered service as a scrape target with its `__meta_consul_*` labels,
and it scrapes cairn's own /v1/agent/metrics?format=prometheus.

Prometheus calls /v1/agent/self, then /v1/catalog/services and
/v1/health/service/:s as blocking queries (with ?stale). Skipped when the
prometheus binary is absent (Debian package `prometheus`); the discovery
test also when the binary lacks Consul SD (Debian's does)."""

import os
import shutil
import tempfile

import pytest

from conftest import free_port
from scrapers import discovers_registered_service, scrape_config, scraped_leader_gauge, serve

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

    def on_exit(log):
        if "consul_sd_configs not found" in log:
            # Debian builds Prometheus with Consul SD disabled ("until its
            # Debian package is back in shape"): nothing to test against.
            pytest.skip(f"{PROMETHEUS} is built without Consul service discovery")

    yield from serve(
        [PROMETHEUS, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/data",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        tmp, port, "/-/ready", "prometheus.log", on_exit,
    )


@pytest.fixture
def prometheus(cairn):
    yield from run_prometheus(scrape_config(cairn.addr, services=["refresh_interval: 2s"]))


@pytest.fixture
def prometheus_scraping_cairn(cairn):
    # No Consul SD here, so this runs on Debian's build too.
    yield from run_prometheus(scrape_config(cairn.addr, own=True))


def test_prometheus_scrapes_cairn_metrics(cairn, prometheus_scraping_cairn):
    """cairn's /v1/agent/metrics scraped as Prometheus scrapes Consul's
    (`format=prometheus`; without it the endpoint answers JSON)."""
    prom, tmp = prometheus_scraping_cairn
    log = os.path.join(tmp, "prometheus.log")
    assert scraped_leader_gauge(prom, log, "cairn-self") == "1"


def test_prometheus_discovers_registered_service(cairn, prometheus):
    prom, tmp = prometheus
    discovers_registered_service(cairn, prom, os.path.join(tmp, "prometheus.log"),
                                 "metrics", 19999)
