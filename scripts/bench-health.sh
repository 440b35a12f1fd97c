#!/usr/bin/env bash
# Throughput of GET /v1/health/service/:s for a service with N instances
# (default 1000), each on its own node with a node check and a service
# check. Starts a release `cairn server --dev` on loopback ports, registers
# the instances, then loads the endpoint with wrk (Debian package `wrk`)
# for a bounded time. Usage: scripts/bench-health.sh [N] [SECONDS] [CONNS]
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000}"; SECS="${2:-10}"; CONNS="${3:-16}"
HTTP=127.0.0.1:18599; RAFT=127.0.0.1:18399; DNS=127.0.0.1:18598

cargo build --release --quiet --bin cairn
source scripts/dev-server.sh
dev_server ./target/release/cairn "$HTTP" "$RAFT" "$DNS" /tmp/cairn-bench.log

python3 - "$HTTP" "$N" <<'PY'
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
addr, n = sys.argv[1], int(sys.argv[2])
def reg(i):
    body = {
        "Node": f"node-{i:04d}", "Address": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
        "NodeMeta": {"rack": f"r{i % 8}"},
        "Service": {"ID": f"web-{i}", "Service": "web", "Port": 8080, "Tags": ["v1", f"shard-{i % 4}"],
                    "Meta": {"version": "1.2.3"}},
        "Checks": [
            {"CheckID": "serfHealth", "Name": "Serf Health Status", "Status": "passing"},
            {"CheckID": f"web-{i}-http", "Name": "http", "ServiceID": f"web-{i}", "Status": "passing",
             "Output": "HTTP GET http://localhost:8080/health: 200 OK"},
        ],
    }
    req = urllib.request.Request(f"http://{addr}/v1/catalog/register", data=json.dumps(body).encode(), method="PUT")
    urllib.request.urlopen(req).read()
with ThreadPoolExecutor(16) as ex:
    list(ex.map(reg, range(n)))
rows = json.load(urllib.request.urlopen(f"http://{addr}/v1/health/service/web"))
print(f"registered {len(rows)} instances of web")
PY
BYTES=$(curl -s "http://$HTTP/v1/health/service/web" | wc -c)
echo "response size: $BYTES bytes"
wrk -t2 -c"$CONNS" -d"${SECS}s" --latency "http://$HTTP/v1/health/service/web"
