"""Every resource cairn sends, checked against Envoy's own validation rules:
the protoc-gen-validate annotations in Envoy's protos (xds-protos), read by
PyPI's protoc-gen-validate runtime validator (`xds_check.check_any`, which
descends into every typed config). The resources come over both ADS
protocols: a sidecar with upstreams, a router, a splitter, a failover and
intentions (L4 and L7) over Delta and over state-of-the-world, and a
proxyless gRPC client's over state-of-the-world. The state-of-the-world
stream's ACL checks are here too: as the Delta stream's, plus a token in
the node's metadata (a gRPC bootstrap's only place for it)."""

import queue
import threading
import time

import pytest

from xds_check import check_any, check_resource, require

grpc = require("grpc")
require("envoy.config.cluster.v3.cluster_pb2")
require("protoc_gen_validate.validator")

from envoy.config.core.v3 import base_pb2  # noqa: E402
from envoy.config.cluster.v3 import cluster_pb2  # noqa: E402
from envoy.config.listener.v3 import listener_pb2  # noqa: E402
from envoy.extensions.filters.network.http_connection_manager.v3 import (  # noqa: E402
    http_connection_manager_pb2 as hcm_pb2)
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2  # noqa: E402
from google.rpc import status_pb2  # noqa: E402

from conftest import CairnServer, get, put  # noqa: E402
from conftest import acl_server as start_acl_server  # noqa: E402
from test_xds import (CDS, EDS, LDS, RDS, TYPES, Sidecar, check, config,  # noqa: E402,F401
                      mesh, register, sidecar_service)


class Sotw:
    """One state-of-the-world ADS stream as Envoy or gRPC run it: clusters
    and listeners by wildcard (or the listeners named), then the endpoints
    of the EDS clusters and the routes of the listeners; every response
    ACKed with its version and nonce (or NACKed on purpose), and every
    resource kept as received."""

    def __init__(self, addr, node_id, listeners=(), token=None, node_meta=None):
        self.channel = grpc.insecure_channel(addr)
        self.requests = queue.Queue()
        self.responses = queue.Queue()
        self.state = {t: {} for t in TYPES}
        self.raw = {t: {} for t in TYPES}
        self.versions = {}
        self.nack_next = None
        self.node = base_pb2.Node(id=node_id, cluster=node_id)
        for k, v in (node_meta or {}).items():
            self.node.metadata.fields[k].string_value = v
        self.names = {CDS: [], LDS: sorted(listeners), EDS: None, RDS: None}
        self._send(CDS, "", "")
        self._send(LDS, "", "")
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        metadata = (("x-consul-token", token),) if token else None
        self.call = stub.StreamAggregatedResources(iter(self.requests.get, None), metadata=metadata)
        threading.Thread(target=self._read, daemon=True).start()

    def _send(self, t, version, nonce, error=None):
        self.requests.put(discovery_pb2.DiscoveryRequest(
            node=self.node, type_url=t, version_info=version, response_nonce=nonce,
            resource_names=self.names[t] or [], error_detail=error))

    def _read(self):
        try:
            for r in self.call:
                self.responses.put(r)
        except grpc.RpcError as e:
            self.responses.put(e)

    def close(self):
        self.requests.put(None)
        self.call.cancel()
        self.channel.close()

    def _handle(self, resp):
        if isinstance(resp, grpc.RpcError):
            raise resp
        t = resp.type_url
        assert resp.nonce and resp.version_info
        if self.nack_next == t:
            self.nack_next = None
            self._send(t, self.versions.get(t, ""), resp.nonce,
                       status_pb2.Status(code=3, message="rejected by the test"))
            return
        self.state[t], self.raw[t] = {}, {}
        for a in resp.resources:
            msg = TYPES[t]()
            assert a.Unpack(msg), f"not a {t}"
            name = msg.cluster_name if t == EDS else msg.name
            self.state[t][name], self.raw[t][name] = msg, a
        self.versions[t] = resp.version_info
        self._send(t, resp.version_info, resp.nonce)
        if t == CDS:
            self._follow(EDS, {c.eds_cluster_config.service_name or n
                               for n, c in self.state[CDS].items()
                               if c.type == cluster_pb2.Cluster.EDS})
        if t == LDS:
            routes = set()
            for l in self.state[LDS].values():
                managers = [f.typed_config for fc in l.filter_chains for f in fc.filters]
                if l.HasField("api_listener"):
                    managers.append(l.api_listener.api_listener)
                for any_msg in managers:
                    if any_msg.Is(hcm_pb2.HttpConnectionManager.DESCRIPTOR):
                        m = hcm_pb2.HttpConnectionManager()
                        any_msg.Unpack(m)
                        if m.HasField("rds"):
                            routes.add(m.rds.route_config_name)
            self._follow(RDS, routes)

    def _follow(self, t, want):
        if sorted(want) != self.names[t]:
            self.names[t] = sorted(want)
            self._send(t, self.versions.get(t, ""), "")

    def wait(self, what, pred, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not pred(self):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {what}: "
                                     f"{ {t.rsplit('.', 1)[-1]: sorted(v) for t, v in self.state.items()} }")
            try:
                self._handle(self.responses.get(timeout=left))
            except queue.Empty:
                pass

    def refusal(self):
        with pytest.raises(grpc.RpcError) as e:
            self.wait("the stream's refusal", lambda s: False)
        return e.value


def invalid(resources):
    """Every validation failure of a {type: {name: Any}} map."""
    return [f"{name}: {f}" for by_name in resources.values()
            for name, a in by_name.items() for f in check_any(a)]


@pytest.fixture(scope="module")
def routed(mesh):
    """The mesh of test_xds with a router, a splitter, a failover and
    intentions (a deny, an L7 permission) on web's upstream api."""
    url = mesh.url
    config(url, {"Kind": "service-resolver", "Name": "api",
                 "ConnectTimeout": "3s",
                 "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"},
                             "v2": {"Filter": "Service.Meta.version == v2"}},
                 "Failover": {"*": {"Service": "api-backup"}}})
    config(url, {"Kind": "service-splitter", "Name": "api", "Splits": [
        {"Weight": 90, "ServiceSubset": "v1"}, {"Weight": 10, "ServiceSubset": "v2"}]})
    config(url, {"Kind": "service-router", "Name": "api", "Routes": [{
        "Match": {"HTTP": {"PathPrefix": "/admin", "Header": [{"Name": "x-debug", "Present": True}],
                           "Methods": ["GET", "POST"]}},
        "Destination": {"ServiceSubset": "v2", "RequestTimeout": "2s", "NumRetries": 2,
                        "RetryOnConnectFailure": True}}]})
    config(url, {"Kind": "service-intentions", "Name": "web", "Sources": [
        {"Name": "db", "Action": "deny"},
        {"Name": "api", "Permissions": [{"Action": "allow", "HTTP": {
            "PathPrefix": "/v1", "Methods": ["GET"], "Header": [{"Name": "x-a", "Exact": "1"}]}}]}]})
    return mesh


def full(s):
    return (s.state[CDS] and s.state[EDS] and s.state[RDS]
            and any(n.startswith("public_listener:") for n in s.state[LDS])
            and any(n.startswith("api:") for n in s.state[LDS]))


def test_the_checker_finds_what_envoy_would_refuse():
    """The checker is no rubber stamp: a cluster with a negative timeout
    and a listener whose connection manager (inside an Any) has no stat
    prefix are refused."""
    from google.protobuf import duration_pb2
    bad = cluster_pb2.Cluster(name="c", connect_timeout=duration_pb2.Duration(seconds=-1))
    assert any("connect_timeout" in f for f in check_resource(bad))
    hcm = hcm_pb2.HttpConnectionManager(rds=hcm_pb2.Rds(route_config_name="r"))
    l = listener_pb2.Listener(name="l")
    l.api_listener.api_listener.Pack(hcm)
    assert any("stat_prefix" in f for f in check_resource(l))


def test_a_sidecars_resources_pass_envoys_validation_on_both_protocols(routed):
    addr = f"127.0.0.1:{routed.grpc_port}"
    delta = Sidecar(addr, "web-sidecar-proxy", node_name="n1")
    sotw = Sotw(addr, "web-sidecar-proxy", node_meta={"node_name": "n1"})
    try:
        delta.wait("everything", full)
        sotw.wait("everything", full)
        delta_raw = {t: {} for t in TYPES}
        for t, by_name in delta.state.items():
            for name, msg in by_name.items():
                delta_raw[t][name] = pack(msg)
        assert invalid(delta_raw) == []
        assert invalid(sotw.raw) == []
        # The two protocols serve the same resources.
        for t in TYPES:
            assert sorted(sotw.state[t]) == sorted(delta.state[t]), t
            for name, msg in sotw.state[t].items():
                assert msg == delta.state[t][name], (t, name)
    finally:
        delta.close()
        sotw.close()


def pack(msg):
    from google.protobuf import any_pb2
    a = any_pb2.Any()
    a.Pack(msg)
    return a


def test_a_nack_keeps_the_stream_and_the_next_change_arrives(routed):
    s = Sotw(f"127.0.0.1:{routed.grpc_port}", "web-sidecar-proxy", node_meta={"node_name": "n1"})
    try:
        s.wait("everything", full)
        before = s.versions[EDS]
        s.nack_next = EDS
        register(routed.url, "n4", "10.0.0.4", sidecar_service(
            "api-sidecar-proxy", "api", 21003, 9090, meta={"version": "v1"}),
            [check("n4", "api-sidecar-proxy")])
        nacks = nack_count(routed.url)
        s.wait("the NACK sent", lambda s: s.nack_next is None)
        assert s.versions[EDS] == before
        deadline = time.monotonic() + 5
        while nack_count(routed.url) != nacks + 1:
            assert time.monotonic() < deadline, "the NACK was not counted"
            time.sleep(0.05)
        register(routed.url, "n5", "10.0.0.5", sidecar_service(
            "api-sidecar-proxy", "api", 21004, 9090, meta={"version": "v1"}),
            [check("n5", "api-sidecar-proxy")])
        s.wait("the next endpoints", lambda s: any(
            e.endpoint.address.socket_address.address == "10.0.0.5"
            for cla in s.state[EDS].values() for le in cla.endpoints for e in le.lb_endpoints))
        assert int(s.versions[EDS]) > int(before) + 1
    finally:
        s.close()


def nack_count(url):
    """cairn_xds_nacks_total, from the server's Prometheus metrics."""
    import urllib.request
    with urllib.request.urlopen(url + "/v1/agent/metrics?format=prometheus", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("cairn_xds_nacks_total "):
                return float(line.split()[1])
    raise AssertionError("no cairn_xds_nacks_total")


def proxyless_mesh(url, token=None):
    q = f"?token={token}" if token else ""
    for i, version in ((1, "v1"), (2, "v2")):
        put(f"{url}/v1/catalog/register{q}", {
            "Node": "g1", "Address": "127.0.0.1",
            "Service": {"ID": f"greeter-{i}", "Service": "greeter", "Port": 50050 + i,
                        "Meta": {"version": version}},
            "Checks": [{"CheckID": f"greeter-{i}", "Name": "alive", "ServiceID": f"greeter-{i}",
                        "Status": "passing"}]})
    for sid, name in (("greeter-backup", "greeter-backup"), ("grpc-client", "client")):
        put(f"{url}/v1/catalog/register{q}", {
            "Node": "g1", "Address": "127.0.0.1",
            "Service": {"ID": sid, "Service": name, "Port": 50060}})


def test_a_proxyless_clients_resources_pass_envoys_validation(cairn):
    url = cairn.url
    proxyless_mesh(url)
    for name in ("greeter", "greeter-backup"):
        config(url, {"Kind": "service-defaults", "Name": name, "Protocol": "grpc"})
    config(url, {"Kind": "service-resolver", "Name": "greeter",
                 "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"},
                             "v2": {"Filter": "Service.Meta.version == v2"}},
                 "Failover": {"*": {"Service": "greeter-backup"}}})
    config(url, {"Kind": "service-splitter", "Name": "greeter", "Splits": [
        {"Weight": 90, "ServiceSubset": "v1"}, {"Weight": 10, "ServiceSubset": "v2"}]})
    s = Sotw(f"127.0.0.1:{cairn.grpc_port}", "grpc-client", listeners=["greeter"])
    try:
        s.wait("the greeter's resources", lambda s: s.state[EDS] and "greeter" in s.state[RDS])
        assert list(s.state[LDS]) == ["greeter"]
        l = s.state[LDS]["greeter"]
        assert l.HasField("api_listener") and not l.HasField("address")
        vh = s.state[RDS]["greeter"].virtual_hosts
        assert [list(v.domains) for v in vh] == [["greeter"]]
        weights = sorted(c.weight.value for c in vh[0].routes[0].route.weighted_clusters.clusters)
        assert weights == [1000, 9000]
        for c in s.state[CDS].values():
            assert not c.HasField("transport_socket"), "no mesh TLS for a proxyless client"
        ports = sorted(e.endpoint.address.socket_address.port_value
                       for cla in s.state[EDS].values() for le in cla.endpoints
                       for e in le.lb_endpoints)
        assert 50051 in ports and 50052 in ports, "the instances' own ports"
        for cla in s.state[EDS].values():
            assert [le.priority for le in cla.endpoints] == list(range(len(cla.endpoints)))
            assert all(le.load_balancing_weight.value == 1 for le in cla.endpoints)
        assert invalid(s.raw) == []
    finally:
        s.close()


def test_a_proxyless_client_must_be_a_registered_instance(cairn):
    s = Sotw(f"127.0.0.1:{cairn.grpc_port}", "nobody", listeners=["greeter"])
    try:
        assert s.refusal().code() == grpc.StatusCode.NOT_FOUND
    finally:
        s.close()


ROOT = "6f1c2a4e-0000-4000-8000-0000000000bb"


@pytest.fixture(scope="module")
def acl_server():
    server = start_acl_server(ROOT)
    proxyless_mesh(server.url, ROOT)
    yield server
    server.stop()


def token(server, rules):
    policy = put(f"{server.url}/v1/acl/policy?token={ROOT}",
                 {"Name": f"p{time.monotonic_ns()}", "Rules": rules})
    return put(f"{server.url}/v1/acl/token?token={ROOT}",
               {"Policies": [{"ID": policy["ID"]}]})["SecretID"]


def test_sotw_under_acls_anonymous_and_a_token_one_permission_short_are_refused(acl_server):
    addr = f"127.0.0.1:{acl_server.grpc_port}"
    for tok in (None, token(acl_server, 'service "client" { policy = "read" }')):
        s = Sotw(addr, "grpc-client", listeners=["greeter"], token=tok)
        try:
            err = s.refusal()
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err
            assert "service:write" in err.details()
        finally:
            s.close()


def test_sotw_a_token_in_the_node_metadata_and_only_readable_services_served(acl_server):
    tok = token(acl_server, 'service "client" { policy = "write" }\n'
                            'service "greeter" { policy = "read" }')
    s = Sotw(f"127.0.0.1:{acl_server.grpc_port}", "grpc-client",
             listeners=["greeter", "greeter-backup"], node_meta={"x-consul-token": tok})
    try:
        s.wait("the greeter's endpoints", lambda s: s.state[EDS])
        # greeter-backup is not readable: no listener for it (the client
        # takes it as nonexistent).
        assert sorted(s.state[LDS]) == ["greeter"]
    finally:
        s.close()


def test_sotw_streams_share_the_stream_cap_and_the_name_bound():
    server = CairnServer(["--grpc-max-streams", "1"])
    try:
        proxyless_mesh(server.url)
        addr = f"127.0.0.1:{server.grpc_port}"
        first = Sotw(addr, "grpc-client", listeners=["greeter"])
        try:
            first.wait("the first stream's listener", lambda s: "greeter" in s.state[LDS])
            # A Delta stream and a second state-of-the-world one: no slot.
            delta = Sidecar(addr, "grpc-client")
            assert delta.refusal().code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            delta.close()
            second = Sotw(addr, "grpc-client", listeners=["greeter"])
            assert second.refusal().code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            second.close()
        finally:
            first.close()
    finally:
        server.stop()
    server = CairnServer()
    try:
        proxyless_mesh(server.url)
        many = Sotw(f"127.0.0.1:{server.grpc_port}", "grpc-client",
                    listeners=[f"s{i}" for i in range(10_001)])
        try:
            err = many.refusal()
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            assert "10001 resource names" in err.details()
        finally:
            many.close()
    finally:
        server.stop()
