"""Ports and process handling shared by the real-client tests (tests/py)
and py-consul's own suite's fixture layer (tests/py-consul/conftest.py,
which scripts/py-consul-suite.sh runs with this directory on PYTHONPATH)."""

import socket
import subprocess

_HANDED_OUT = set()


def free_port():
    """A loopback port nobody listens on, never the same one twice in a run:
    the kernel may offer a port again once its probe socket closes, and a
    cluster whose gRPC port is another server's Raft port never forms."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def stop_process(proc, grace=10):
    """SIGTERM, then SIGKILL if it has not exited within `grace` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
