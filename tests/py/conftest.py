"""Shared fixtures for the real-client tests: a `cairn server --dev` on free
ports (the binary from $CAIRN_BIN, else target/debug/cairn), stopped when
the session ends."""

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from cairn_processes import free_port, stop_process  # noqa: F401 (tests import free_port from here)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def put(url, body):
    """PUT `body` as JSON; the decoded JSON answer."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def get(url):
    """GET; the decoded JSON answer."""
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def cairn_bin():
    path = os.environ.get("CAIRN_BIN") or str(ROOT / "target" / "debug" / "cairn")
    if not os.path.exists(path):
        pytest.fail(f"cairn binary not found at {path}: run cargo build or set CAIRN_BIN")
    return path


class CairnServer:
    def __init__(self, extra=()):
        self.http_port = free_port()
        self.raft_port = free_port()
        self.dns_port = free_port()
        self.grpc_port = free_port()
        self.addr = f"127.0.0.1:{self.http_port}"
        self.url = f"http://{self.addr}"
        self.log = tempfile.NamedTemporaryFile(prefix="cairn-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [cairn_bin(), "server", "--dev", "--node", "py-node",
             "--http-addr", self.addr, "--raft-addr", f"127.0.0.1:{self.raft_port}",
             "--dns-addr", f"127.0.0.1:{self.dns_port}",
             "--grpc-addr", f"127.0.0.1:{self.grpc_port}", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        self.wait_for_leader()

    def wait_for_leader(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(self.url + "/v1/status/leader", timeout=2) as r:
                    if json.loads(r.read() or b'""'):
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("cairn did not elect a leader:\n" + pathlib.Path(self.log.name).read_text())

    def stop(self):
        stop_process(self.proc)



def acl_server(root, extra=()):
    """A `cairn server --dev` with ACLs on, default deny, `root` its initial
    management (and agent) token: returned once the leader has written it."""
    server = CairnServer(["--acl-enabled", "--acl-default-policy", "deny",
                          "--acl-initial-management-token", root, "--acl-agent-token", root, *extra])
    deadline = time.monotonic() + 10
    while True:
        try:
            get(f"{server.url}/v1/acl/token/self?token={root}")
            return server
        except urllib.error.HTTPError:
            if time.monotonic() > deadline:
                server.stop()
                raise AssertionError("the management token never appeared")
            time.sleep(0.1)


class ThreeServers:
    """Three cairn servers on loopback that form a cluster by themselves
    (`extra`: more flags for each); fails at once, with their logs, if one
    exits or no leader is elected within the wait."""

    def __init__(self, root, extra=(), name="cairn"):
        self.http = [free_port() for _ in range(3)]
        raft = [free_port() for _ in range(3)]
        self.raft = raft
        self.url = f"http://127.0.0.1:{self.http[0]}"
        self.procs, self.logs = [], []
        for i in range(3):
            log = open(root / f"{name}-s{i}.log", "wb")
            joins = [a for j in range(3) if j != i for a in ("--join", f"127.0.0.1:{raft[j]}")]
            self.procs.append(subprocess.Popen(
                [cairn_bin(), "server", *extra, "--node", f"s{i}",
                 "--data-dir", str(root / f"{name}-s{i}"),
                 "--http-addr", f"127.0.0.1:{self.http[i]}",
                 "--raft-addr", f"127.0.0.1:{raft[i]}",
                 "--grpc-addr", f"127.0.0.1:{free_port()}",
                 "--dns-addr", f"127.0.0.1:{free_port()}",
                 "--bootstrap-expect", "3", *joins],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            self.logs.append(log)
        deadline = time.monotonic() + 90
        for port in self.http:
            while not self._leader_seen(port):
                if time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"no cairn leader in 90 s\n{self.tail()}")
                time.sleep(0.25)

    def _leader_seen(self, port):
        dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
        if dead:
            self.stop()
            raise AssertionError(f"cairn server(s) {dead} exited\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status/leader", timeout=3) as r:
                return bool(json.loads(r.read() or b'""'))
        except OSError:
            return False

    def tail(self):
        out = []
        for log in self.logs:
            log.flush()
            lines = pathlib.Path(log.name).read_text(errors="replace").splitlines()
            out.append(f"--- {log.name} (last 30 lines)\n" + "\n".join(lines[-30:]))
        return "\n".join(out)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()

@pytest.fixture(scope="module")
def cairn():
    server = CairnServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def certs():
    """A CA and a certificate for 127.0.0.1, made by `cairn tls`."""
    tmp = tempfile.TemporaryDirectory(prefix="cairn-certs-")
    d = pathlib.Path(tmp.name)
    for args in (["tls", "ca", "create"], ["tls", "cert", "create", "-server"]):
        subprocess.run([cairn_bin(), *args], cwd=d, check=True, capture_output=True)
    yield {
        "ca": (d / "consul-agent-ca.pem").read_text(),
        "ca_file": str(d / "consul-agent-ca.pem"),
        "cert": str(d / "dc1-server-consul-0.pem"),
        "key": str(d / "dc1-server-consul-0-key.pem"),
    }
    tmp.cleanup()


def chromium(*extra):
    """Headless Chromium (Debian's `chromium` and `chromium-driver`) under
    Selenium, `extra` more flags; under CI (`CI` set) a missing browser
    fails the run rather than skipping."""
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
    why = None
    if webdriver is None:
        why = "the selenium package is not installed (pip install selenium)"
    elif not (shutil.which("chromium") and shutil.which("chromedriver")):
        why = "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,800", *extra):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    d = webdriver.Chrome(options=opts, service=service)
    d.set_window_size(1280, 800)
    return d
