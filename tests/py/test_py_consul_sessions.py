"""py-consul's session API and KV locks against cairn: create, info, list,
node, renew, destroy, kv.put(acquire=...) / release, a leader election
among contenders, and lock-delay."""

import threading
import time

import consul
import pytest


@pytest.fixture
def c(cairn):
    host, port = cairn.addr.split(":")
    return consul.Consul(host=host, port=int(port))


def test_session_lifecycle(c):
    sid = c.session.create(name="py", ttl=10, lock_delay=0)
    index, info = c.session.info(sid)
    assert info["ID"] == sid and info["Name"] == "py" and info["TTL"] == "10s"
    assert info["Node"] == "py-node", "defaults to the server's node"
    assert info["LockDelay"] == 0
    assert int(index) >= info["CreateIndex"] > 0
    _, sessions = c.session.list()
    assert sid in [s["ID"] for s in sessions]
    _, on_node = c.session.node("py-node")
    assert sid in [s["ID"] for s in on_node]
    assert c.session.renew(sid)["ID"] == sid
    assert c.session.destroy(sid) is True
    _, info = c.session.info(sid)
    assert info is None
    with pytest.raises(consul.NotFound):
        c.session.renew(sid)
    with pytest.raises(Exception):
        c.session.create(ttl=5)


def test_acquire_release(c):
    a = c.session.create(lock_delay=0)
    b = c.session.create(lock_delay=0)
    assert c.kv.put("py/lock", "a", acquire=a) is True
    assert c.kv.put("py/lock", "b", acquire=b) is False
    _, entry = c.kv.get("py/lock")
    assert entry["Session"] == a and entry["LockIndex"] == 1
    assert entry["Value"] == b"a"
    assert c.kv.put("py/lock", "b", release=b) is False
    assert c.kv.put("py/lock", "free", release=a) is True
    _, entry = c.kv.get("py/lock")
    assert "Session" not in entry
    assert c.kv.put("py/lock", "b", acquire=b) is True
    _, entry = c.kv.get("py/lock")
    assert entry["Session"] == b and entry["LockIndex"] == 2
    # Destroying the holder frees the key for the other.
    c.session.destroy(b)
    assert c.kv.put("py/lock", "a", acquire=a) is True
    c.session.destroy(a)


def test_lock_delay_after_invalidation(c):
    a = c.session.create(lock_delay=2)
    b = c.session.create(lock_delay=0)
    assert c.kv.put("py/delayed", "a", acquire=a) is True
    c.session.destroy(a)
    destroyed = time.monotonic()
    assert c.kv.put("py/delayed", "b", acquire=b) is False, "lock-delay holds"
    deadline = destroyed + 10
    while not c.kv.put("py/delayed", "b", acquire=b):
        assert time.monotonic() < deadline, "never acquired after the lock-delay"
        time.sleep(0.2)
    assert time.monotonic() - destroyed >= 1.5
    c.session.destroy(b)


def test_leader_election(c):
    """Contenders loop on acquire, waiting on a blocking read of the key;
    exactly one is leader at a time, and when it steps down another one
    takes over."""
    key = "py/election/leader"
    leaders = []
    overlap = []
    holding = set()
    lock = threading.Lock()
    stop = threading.Event()

    def contender(name):
        sid = c.session.create(name=name, lock_delay=0)
        index = None
        while not stop.is_set():
            if c.kv.put(key, name, acquire=sid):
                with lock:
                    if holding:
                        overlap.append((name, set(holding)))
                    holding.add(name)
                    leaders.append(name)
                time.sleep(0.3)
                with lock:
                    holding.discard(name)
                c.kv.put(key, name, release=sid)
                time.sleep(0.1)
                continue
            index, _ = c.kv.get(key, index=index, wait="1s")
        c.session.destroy(sid)

    threads = [threading.Thread(target=contender, args=(f"c{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    time.sleep(4)
    stop.set()
    for t in threads:
        t.join(15)
    assert not overlap, f"two leaders at once: {overlap}"
    assert len(set(leaders)) >= 2, f"leadership never moved: {leaders}"
