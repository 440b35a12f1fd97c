"""Mesh gateways across datacenters, checked against Envoy's own validation
rules (the protoc-gen-validate annotations of xds-protos, through
test_xds_validate's checker): dc1 and dc2 (dev servers joined with
--join-wan) with a mesh gateway each; web's sidecar in dc1 has the upstream
api, whose resolver fails over to dc2. In mesh gateway mode local its dc2
cluster's endpoints are dc1's gateway (LAN address), in mode remote dc2's
(WAN address); every resource of the sidecar in each mode, and of dc1's
mesh gateway (which routes dc2's names to dc2's gateway), passes Envoy's
rules."""

from xds_check import require

require("grpc")
require("envoy.config.cluster.v3.cluster_pb2")
require("protoc_gen_validate.validator")

from test_xds import CDS, EDS, LDS, TYPES, Sidecar, ca_roots, config, eds_hosts, register, unpack  # noqa: E402
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2  # noqa: E402
from test_xds_failover_dc import api, dcs  # noqa: E402,F401
from test_xds_validate import invalid, pack  # noqa: E402


def mesh_gateway(url, node, lan, wan):
    register(url, node, lan, {
        "ID": "mesh-gateway", "Service": "mesh-gateway", "Kind": "mesh-gateway",
        "Port": 8443, "Address": lan,
        "TaggedAddresses": {"lan": {"Address": lan, "Port": 8443},
                            "wan": {"Address": wan, "Port": 443}}})


def web(url, mode):
    register(url, "n1", "10.1.0.1", {
        "ID": "web-sidecar-proxy", "Service": "web-sidecar-proxy", "Kind": "connect-proxy",
        "Port": 21000,
        "Proxy": {"DestinationServiceName": "web", "LocalServicePort": 8080,
                  "Upstreams": [{"DestinationName": "api", "LocalBindPort": 9191,
                                 "MeshGateway": {"Mode": mode}}]}})


def everything(s):
    """Every resource the stream holds, packed as it came."""
    return {t: {name: pack(msg) for name, msg in s.state[t].items()} for t in TYPES}


def test_mesh_gateways_and_sidecars_through_them_pass_envoys_validation(dcs):
    dc1, dc2 = dcs
    api(dc1.url, "n2", "10.1.0.2", 21001, "passing")
    api(dc2.url, "far", "10.2.0.2", 22001, "passing")
    mesh_gateway(dc1.url, "gw1", "10.1.0.100", "192.0.2.1")
    mesh_gateway(dc2.url, "gw2", "10.2.0.100", "198.51.100.2")
    config(dc1.url, {"Kind": "service-resolver", "Name": "api",
                     "Failover": {"*": {"Datacenters": ["dc2"]}}})
    td = ca_roots(dc1.url)["TrustDomain"]
    far = f"api.default.dc2.internal.{td}"
    web(dc1.url, "local")
    addr = f"127.0.0.1:{dc1.grpc_port}"
    sidecar = Sidecar(addr, "web-sidecar-proxy", node_name="n1")
    try:
        # dc2's target is the failover tier of api's aggregate cluster
        # (named with the chain's customization hash: the upstream's mode
        # overrides the chain), with dc2's SNI, TLS passing the gateways.
        def far_tier(s):
            return next((n for n in s.state[CDS] if n.startswith("failover-target~1~")), None)

        def through(gateway):
            def ok(s):
                t = far_tier(s)
                if not (t and t in s.state[EDS] and eds_hosts(s.state[EDS][t]) == [(0, gateway)]
                        and s.state[CDS][t].HasField("transport_socket")):
                    return False
                tls = unpack(s.state[CDS][t].transport_socket.typed_config, tls_pb2.UpstreamTlsContext)
                return tls.sni == far
            return ok

        sidecar.wait("dc1's gateway for dc2's api (mode local)", through("10.1.0.100:8443"))
        assert invalid(everything(sidecar)) == []
        web(dc1.url, "remote")
        sidecar.wait("dc2's gateway for dc2's api (mode remote)", through("198.51.100.2:443"))
        assert invalid(everything(sidecar)) == []
    finally:
        sidecar.close()

    gateway = Sidecar(addr, "mesh-gateway", node_name="gw1")
    try:
        dc2_gateways = f"dc2.internal.{td}"
        gateway.wait("dc2's gateways behind dc1's", lambda s: dc2_gateways in s.state[EDS]
                     and eds_hosts(s.state[EDS][dc2_gateways]) == [(0, "198.51.100.2:443")]
                     and s.state[LDS])
        names = [list(fc.filter_chain_match.server_names)
                 for l in gateway.state[LDS].values() for fc in l.filter_chains]
        assert names[-1] == [], "the sni_cluster catch-all comes last"
        assert [f"*.{dc2_gateways}"] in names, names
        assert invalid(everything(gateway)) == []
    finally:
        gateway.close()
