"""Gateways' and sidecars' TLS, L7 intentions at terminating gateways and
terminating gateways' virtual IPs, read from a real `cairn server --dev`
over Delta ADS (test_xds's client) and checked against Envoy's own
validation rules (test_xds_validate's checker, the protoc-gen-validate
annotations of xds-protos): an ingress gateway's leaf names its hosts and
its SDS certificates name their cluster; the mesh entry's TLS reaches a
sidecar's public listener and upstream clusters; an http service behind a
terminating gateway gets the HTTP RBAC of its L7 intentions; a service a
terminating gateway links has a virtual IP that DNS answers for (`dig`)."""

import shutil
import subprocess

import pytest

from xds_check import require

require("grpc")
require("envoy.config.cluster.v3.cluster_pb2")
require("protoc_gen_validate.validator")

from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2  # noqa: E402
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2  # noqa: E402

from conftest import get  # noqa: E402
from test_xds import (  # noqa: E402
    CDS, LDS, RDS, TYPES, Sidecar, ca_roots, check, config, hcm_pb2, register,
    sidecar_service, unpack,
)
from test_xds_validate import invalid, pack  # noqa: E402


def by_sni(listener):
    """A gateway listener's chains by the server name each matches (the
    last, `sni_cluster` catch-all matches none and is left out)."""
    return {fc.filter_chain_match.server_names[0]: fc
            for fc in listener.filter_chains if fc.filter_chain_match.server_names}


@pytest.fixture(scope="module")
def world(cairn):
    """web and api (http) with sidecars on n1 (web's upstream: api); an
    ingress gateway `ig` on gw1, a terminating gateway `tg` on gw2;
    billing (http) and ledger (tcp) outside the mesh on n9."""
    url = cairn.url
    for svc in ("web", "api", "billing"):
        config(url, {"Kind": "service-defaults", "Name": svc, "Protocol": "http"})
    register(url, "n1", "127.0.0.11", {"ID": "web", "Service": "web", "Port": 8080})
    register(url, "n1", "127.0.0.11", sidecar_service(
        "web-sidecar-proxy", "web", 21000, 8080,
        upstreams=[{"DestinationName": "api", "LocalBindPort": 9191}]),
        [check("n1", "web-sidecar-proxy")])
    register(url, "n1", "127.0.0.11", {"ID": "api", "Service": "api", "Port": 8081})
    register(url, "n1", "127.0.0.11", sidecar_service("api-sidecar-proxy", "api", 21001, 8081),
             [check("n1", "api-sidecar-proxy")])
    register(url, "gw1", "127.0.0.21",
             {"Kind": "ingress-gateway", "ID": "ig", "Service": "ig", "Port": 8443})
    register(url, "gw2", "127.0.0.22",
             {"Kind": "terminating-gateway", "ID": "tg", "Service": "tg", "Port": 8444})
    register(url, "n9", "127.0.0.99", {"ID": "billing", "Service": "billing", "Port": 443})
    register(url, "n9", "127.0.0.99", {"ID": "ledger", "Service": "ledger", "Port": 5433})
    return cairn


def stream(world, sid, node):
    return Sidecar(f"127.0.0.1:{world.grpc_port}", sid, node_name=node)


def everything(s):
    return {t: {name: pack(msg) for name, msg in s.state[t].items()} for t in TYPES}


def downstream(fc):
    return unpack(fc.transport_socket.typed_config, tls_pb2.DownstreamTlsContext)


def sds(ctx):
    """(secret, SDS cluster) of a context's certificates over SDS."""
    return [(c.name, c.sds_config.api_config_source.grpc_services[0].envoy_grpc.cluster_name)
            for c in ctx.common_tls_context.tls_certificate_sds_secret_configs]


def dns_names(pem):
    from cryptography import x509
    cert = x509.load_pem_x509_certificate(pem.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName)


def test_an_ingress_gateways_tls_leaf_and_sds_pass_envoys_rules(world):
    url = world.url
    config(url, {"Kind": "ingress-gateway", "Name": "ig", "TLS": {"Enabled": True}, "Listeners": [
        {"Port": 8080, "Protocol": "http", "Services": [
            {"Name": "web", "Hosts": ["web.example.com"]}, {"Name": "api"}]}]})
    ig = stream(world, "ig", "gw1")
    try:
        name = "http:0.0.0.0:8080"

        def leaf_served(s):
            l = s.state[LDS].get(name)
            return l is not None and l.filter_chains[0].HasField("transport_socket") \
                and "8080" in s.state[RDS]
        ig.wait("the TLS listener with the gateway's leaf", leaf_served)
        ctx = downstream(ig.state[LDS][name].filter_chains[0])
        assert ctx.require_client_certificate.value is False
        assert list(ctx.common_tls_context.alpn_protocols) == ["http/1.1"]
        pem = ctx.common_tls_context.tls_certificates[0].certificate_chain.inline_string
        names = dns_names(pem)
        for want in ("*.ingress.consul", "*.ingress.dc1.consul", "web.example.com"):
            assert want in names, names
        assert invalid(everything(ig)) == []

        # SDS: the gateway's cluster, the listener's certificate, and web's
        # own certificate on a chain of its own matched by its host.
        config(url, {"Kind": "ingress-gateway", "Name": "ig",
                     "TLS": {"SDS": {"ClusterName": "sds-cluster"}}, "Listeners": [
            {"Port": 8080, "Protocol": "http", "TLS": {"SDS": {"CertResource": "default-cert"}},
             "Services": [
                 {"Name": "web", "Hosts": ["web.example.com"],
                  "TLS": {"SDS": {"CertResource": "web-cert"}}},
                 {"Name": "api"}]}]})

        def sni_chains(s):
            l = s.state[LDS].get(name)
            return l is not None and len(l.filter_chains) == 2 and "8080_web" in s.state[RDS]
        ig.wait("a chain per certificate", sni_chains)
        l = ig.state[LDS][name]
        assert [f.name for f in l.listener_filters] == ["envoy.filters.listener.tls_inspector"]
        web, rest = l.filter_chains
        assert list(web.filter_chain_match.server_names) == ["web.example.com"]
        assert sds(downstream(web)) == [("web-cert", "sds-cluster")]
        assert sds(downstream(rest)) == [("default-cert", "sds-cluster")]
        assert not downstream(rest).common_tls_context.tls_certificates
        routes = {vh.name for vh in ig.state[RDS]["8080"].virtual_hosts}
        assert routes == {"api"}
        assert [vh.name for vh in ig.state[RDS]["8080_web"].virtual_hosts] == ["web"]
        assert invalid(everything(ig)) == []
        assert ig.error is None
    finally:
        ig.close()


def test_an_sds_entry_missing_half_is_refused_and_changes_nothing(world):
    import urllib.error
    import urllib.request
    import json
    entry = {"Kind": "ingress-gateway", "Name": "ig-bad", "Listeners": [
        {"Port": 8080, "Protocol": "http", "TLS": {"SDS": {"ClusterName": "sds"}},
         "Services": [{"Name": "web"}]}]}
    req = urllib.request.Request(world.url + "/v1/config", data=json.dumps(entry).encode(),
                                 method="PUT")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    assert "TLS.SDS.CertResource is required if ClusterName is set for listener" in \
        e.value.read().decode()
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(world.url + "/v1/config/ingress-gateway/ig-bad", timeout=10)
    assert e.value.code == 404


def test_the_mesh_entrys_tls_reaches_a_sidecar(world):
    url = world.url
    config(url, {"Kind": "mesh", "Name": "mesh", "TLS": {
        "Incoming": {"TLSMinVersion": "TLSv1_2", "TLSMaxVersion": "TLSv1_2",
                     "CipherSuites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]},
        "Outgoing": {"TLSMinVersion": "TLSv1_3"}}})
    web = stream(world, "web-sidecar-proxy", "n1")
    try:
        td = ca_roots(url)["TrustDomain"]
        api = f"api.default.dc1.internal.{td}"

        def ready(s):
            l = s.listener("public_listener:")
            return l is not None and api in s.state[CDS] and \
                downstream(l.filter_chains[0]).common_tls_context.tls_params.cipher_suites
        web.wait("the mesh's TLS settings", ready)
        inbound = downstream(web.listener("public_listener:").filter_chains[0])
        params = inbound.common_tls_context.tls_params
        assert params.tls_minimum_protocol_version == common_pb2.TlsParameters.TLSv1_2
        assert params.tls_maximum_protocol_version == common_pb2.TlsParameters.TLSv1_2
        assert list(params.cipher_suites) == ["ECDHE-RSA-AES128-GCM-SHA256"]
        up = unpack(web.state[CDS][api].transport_socket.typed_config, tls_pb2.UpstreamTlsContext)
        assert up.common_tls_context.tls_params.tls_minimum_protocol_version == \
            common_pb2.TlsParameters.TLSv1_3
        assert invalid(everything(web)) == []
        assert web.error is None
    finally:
        web.close()
        config(url, {"Kind": "mesh", "Name": "mesh"})


def test_a_terminating_gateway_enforces_l7_intentions_and_its_services_have_vips(world):
    url = world.url
    config(url, {"Kind": "service-intentions", "Name": "billing", "Sources": [
        {"Name": "web", "Permissions": [
            {"Action": "allow", "HTTP": {"PathPrefix": "/v1", "Methods": ["GET"]}},
            {"Action": "deny", "HTTP": {"PathPrefix": "/"}}]}]})
    config(url, {"Kind": "terminating-gateway", "Name": "tg", "Services": [
        {"Name": "billing"}, {"Name": "ledger"}]})
    tg = stream(world, "tg", "gw2")
    try:
        td = ca_roots(url)["TrustDomain"]
        billing = f"billing.default.dc1.internal.{td}"
        name = "default:0.0.0.0:8444"
        tg.wait("billing's HTTP chain and its routes", lambda s:
                name in s.state[LDS] and len(by_sni(s.state[LDS][name])) == 2
                and billing in s.state[RDS])
        chains = by_sni(tg.state[LDS][name])
        fc = chains[billing]
        assert [f.name for f in fc.filters] == ["envoy.filters.network.http_connection_manager"]
        hcm = unpack(fc.filters[0].typed_config, hcm_pb2.HttpConnectionManager)
        assert [f.name for f in hcm.http_filters] == \
            ["envoy.filters.http.rbac", "envoy.filters.http.router"]
        rbac = unpack(hcm.http_filters[0].typed_config, http_rbac_pb2.RBAC)
        assert list(rbac.rules.policies) == ["consul-intentions-layer7-0"]
        ledger = chains[f"ledger.default.dc1.internal.{td}"]
        assert [f.name for f in ledger.filters] == \
            ["envoy.filters.network.rbac", "envoy.filters.network.tcp_proxy"]
        assert invalid(everything(tg)) == []
        assert tg.error is None
    finally:
        tg.close()

    # Both linked services have virtual IPs, which their chains carry and
    # DNS answers for.
    vips = {}
    for svc in ("billing", "ledger"):
        chain = get(f"{url}/v1/discovery-chain/{svc}")["Chain"]
        vips[svc] = chain.get("AutoVirtualIPs", [])
        assert len(vips[svc]) == 1 and vips[svc][0].startswith("240."), (svc, chain)
    assert vips["billing"] != vips["ledger"]
    if not shutil.which("dig"):
        pytest.skip("dig is not installed")

    def dig(name):
        out = subprocess.run(["dig", "+short", "+time=2", "+tries=1", "-p", str(world.dns_port),
                              "@127.0.0.1", name, "A"], capture_output=True, text=True, timeout=10)
        return out.stdout.split()
    assert dig("billing.virtual.consul") == vips["billing"]
    assert dig("ledger.virtual.consul") == vips["ledger"]
    assert dig("nope.virtual.consul") == []
