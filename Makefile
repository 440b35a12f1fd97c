# cairn — the commands a person and CI use. See README.md.

CARGO ?= cargo
SEEDS ?= 500

.PHONY: run build release test unit sim-test sim-bugs clients py-consul conformance cluster bench sim fmt lint

## Run one dev server on 127.0.0.1:8500 (data in a temporary directory).
run:
	$(CARGO) run --release -- server --dev

build:
	$(CARGO) build

release:
	$(CARGO) build --release

## Every test: unit and integration tests (real processes), the fault
## simulation (50 seeds per scenario), real clients, py-consul's own test
## suite, conformance.
test: unit sim-test clients py-consul conformance

unit:
	$(CARGO) test --workspace --exclude sim --no-fail-fast

## The simulation runs in release: 50 seeds of each scenario (10 of the
## two-datacenter federation's) in a few minutes.
sim-test:
	$(CARGO) test -p sim --release

## Real Consul clients (py-consul, Prometheus, VictoriaMetrics) against a dev server.
clients: build
	bash scripts/test-clients.sh

## py-consul's own test suite (its pinned sdist from PyPI), unchanged but
## for its fixture layer: a cairn dev server per test (tests/py-consul).
py-consul: build
	CAIRN_BIN=target/debug/cairn bash scripts/py-consul-suite.sh

## Consul's own test tables, played against a dev server; then Consul's ACL
## test tables against two (default deny and allow); then Consul's xDS
## golden files, what Envoy gets, case by case.
conformance: build
	bash scripts/conformance.sh
	CAIRN_BIN=target/debug/cairn bash ../shared/conformance/acl/play.sh
	bash scripts/xds-golden.sh

## A 3-server cluster on loopback (HTTP 8500-8502, gRPC 8510-8512); Ctrl-C stops it.
cluster: release
	bash scripts/cluster.sh

## One build of all it runs (the server, the load tool, the examples):
## built apart, the examples' dev-dependencies built the library twice.
bench:
	$(CARGO) build --release -p cairn -p cairn-load --bins --examples
	bash scripts/bench.sh
	$(CARGO) run --release --example proxycfg_bench

sim:
	$(CARGO) run -p sim --release -- --seeds $(SEEDS)
	$(CARGO) run -p sim --release -- --federation --seeds $(SEEDS)

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) test --test layers
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Each injected bug (a build feature of cairn) must be caught by the
## simulation within a bounded number of seeds (the last two are bugs of
## the endpoint layer's routing and token checks). Release builds: slow.
sim-bugs:
	for bug in bug-ack-before-commit bug-stale-read bug-stream-back-in-time bug-follower-reads bug-forwarded-token bug-xds-acl-unchanged; do \
	  $(CARGO) test -p sim --release --features $$bug --test seeds -- --nocapture || exit 1; \
	done
