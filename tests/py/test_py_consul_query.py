"""py-consul's prepared query API (`c.query.*`) against cairn: create,
list, get, update, execute (with `near` and `limit`), explain, delete.

py-consul sends every query as a `name_prefix_match` template, its keys
in lower case: both must be taken as Consul takes them."""

import consul
import pytest


@pytest.fixture
def c(cairn):
    host, port = cairn.addr.split(":")
    return consul.Consul(host=host, port=int(port))


def register(c, node, addr, tags, status):
    assert c.catalog.register(
        node,
        addr,
        service={"Service": "pyq-web", "ID": f"pyq-{node}", "Port": 80, "Tags": tags},
        check={"CheckID": f"pyq-{node}-check", "Name": "check", "Status": status,
               "ServiceID": f"pyq-{node}"},
    )


def test_query_lifecycle(c):
    register(c, "pyq-a", "10.9.0.1", ["v1"], "passing")
    register(c, "pyq-b", "10.9.0.2", ["v1"], "warning")
    register(c, "pyq-c", "10.9.0.3", ["v2"], "critical")

    created = c.query.create("pyq-web", name="pyq-v1", tags=["v1"], ttl="10s")
    qid = created["ID"]
    assert len(qid) == 36

    listed = c.query.list()
    assert qid in [q["ID"] for q in listed]
    [got] = c.query.get(qid)
    assert got["Name"] == "pyq-v1"
    assert got["Service"]["Service"] == "pyq-web"
    assert got["Service"]["Tags"] == ["v1"]
    assert got["DNS"]["TTL"] == "10s"
    assert got["Template"]["Type"] == "name_prefix_match"

    res = c.query.execute(qid)
    assert res["Service"] == "pyq-web"
    assert res["Datacenter"] == "dc1"
    assert res["Failovers"] == 0
    assert sorted(n["Node"]["Node"] for n in res["Nodes"]) == ["pyq-a", "pyq-b"]
    # By name, with a limit.
    res = c.query.execute("pyq-v1", limit=1)
    assert len(res["Nodes"]) == 1
    # `near` puts the node asked from first.
    for _ in range(3):
        res = c.query.execute("pyq-v1", near="pyq-b")
        assert res["Nodes"][0]["Node"]["Node"] == "pyq-b"

    # Update: only passing instances now.
    assert c.query.update(qid, "pyq-web", name="pyq-v1", tags=["v1"], onlypassing=True)
    [got] = c.query.get(qid)
    assert got["Service"]["OnlyPassing"] is True
    res = c.query.execute(qid)
    assert [n["Node"]["Node"] for n in res["Nodes"]] == ["pyq-a"]

    explained = c.query.explain("pyq-v1")
    assert explained["Query"]["ID"] == qid
    assert explained["Query"]["Service"]["Service"] == "pyq-web"

    assert c.query.delete(qid)
    assert qid not in [q["ID"] for q in c.query.list()]
    assert c.query.get(qid) is None


def test_template_with_regexp(c):
    register(c, "pyq-t", "10.9.0.9", ["blue"], "passing")
    created = c.query.create(
        "${match(1)}", name="pyq-tpl-", regexp="^pyq-tpl-(.+)$"
    )
    res = c.query.execute("pyq-tpl-pyq-web")
    assert "pyq-t" in [n["Node"]["Node"] for n in res["Nodes"]]
    assert c.query.explain("pyq-tpl-pyq-web")["Query"]["Service"]["Service"] == "pyq-web"
    assert c.query.delete(created["ID"])


def test_refusals(c):
    with pytest.raises(consul.ConsulException):
        c.query.create("pyq-web", name="pyq-bad", nearestn=-1)
    with pytest.raises(consul.ConsulException):
        c.query.create("pyq-web", name="pyq-bad-re", regexp="((")
