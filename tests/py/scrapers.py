"""What the Prometheus and VictoriaMetrics tests share: running a scraper
next to cairn, and the two checks made through it (a registered service
discovered as a target with Consul's `__meta_consul_*` labels, and cairn's
own metrics scraped)."""

import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from conftest import get, put


def scrape_config(addr, services=None, own=False):
    """A Prometheus-style scrape config: with `services`, job
    `cairn-services` discovering cairn's catalog by Consul SD (`services`
    holds extra SD lines, e.g. a refresh interval); with `own`, job
    `cairn-self` scraping cairn's metrics as Prometheus scrapes Consul's."""
    text = "global:\n  scrape_interval: 1s\nscrape_configs:\n"
    if services is not None:
        text += ("  - job_name: cairn-services\n    consul_sd_configs:\n"
                 f'      - server: "{addr}"\n')
        text += "".join(f"        {line}\n" for line in services)
    if own:
        text += ("  - job_name: cairn-self\n    metrics_path: /v1/agent/metrics\n"
                 "    params:\n      format: [prometheus]\n"
                 f'    static_configs:\n      - targets: ["{addr}"]\n')
    return text


def serve(argv, tmp, port, ready_path, log_name, on_exit=None):
    """Runs a scraper (`argv`, listening on `port`) until the test ends;
    yields (url, tmp). If it exits at start, `on_exit(log)` may skip the
    test; otherwise the test fails with the log."""
    log_path = os.path.join(tmp, log_name)
    log = open(log_path, "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + ready_path, timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    if proc.poll() is not None:
        log.close()
        text = open(log_path).read()
        shutil.rmtree(tmp, ignore_errors=True)
        if on_exit:
            on_exit(text)
        pytest.fail(f"{argv[0]} exited at start:\n" + text[-4000:])
    yield url, tmp
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)


def scraped_leader_gauge(url, log_path, job):
    """Waits until the scraper holds cairn's `cairn_raft_is_leader` from
    job `job`; returns its value as the scraper's API shows it."""
    query = urllib.parse.quote(f'cairn_raft_is_leader{{job="{job}"}}')
    deadline = time.time() + 60
    result = []
    while not result and time.time() < deadline:
        try:
            result = get(f"{url}/api/v1/query?query={query}")["data"]["result"]
        except OSError:
            result = []
        if not result:
            time.sleep(1)
    if not result:
        pytest.fail("no cairn_raft_is_leader scraped within 60s; log:\n"
                    + open(log_path).read()[-4000:])
    return result[0]["value"][1]


def find_target(url, service):
    """The scraper's active target discovered for `service`, if any."""
    try:
        targets = get(url + "/api/v1/targets")["data"]["activeTargets"]
    except OSError:
        return None
    for t in targets:
        if t["discoveredLabels"].get("__meta_consul_service") == service:
            return t
    return None


def discovers_registered_service(cairn, url, log_path, service, port):
    """Registers `service` (one instance, node `<service>-node`) in cairn,
    waits until the scraper makes it a target, and checks its labels;
    returns the target."""
    node = f"{service}-node"
    assert put(cairn.url + "/v1/catalog/register", {
        "Node": node, "Address": "127.0.0.1", "NodeMeta": {"rack": "r1"},
        "Service": {"ID": f"{service}-1", "Service": service, "Port": port,
                    "Tags": ["scrape", "v2"], "Meta": {"team": "core"}},
        "Check": {"CheckID": f"{service}-alive", "Name": "alive",
                  "ServiceID": f"{service}-1", "Status": "passing"},
    }) is True
    deadline = time.time() + 60
    found = find_target(url, service)
    while found is None and time.time() < deadline:
        time.sleep(1)
        found = find_target(url, service)
    if found is None:
        pytest.fail("the service was not discovered within 60s; log:\n"
                    + open(log_path).read()[-4000:])
    labels = found["discoveredLabels"]
    assert labels["__address__"] == f"127.0.0.1:{port}"
    assert labels["__meta_consul_service_id"] == f"{service}-1"
    assert labels["__meta_consul_node"] == node
    assert labels["__meta_consul_dc"] == "dc1"
    assert labels["__meta_consul_service_port"] == str(port)
    assert labels["__meta_consul_tags"] == ",scrape,v2,"
    assert labels["__meta_consul_service_metadata_team"] == "core"
    assert labels["__meta_consul_metadata_rack"] == "r1"
    assert labels["__meta_consul_health"] == "passing"
    assert found["scrapePool"] == "cairn-services"
    return found
