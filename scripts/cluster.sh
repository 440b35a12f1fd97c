#!/usr/bin/env bash
# Starts a 3-server cairn cluster on loopback for a person to try, and stops
# it cleanly (SIGTERM to each server, by PID) on Ctrl-C or exit.
#   HTTP: 127.0.0.1:8500, :8501, :8502   Raft: 127.0.0.1:8300, :8301, :8302
#   gRPC (xDS): 127.0.0.1:8510, :8511, :8512
#   DNS:  127.0.0.1:8600, :8601, :8602 (UDP and TCP)
# Data lives in ./data/cluster/sN and survives restarts of the script.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CAIRN_BIN:-target/release/cairn}
[ -x "$BIN" ] || cargo build --release
mkdir -p data/cluster
pids=()
stop() {
  echo "stopping cluster"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop EXIT INT TERM
for i in 0 1 2; do
  joins=()
  for j in 0 1 2; do [ "$j" = "$i" ] || joins+=(--join "127.0.0.1:830$j"); done
  "$BIN" server --node "s$i" --data-dir "data/cluster/s$i" \
    --http-addr "127.0.0.1:850$i" --raft-addr "127.0.0.1:830$i" \
    --dns-addr "127.0.0.1:860$i" --grpc-addr "127.0.0.1:851$i" \
    --bootstrap-expect 3 "${joins[@]}" 2>"data/cluster/s$i.log" &
  pids+=($!)
done
for _ in $(seq 1 50); do
  leader=$(curl -sf http://127.0.0.1:8500/v1/status/leader || true)
  [ -n "$leader" ] && [ "$leader" != '""' ] && break
  sleep 0.2
done
echo "cluster up; leader $leader. Try: curl -X PUT -d hi http://127.0.0.1:8501/v1/kv/hello"
echo "logs in data/cluster/*.log; Ctrl-C stops it"
wait
