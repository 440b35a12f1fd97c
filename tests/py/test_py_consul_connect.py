"""py-consul's Connect calls against cairn, unchanged: CA roots and
configuration, the agent's roots and leaf, intentions (upsert, read, list,
match, check, delete) and the agent's authorize."""

import consul
import pytest


@pytest.fixture
def c(cairn):
    host, port = cairn.addr.split(":")
    return consul.Consul(host=host, port=int(port))


def test_ca_roots_configuration_and_leaf(c):
    roots = c.connect.ca.roots()
    assert roots["TrustDomain"].endswith(".consul")
    active = [r for r in roots["Roots"] if r["Active"]]
    assert len(active) == 1 and active[0]["ID"] == roots["ActiveRootID"]
    assert active[0]["RootCert"].startswith("-----BEGIN CERTIFICATE-----")
    assert c.agent.connect.ca.roots()["ActiveRootID"] == roots["ActiveRootID"]

    config = c.connect.ca.configuration()
    assert config["Provider"] == "consul"
    assert config["Config"]["PrivateKeyType"] == "ec"
    # A new TTL: the configuration changes, the root stays.
    assert c.connect.ca.update_configuration("consul", {"LeafCertTTL": "48h"}) is True
    assert c.connect.ca.configuration()["Config"]["LeafCertTTL"] == "48h"
    assert c.connect.ca.roots()["ActiveRootID"] == roots["ActiveRootID"]
    with pytest.raises(consul.ConsulException):
        c.connect.ca.update_configuration("consul", {"LeafCertTTL": "1m"})

    leaf = c.agent.connect.ca.leaf("py-web")
    assert leaf["Service"] == "py-web"
    assert leaf["ServiceURI"] == f"spiffe://{roots['TrustDomain']}/ns/default/dc/dc1/svc/py-web"
    assert "PRIVATE KEY" in leaf["PrivateKeyPEM"]


def test_intentions_and_authorize(c):
    ixn = c.connect.intentions
    assert ixn.upsert("py-web", "py-db", action="deny", description="no web") is True
    assert ixn.upsert("*", "py-db", action="allow") is True
    one = ixn.read("py-web", "py-db")
    assert one["Action"] == "deny" and one["Description"] == "no web"
    assert one["Precedence"] == 9
    mine = [i for i in ixn.list() if i["DestinationName"] == "py-db"]
    assert [(i["SourceName"], i["Precedence"]) for i in mine] == [("py-web", 9), ("*", 8)]
    matched = ixn.match("destination", "py-db")["py-db"]
    assert [i["SourceName"] for i in matched][:2] == ["py-web", "*"]
    assert ixn.check("py-web", "py-db") is False
    assert ixn.check("py-api", "py-db") is True

    td = c.connect.ca.roots()["TrustDomain"]
    uri = f"spiffe://{td}/ns/default/dc/dc1/svc/py-web"
    auth = c.agent.connect.authorize("py-db", uri, "01")
    assert auth["Authorized"] is False
    assert auth["Reason"].startswith("Matched L4 intention: py-web => py-db")
    auth = c.agent.connect.authorize("py-elsewhere", uri, "01")
    assert auth == {"Authorized": True, "Reason": "Default behavior configured by ACLs"}

    assert ixn.delete("py-web", "py-db") is True
    assert ixn.check("py-web", "py-db") is True
    assert ixn.read("py-web", "py-db") is None  # a 404, as py-consul reads it
    assert ixn.delete("*", "py-db") is True
