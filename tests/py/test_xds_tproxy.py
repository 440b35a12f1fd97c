"""A transparent proxy's resources, over both ADS protocols, from a server
with ACLs on and default deny: its outbound listener
(`outbound_listener:127.0.0.1:15001`, the `original_dst` listener filter)
has one filter chain per upstream its service's intentions allow (none
registered), each matching exactly that service's virtual IP (as the
discovery chain's `AutoVirtualIPs` shows it); the chains follow the
intentions as they change; every resource passes Envoy's validation rules
(`xds_check`, the protoc-gen-validate annotations of Envoy's protos)."""

import urllib.request

import pytest

from xds_check import require

require("grpc")
require("envoy.config.cluster.v3.cluster_pb2")
require("protoc_gen_validate.validator")

from envoy.extensions.filters.listener.original_dst.v3 import original_dst_pb2  # noqa: E402
from envoy.extensions.filters.network.http_connection_manager.v3 import (  # noqa: E402
    http_connection_manager_pb2 as hcm_pb2)
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2  # noqa: E402

from conftest import acl_server, get, put  # noqa: E402
from test_xds import CDS, EDS, LDS, RDS, TYPES, Sidecar, check, sidecar_service  # noqa: E402
from test_xds_validate import Sotw, invalid, pack  # noqa: E402

ROOT = "6f1c2a4e-0000-4000-8000-0000000000cc"
OUTBOUND = "outbound_listener:127.0.0.1:15001"


def url(server, path):
    sep = "&" if "?" in path else "?"
    return f"{server.url}{path}{sep}token={ROOT}"


def config(server, entry):
    assert put(url(server, "/v1/config"), entry) is True


def delete_config(server, kind, name):
    req = urllib.request.Request(url(server, f"/v1/config/{kind}/{name}"), method="DELETE")
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def allow(server, source, dest):
    config(server, {"Kind": "service-intentions", "Name": dest,
                    "Sources": [{"Name": source, "Action": "allow"}]})


@pytest.fixture(scope="module")
def mesh():
    """web (a transparent proxy, no upstream registered), api (http), db
    and cache (tcp), each with a sidecar; web may reach api and db."""
    server = acl_server(ROOT)
    config(server, {"Kind": "service-defaults", "Name": "api", "Protocol": "http"})
    for i, name in enumerate(["web", "api", "db", "cache"], start=1):
        node, addr = f"n{i}", f"10.0.0.{i}"
        sid = f"{name}-sidecar-proxy"
        put(url(server, "/v1/catalog/register"), {
            "Node": node, "Address": addr,
            "Service": {"ID": name, "Service": name, "Port": 8080}})
        svc = sidecar_service(sid, name, 21000, 8080)
        if name == "web":
            svc["Proxy"]["Mode"] = "transparent"
        put(url(server, "/v1/catalog/register"), {
            "Node": node, "Address": addr, "Service": svc, "Checks": [check(node, sid)]})
    allow(server, "web", "api")
    allow(server, "web", "db")
    yield server
    server.stop()


def vip(server, service):
    chain = get(url(server, f"/v1/discovery-chain/{service}"))["Chain"]
    return chain["AutoVirtualIPs"]


def outbound_chains(state):
    """{filter chain name: sorted matched addresses} of the outbound
    listener (None while it has not arrived)."""
    l = state[LDS].get(OUTBOUND)
    if l is None:
        return None
    return {fc.name: sorted(r.address_prefix for r in fc.filter_chain_match.prefix_ranges)
            for fc in l.filter_chains}


def delta_raw(s):
    return {t: {name: pack(msg) for name, msg in by_name.items()}
            for t, by_name in s.state.items()}


def test_the_outbound_listener_follows_the_intentions(mesh):
    vips = {name: vip(mesh, name) for name in ("api", "db", "cache")}
    for name, v in vips.items():
        assert len(v) == 1 and v[0].startswith("240."), (name, v)
    assert len({v[0] for v in vips.values()}) == 3, vips
    addr = f"127.0.0.1:{mesh.grpc_port}"
    delta = Sidecar(addr, "web-sidecar-proxy", node_name="n1", token=ROOT)
    sotw = Sotw(addr, "web-sidecar-proxy", node_meta={"node_name": "n1"}, token=ROOT)
    try:
        def upstreams(*names):
            want = {n: vips[n] for n in names}

            def ready(s):
                # The chains, and what they lead to: api's route, every
                # EDS cluster's endpoints.
                return (outbound_chains(s.state) == want
                        and ("api" in s.state[RDS]) == ("api" in names)
                        and all((c.eds_cluster_config.service_name or n) in s.state[EDS]
                                for n, c in s.state[CDS].items()
                                if c.HasField("eds_cluster_config")))
            return ready

        for s in (delta, sotw):
            s.wait("api's and db's chains", upstreams("api", "db"))
        l = delta.state[LDS][OUTBOUND]
        assert l.address.socket_address.address == "127.0.0.1"
        assert l.address.socket_address.port_value == 15001
        assert [f.name for f in l.listener_filters] == ["envoy.filters.listener.original_dst"]
        assert l.listener_filters[0].typed_config.Is(original_dst_pb2.OriginalDst.DESCRIPTOR)
        by_name = {fc.name: fc for fc in l.filter_chains}
        hcm = hcm_pb2.HttpConnectionManager()
        assert by_name["api"].filters[0].typed_config.Unpack(hcm)
        assert hcm.rds.route_config_name == "api"
        tcp = tcp_proxy_pb2.TcpProxy()
        assert by_name["db"].filters[0].typed_config.Unpack(tcp)
        assert tcp.cluster.startswith("db.default.dc1.internal.")
        assert tcp.cluster in delta.state[CDS]
        # Everything else passes through to where it was going.
        tcp = tcp_proxy_pb2.TcpProxy()
        assert l.default_filter_chain.filters[0].typed_config.Unpack(tcp)
        assert tcp.cluster == "original-destination"
        assert "original-destination" in delta.state[CDS]
        assert not any(n.startswith("cache.") for n in delta.state[CDS])
        assert invalid(delta_raw(delta)) == []
        assert invalid(sotw.raw) == []

        # cache allowed, then db's intention gone: the chains follow.
        allow(mesh, "web", "cache")
        for s in (delta, sotw):
            s.wait("cache's chain added", upstreams("api", "cache", "db"))
        delete_config(mesh, "service-intentions", "db")
        for s in (delta, sotw):
            s.wait("db's chain gone", upstreams("api", "cache"))
        assert not any(n.startswith("db.") for n in delta.state[CDS])
        assert invalid(delta_raw(delta)) == []
        assert invalid(sotw.raw) == []
        # The protocols agree (Envoy drops what it unsubscribed from; the
        # Delta client here keeps it, so only its subscribed endpoints count).
        for t in TYPES:
            have = [n for n in delta.state[t] if t != EDS or n in delta.subs[EDS]]
            assert sorted(sotw.state[t]) == sorted(have), t

        # A manual virtual IP reaches the chain that matches api.
        r = put(url(mesh, "/v1/internal/service-virtual-ip"),
                {"Service": "api", "ManualVIPs": ["10.1.1.1"]})
        assert r["Found"] is True
        for s in (delta, sotw):
            s.wait("api's manual IP", lambda s: (outbound_chains(s.state) or {}).get("api")
                   == sorted(["10.1.1.1", *vips["api"]]))

        # The mesh entry keeps traffic inside the mesh: no passthrough.
        config(mesh, {"Kind": "mesh", "Name": "mesh",
                      "TransparentProxy": {"MeshDestinationsOnly": True}})
        for s in (delta, sotw):
            s.wait("the passthrough gone", lambda s: OUTBOUND in s.state[LDS]
                   and not s.state[LDS][OUTBOUND].HasField("default_filter_chain")
                   and "original-destination" not in s.state[CDS])
        assert invalid(delta_raw(delta)) == []
        assert invalid(sotw.raw) == []
    finally:
        delta.close()
        sotw.close()
