#!/usr/bin/env bash
# Real-client tests: Patroni (Debian's, with python3-consul) electing and
# failing over PostgreSQL on a three-server cairn cluster; py-consul (catalog, health, a blocking query, Connect
# CA, leaves and intentions, the
# server's agent API and maintenance mode, sessions and KV locks with a
# leader election, user events), a Delta-ADS sidecar client (grpcio + xds-protos:
# Envoy's protos) and consul-dataplane's gRPC calls on the gRPC port,
# `cairn connect envoy -bootstrap` parsed with Envoy's protos, the npm
# `consul` client (KV, agent, health, sessions, a watch, events),
# Prometheus's and VictoriaMetrics's Consul service discovery and their
# scraping of /v1/agent/metrics?format=prometheus, each
# against a `cairn server --dev` they start on free ports
# (tests/py/conftest.py).
#
# Builds cairn (debug, or CAIRN_BIN=path to use a given binary), installs
# py-consul, pytest, grpcio, xds-protos and protoc-gen-validate if missing, and runs pytest on tests/py. The
# Prometheus test skips with a message when /usr/bin/prometheus (Debian
# package `prometheus`) is absent or built without Consul SD (Debian's is);
# the VictoriaMetrics one when `victoria-metrics` (Debian package) is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${CAIRN_BIN:-}" ]]; then
    cargo build --quiet --bin cairn
    export CAIRN_BIN="$PWD/target/debug/cairn"
fi

PY="${PYTHON:-python3}"
if ! "$PY" -c 'import consul, pytest, grpc, envoy.service.discovery.v3, protoc_gen_validate, selenium' 2>/dev/null; then
    "$PY" -m pip install --quiet py-consul pytest grpcio xds-protos protoc-gen-validate selenium
fi
# The web UI's browser tests (tests/py/test_ui.py): skipped without the
# browser, failed without it under CI.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "test-clients: chromium and chromium-driver not installed (apt-get install -y chromium chromium-driver); the UI tests will be skipped (failed under CI)"
fi

if ! command -v prometheus >/dev/null 2>&1 && [[ ! -x /usr/bin/prometheus ]]; then
    echo "test-clients: prometheus not installed (apt-get install -y prometheus); its test will be skipped"
fi

# The npm `consul` client (tests/node, its version pinned by the lock file).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "test-clients: node and npm are needed (apt-get install -y nodejs npm)" >&2
    exit 1
fi
(cd tests/node && npm ci --no-audit --no-fund --silent)
node --test tests/node/

exec "$PY" -m pytest -q -rs tests/py "$@"
