#!/usr/bin/env bash
# Cost of ?merge-central-config: GET /v1/health/connect/web for N proxy
# instances (default 100) with U upstreams each (default 10), merged and
# unmerged, against a release `cairn server --dev` on loopback. Central
# config: proxy-defaults (Config, MeshGateway), service-defaults for web
# (Protocol, UpstreamConfig Defaults and one Override) and for every
# upstream (Protocol). Loads each variant with wrk (Debian package `wrk`).
# A third read, of proxies registered with the merged content already, is
# the control: the same bytes without merging.
# Usage: scripts/bench-merge.sh [N] [U] [SECONDS] [CONNS]
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-100}"; U="${2:-10}"; SECS="${3:-10}"; CONNS="${4:-8}"
HTTP=127.0.0.1:18699; RAFT=127.0.0.1:18698; DNS=127.0.0.1:18697

cargo build --release --quiet --bin cairn
source scripts/dev-server.sh
dev_server ./target/release/cairn "$HTTP" "$RAFT" "$DNS" /tmp/cairn-bench-merge.log

python3 - "$HTTP" "$N" "$U" <<'PY'
import json, sys, urllib.request
addr, n, u = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def put(path, body):
    req = urllib.request.Request(f"http://{addr}{path}", data=json.dumps(body).encode(), method="PUT")
    assert urllib.request.urlopen(req).read().strip() == b"true", (path, body)
put("/v1/config", {"Kind": "proxy-defaults", "Name": "global", "MeshGateway": {"Mode": "local"},
                   "Config": {"protocol": "tcp", "handshake_timeout_ms": 1000}})
put("/v1/config", {"Kind": "service-defaults", "Name": "web", "Protocol": "http",
                   "UpstreamConfig": {"Defaults": {"ConnectTimeoutMs": 500, "Limits": {"MaxConnections": 512}},
                                      "Overrides": [{"Name": "up-0", "Protocol": "grpc"}]}})
for j in range(u):
    put("/v1/config", {"Kind": "service-defaults", "Name": f"up-{j}", "Protocol": "http"})
ups = [{"DestinationName": f"up-{j}", "LocalBindPort": 9000 + j} for j in range(u)]
for i in range(n):
    put("/v1/catalog/register", {
        "Node": f"node-{i:04d}", "Address": f"10.0.{i // 256 % 256}.{i % 256}",
        "Checks": [{"CheckID": "serfHealth", "Name": "Serf Health Status", "Status": "passing"}],
        "Service": {"Kind": "connect-proxy", "ID": "web-proxy", "Service": "web-proxy", "Port": 21000,
                    "Proxy": {"DestinationServiceName": "web", "Upstreams": ups}}})
rows = json.load(urllib.request.urlopen(f"http://{addr}/v1/health/connect/web?merge-central-config"))
assert len(rows) == n, len(rows)
assert rows[0]["Service"]["Proxy"]["Upstreams"][0]["Config"]["protocol"] == "grpc", "not merged"
# Control: proxies for `api` registered with what merging gives web's, so
# an unmerged read of api serializes as much as a merged read of web.
for r in rows:
    svc = dict(r["Service"], ID="api-proxy", Service="api-proxy")
    svc["Proxy"] = dict(svc["Proxy"], DestinationServiceName="api")
    put("/v1/catalog/register", {"Node": r["Node"]["Node"], "Address": r["Node"]["Address"],
                                 "Service": svc})
print(f"registered {n} proxies for web, {u} upstreams each (and {n} pre-merged ones for api)")
PY
for path in web "web?merge-central-config" api; do
    URL="http://$HTTP/v1/health/connect/$path"
    echo "== GET /v1/health/connect/$path: $(curl -s "$URL" | wc -c) bytes"
    wrk -t2 -c"$CONNS" -d2s "$URL" >/dev/null   # warm-up
    wrk -t2 -c"$CONNS" -d"${SECS}s" --latency "$URL" | grep -E "Requests/sec|Latency|  50%|  99%"
done
