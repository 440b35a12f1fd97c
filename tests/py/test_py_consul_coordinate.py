"""py-consul's coordinate API against cairn: datacenters, nodes, node,
update, and `near` on the health and catalog reads."""

import time

import consul
import pytest


@pytest.fixture
def c(cairn):
    host, port = cairn.addr.split(":")
    return consul.Consul(host=host, port=int(port))


def coord(x):
    return {"Vec": [x, 0, 0, 0, 0, 0, 0, 0], "Error": 0.2, "Adjustment": 0.0, "Height": 0.0001}


def eventually(f, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = f()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_server_has_a_coordinate(c):
    def server_coord():
        dcs = c.coordinate.datacenters()
        return [x for x in dcs[0]["Coordinates"] if x["Node"] == "py-node"]  # Consul strips the WAN name's .dc

    [row] = eventually(server_coord, "the server's coordinate")
    assert len(row["Coord"]["Vec"]) == 8
    dcs = c.coordinate.datacenters()
    assert dcs[0]["Datacenter"] == "dc1" and dcs[0]["AreaID"] == "wan"

    # The datacenters list has the server's live estimate from the start;
    # the node's row reaches the state with the leader's next batch.
    def with_node():
        index, nodes = c.coordinate.nodes()
        return (index, nodes) if "py-node" in [n["Node"] for n in nodes] else None

    index, nodes = eventually(with_node, "the server's node coordinate")
    assert int(index) > 0
    assert "py-node" in [n["Node"] for n in nodes]
    index, one = c.coordinate.node("py-node")
    assert one[0]["Node"] == "py-node"
    assert set(one[0]["Coord"]) == {"Vec", "Error", "Adjustment", "Height"}
    _, missing = c.coordinate.node("py-nope")
    assert missing is None


def test_update_and_near(c):
    for node in ("py-a-far", "py-b-near"):
        assert c.catalog.register(node, "10.1.0.1", service={"Service": "py-web", "Port": 80})
    assert c.coordinate.update("py-a-far", coord(1.0))
    assert c.coordinate.update("py-b-near", coord(0.0001))

    def both():
        _, nodes = c.coordinate.nodes()
        return {"py-a-far", "py-b-near"} <= {n["Node"] for n in nodes}

    eventually(both, "both coordinates")
    _, rows = c.health.service("py-web")
    assert [r["Node"]["Node"] for r in rows] == ["py-a-far", "py-b-near"]
    _, rows = c.health.service("py-web", near="_agent")
    assert [r["Node"]["Node"] for r in rows] == ["py-b-near", "py-a-far"]
    _, nodes = c.catalog.nodes(near="py-a-far")
    assert nodes[0]["Node"] == "py-a-far"
    _, nodes = c.catalog.nodes(near="_agent")
    assert nodes[-1]["Node"] == "py-a-far"


def test_bad_update_is_refused(c):
    bad = coord(0.1)
    bad["Vec"] = bad["Vec"][:7]
    with pytest.raises(consul.ConsulException, match="rejected bad coordinate"):
        c.coordinate.update("py-node", bad)
