"""Gateways' xDS, read by the Delta-ADS client of test_xds.py (grpcio and
Envoy's own protos): an ingress gateway's listeners, routes and clusters
name exactly the ports, hosts and services of its config entry and follow
the entry when it changes; a terminating gateway has a filter chain per
linked service, matched by the service's SNI, with the intentions' RBAC
and TLS origination where the entry asks for it. No traffic is sent: the
addresses registered are loopback ones, and only configuration is read."""

import pytest

from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2

from test_xds import (
    CDS, EDS, LDS, RDS, Sidecar, ca_roots, check, config, eds_hosts, hcm_pb2,
    net_rbac_pb2, register, sidecar_service, unpack,
)


def by_sni(listener):
    """A gateway listener's chains by the server name each matches (the
    last, `sni_cluster` catch-all matches none and is left out)."""
    return {fc.filter_chain_match.server_names[0]: fc
            for fc in listener.filter_chains if fc.filter_chain_match.server_names}


@pytest.fixture(scope="module")
def world(cairn):
    """web and api (http) and db (tcp), each with a sidecar on n1; an
    ingress gateway `ig` on gw1 and a terminating gateway `tg` on gw2;
    billing and ledger outside the mesh on n9."""
    url = cairn.url
    for svc in ("web", "api"):
        config(url, {"Kind": "service-defaults", "Name": svc, "Protocol": "http"})
    for svc, port, proxy_port in (("web", 8080, 21000), ("api", 8081, 21001), ("db", 5432, 21002)):
        register(url, "n1", "127.0.0.11", {"ID": svc, "Service": svc, "Port": port})
        register(url, "n1", "127.0.0.11", sidecar_service(f"{svc}-sidecar-proxy", svc, proxy_port, port),
                 [check("n1", f"{svc}-sidecar-proxy")])
    register(url, "gw1", "127.0.0.21",
             {"Kind": "ingress-gateway", "ID": "ig", "Service": "ig", "Port": 8443})
    register(url, "gw2", "127.0.0.22",
             {"Kind": "terminating-gateway", "ID": "tg", "Service": "tg", "Port": 8444})
    register(url, "n9", "127.0.0.99", {"ID": "billing", "Service": "billing", "Port": 443})
    register(url, "n9", "127.0.0.99", {"ID": "ledger", "Service": "ledger", "Port": 5433,
                                       "Address": "127.0.0.98"})
    return cairn


def gateway(world, sid, node):
    return Sidecar(f"127.0.0.1:{world.grpc_port}", sid, node_name=node)


def sni(svc, trust_domain):
    return f"{svc}.default.dc1.internal.{trust_domain}"


def route_clusters(vh):
    return sorted({r.route.cluster for r in vh.routes})


def test_an_ingress_gateway_serves_exactly_its_entry_and_follows_it(world):
    url = world.url
    td = ca_roots(url)["TrustDomain"]
    config(url, {"Kind": "ingress-gateway", "Name": "ig", "Defaults": {"MaxConnections": 100}, "Listeners": [
        {"Port": 8080, "Protocol": "http", "Services": [
            {"Name": "web", "Hosts": ["web.example.com", "www.example.com"], "MaxConcurrentRequests": 7,
             "RequestHeaders": {"Set": {"X-Gateway": "ig"}, "Remove": ["X-Debug"]}},
            {"Name": "api"}]},
        {"Port": 9090, "Protocol": "tcp", "Services": [{"Name": "db"}]}]})
    ig = gateway(world, "ig", "gw1")
    try:
        want_listeners = {"http:0.0.0.0:8080", "db:0.0.0.0:9090"}
        want_clusters = {sni("web", td), sni("api", td), sni("db", td)}
        ig.wait("the entry's two listeners, its route and three clusters", lambda s:
                set(s.state[LDS]) == want_listeners and "8080" in s.state[RDS]
                and set(s.state[CDS]) == want_clusters
                and want_clusters <= set(s.state[EDS]))
        http = ig.state[LDS]["http:0.0.0.0:8080"]
        assert http.address.socket_address.port_value == 8080
        hcm = unpack(http.filter_chains[0].filters[0].typed_config, hcm_pb2.HttpConnectionManager)
        assert hcm.rds.route_config_name == "8080"

        routes = ig.state[RDS]["8080"]
        hosts = {vh.name: vh for vh in routes.virtual_hosts}
        assert sorted(hosts) == ["api", "web"]
        # Each host also with the listener's port (a Host header carries it).
        assert sorted(hosts["web"].domains) == ["web.example.com", "web.example.com:8080",
                                                "www.example.com", "www.example.com:8080"]
        assert sorted(hosts["api"].domains) == ["api.ingress.*", "api.ingress.*:8080"]
        assert route_clusters(hosts["web"]) == [sni("web", td)]
        assert route_clusters(hosts["api"]) == [sni("api", td)]
        assert [(h.header.key, h.header.value) for h in hosts["web"].request_headers_to_add] == \
            [("X-Gateway", "ig")]
        assert list(hosts["web"].request_headers_to_remove) == ["X-Debug"]

        tcp = ig.state[LDS]["db:0.0.0.0:9090"]
        proxy = unpack(tcp.filter_chains[0].filters[0].typed_config, tcp_proxy_pb2.TcpProxy)
        assert proxy.cluster == sni("db", td)
        # Clusters reach the services' sidecars, with the mesh's mTLS.
        assert eds_hosts(ig.state[EDS][sni("web", td)]) == [(0, "127.0.0.11:21000")]
        up = unpack(ig.state[CDS][sni("web", td)].transport_socket.typed_config,
                    tls_pb2.UpstreamTlsContext)
        assert up.sni == sni("web", td)
        # A service's own limits, else the entry's Defaults.
        web_limits = ig.state[CDS][sni("web", td)].circuit_breakers.thresholds[0]
        assert (web_limits.max_connections.value, web_limits.max_requests.value) == (100, 7)
        api_limits = ig.state[CDS][sni("api", td)].circuit_breakers.thresholds[0]
        assert api_limits.max_connections.value == 100 and not api_limits.HasField("max_requests")

        # The entry changes: api leaves, the http listener moves to 8088 and
        # serves TLS, db's listener goes. The gateway follows.
        config(url, {"Kind": "ingress-gateway", "Name": "ig",
                     "TLS": {"Enabled": True, "TLSMinVersion": "TLSv1_2",
                             "CipherSuites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]}, "Listeners": [
            {"Port": 8088, "Protocol": "http", "Services": [
                {"Name": "web", "Hosts": ["web.example.com"]}]}]})
        ig.wait("the changed entry", lambda s:
                set(s.state[LDS]) == {"http:0.0.0.0:8088"} and "8088" in s.state[RDS]
                and set(s.state[CDS]) == {sni("web", td)})
        routes = ig.state[RDS]["8088"]
        assert [(vh.name, list(vh.domains)) for vh in routes.virtual_hosts] == \
            [("web", ["web.example.com", "web.example.com:8088"])]
        moved = ig.state[LDS]["http:0.0.0.0:8088"]
        assert moved.filter_chains[0].HasField("transport_socket")
        down = unpack(moved.filter_chains[0].transport_socket.typed_config, tls_pb2.DownstreamTlsContext)
        assert "BEGIN CERTIFICATE" in down.common_tls_context.tls_certificates[0].certificate_chain.inline_string
        params = down.common_tls_context.tls_params
        assert params.tls_minimum_protocol_version == common_pb2.TlsParameters.TLSv1_2
        assert list(params.cipher_suites) == ["ECDHE-RSA-AES128-GCM-SHA256"]
        assert ig.error is None
    finally:
        ig.close()


def test_a_terminating_gateway_has_a_filter_chain_per_linked_service(world):
    url = world.url
    td = ca_roots(url)["TrustDomain"]
    config(url, {"Kind": "terminating-gateway", "Name": "tg", "Services": [
        {"Name": "billing", "CAFile": "/etc/billing/ca.pem", "SNI": "billing.example.com"},
        {"Name": "ledger"}]})
    config(url, {"Kind": "service-intentions", "Name": "billing",
                 "Sources": [{"Name": "web", "Action": "allow"}, {"Name": "*", "Action": "deny"}]})
    tg = gateway(world, "tg", "gw2")
    try:
        name = "default:0.0.0.0:8444"
        tg.wait("the terminating listener with two chains", lambda s:
                name in s.state[LDS] and len(by_sni(s.state[LDS][name])) == 2
                and {sni("billing", td), sni("ledger", td)} <= set(s.state[CDS]))
        l = tg.state[LDS][name]
        assert [f.name for f in l.listener_filters] == ["envoy.filters.listener.tls_inspector"]
        chains = by_sni(l)
        assert sorted(chains) == sorted([sni("billing", td), sni("ledger", td)])
        # Last, as Consul's, the catch-all: any other name goes to the
        # cluster it names, which no cluster of the gateway is.
        assert [f.name for f in l.filter_chains[-1].filters] == \
            ["envoy.filters.network.sni_cluster", "envoy.filters.network.tcp_proxy"]
        for svc in ("billing", "ledger"):
            fc = chains[sni(svc, td)]
            kinds = [f.name for f in fc.filters]
            assert kinds == ["envoy.filters.network.rbac", "envoy.filters.network.tcp_proxy"]
            proxy = unpack(fc.filters[1].typed_config, tcp_proxy_pb2.TcpProxy)
            assert proxy.cluster == sni(svc, td)
            # The gateway answers for the service with the service's leaf.
            down = unpack(fc.transport_socket.typed_config, tls_pb2.DownstreamTlsContext)
            assert down.require_client_certificate.value is True
        # billing's intentions are enforced at the gateway: with this
        # (ACL-less) server's default of allow, the deny of `*` is a DENY
        # policy; ledger has no intentions, so nothing is denied.
        from envoy.config.rbac.v3 import rbac_pb2
        rbac = unpack(chains[sni("billing", td)].filters[0].typed_config, net_rbac_pb2.RBAC)
        assert rbac.rules.action == rbac_pb2.RBAC.DENY
        assert len(rbac.rules.policies) == 1, rbac
        rbac = unpack(chains[sni("ledger", td)].filters[0].typed_config, net_rbac_pb2.RBAC)
        assert not rbac.rules.policies, rbac

        # Clusters to the services' own addresses (IPs: by EDS, as
        # Consul's); TLS origination for billing.
        tg.wait("the linked services' endpoints", lambda s:
                {sni("billing", td), sni("ledger", td)} <= set(s.state[EDS]))
        billing = tg.state[CDS][sni("billing", td)]
        assert billing.type == cluster_pb2.Cluster.EDS
        assert eds_hosts(tg.state[EDS][sni("billing", td)]) == [(0, "127.0.0.99:443")]
        up = unpack(billing.transport_socket.typed_config, tls_pb2.UpstreamTlsContext)
        assert up.sni == "billing.example.com"
        assert up.common_tls_context.validation_context.trusted_ca.filename == "/etc/billing/ca.pem"
        ledger = tg.state[CDS][sni("ledger", td)]
        assert eds_hosts(tg.state[EDS][sni("ledger", td)]) == [(0, "127.0.0.98:5433")]
        assert not ledger.HasField("transport_socket")

        # Unlinking ledger removes its chain and cluster.
        config(url, {"Kind": "terminating-gateway", "Name": "tg", "Services": [
            {"Name": "billing", "CAFile": "/etc/billing/ca.pem", "SNI": "billing.example.com"}]})
        tg.wait("ledger unlinked", lambda s:
                len(by_sni(s.state[LDS][name])) == 1 and sni("ledger", td) not in s.state[CDS])
        assert tg.error is None
    finally:
        tg.close()


def test_under_acls_a_gateway_stream_needs_service_write_on_the_gateway():
    import grpc

    from conftest import acl_server, put

    root = "6f1c2a4e-0000-4000-8000-0000000000bb"
    server = acl_server(root)
    try:
        put(f"{server.url}/v1/catalog/register?token={root}", {
            "Node": "n1", "Address": "127.0.0.11", "Service": {"ID": "db", "Service": "db", "Port": 5432}})
        put(f"{server.url}/v1/catalog/register?token={root}", {
            "Node": "gw1", "Address": "127.0.0.21",
            "Service": {"Kind": "ingress-gateway", "ID": "ig", "Service": "ig", "Port": 8443}})
        put(f"{server.url}/v1/config?token={root}", {
            "Kind": "ingress-gateway", "Name": "ig",
            "Listeners": [{"Port": 9090, "Protocol": "tcp", "Services": [{"Name": "db"}]}]})

        def token(name, rules):
            put(f"{server.url}/v1/acl/policy?token={root}", {"Name": name, "Rules": rules})
            t = put(f"{server.url}/v1/acl/token?token={root}", {"Policies": [{"Name": name}]})
            return t["SecretID"]

        addr = f"127.0.0.1:{server.grpc_port}"
        # service:write on the service it exposes, not on the gateway: one
        # permission short.
        short = Sidecar(addr, "ig", node_name="gw1",
                        token=token("db-writer", 'service "db" { policy = "write" }'))
        try:
            err = short.refusal()
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "service:write" in err.details()
        finally:
            short.close()
        allowed = Sidecar(addr, "ig", node_name="gw1",
                          token=token("ig-writer", 'service "ig" { policy = "write" }'))
        try:
            allowed.wait("the gateway's tcp listener", lambda s: "db:0.0.0.0:9090" in s.state[LDS])
        finally:
            allowed.close()
    finally:
        server.stop()


def test_under_acls_a_terminating_gateway_gets_only_the_leaves_its_token_may_write():
    """The gateway answers for each linked service with that service's leaf
    and private key, so its token must be allowed to be that service: with
    `service "tg" write` and `service "billing" write`, a `*` link gives
    billing's chain and cluster and nothing of db's (on today's main db's
    chain came with db's key); once the policy loses billing, billing's
    goes too, on the same stream."""
    from conftest import acl_server, put

    root = "6f1c2a4e-0000-4000-8000-0000000000bc"
    server = acl_server(root)
    try:
        for node, addr, svc in (("n9", "127.0.0.99", "billing"), ("n8", "127.0.0.98", "db")):
            put(f"{server.url}/v1/catalog/register?token={root}", {
                "Node": node, "Address": addr, "Service": {"ID": svc, "Service": svc, "Port": 443}})
        put(f"{server.url}/v1/catalog/register?token={root}", {
            "Node": "gw2", "Address": "127.0.0.22",
            "Service": {"Kind": "terminating-gateway", "ID": "tg", "Service": "tg", "Port": 8444}})
        put(f"{server.url}/v1/config?token={root}", {
            "Kind": "terminating-gateway", "Name": "tg", "Services": [{"Name": "*"}]})
        td = ca_roots(server.url)["TrustDomain"]
        rules = 'service "tg" { policy = "write" }\nservice_prefix "" { policy = "read" }\n'
        policy = put(f"{server.url}/v1/acl/policy?token={root}", {
            "Name": "tg", "Rules": rules + 'service "billing" { policy = "write" }'})
        secret = put(f"{server.url}/v1/acl/token?token={root}",
                     {"Policies": [{"Name": "tg"}]})["SecretID"]
        tg = Sidecar(f"127.0.0.1:{server.grpc_port}", "tg", node_name="gw2", token=secret)
        name = "default:0.0.0.0:8444"
        try:
            tg.wait("billing's chain", lambda s:
                    name in s.state[LDS] and sni("billing", td) in s.state[CDS])
            chains = list(by_sni(tg.state[LDS][name]))
            assert chains == [sni("billing", td)], chains
            assert sni("db", td) not in tg.state[CDS], "db's cluster for a token that may only read db"
            # One permission less: billing's chain, cluster and key go.
            put(f"{server.url}/v1/acl/policy/{policy['ID']}?token={root}", {"Name": "tg", "Rules": rules})
            tg.wait("billing's chain gone with its permission", lambda s:
                    name in s.state[LDS] and not by_sni(s.state[LDS][name])
                    and sni("billing", td) not in s.state[CDS])
            assert tg.error is None
        finally:
            tg.close()
    finally:
        server.stop()


def test_an_ingress_wildcard_follows_the_catalog(world):
    url = world.url
    td = ca_roots(url)["TrustDomain"]
    register(url, "gw3", "127.0.0.23",
             {"Kind": "ingress-gateway", "ID": "ig2", "Service": "ig2", "Port": 8445})
    config(url, {"Kind": "ingress-gateway", "Name": "ig2", "Listeners": [
        {"Port": 8090, "Protocol": "http", "Services": [{"Name": "*"}]}]})
    ig = gateway(world, "ig2", "gw3")
    try:
        def hosts(s):
            rc = s.state[RDS].get("8090")
            return sorted(vh.name for vh in rc.virtual_hosts) if rc else None
        # The http services; db (tcp) and the services outside the mesh
        # are left out, as is no service's own gateway.
        ig.wait("web and api behind *, and only their clusters", lambda s: hosts(s) == ["api", "web"]
                and set(s.state[CDS]) == {sni("web", td), sni("api", td)})
        config(url, {"Kind": "service-defaults", "Name": "shop", "Protocol": "http"})
        register(url, "n1", "127.0.0.11", {"ID": "shop", "Service": "shop", "Port": 8082})
        register(url, "n1", "127.0.0.11", sidecar_service("shop-sidecar-proxy", "shop", 21003, 8082),
                 [check("n1", "shop-sidecar-proxy")])
        ig.wait("shop registered behind *", lambda s: hosts(s) == ["api", "shop", "web"]
                and sni("shop", td) in s.state[CDS])
        shop = next(vh for vh in ig.state[RDS]["8090"].virtual_hosts if vh.name == "shop")
        assert sorted(shop.domains) == ["shop.ingress.*", "shop.ingress.*:8090"]
        assert ig.error is None
    finally:
        ig.close()
