"""Two datacenters through real clients: py-consul's `dc=` arguments and
`dig` against each datacenter's DNS port. dc2 is a dev server naming dc1
its primary; dc1 joins it over the WAN (`--join-wan`). Every write and
read of the other datacenter goes through a server of this one, as a
Consul user's would."""

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request

import consul
import pytest

from conftest import CairnServer


@pytest.fixture(scope="module")
def dcs():
    dc2 = CairnServer(["--datacenter", "dc2", "--primary-datacenter", "dc1"])
    dc1 = CairnServer(["--datacenter", "dc1", "--join-wan", f"127.0.0.1:{dc2.raft_port}"])
    try:
        for url, other in ((dc1.url, b"dc2"), (dc2.url, b"dc1")):
            deadline = time.monotonic() + 30
            while True:
                with urllib.request.urlopen(url + "/v1/catalog/datacenters", timeout=5) as r:
                    if other in r.read():
                        break
                assert time.monotonic() < deadline, f"{url} never learned of {other}"
                time.sleep(0.1)
        yield dc1, dc2
    finally:
        dc1.stop()
        dc2.stop()


def client(server):
    host, port = server.addr.split(":")
    return consul.Consul(host=host, port=int(port))


def register(c, status, dc=None):
    c.catalog.register(
        "far", "10.2.0.9", dc=dc,
        service={"ID": "web1", "Service": "web", "Port": 8080, "Tags": ["v1"]},
        check={"CheckID": "web1-alive", "Name": "alive", "ServiceID": "web1", "Status": status})


def test_datacenters_list_both_this_one_first(dcs):
    dc1, dc2 = dcs
    assert client(dc1).catalog.datacenters() == ["dc1", "dc2"]
    assert client(dc2).catalog.datacenters() == ["dc2", "dc1"]


def test_writes_and_reads_with_dc_go_to_that_datacenter(dcs):
    dc1, dc2 = dcs
    c1, c2 = client(dc1), client(dc2)
    # A registration and a key written through dc1 with dc="dc2" land in
    # dc2 and only there.
    register(c1, "passing", dc="dc2")
    assert c1.kv.put("fed/greeting", "from dc1", dc="dc2")
    assert [n["Node"] for n in c2.catalog.service("web")[1]] == ["far"]
    assert c1.catalog.service("web")[1] == []
    assert c2.kv.get("fed/greeting")[1]["Value"] == b"from dc1"
    assert c1.kv.get("fed/greeting")[1] is None
    # And read back through dc1 with dc="dc2".
    assert c1.kv.get("fed/greeting", dc="dc2")[1]["Value"] == b"from dc1"
    _, rows = c1.health.service("web", dc="dc2", passing=True)
    assert [(r["Node"]["Node"], r["Service"]["Port"]) for r in rows] == [("far", 8080)]
    # An unknown datacenter is Consul's 500 "No path to datacenter".
    with pytest.raises(consul.ConsulException, match="No path to datacenter"):
        c1.kv.get("fed/greeting", dc="dc9")


def test_a_huge_registration_for_dc2_is_refused_whole(dcs):
    dc1, dc2 = dcs
    # Just past the request cap (4 MiB), read before the body's datacenter is
    # known: 413 from dc1, nothing sent on, nothing registered in dc2.
    body = json.dumps({"Datacenter": "dc2", "Node": "huge", "Address": "10.2.0.8",
                       "NodeMeta": {"pad": "x" * ((4 << 20) + (16 << 10))}}).encode()
    req = urllib.request.Request(dc1.url + "/v1/catalog/register", data=body, method="PUT")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 413
    assert "huge" not in [n["Node"] for n in client(dc2).catalog.nodes()[1]]


def test_a_blocking_read_of_dc2_through_dc1_wakes_on_dc2s_write(dcs):
    dc1, dc2 = dcs
    c1, c2 = client(dc1), client(dc2)
    c2.kv.put("fed/watched", "before")
    index, _ = c1.kv.get("fed/watched", dc="dc2")
    got = {}

    def watch():
        got["answer"] = c1.kv.get("fed/watched", dc="dc2", index=index, wait="60s")

    t = threading.Thread(target=watch)
    t.start()
    # Only once the read is parked (in dc2, which answers it) does the
    # write come: a read that never blocked would answer "before".
    deadline = time.monotonic() + 10
    while not parked(dc2):
        assert time.monotonic() < deadline and t.is_alive(), f"the read never parked: {got}"
        time.sleep(0.05)
    c2.kv.put("fed/watched", "after")
    t.join(30)
    assert not t.is_alive(), "the blocking read was never answered"
    new_index, row = got["answer"]
    assert row["Value"] == b"after"
    assert int(new_index) > int(index)


def parked(server):
    """Whether a blocking query waits on `server` now (its gauge)."""
    with urllib.request.urlopen(server.url + "/v1/agent/metrics?format=prometheus", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("cairn_blocking_queries_parked"):
                return float(line.split()[-1]) > 0
    return False


def test_a_prepared_query_fails_over_to_dc2_when_dc1_has_none_passing(dcs):
    dc1, dc2 = dcs
    c1, c2 = client(dc1), client(dc2)
    register(c2, "passing")
    q = c1.query.create("web", name="fed-web", nearestn=1, onlypassing=True)
    answer = c1.query.execute(q["ID"])
    assert answer["Datacenter"] == "dc2"
    assert answer["Failovers"] == 1
    assert [n["Node"]["Node"] for n in answer["Nodes"]] == ["far"]
    # dc2's instance critical too: nothing anywhere.
    register(c2, "critical")
    answer = c1.query.execute(q["ID"])
    assert answer["Nodes"] == []
    register(c2, "passing")


def dig(server, name):
    if not shutil.which("dig"):
        pytest.fail("dig is not installed (Debian's dnsutils)")
    out = subprocess.run(["dig", "+short", "+time=2", "+tries=1", "-p", str(server.dns_port),
                          "@127.0.0.1", name, "A"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_dig_against_each_datacenter(dcs):
    dc1, dc2 = dcs
    register(client(dc2), "passing")
    # dc2's instance: by dc2's own name there, and through dc1 with the
    # datacenter label; dc1's own names do not have it.
    assert dig(dc2, "web.service.consul") == ["10.2.0.9"]
    assert dig(dc1, "web.service.dc2.consul") == ["10.2.0.9"]
    assert dig(dc1, "v1.web.service.dc2.consul") == ["10.2.0.9"]
    assert dig(dc1, "far.node.dc2.consul") == ["10.2.0.9"]
    assert dig(dc1, "web.service.consul") == []
    assert dig(dc2, "web.service.dc1.consul") == []
    # A critical instance leaves the answer in both datacenters.
    register(client(dc2), "critical")
    assert dig(dc1, "web.service.dc2.consul") == []
    assert dig(dc2, "web.service.consul") == []
    register(client(dc2), "passing")
