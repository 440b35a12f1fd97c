#!/usr/bin/env python3
"""Replication lag from the primary to a secondary (make bench, part
`federation`): writes RUNS service-defaults entries at PRIMARY and times
until each reads back at SECONDARY (polled every 2 ms). Prints
`row=lag runs=.. p50_ms=.. p99_ms=.. max_ms=.. missing=..`.

Usage: fed_lag.py PRIMARY_URL SECONDARY_URL [RUNS] [TOKEN]"""

import json
import sys
import time
import urllib.error
import urllib.request


def call(url, method="GET", body=None, token=None):
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode())
    if token:
        req.add_header("X-Consul-Token", token)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def main():
    primary, secondary = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    token = sys.argv[4] if len(sys.argv) > 4 else None
    lags, missing = [], 0
    stamp = int(time.time())
    for i in range(runs):
        name = f"lag-{stamp}-{i}"
        if call(f"{primary}/v1/config", "PUT", {"Kind": "service-defaults", "Name": name, "Protocol": "http"}, token) != 200:
            raise SystemExit(f"the write of {name} at the primary failed")
        t0 = time.monotonic()
        while call(f"{secondary}/v1/config/service-defaults/{name}", token=token) != 200:
            if time.monotonic() - t0 > 10:
                missing += 1
                break
            time.sleep(0.002)
        else:
            lags.append((time.monotonic() - t0) * 1000)
    lags.sort()
    pct = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))] if lags else float("nan")
    print(f"row=lag runs={runs} p50_ms={pct(0.5):.1f} p99_ms={pct(0.99):.1f} "
          f"max_ms={(lags[-1] if lags else float('nan')):.1f} missing={missing}")


if __name__ == "__main__":
    main()
