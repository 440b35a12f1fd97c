"""Cross-datacenter failover over a real Delta ADS stream: dc1 and dc2
(dev servers joined with --join-wan); web's sidecar in dc1 has the upstream
api, whose resolver fails over to dc2. Its EDS holds dc1's api sidecar at
priority 0 and dc2's at priority 1 (their own addresses, mesh gateway mode
none); when dc1's goes critical only dc2's remain, and back. dc2's target
has a cluster of its own with dc2's SNI and SPIFFE ID."""

import time
import urllib.request

import pytest

from conftest import CairnServer
from test_xds import CDS, EDS, Sidecar, check, config, eds_hosts, register, sidecar_service, unpack
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2


@pytest.fixture(scope="module")
def dcs():
    dc2 = CairnServer(["--datacenter", "dc2", "--primary-datacenter", "dc1"])
    dc1 = CairnServer(["--datacenter", "dc1", "--join-wan", f"127.0.0.1:{dc2.raft_port}"])
    try:
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(dc1.url + "/v1/catalog/datacenters", timeout=5) as r:
                if r.read().count(b"dc2"):
                    break
            assert time.monotonic() < deadline, "dc1 never learned of dc2"
            time.sleep(0.1)
        yield dc1, dc2
    finally:
        dc1.stop()
        dc2.stop()


def api(url, node, addr, port, status):
    register(url, node, addr, {"ID": "api", "Service": "api", "Port": 9090})
    register(url, node, addr, sidecar_service("api-sidecar-proxy", "api", port, 9090),
             [check(node, "api-sidecar-proxy", status)])


def test_a_sidecars_endpoints_fail_over_to_another_datacenter(dcs):
    dc1, dc2 = dcs
    api(dc1.url, "n2", "10.1.0.2", 21001, "passing")
    api(dc2.url, "far", "10.2.0.2", 22001, "passing")
    config(dc1.url, {"Kind": "service-resolver", "Name": "api",
                     "Failover": {"*": {"Datacenters": ["dc2"]}}})
    register(dc1.url, "n1", "10.1.0.1", sidecar_service(
        "web-sidecar-proxy", "web", 21000, 8080,
        upstreams=[{"DestinationName": "api", "LocalBindPort": 9191}]),
        [check("n1", "web-sidecar-proxy")])
    web = Sidecar(f"127.0.0.1:{dc1.grpc_port}", "web-sidecar-proxy", node_name="n1")
    try:
        # As Consul's: api's cluster aggregates one cluster per tier, dc1's
        # target first, dc2's next, each dialing its own target.
        def primary(s):
            return next((n for n in s.state[CDS] if n.startswith("api.default.dc1.internal.")), None)

        def tier(s, i):
            return f"failover-target~{i}~{primary(s)}"

        def hosts(s, i):
            name = tier(s, i)
            return name in s.state[EDS] and eds_hosts(s.state[EDS][name])

        web.wait("dc1's sidecar, then dc2's as the next tier",
                 lambda s: primary(s) and hosts(s, 0) == [(0, "10.1.0.2:21001")]
                 and hosts(s, 1) == [(0, "10.2.0.2:22001")])
        web.wait("the mesh's TLS (the CA made)",
                 lambda s: s.state[CDS][tier(s, 1)].HasField("transport_socket"))
        agg = web.state[CDS][primary(web)]
        assert agg.cluster_type.name == "envoy.clusters.aggregate"

        # dc2's tier: its SNI and dc2's SPIFFE ID.
        far = web.state[CDS][tier(web, 1)]
        tls = unpack(far.transport_socket.typed_config, tls_pb2.UpstreamTlsContext)
        assert tls.sni.startswith("api.default.dc2.internal."), tls.sni
        sans = [m.matcher.exact for m in tls.common_tls_context.validation_context.match_typed_subject_alt_names]
        assert len(sans) == 1 and sans[0].endswith("/ns/default/dc/dc2/svc/api"), sans

        # dc1's api critical: its tier empties, dc2's stays (Envoy moves on).
        api(dc1.url, "n2", "10.1.0.2", 21001, "critical")
        web.wait("dc2's alone", lambda s: hosts(s, 0) == [] and hosts(s, 1) == [(0, "10.2.0.2:22001")])
        api(dc1.url, "n2", "10.1.0.2", 21001, "passing")
        web.wait("dc1's back", lambda s: hosts(s, 0) == [(0, "10.1.0.2:21001")])

        # dc2's instance critical there: gone from dc1's proxy.
        api(dc2.url, "far", "10.2.0.2", 22001, "critical")
        web.wait("dc2's gone", lambda s: hosts(s, 1) == [] and hosts(s, 0) == [(0, "10.1.0.2:21001")])
    finally:
        web.close()
