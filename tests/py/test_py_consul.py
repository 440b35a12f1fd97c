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
