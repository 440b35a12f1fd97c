"""py-consul's event API against cairn: event.fire with its filters and
event.list (by name, blocking on the index Consul derives from the last
event's ID), on the server's own agent."""

import threading
import time

import consul
import pytest


@pytest.fixture
def c(cairn):
    host, port = cairn.addr.split(":")
    return consul.Consul(host=host, port=int(port))


def names(c, name=None):
    _, events = c.event.list(name=name)
    return [e["Name"] for e in events]


def wait_for(c, name, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        index, events = c.event.list(name=name)
        if events:
            return index, events
        time.sleep(0.1)
    raise AssertionError(f"event {name} never listed")


@pytest.fixture
def following(c):
    """The agent receives only what is fired after it follows: probe."""
    deadline = time.time() + 30
    while time.time() < deadline:
        c.event.fire("py-probe")
        time.sleep(0.3)
        if names(c, "py-probe"):
            return
    raise AssertionError("the agent never received a probe")


def test_fire_and_list(c, following):
    fired = c.event.fire("py-deploy", "v1", node="^py-")
    assert fired["Name"] == "py-deploy"
    assert fired["NodeFilter"] == "^py-"
    assert fired["Version"] == 1
    assert fired["ID"]
    index, events = wait_for(c, "py-deploy")
    assert [e["ID"] for e in events] == [fired["ID"]]
    assert events[0]["Payload"] == b"v1"
    assert events[0]["LTime"] > 0
    # Not for this node: filtered out; a marker after it shows it was handled.
    c.event.fire("py-elsewhere", node="^other-node$")
    c.event.fire("py-marker")
    wait_for(c, "py-marker")
    assert names(c, "py-elsewhere") == []
    assert "py-deploy" in names(c) and "py-marker" in names(c)


def test_blocking_list_wakes_on_a_fire(c, following):
    c.event.fire("py-block", "1")
    index, events = wait_for(c, "py-block")
    got = {}

    def block():
        started = time.time()
        got["answer"] = c.event.list(name="py-block", index=index, wait="30s")
        got["took"] = time.time() - started

    t = threading.Thread(target=block)
    t.start()
    c.event.fire("py-block", "2")
    t.join(40)
    new_index, events = got["answer"]
    assert got["took"] < 10
    assert new_index != index
    assert [e["Payload"] for e in events] == [b"1", b"2"]


def test_too_large_is_refused(c):
    with pytest.raises(Exception):
        c.event.fire("py-big", "x" * 600)
    with pytest.raises(Exception):
        c.event.fire("py-tag", tag="v1")
