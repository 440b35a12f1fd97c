#!/usr/bin/env bash
# A/B of the write path: the same write rows as `make bench`'s compare part
# (cairn only), for two or more cairn binaries, alternating them round by
# round so that load from elsewhere on the machine falls on each alike.
#
#   scripts/ab-write.sh BIN_A BIN_B [BIN_C...]
#   AB_ROUNDS=N (default 2)  AB_SECONDS=N (default 5)  AB_CLIENTS="1 16 64 256"
#   AB_OUT=dir (default data/ab)  AB_PORT_BASE=B (default 28000)
#
# Prints one line per binary, round and row: ops/s, p50, p99, load1, and
# the CPU the three servers used per write (µs, from /proc/PID/stat).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 BIN_A BIN_B [BIN...]" >&2; exit 2; }
ROUNDS=${AB_ROUNDS:-2}
SECS=${AB_SECONDS:-5}
CLIENTS=${AB_CLIENTS:-1 16 64 256}
OUT=${AB_OUT:-data/ab}
LOAD=${CAIRN_LOAD:-target/release/cairn-load}
B=${AB_PORT_BASE:-28000}
TICK=$(getconf CLK_TCK)

PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM

cpu_ticks() { # pids... -> utime+stime summed
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}
field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p"; }

for round in $(seq 1 "$ROUNDS"); do
  for bin in "$@"; do
    rm -rf "$OUT"; mkdir -p "$OUT"
    addrs=""
    for i in 0 1 2; do
      joins=()
      for j in 0 1 2; do [ "$j" = "$i" ] || joins+=(--join "127.0.0.1:$((B + 300 + j))"); done
      "$bin" server --node "s$i" --data-dir "$OUT/s$i" --http-addr "127.0.0.1:$((B + 500 + i))" \
        --raft-addr "127.0.0.1:$((B + 300 + i))" --dns-addr "127.0.0.1:$((B + 600 + i))" \
        --bootstrap-expect 3 "${joins[@]}" 2>>"$OUT/s$i.log" &
      PIDS+=($!)
      addrs+="${addrs:+,}127.0.0.1:$((B + 500 + i))"
    done
    "$LOAD" leader --system cairn --addrs "$addrs" >/dev/null
    for c in $CLIENTS; do
      l=$(cut -d' ' -f1 /proc/loadavg)
      t0=$(cpu_ticks "${PIDS[@]}")
      r=$("$LOAD" write --system cairn --addrs "$addrs" --clients "$c" --seconds "$SECS" \
        --warmup 1 --keys 1000 --value-size 256 2>>"$OUT/load.log" || echo error)
      t1=$(cpu_ticks "${PIDS[@]}")
      ops=$(field ok "$r"); tput=$(field tput "$r")
      us=$(awk -v t=$((t1 - t0)) -v hz="$TICK" -v n="${ops:-0}" \
        'BEGIN { if (n > 0) printf "%.0f", t / hz * 1e6 / n; else print "-" }')
      printf '%s round %s clients %3s: %6s ops/s p50 %s p99 %s cpu/write %s µs load1 %s\n' \
        "$bin" "$round" "$c" \
        "${tput:-err}" "$(field p50_ms "$r")" "$(field p99_ms "$r")" "$us" "$l"
    done
    stop_all
  done
done
