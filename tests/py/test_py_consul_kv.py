"""py-consul's KV calls against cairn, unchanged: put/get/recurse/keys,
cas, flags, delete, transactions and a blocking get."""

import base64
import threading
import time

import consul
import pytest


@pytest.fixture
def c(cairn):
    host, port = cairn.addr.split(":")
    return consul.Consul(host=host, port=int(port))


def test_put_get_and_recurse(c):
    assert c.kv.put("py/app/one", "1") is True
    assert c.kv.put("py/app/two", "2", flags=7) is True
    index, item = c.kv.get("py/app/two")
    assert item["Value"] == b"2" and item["Flags"] == 7 and int(index) > 0
    _, items = c.kv.get("py/app/", recurse=True)
    assert [i["Key"] for i in items] == ["py/app/one", "py/app/two"]
    _, keys = c.kv.get("py/", keys=True, separator="/")
    assert keys == ["py/app/"]
    _, missing = c.kv.get("py/nope")
    assert missing is None


def test_cas_and_delete(c):
    assert c.kv.put("py/cas", "a", cas=0) is True
    assert c.kv.put("py/cas", "b", cas=0) is False
    _, item = c.kv.get("py/cas")
    assert c.kv.put("py/cas", "c", cas=item["ModifyIndex"]) is True
    assert c.kv.delete("py/cas", cas=1) is False
    _, item = c.kv.get("py/cas")
    assert c.kv.delete("py/cas", cas=item["ModifyIndex"]) is True
    assert c.kv.get("py/cas")[1] is None
    c.kv.put("py/tree/a", "x")
    c.kv.put("py/tree/b", "y")
    assert c.kv.delete("py/tree/", recurse=True) is True
    assert c.kv.get("py/tree/", recurse=True)[1] is None


def test_txn(c):
    ops = [
        {"KV": {"Verb": "set", "Key": "py/txn/a", "Value": base64.b64encode(b"A").decode()}},
        {"KV": {"Verb": "get", "Key": "py/txn/a"}},
    ]
    result = c.txn.put(ops)
    assert len(result["Results"]) == 2
    assert base64.b64decode(result["Results"][1]["KV"]["Value"]) == b"A"


def test_blocking_get_wakes_on_change(c):
    c.kv.put("py/watch", "before")
    index, _ = c.kv.get("py/watch")
    seen = {}

    def watch():
        seen["index"], seen["item"] = c.kv.get("py/watch", index=index, wait="10s")

    t = threading.Thread(target=watch)
    t.start()
    time.sleep(0.3)
    c.kv.put("py/unrelated", "x")
    time.sleep(0.3)
    assert t.is_alive(), "an unrelated key woke the blocking get"
    c.kv.put("py/watch", "after")
    t.join(timeout=5)
    assert not t.is_alive()
    assert int(seen["index"]) > int(index) and seen["item"]["Value"] == b"after"
