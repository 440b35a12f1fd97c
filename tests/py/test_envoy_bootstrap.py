"""`cairn connect envoy -bootstrap -sidecar-for ID` against a dev server:
the printed bootstrap is parsed strictly with Envoy's own protos
(xds-protos: an unknown field or a wrong type fails), and a Delta ADS
stream opened the way that bootstrap tells Envoy to (its node, its
static cluster's address, its initial metadata) is served the sidecar's
resources."""

import json
import os
import subprocess
import urllib.request

import pytest
from google.protobuf import json_format

# The types the bootstrap's `Any` fields name must be known to the parser.
import envoy.extensions.access_loggers.stream.v3.stream_pb2  # noqa: F401
import envoy.extensions.transport_sockets.tls.v3.tls_pb2  # noqa: F401
import envoy.extensions.upstreams.http.v3.http_protocol_options_pb2  # noqa: F401
from envoy.config.bootstrap.v3 import bootstrap_pb2

from conftest import CairnServer, cairn_bin
from test_xds import CDS, Sidecar

TOKEN = "3d1e0c59-0000-4000-8000-00000000e4b0"


@pytest.fixture(scope="module")
def acl_server():
    server = CairnServer(extra=["--acl-enabled", "--acl-default-policy", "deny",
                                "--acl-initial-management-token", TOKEN,
                                "--acl-agent-token", TOKEN])
    yield server
    server.stop()


def bootstrap(server, *args):
    env = dict(os.environ, CAIRN_HTTP_ADDR=server.url, CAIRN_HTTP_TOKEN=TOKEN)
    env.pop("CONSUL_HTTP_ADDR", None)
    out = subprocess.run([cairn_bin(), "connect", "envoy", *args], env=env,
                         capture_output=True, text=True, timeout=30)
    return out


def register_web(server):
    req_body = {"Name": "web", "Port": 8080,
                "Connect": {"SidecarService": {"Port": 21000}}}

    req = urllib.request.Request(server.url + "/v1/agent/service/register",
                                 data=json.dumps(req_body).encode(), method="PUT",
                                 headers={"X-Consul-Token": TOKEN})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def test_bootstrap_parses_strictly_and_is_served(acl_server):
    register_web(acl_server)
    out = bootstrap(acl_server, "-bootstrap", "-sidecar-for", "web")
    assert out.returncode == 0, out.stderr
    # Strict: json_format.Parse refuses unknown fields.
    b = json_format.Parse(out.stdout, bootstrap_pb2.Bootstrap())
    assert b.node.id == "web-sidecar-proxy"
    assert b.node.cluster == "web"
    assert b.node.metadata.fields["node_name"].string_value == "py-node"
    assert b.admin.address.socket_address.port_value == 19000
    [agent] = b.static_resources.clusters
    assert agent.name == "local_agent"
    sock = agent.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (sock.address, sock.port_value) == ("127.0.0.1", acl_server.grpc_port)
    ads = b.dynamic_resources.ads_config
    assert ads.api_type == ads.DELTA_GRPC
    [svc] = ads.grpc_services
    assert svc.envoy_grpc.cluster_name == "local_agent"
    meta = {m.key: m.value for m in svc.initial_metadata}
    assert meta == {"x-consul-token": TOKEN}

    # Envoy with this bootstrap: a stream as it would open one is served.
    side = Sidecar(f"{sock.address}:{sock.port_value}", b.node.id,
                   node_name=b.node.metadata.fields["node_name"].string_value,
                   token=meta["x-consul-token"])
    try:
        side.wait("the sidecar's clusters", lambda s: any(
            n.startswith("local_app") for n in s.state[CDS]))
    finally:
        side.close()


def test_bootstrap_refuses_an_unknown_service(acl_server):
    out = bootstrap(acl_server, "-bootstrap", "-sidecar-for", "nope")
    assert out.returncode == 1
    assert "No sidecar proxy registered for nope" in out.stderr


def test_connect_envoy_runs_envoy_with_the_bootstrap(acl_server, tmp_path):
    """Without -bootstrap, `connect envoy` becomes Envoy (exec), as
    Consul's: the bootstrap handed over as an already unlinked file on
    Envoy's stdin (`--config-path /dev/stdin`: the token is never left on
    disk), hot restart off unless Envoy's arguments set it, the arguments
    after `--` passed on. No Envoy is packaged here: an `envoy` on the PATH
    that records what it was given stands in for it."""
    register_web(acl_server)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    envoy = bin_dir / "envoy"
    envoy.write_text("#!/bin/sh\n"
                     f"printf '%s\\n' \"$@\" > {tmp_path}/args\n"
                     f"cat /dev/stdin > {tmp_path}/config\n")
    envoy.chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()

    def run(*extra):
        env = dict(os.environ, CAIRN_HTTP_ADDR=acl_server.url, CAIRN_HTTP_TOKEN=TOKEN,
                   PATH=f"{bin_dir}:{os.environ['PATH']}", TMPDIR=str(tmp))
        env.pop("CONSUL_HTTP_ADDR", None)
        return subprocess.run([cairn_bin(), "connect", "envoy", "-sidecar-for", "web", *extra],
                              env=env, capture_output=True, text=True, timeout=30)

    out = run("--", "--log-level", "debug")
    assert out.returncode == 0, out.stderr
    args = (tmp_path / "args").read_text().split()
    assert args == ["--config-path", "/dev/stdin", "--disable-hot-restart",
                    "--log-level", "debug"]
    b = json_format.Parse((tmp_path / "config").read_text(), bootstrap_pb2.Bootstrap())
    assert b.node.id == "web-sidecar-proxy"
    assert list(tmp.iterdir()) == [], "the bootstrap file is unlinked before Envoy runs"

    out = run("--", "--restart-epoch", "1")
    assert out.returncode == 0, out.stderr
    assert "--disable-hot-restart" not in (tmp_path / "args").read_text().split()

    env = dict(os.environ, CAIRN_HTTP_ADDR=acl_server.url, CAIRN_HTTP_TOKEN=TOKEN,
               PATH="/nonexistent")
    out = subprocess.run([cairn_bin(), "connect", "envoy", "-sidecar-for", "web"],
                         env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "Couldn't find envoy binary" in out.stderr
