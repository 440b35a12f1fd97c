"""py-consul's txn with node, service and check operations, and its
snapshot save/restore, against cairn, unchanged."""

import base64

import consul
import pytest


@pytest.fixture
def c(cairn):
    host, port = cairn.addr.split(":")
    return consul.Consul(host=host, port=int(port))


def test_txn_node_service_and_check_operations(c):
    result = c.txn.put([
        {"Node": {"Verb": "set", "Node": {"Node": "py-txn", "Address": "10.1.0.1"}}},
        {"Service": {"Verb": "set", "Node": "py-txn",
                     "Service": {"ID": "py-web-1", "Service": "py-web", "Port": 8080}}},
        {"Check": {"Verb": "set", "Check": {"Node": "py-txn", "CheckID": "py-web-ok",
                                            "ServiceID": "py-web-1", "Status": "passing"}}},
    ])
    kinds = [next(iter(r)) for r in result["Results"]]
    assert kinds == ["Node", "Service", "Check"]
    _, nodes = c.health.service("py-web", passing=True)
    assert [n["Service"]["ID"] for n in nodes] == ["py-web-1"]

    # A stale cas fails the whole txn: py-consul raises on the 409, and
    # the KV write in it is not applied.
    stale = result["Results"][1]["Service"]["ModifyIndex"] + 1000
    with pytest.raises(consul.ConsulException) as e:
        c.txn.put([
            {"KV": {"Verb": "set", "Key": "py/txn/rolled-back",
                    "Value": base64.b64encode(b"x").decode()}},
            {"Service": {"Verb": "cas", "Node": "py-txn",
                         "Service": {"ID": "py-web-1", "Service": "py-web", "ModifyIndex": stale}}},
        ])
    assert "409" in str(e.value)
    assert c.kv.get("py/txn/rolled-back")[1] is None

    result = c.txn.put([{"Node": {"Verb": "delete", "Node": {"Node": "py-txn"}}}])
    assert not result["Results"]
    _, nodes = c.health.service("py-web")
    assert nodes == []


def test_snapshot_save_and_restore(c):
    assert c.kv.put("py/snap/kept", "before") is True
    saved = c.snapshot.save()
    assert saved[:2] == b"\x1f\x8b"  # Consul's envelope: a gzipped tar
    assert c.kv.put("py/snap/kept", "after") is True
    assert c.kv.put("py/snap/later", "x") is True
    assert c.snapshot.restore(saved) is True
    assert c.kv.get("py/snap/kept")[1]["Value"] == b"before"
    assert c.kv.get("py/snap/later")[1] is None
    # A damaged one is refused (400) and changes nothing.
    damaged = bytearray(saved)
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(consul.ConsulException):
        c.snapshot.restore(bytes(damaged))
    assert c.kv.get("py/snap/kept")[1]["Value"] == b"before"
