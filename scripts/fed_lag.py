#!/usr/bin/env python3
"""Replication lag from the primary to a secondary (make bench, part
`federation`): writes RUNS objects at PRIMARY and times until each reads
back at SECONDARY (polled every 2 ms). KIND `config`: service-defaults
entries; `token`: ACL tokens (needs ACLs on and a management TOKEN), each
read back by its accessor, once the secondary's ACL replication has made
its first pull (`ReplicatedIndex > 0` in `/v1/acl/replication`: before it,
a token waits for the federation to form, not for replication). Prints
`row=lag runs=.. p50_ms=.. p99_ms=.. max_ms=.. missing=.. lags_ms=..`, the
last every lag in the order written (a first-write outlier shows first).

Usage: fed_lag.py PRIMARY_URL SECONDARY_URL [RUNS] [TOKEN] [KIND]"""

import json
import sys
import time
import urllib.error
import urllib.request


def call(url, method="GET", body=None, token=None, answer=False):
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode())
    if token:
        req.add_header("X-Consul-Token", token)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return (r.status, json.load(r)) if answer else r.status
    except urllib.error.HTTPError as e:
        return (e.code, None) if answer else e.code


def write_config(primary, name, token):
    """A service-defaults entry; the path that reads it back."""
    if call(f"{primary}/v1/config", "PUT", {"Kind": "service-defaults", "Name": name, "Protocol": "http"}, token) != 200:
        raise SystemExit(f"the write of {name} at the primary failed")
    return f"/v1/config/service-defaults/{name}"


def write_token(primary, name, token):
    """A global token; the path that reads it back by accessor."""
    status, made = call(f"{primary}/v1/acl/token", "PUT", {"Description": name}, token, answer=True)
    if status != 200:
        raise SystemExit(f"the token {name} was not made at the primary: {status}")
    return f"/v1/acl/token/{made['AccessorID']}"


def wait_replicating(secondary, token):
    """Until the secondary's ACL replication has pulled once (30 s)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:
        status, r = call(f"{secondary}/v1/acl/replication", token=token, answer=True)
        if status == 200 and r.get("ReplicatedIndex", 0) > 0:
            return
        time.sleep(0.05)
    raise SystemExit("the secondary's ACL replication made no pull within 30 s")


def main():
    primary, secondary = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    token = (sys.argv[4] or None) if len(sys.argv) > 4 else None
    kind = sys.argv[5] if len(sys.argv) > 5 else "config"
    write = {"config": write_config, "token": write_token}[kind]
    if kind == "token":
        wait_replicating(secondary, token)
    lags, missing = [], 0
    stamp = int(time.time())
    for i in range(runs):
        path = write(primary, f"lag-{stamp}-{i}", token)
        t0 = time.monotonic()
        while call(f"{secondary}{path}", token=token) != 200:
            if time.monotonic() - t0 > 10:
                missing += 1
                break
            time.sleep(0.002)
        else:
            lags.append((time.monotonic() - t0) * 1000)
    in_order = ",".join(f"{x:.1f}" for x in lags)
    lags.sort()
    pct = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))] if lags else float("nan")
    print(f"row=lag runs={runs} p50_ms={pct(0.5):.1f} p99_ms={pct(0.99):.1f} "
          f"max_ms={(lags[-1] if lags else float('nan')):.1f} missing={missing} lags_ms={in_order}")


if __name__ == "__main__":
    main()
