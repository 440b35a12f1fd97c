"""Patroni (Debian's `patroni` with `python3-consul`) runs PostgreSQL high
availability on a three-server cairn cluster, as its users run it on
Consul: two PostgreSQL nodes, each Patroni talking to a different cairn
server, sessions bound to `checks: [serfHealth]`. A primary is elected, a
replica follows it, and when the primary's node dies (Patroni and
PostgreSQL killed) the replica takes over within the DCS ttl plus the
session's, with the primary's acknowledged, replicated rows.

Needs root (PostgreSQL runs as the `postgres` user, through runuser);
skipped with a message where Patroni or PostgreSQL is not installed
(`.ci/run` installs both)."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import pytest

from conftest import ThreeServers, free_port

PATRONI = "/usr/bin/patroni"
PG_BIN = "/usr/lib/postgresql/15/bin"
TTL = 20

pytestmark = pytest.mark.skipif(
    not (os.path.exists(PATRONI) and os.path.exists(PG_BIN) and os.geteuid() == 0
         and shutil.which("runuser") and shutil.which("psql")),
    reason="patroni, postgresql-15 and root needed (apt-get install patroni python3-consul)")


class SqlError(Exception):
    """psql failed (the server may still be starting)."""


def http_json(url, timeout=3):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def wait_until(what, pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except (OSError, SqlError):
            pass
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")



class Patroni:
    """One Patroni node (and the PostgreSQL it runs) as the postgres user."""

    def __init__(self, root, name, consul_port):
        self.name = name
        self.dir = root / name
        self.dir.mkdir()
        self.pg_port = free_port()
        self.api_port = free_port()
        config = {
            "scope": "cairn-demo",
            "name": name,
            "restapi": {"listen": f"127.0.0.1:{self.api_port}",
                        "connect_address": f"127.0.0.1:{self.api_port}"},
            "consul": {"host": f"127.0.0.1:{consul_port}", "checks": ["serfHealth"],
                       "register_service": False},
            "bootstrap": {
                "dcs": {"ttl": TTL, "loop_wait": 2, "retry_timeout": 5,
                        "maximum_lag_on_failover": 1048576,
                        "postgresql": {"use_pg_rewind": True}},
                "initdb": [{"encoding": "UTF8"}],
                "pg_hba": ["local all all trust",
                           "host replication replicator 127.0.0.1/32 md5",
                           "host all all 127.0.0.1/32 md5"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_port}",
                "connect_address": f"127.0.0.1:{self.pg_port}",
                "data_dir": str(self.dir / "data"),
                "bin_dir": PG_BIN,
                "pgpass": str(self.dir / "pgpass"),
                "authentication": {
                    "replication": {"username": "replicator", "password": "rep-pass"},
                    "superuser": {"username": "postgres", "password": "su-pass"},
                    "rewind": {"username": "rewinder", "password": "rw-pass"},
                },
                "parameters": {"unix_socket_directories": str(self.dir)},
            },
        }
        (self.dir / "patroni.yml").write_text(json.dumps(config))  # JSON is YAML
        shutil.chown(self.dir, "postgres", "postgres")
        self.log = open(self.dir / "patroni.log", "wb")
        self.proc = subprocess.Popen(
            ["runuser", "-u", "postgres", "--", PATRONI, str(self.dir / "patroni.yml")],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    def role(self):
        """"primary", "replica" or None, from Patroni's REST API (Patroni
        before 3.1 calls a primary "master")."""
        try:
            role = http_json(f"http://127.0.0.1:{self.api_port}/patroni").get("role")
        except OSError:
            return None
        return "primary" if role == "master" else role

    def sql(self, query):
        out = subprocess.run(
            ["psql", f"host=127.0.0.1 port={self.pg_port} user=postgres password=su-pass "
             "dbname=postgres connect_timeout=3", "-Atc", query],
            capture_output=True, text=True, timeout=20)
        if out.returncode != 0:
            raise SqlError(out.stderr.strip())
        return out.stdout.strip()

    def kill(self):
        """The node dies: Patroni and its PostgreSQL, at once."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        subprocess.run(["pkill", "-KILL", "-f", str(self.dir / "data")], check=False)
        self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        subprocess.run(["pkill", "-KILL", "-f", str(self.dir / "data")], check=False)

    def tail(self):
        return (self.dir / "patroni.log").read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def ha():
    root = pathlib.Path(tempfile.mkdtemp(prefix="cairn-patroni-"))
    os.chmod(root, 0o755)
    cluster = ThreeServers(root)
    nodes = []
    try:
        nodes.append(Patroni(root, "pg1", cluster.http[0]))
        nodes.append(Patroni(root, "pg2", cluster.http[1]))
        yield cluster, nodes
    finally:
        for n in nodes:
            n.stop()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_election_and_failover_with_serf_health_sessions(ha):
    cluster, nodes = ha
    try:
        primary = wait_until("a primary", lambda: next(
            (n for n in nodes if n.role() == "primary"), None), 90)
        replica = next(n for n in nodes if n is not primary)
        wait_until("a streaming replica", lambda: replica.role() == "replica" and
                   replica.sql("select pg_is_in_recovery()") == "t", 90)
    except AssertionError:
        raise AssertionError("\n".join(n.tail() for n in nodes))

    # The leader key is held by a session bound to serfHealth, on the
    # node of the cairn server that primary's Patroni talks to.
    consul = f"http://127.0.0.1:{cluster.http[0]}"
    leader = http_json(f"{consul}/v1/kv/service/cairn-demo/leader")[0]
    assert base64_decode(leader["Value"]) == primary.name
    session = http_json(f"{consul}/v1/session/info/{leader['Session']}")[0]
    assert "serfHealth" in (session.get("NodeChecks") or []) + (session.get("Checks") or []), session

    primary.sql("create table t (v int); insert into t values (42)")
    wait_until("the row on the replica", lambda: replica.sql(
        "select coalesce(sum(v), 0) from t") == "42", 30)

    # The primary's node dies; the replica takes over within the ttl plus
    # the session's (Consul's sessions live up to twice their TTL).
    died = time.monotonic()
    primary.kill()
    try:
        wait_until("the replica's promotion", lambda: replica.role() == "primary" and
                   replica.sql("select pg_is_in_recovery()") == "f", TTL + TTL + 10)
    except AssertionError:
        ps = subprocess.run(["ps", "-eo", "pid,pgid,user,args"], capture_output=True, text=True).stdout
        sessions = http_json(f"{consul}/v1/session/list")
        kv = http_json(f"{consul}/v1/kv/service/cairn-demo/?recurse")
        raise AssertionError(f"{replica.tail()}\n{ps}\n{sessions}\n{kv}")
    took = time.monotonic() - died
    assert took < 2 * TTL + 10, took
    replica.sql("insert into t values (1)")
    assert replica.sql("select sum(v) from t") == "43"
    leader = http_json(f"{consul}/v1/kv/service/cairn-demo/leader")[0]
    assert base64_decode(leader["Value"]) == replica.name
    print(f"failover took {took:.1f} s (ttl {TTL})")


def base64_decode(v):
    import base64
    return base64.b64decode(v).decode()
