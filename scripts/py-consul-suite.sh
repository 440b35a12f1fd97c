#!/usr/bin/env bash
# py-consul's own test suite (its sdist's tests/, written against real
# Consul) run unchanged against cairn: fetches the pinned sdist from PyPI,
# puts tests/py-consul/conftest.py in place of its fixture layer (a
# `cairn server --dev` per test instead of a docker container; see that
# file's header), and runs every test file. Fails on any failure but the
# tests listed, with their reasons, in that conftest's EXPECTED_FAILURES.
#
# CAIRN_BIN: the binary (default target/debug/cairn, built if missing).
# Server logs: target/py-consul/logs/<test>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

VERSION=1.8.0
WORK="$PWD/target/py-consul"
PY="${PYTHON:-python3}"

if [[ -z "${CAIRN_BIN:-}" ]]; then
    cargo build --quiet --bin cairn
    export CAIRN_BIN="$PWD/target/debug/cairn"
fi
# The tests run from the sdist's directory: a relative path would not hold.
CAIRN_BIN="$(realpath "$CAIRN_BIN")"
export CAIRN_BIN

if ! "$PY" -c 'import pytest, pytest_asyncio, aiohttp, requests, packaging' 2>/dev/null; then
    "$PY" -m pip install --quiet --disable-pip-version-check pytest pytest-asyncio aiohttp requests packaging
fi

mkdir -p "$WORK"
SDIST="$WORK/py_consul-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$WORK" "py-consul==$VERSION"
fi
SRC="$WORK/py_consul-$VERSION"
rm -rf "$SRC" "$WORK/logs"
tar -xzf "$SDIST" -C "$WORK"
cp tests/py-consul/conftest.py "$SRC/conftest.py"

cd "$SRC"
echo "py-consul $VERSION suite against $CAIRN_BIN (server logs in $WORK/logs)"
# Coverage (the addopts of its pyproject) is theirs to measure, not ours.
# The sdist's own package (the tests import `consul` from here), not an
# installed one.
# tests/py on the path: the fixture layer shares its port and process helpers.
PYTHONPATH="$ROOT/tests/py${PYTHONPATH:+:$PYTHONPATH}" PY_CONSUL_LOGS="$WORK/logs" exec "$PY" -m pytest -q -rfEX -p no:cacheprovider -o addopts="--durations=0 --durations-min=3.0" tests "$@"
