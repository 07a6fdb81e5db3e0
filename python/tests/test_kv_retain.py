"""Pins, priorities and TTLs of hash-mode KV blocks from Python (issue 23
item 4): the calls reach the owners and read back what they set."""

import uuid

import pytest

import pygd2fs


def key(prefix="ret"):
    return f"{prefix}/{uuid.uuid4().hex}"


def test_kv_retain(conn):
    kv = conn.kv()
    k = key()
    kv.put(k, b"x" * 1000)
    assert kv.retention(k) == {"pin": "", "priority": 0, "ttl": None}
    kv.pin(k)
    kv.set_priority(k, 3)
    assert kv.expire(k, 3600) is True
    r = kv.retention(k)
    assert r["pin"] == "dram" and r["priority"] == 3 and 3590 < r["ttl"] <= 3600, r
    assert kv.exists(k)  # probes leave it as it is
    assert kv.retention(k)["pin"] == "dram"
    kv.persist(k)
    kv.unpin(k)
    assert kv.retention(k) == {"pin": "", "priority": 3, "ttl": None}
    assert kv.expire(k, 0) is True  # as Redis: deletes at once
    with pytest.raises(pygd2fs.NotFound):
        kv.get(k)
    assert kv.expire(k, 10) is False
    with pytest.raises(pygd2fs.NotFound):
        kv.pin(k)
    with pytest.raises(pygd2fs.errors.BadRequest):
        kv.pin(key(), tier="ssd")
    p = key("chain")
    for i in range(4):
        kv.put(f"{p}/{i}", b"y" * 100)
    assert kv.pin_prefix(p + "/", "dram") == 4
    assert kv.retention(f"{p}/2")["pin"] == "dram"
    assert kv.pin_prefix(p + "/", "none") == 4
    with pytest.raises(ValueError, match="empty"):
        kv.pin_prefix("")
