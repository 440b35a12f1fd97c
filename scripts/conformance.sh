#!/usr/bin/env bash
# Plays Consul's test tables (../shared/conformance) against a fresh dev
# server and stops it afterwards. Exit status is the runner's.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CAIRN_BIN:-target/debug/cairn}
CASES=${CONFORMANCE_DIR:-../shared/conformance}
DIRS=${CONFORMANCE_DIRS:-"discovery-chain config-validation merge-central-config"}
# Free ports, unless given: on a fixed one, a server left running by someone
# else would answer the cases in this one's place.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=${PORT:-$(free_port)}
RAFT_PORT=${RAFT_PORT:-$(free_port)}
DNS_PORT=${DNS_PORT:-$(free_port)}
if [ ! -d "$CASES" ]; then echo "conformance: $CASES not found" >&2; exit 1; fi
"$BIN" server --dev --http-addr "127.0.0.1:$PORT" --raft-addr "127.0.0.1:$RAFT_PORT" \
  --dns-addr "127.0.0.1:$DNS_PORT" --grpc-addr "" 2>/tmp/cairn-conformance.log &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  l=$(curl -sf "http://127.0.0.1:$PORT/v1/status/leader" || true)
  [ -n "$l" ] && [ "$l" != '""' ] && break
  sleep 0.1
done
paths=()
for d in $DIRS; do paths+=("$CASES/$d"); done
status=0
out=$(python3 "$CASES/run.py" --url "http://127.0.0.1:$PORT" --feature-exclude peering "${paths[@]}") || status=$?
echo "$out"
# A run that played nothing proves nothing: it fails.
passed=$(echo "$out" | sed -n 's/^\([0-9][0-9]*\) passed, .*/\1/p' | tail -n 1)
if [ "${passed:-0}" -eq 0 ]; then echo "conformance: no case passed (none played?)" >&2; exit 1; fi
exit $status
