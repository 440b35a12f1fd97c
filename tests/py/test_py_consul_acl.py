"""py-consul with `token=` against a cairn server with ACLs on and default
deny, unchanged: the initial management token as the bootstrap (and Consul's
reset file for one more), a policy and a token made through its ACL
API, KV within and outside the token's prefix, and a catalog list filtered
by a deny rule."""

import pathlib
import re
import tempfile
import uuid

import consul
import pytest

from conftest import CairnServer

ROOT = str(uuid.uuid4())


@pytest.fixture(scope="module")
def acl_server():
    data_dir = tempfile.mkdtemp(prefix="cairn-py-acl-")
    server = CairnServer(
        ["--data-dir", data_dir, "--acl-enabled", "--acl-default-policy", "deny",
         "--acl-initial-management-token", ROOT, "--acl-agent-token", ROOT])
    server.data_dir = data_dir
    yield server
    server.stop()


def client(server, token=None):
    host, port = server.addr.split(":")
    return consul.Consul(host=host, port=int(port), token=token)


def test_bootstrap_is_refused_after_the_initial_token_until_a_reset(acl_server):
    c = client(acl_server)
    # The initial management token is the bootstrap, as in Consul.
    with pytest.raises(consul.ACLPermissionDenied) as refused:
        c.acl.bootstrap()
    reset = re.search(r"reset index: (\d+)", str(refused.value)).group(1)
    (pathlib.Path(acl_server.data_dir) / "acl-bootstrap-reset").write_text(reset)
    secret = str(uuid.uuid4())
    token = c.acl.bootstrap(bootstrap_secret=secret)
    assert token["SecretID"] == secret
    assert client(acl_server, secret).acl.token.read_self()["AccessorID"] == token["AccessorID"]
    with pytest.raises(consul.ACLPermissionDenied):
        c.acl.bootstrap()


def test_a_key_prefix_token(acl_server):
    root = client(acl_server, ROOT)
    # py-consul sends `rules` JSON-encoded: Consul's JSON rule syntax.
    root.acl.policy.create("py-app", rules={"key_prefix": {"py/": {"policy": "write"}}})
    t = root.acl.token.create(description="py app", policies_name=["py-app"])
    app = client(acl_server, t["SecretID"])
    assert app.kv.put("py/x", "1") is True
    assert app.kv.get("py/x")[1]["Value"] == b"1"
    with pytest.raises(consul.ACLPermissionDenied):
        app.kv.put("other/x", "1")
    with pytest.raises(consul.ACLPermissionDenied):
        client(acl_server).kv.put("py/y", "1")
    root.acl.token.delete(t["AccessorID"])
    with pytest.raises(consul.ACLPermissionDenied):
        app.kv.get("py/x")


def test_a_deny_rule_filters_the_catalog(acl_server):
    root = client(acl_server, ROOT)
    root.catalog.register("py-n1", "10.0.0.1", service={"Service": "web", "Port": 80})
    root.catalog.register("py-n2", "10.0.0.2", service={"Service": "db", "Port": 5432})
    root.acl.policy.create("py-reader", rules={
        "service_prefix": {"": {"policy": "read"}},
        "service": {"web": {"policy": "deny"}},
        "node_prefix": {"": {"policy": "read"}},
    })
    t = root.acl.token.create(policies_name=["py-reader"])
    _, services = client(acl_server, t["SecretID"]).catalog.services()
    assert "db" in services and "web" not in services
