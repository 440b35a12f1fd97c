#!/usr/bin/env bash
# Replays Consul's xDS golden cases (../shared/conformance/xds) against the
# debug build: each case starts its own servers, plays its setup, opens a
# Delta ADS stream as the case's proxy and compares what cairn sends with
# what Consul's golden files say it sends. Exit status is the runner's.
set -euo pipefail
cd "$(dirname "$0")/.."
export CAIRN_BIN=${CAIRN_BIN:-target/debug/cairn}
status=0
out=$(python3 ../shared/conformance/xds/run.py "$@") || status=$?
echo "$out"
# A run that compared nothing proves nothing: it fails.
passed=$(echo "$out" | sed -n 's/^\([0-9][0-9]*\) passed, .*/\1/p' | tail -n 1)
if [ "${passed:-0}" -eq 0 ]; then echo "xds-golden: no case passed (none played?)" >&2; exit 1; fi
exit $status
