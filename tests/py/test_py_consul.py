"""py-consul (module `consul`) against cairn: catalog and health calls, and
a blocking query, exactly as an application would make them."""

import threading
import time

import consul
import pytest


@pytest.fixture(scope="module")
def c(cairn):
    return consul.Consul(host="127.0.0.1", port=cairn.http_port)


def register_web(c, node, address, sid, port, tags, status="passing"):
    assert c.catalog.register(
        node,
        address,
        service={"Service": "web", "ID": sid, "Port": port, "Tags": tags},
        check={"CheckID": f"{sid}-alive", "Name": "alive", "ServiceID": sid, "Status": status},
    ) is True


def test_catalog_register_and_read(c):
    register_web(c, "py1", "10.1.0.1", "web-a", 8080, ["v1", "primary"])
    register_web(c, "py2", "10.1.0.2", "web-b", 8081, ["v1"], status="critical")

    index, nodes = c.catalog.nodes()
    assert int(index) > 0
    assert {"py1", "py2"} <= {n["Node"] for n in nodes}

    _, services = c.catalog.services()
    assert sorted(services["web"]) == ["primary", "v1"]

    _, rows = c.catalog.service("web")
    assert [r["ServiceID"] for r in rows] == ["web-a", "web-b"]
    assert rows[0]["ServicePort"] == 8080
    assert rows[0]["Address"] == "10.1.0.1"

    _, rows = c.catalog.service("web", tag="primary")
    assert [r["ServiceID"] for r in rows] == ["web-a"]

    _, node = c.catalog.node("py1")
    assert node["Node"]["Address"] == "10.1.0.1"
    assert "web-a" in node["Services"]

    _, rows = c.catalog.service("web", filter_expr="ServicePort == 8081")
    assert [r["ServiceID"] for r in rows] == ["web-b"]


def test_health_calls(c):
    _, rows = c.health.service("web")
    assert len(rows) == 2
    _, rows = c.health.service("web", passing=True)
    assert [r["Service"]["ID"] for r in rows] == ["web-a"]
    assert rows[0]["Checks"][0]["Status"] == "passing"

    _, rows = c.health.service("web", tag=["v1", "primary"])
    assert [r["Node"]["Node"] for r in rows] == ["py1"]

    _, rows = c.health.service("web", filter_expr='Node.Node == "py2"')
    assert [r["Node"]["Node"] for r in rows] == ["py2"]

    _, checks = c.health.checks("web")
    assert sorted(ch["CheckID"] for ch in checks) == ["web-a-alive", "web-b-alive"]

    _, checks = c.health.state("critical")
    assert [ch["CheckID"] for ch in checks] == ["web-b-alive"]

    _, checks = c.health.node("py1")
    assert [ch["CheckID"] for ch in checks] == ["web-a-alive"]


def test_blocking_query_wakes_on_change(c):
    index, rows = c.health.service("web", passing=True)
    assert len(rows) == 1
    result = {}

    def watch():
        t = time.time()
        result["answer"] = c.health.service("web", index=index, wait="30s", passing=True)
        result["took"] = time.time() - t

    th = threading.Thread(target=watch)
    th.start()
    time.sleep(0.5)
    # An unrelated change must not wake it...
    c.catalog.register("py3", "10.1.0.3", service={"Service": "other", "Port": 1})
    time.sleep(0.5)
    assert th.is_alive(), "blocking query woke on an unrelated service"
    # ...a change to its service does.
    register_web(c, "py2", "10.1.0.2", "web-b", 8081, ["v1"], status="passing")
    th.join(20)
    assert not th.is_alive()
    new_index, rows = result["answer"]
    assert int(new_index) > int(index)
    assert sorted(r["Service"]["ID"] for r in rows) == ["web-a", "web-b"]
    assert result["took"] < 15


def test_deregister(c):
    assert c.catalog.deregister("py2", service_id="web-b") is True
    _, rows = c.catalog.service("web")
    assert [r["ServiceID"] for r in rows] == ["web-a"]
    assert c.catalog.deregister("py1") is True
    _, rows = c.health.service("web")
    assert rows == []
    _, node = c.catalog.node("py1")
    assert node is None


def test_bad_input_is_rejected(c):
    with pytest.raises(consul.ConsulException):
        c.catalog.register("bad", "10.9.9.9", check={"Name": "x", "Status": "bogus"})
    _, node = c.catalog.node("bad")
    assert node is None


# The agent API of the server itself (`cairn server --dev` is an agent too,
# as `consul agent -dev`): registrations through it reach the catalog and
# health at once, and maintenance mode takes instances out of health.

def passing_ids(c, service):
    _, rows = c.health.service(service, passing=True)
    return [r["Service"]["ID"] for r in rows]


def test_agent_register_on_the_server_reaches_catalog_and_health(c):
    assert c.agent.service.register(
        "pyapi", service_id="pyapi-1", port=9090, tags=["blue"], check=consul.Check.ttl("10m")
    ) is True
    _, rows = c.catalog.service("pyapi")
    assert [(r["Node"], r["ServiceID"], r["ServicePort"]) for r in rows] == [("py-node", "pyapi-1", 9090)]
    _, rows = c.health.service("pyapi")
    assert [r["Service"]["ID"] for r in rows] == ["pyapi-1"]
    # A TTL check starts critical; passing it through the agent flips health.
    assert passing_ids(c, "pyapi") == []
    assert c.agent.check.ttl_pass("service:pyapi-1", notes="ok") is True
    assert passing_ids(c, "pyapi") == ["pyapi-1"]
    assert c.agent.services()["pyapi-1"]["Tags"] == ["blue"]
    assert c.agent.checks()["service:pyapi-1"]["Status"] == "passing"


def test_agent_self_and_metrics(c, cairn):
    me = c.agent.self()
    assert me["Config"]["Server"] is True
    assert me["Config"]["NodeName"] == "py-node"
    assert me["Config"]["Datacenter"] == "dc1"
    # Where Envoy's bootstrap (consul connect envoy, Nomad) finds xDS.
    assert me["DebugConfig"]["GRPCPort"] == cairn.grpc_port
    assert me["DebugConfig"]["GRPCTLSPort"] == -1
    assert me["DebugConfig"]["SessionTTLMin"] == "10s"
    metrics = c.agent.metrics()
    assert {"Timestamp", "Gauges", "Points", "Counters", "Samples"} <= set(metrics)
    assert any(g["Name"] == "cairn_agent_services" and g["Value"] == 1 for g in metrics["Gauges"])


def test_maintenance_mode_drops_the_instance(c):
    assert c.agent.service.maintenance("pyapi-1", True, reason="deploy") is True
    assert passing_ids(c, "pyapi") == []
    _, checks = c.health.checks("pyapi")
    maint = [ch for ch in checks if ch["CheckID"] == "_service_maintenance:pyapi-1"]
    assert [(ch["Status"], ch["Notes"]) for ch in maint] == [("critical", "deploy")]
    assert c.agent.service.maintenance("pyapi-1", False) is True
    assert passing_ids(c, "pyapi") == ["pyapi-1"]

    assert c.agent.maintenance(True, reason="reboot") is True
    assert passing_ids(c, "pyapi") == []
    assert c.agent.maintenance(False) is True
    assert passing_ids(c, "pyapi") == ["pyapi-1"]

    # An unknown service is a 404, which py-consul reports as False.
    assert c.agent.service.maintenance("no-such-service", True) is False


def test_agent_deregister_on_the_server(c):
    assert c.agent.service.deregister("pyapi-1") is True
    _, rows = c.catalog.service("pyapi")
    assert rows == []
