"""py-consul over HTTPS, unchanged: `scheme="https", verify=<ca file>`
against a `cairn server --dev` serving HTTPS only, its CA and certificate
made by `cairn tls`. A client that does not trust the CA is refused. The
gRPC port (xDS, consul-dataplane) is TLS with the same certificate. With
ACLs on (default deny) the same client passes its `token=` over HTTPS."""

import json
import subprocess
import tempfile
import time
import pathlib
import uuid

import consul
import pytest
import requests

from conftest import cairn_bin, free_port


def start_https(extra=()):
    """A `cairn server --dev` serving HTTPS only with a CA and certificate
    made by `cairn tls`; yields (port, CA file, gRPC port)."""
    tmp = tempfile.TemporaryDirectory(prefix="cairn-tls-")
    d = pathlib.Path(tmp.name)
    for args in (["tls", "ca", "create"], ["tls", "cert", "create", "-server"]):
        subprocess.run([cairn_bin(), *args], cwd=d, check=True, capture_output=True)
    port = free_port()
    grpc_port = free_port()
    log = open(d / "server.log", "w")
    proc = subprocess.Popen(
        [cairn_bin(), "server", "--dev", "--node", "py-tls",
         "--http-addr", "", "--https-addr", f"127.0.0.1:{port}",
         "--raft-addr", f"127.0.0.1:{free_port()}",
         "--dns-addr", f"127.0.0.1:{free_port()}",
         "--grpc-addr", f"127.0.0.1:{grpc_port}",
         "--tls-ca-file", str(d / "consul-agent-ca.pem"),
         "--tls-cert-file", str(d / "dc1-server-consul-0.pem"),
         "--tls-key-file", str(d / "dc1-server-consul-0-key.pem"), *extra],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    ca = str(d / "consul-agent-ca.pem")
    deadline = time.time() + 30
    while True:
        try:
            r = requests.get(f"https://127.0.0.1:{port}/v1/status/leader", verify=ca, timeout=2)
            if r.ok and json.loads(r.text or '""'):
                break
        except requests.RequestException:
            pass
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail("cairn did not serve HTTPS with a leader:\n" + (d / "server.log").read_text())
        time.sleep(0.1)
    yield port, ca, grpc_port
    proc.terminate()
    proc.wait(10)
    tmp.cleanup()


@pytest.fixture(scope="module")
def https_server():
    yield from start_https()


ROOT = str(uuid.uuid4())


@pytest.fixture(scope="module")
def https_acl_server():
    yield from start_https(["--acl-enabled", "--acl-default-policy", "deny",
                            "--acl-initial-management-token", ROOT])


def test_py_consul_over_https(https_server):
    port, ca, _ = https_server
    c = consul.Consul(host="127.0.0.1", port=port, scheme="https", verify=ca)
    assert c.kv.put("py/tls", "secret") is True
    _, item = c.kv.get("py/tls")
    assert item["Value"] == b"secret"
    assert c.catalog.register("tls-node", "10.0.0.9", service={"service": "tls-web", "port": 443})
    _, nodes = c.catalog.service("tls-web")
    assert [n["Node"] for n in nodes] == ["tls-node"]
    assert c.agent.self()["Config"]["NodeName"] == "py-tls"


def test_py_consul_refuses_an_unknown_ca(https_server):
    port, _, _ = https_server
    c = consul.Consul(host="127.0.0.1", port=port, scheme="https", verify=True)
    with pytest.raises(requests.exceptions.SSLError):
        c.kv.get("py/tls")


def test_grpc_is_tls_with_the_server_certificate(https_server):
    import grpc
    _, ca, grpc_port = https_server
    method = "/hashicorp.consul.dataplane.DataplaneService/GetSupportedDataplaneFeatures"
    creds = grpc.ssl_channel_credentials(root_certificates=pathlib.Path(ca).read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{grpc_port}", creds,
                             options=[("grpc.ssl_target_name_override", "server.dc1.consul")]) as ch:
        # An empty request; the answer's bytes are its feature list.
        answer = ch.unary_unary(method)(b"", timeout=10)
        assert len(answer) > 0
    # Plain gRPC on the TLS port gets nowhere.
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary(method)(b"", timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_py_consul_over_https_with_a_token(https_acl_server):
    port, ca, _ = https_acl_server
    def client(token=None):
        return consul.Consul(host="127.0.0.1", port=port, scheme="https", verify=ca, token=token)
    root = client(ROOT)
    # The leader writes the initial management token once it leads.
    deadline = time.time() + 10
    while True:
        try:
            root.acl.token.read_self()
            break
        except consul.ACLPermissionDenied:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    root.acl.policy.create("py-tls-app", rules={"key_prefix": {"py/": {"policy": "write"}}})
    secret = root.acl.token.create(policies_name=["py-tls-app"])["SecretID"]
    with pytest.raises(consul.ACLPermissionDenied):
        client().kv.put("py/anon", "1")
    app = client(secret)
    assert app.kv.put("py/tls-acl", "ok") is True
    assert app.kv.get("py/tls-acl")[1]["Value"] == b"ok"
    with pytest.raises(consul.ACLPermissionDenied):
        app.kv.put("other/x", "1")
    # Nothing was written by the refused requests.
    assert root.kv.get("py/anon")[1] is None
