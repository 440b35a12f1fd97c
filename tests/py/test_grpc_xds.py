"""gRPC's own proxyless xDS client (grpcio, which carries gRPC's C-core xDS
implementation) against cairn's state-of-the-world ADS: a test service on
three ports registered as `web` with TTL checks, a client channel on
`xds:///web` whose bootstrap names cairn's gRPC port (printed by `cairn
connect grpc-bootstrap`). The client runs in a subprocess, since the
bootstrap is read from the environment when the first xDS channel is made."""

import collections
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request

import pytest

from conftest import cairn_bin, put
from xds_check import require

grpc = require("grpc")

# A tiny service without generated code: one unary method whose answer
# is the name of the instance that served it.
METHOD = "/cairn.test.Who/Am"


class Instances:
    """gRPC servers on loopback, each answering METHOD with its name."""

    def __init__(self):
        self.servers, self.ports = {}, {}

    def start(self, name):
        from concurrent import futures
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler("cairn.test.Who", {
            "Am": grpc.unary_unary_rpc_method_handler(lambda req, ctx, n=name: n.encode()),
        })
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self.servers[name], self.ports[name] = server, port
        return port

    def stop(self):
        for s in self.servers.values():
            s.stop(0)


CLIENT = textwrap.dedent("""
    import json, sys, time
    import grpc
    target, calls, every = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    channel = grpc.insecure_channel(target)
    who = channel.unary_unary("%s")
    # The first call waits for the xDS resources to arrive.
    print(json.dumps([time.time(), who(b"", wait_for_ready=True, timeout=30).decode()]), flush=True)
    for _ in range(calls - 1):
        try:
            print(json.dumps([time.time(), who(b"", timeout=5).decode()]), flush=True)
        except grpc.RpcError as e:
            print(json.dumps([time.time(), "error:" + str(e.code())]), flush=True)
        if every:
            time.sleep(every)
""" % METHOD)


def put_raw(url, body=None):
    data = b"" if body is None else json.dumps(body).encode()
    urllib.request.urlopen(urllib.request.Request(url, data=data, method="PUT"), timeout=10).close()


def agent_register(url, name, sid, port, meta=None):
    put_raw(url + "/v1/agent/service/register", {
        "ID": sid, "Name": name, "Port": port, "Address": "127.0.0.1", "Meta": meta or {},
        "Check": {"CheckID": f"{sid}-ttl", "Name": "ttl", "TTL": "600s"}})
    ttl(url, sid, "pass")


def ttl(url, sid, how):
    put_raw(f"{url}/v1/agent/check/{how}/{sid}-ttl")


def config(url, entry):
    assert put(url + "/v1/config", entry) is True


@pytest.fixture(scope="module")
def mesh(cairn, tmp_path_factory):
    url = cairn.url
    inst = Instances()
    for i in (1, 2, 3):
        port = inst.start(f"web-{i}")
        agent_register(url, "web", f"web-{i}", port, {"version": "v2" if i == 3 else "v1"})
    for name in ("api", "api-backup"):
        agent_register(url, name, name, inst.start(name))
    # The client is itself a registered instance: its node id names it.
    agent_register(url, "client", "grpc-client", 1)
    out = subprocess.run(
        [cairn_bin(), "connect", "grpc-bootstrap", "-service", "grpc-client",
         "-grpc-addr", f"127.0.0.1:{cairn.grpc_port}"],
        capture_output=True, text=True, timeout=30, env=dict(os.environ, CAIRN_HTTP_ADDR=cairn.url))
    assert out.returncode == 0, out.stderr
    bootstrap = json.loads(out.stdout)
    assert bootstrap["node"]["id"] == "grpc-client"
    assert bootstrap["xds_servers"][0]["server_features"] == ["xds_v3"]
    path = tmp_path_factory.mktemp("grpc") / "bootstrap.json"
    path.write_text(out.stdout)
    yield cairn, inst, path
    inst.stop()


def run_client(bootstrap, target, calls, every=0.0, timeout=120):
    """(time, instance) of every call, made by a client in a subprocess."""
    env = dict(os.environ, GRPC_XDS_BOOTSTRAP=str(bootstrap))
    p = subprocess.run([sys.executable, "-c", CLIENT, target, str(calls), str(every)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return [tuple(json.loads(line)) for line in p.stdout.splitlines()]


def start_client(bootstrap, target, calls, every):
    env = dict(os.environ, GRPC_XDS_BOOTSTRAP=str(bootstrap))
    return subprocess.Popen([sys.executable, "-c", CLIENT, target, str(calls), str(every)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_calls_spread_over_every_healthy_instance(mesh):
    _, _, bootstrap = mesh
    counts = collections.Counter(who for _, who in run_client(bootstrap, "xds:///web", 300))
    assert set(counts) == {"web-1", "web-2", "web-3"}, counts
    assert min(counts.values()) >= 50, counts


def test_a_catalog_instance_gets_its_bootstrap_and_its_calls(mesh, tmp_path):
    """The agentless path: an instance registered through the catalog, on a
    node no agent runs, is found by grpc-bootstrap (-node picks among
    several) and its client is served."""
    cairn, _, _ = mesh
    for node in ("dp-1", "dp-2"):
        put_raw(cairn.url + "/v1/catalog/register", {
            "Node": node, "Address": "10.9.0.1",
            "Service": {"ID": f"cat-client-{node}", "Service": "cat-client", "Port": 1}})

    def bootstrap(*args):
        return subprocess.run(
            [cairn_bin(), "connect", "grpc-bootstrap", "-grpc-addr",
             f"127.0.0.1:{cairn.grpc_port}", *args],
            capture_output=True, text=True, timeout=30, env=dict(os.environ, CAIRN_HTTP_ADDR=cairn.url))

    two = bootstrap("-service", "cat-client")
    assert two.returncode != 0 and "-node" in two.stderr, two.stderr
    out = bootstrap("-service", "cat-client", "-node", "dp-2")
    assert out.returncode == 0, out.stderr
    b = json.loads(out.stdout)
    assert (b["node"]["id"], b["node"]["cluster"], b["node"]["metadata"]["node_name"]) == (
        "cat-client-dp-2", "cat-client", "dp-2")
    by_id = bootstrap("-service", "cat-client-dp-1", "-node", "dp-1")
    assert by_id.returncode == 0, by_id.stderr
    assert json.loads(by_id.stdout)["node"]["id"] == "cat-client-dp-1"
    missing = bootstrap("-service", "no-such-client")
    assert missing.returncode != 0 and "catalog" in missing.stderr, missing.stderr
    path = tmp_path / "catalog-bootstrap.json"
    path.write_text(out.stdout)
    seen = {w for _, w in run_client(path, "xds:///web", 30)}
    assert seen and seen <= {"web-1", "web-2", "web-3"}, seen


def test_an_instance_whose_check_fails_gets_no_calls_within_5s(mesh):
    cairn, _, bootstrap = mesh
    client = start_client(bootstrap, "xds:///web", 1500, 0.01)
    try:
        first = json.loads(client.stdout.readline())
        assert first[1].startswith("web-"), first
        time.sleep(1)
        failed_at = time.time()
        ttl(cairn.url, "web-3", "fail")
        out, err = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
        ttl(cairn.url, "web-3", "pass")
    calls = [tuple(json.loads(line)) for line in out.splitlines()]
    assert all(not who.startswith("error") for _, who in calls), [c for c in calls if c[1].startswith("error")][:5]
    before = [who for t, who in calls if t < failed_at]
    after = [who for t, who in calls if t > failed_at + 5]
    assert "web-3" in before
    assert len(after) > 100 and "web-3" not in after, collections.Counter(after)


def test_a_90_10_split_is_followed(mesh):
    cairn, _, bootstrap = mesh
    url = cairn.url
    config(url, {"Kind": "service-defaults", "Name": "web", "Protocol": "grpc"})
    config(url, {"Kind": "service-resolver", "Name": "web", "Subsets": {
        "v1": {"Filter": "Service.Meta.version == v1"},
        "v2": {"Filter": "Service.Meta.version == v2"}}})
    config(url, {"Kind": "service-splitter", "Name": "web", "Splits": [
        {"Weight": 90, "ServiceSubset": "v1"}, {"Weight": 10, "ServiceSubset": "v2"}]})
    counts = collections.Counter(who for _, who in run_client(bootstrap, "xds:///web", 1000))
    v2 = counts["web-3"]
    # Binomial(1000, 0.1): sd 9.5; six of them either way.
    assert 43 <= v2 <= 157, counts
    assert counts["web-1"] + counts["web-2"] == 1000 - v2, counts


def test_a_resolver_failover_is_followed(mesh):
    cairn, _, bootstrap = mesh
    url = cairn.url
    config(url, {"Kind": "service-resolver", "Name": "api",
                 "Failover": {"*": {"Service": "api-backup"}}})
    assert {w for _, w in run_client(bootstrap, "xds:///api", 20)} == {"api"}
    ttl(url, "api", "fail")
    try:
        deadline = time.time() + 10
        while True:
            seen = {w for _, w in run_client(bootstrap, "xds:///api", 20)}
            if seen == {"api-backup"} or time.time() > deadline:
                break
        assert seen == {"api-backup"}
    finally:
        ttl(url, "api", "pass")


def test_a_tls_grpc_port_is_reached_with_the_bootstraps_tls_credentials(tmp_path):
    """The bootstrap of `-grpc-addr https://…` names the CA: gRPC's xDS
    client speaks TLS to the port and verifies the server's certificate."""
    from test_py_consul_tls import start_https
    requests = require("requests")
    gen = start_https()
    port, ca, grpc_port = next(gen)
    inst = Instances()
    try:
        url = f"https://127.0.0.1:{port}"

        def register(body):
            r = requests.put(url + "/v1/catalog/register", json=body, verify=ca, timeout=10)
            assert r.ok, r.text
        register({"Node": "g", "Address": "127.0.0.1", "Service": {
            "ID": "tls-web-1", "Service": "tls-web", "Port": inst.start("tls-web-1")}})
        r = requests.put(url + "/v1/agent/service/register", verify=ca, timeout=10,
                         json={"ID": "tls-client", "Name": "tls-client", "Port": 1})
        assert r.ok, r.text
        out = subprocess.run(
            [cairn_bin(), "connect", "grpc-bootstrap", "-service", "tls-client",
             "-grpc-addr", f"https://localhost:{grpc_port}", "-grpc-ca-file", ca],
            capture_output=True, text=True, timeout=30,
            env=dict(os.environ, CAIRN_HTTP_ADDR=url, CAIRN_CACERT=ca))
        assert out.returncode == 0, out.stderr
        b = json.loads(out.stdout)
        assert b["xds_servers"][0]["channel_creds"] == [
            {"type": "tls", "config": {"ca_certificate_file": ca}}]
        path = tmp_path / "bootstrap.json"
        path.write_text(out.stdout)
        assert {w for _, w in run_client(path, "xds:///tls-web", 5)} == {"tls-web-1"}
    finally:
        inst.stop()
        next(gen, None)


def test_under_acls_the_bootstraps_token_lets_the_client_dial_what_it_may_read():
    """ACLs on, default deny: the bootstrap carries the client's token in
    the node's metadata; the client reaches a service it may read, and a
    service it may not read does not exist for it."""
    from conftest import acl_server
    root = "6f1c2a4e-0000-4000-8000-0000000000cc"
    server = acl_server(root)
    inst = Instances()
    try:
        for name in ("open", "secret"):
            put(f"{server.url}/v1/catalog/register?token={root}", {
                "Node": "g", "Address": "127.0.0.1",
                "Service": {"ID": f"{name}-1", "Service": name, "Port": inst.start(name)}})
        put_raw(f"{server.url}/v1/agent/service/register?token={root}",
                {"ID": "acl-client", "Name": "acl-client", "Port": 1})
        policy = put(f"{server.url}/v1/acl/policy?token={root}", {
            "Name": "grpc-client",
            "Rules": 'service "acl-client" { policy = "write" }\n'
                     'service "open" { policy = "read" }\n'
                     'agent_prefix "" { policy = "read" }\n'})
        token = put(f"{server.url}/v1/acl/token?token={root}",
                    {"Policies": [{"ID": policy["ID"]}]})["SecretID"]
        out = subprocess.run(
            [cairn_bin(), "connect", "grpc-bootstrap", "-service", "acl-client",
             "-grpc-addr", f"127.0.0.1:{server.grpc_port}"],
            capture_output=True, text=True, timeout=30,
            env=dict(os.environ, CAIRN_HTTP_ADDR=server.url, CAIRN_HTTP_TOKEN=token))
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["node"]["metadata"]["x-consul-token"] == token
        bootstrap = pathlib.Path(tempfile.mkdtemp()) / "bootstrap.json"
        bootstrap.write_text(out.stdout)
        assert {w for _, w in run_client(bootstrap, "xds:///open", 5)} == {"open"}
        # The unreadable service: no listener, which gRPC reports as the
        # resource not existing once its does-not-exist timer (15 s) ran
        # out, a listener it never had being left out of a response.
        env = dict(os.environ, GRPC_XDS_BOOTSTRAP=str(bootstrap))
        probe = textwrap.dedent("""
            import sys, grpc
            ch = grpc.insecure_channel("xds:///secret")
            try:
                ch.unary_unary("%s")(b"", timeout=40)
                print("reached")
            except grpc.RpcError as e:
                print(e.code(), e.details())
        """ % METHOD)
        p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=90, env=env)
        assert "reached" not in p.stdout and "UNAVAILABLE" in p.stdout, p.stdout + p.stderr
        assert "does not exist" in p.stdout, p.stdout
    finally:
        inst.stop()
        server.stop()
