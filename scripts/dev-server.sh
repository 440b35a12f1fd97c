# Sourced by the benchmark scripts that load one dev server on loopback.
#
# dev_server BIN HTTP RAFT DNS LOG: starts `BIN server --dev` on those
# addresses (no gRPC port) with its output in LOG, stops it when the
# calling script exits, and returns once the server names a leader (10 s
# at most; the load that follows shows a server without one).
dev_server() {
    local bin=$1 http=$2 raft=$3 dns=$4 log=$5
    "$bin" server --dev --http-addr "$http" --raft-addr "$raft" \
        --dns-addr "$dns" --grpc-addr "" >"$log" 2>&1 &
    DEV_SERVER_PID=$!
    trap 'kill $DEV_SERVER_PID 2>/dev/null; wait $DEV_SERVER_PID 2>/dev/null || true' EXIT
    for _ in $(seq 100); do
        [[ "$(curl -s "http://$http/v1/status/leader")" == '"'*:*'"' ]] && return 0
        sleep 0.1
    done
}
