"""What the newest engine branches call (issue 28): pygd2fs.InspectStatus on a
failed transfer, Client.Create(path, 0, 0, ""), a data-plane address list of
one address per NIC, and commits of the engine's kvcache_params as it returns
them (flags, fields gd2fs does not know, a prefill-only save shorter than the
plan). Against a real cluster of separate processes."""

import socket
import uuid

import pytest
import torch

import pygd2fs


def _path():
    return f"/kv/round2/{uuid.uuid4().hex}"


def test_inspect_status(client):
    buf = torch.zeros(4096, dtype=torch.uint8)
    io = client.RegIOMEM(buf.data_ptr(), buf.numel())
    p = _path()
    req = client.Read(p, 0, [pygd2fs.SGE(buf.data_ptr(), 4096, io)], 0, "")
    assert client.Wait(-1) == [req]
    assert req.Status() == pygd2fs.errors.NOT_FOUND
    s = pygd2fs.InspectStatus(req)
    assert s.startswith(f"read {p} [0, 4096): NOT_FOUND (1)") and "not" in s.lower(), s
    assert pygd2fs.InspectStatus(req.Status()) == "NOT_FOUND (1)"
    assert pygd2fs.InspectStatus(0) == "OK (0)"
    assert pygd2fs.InspectStatus(pygd2fs.PENDING).startswith("PENDING")
    assert pygd2fs.InspectStatus(99) == "UNKNOWN(99) (99)"
    with pytest.raises(TypeError):
        pygd2fs.InspectStatus("1")
    client.DeregIOMEM(io)


def test_create_then_write(client, conn):
    p = _path()
    st = client.Create(p, 0, 0, "")
    assert st == 0 and st.Status() == 0 and st.Error() == "" and isinstance(st, int)
    assert conn.stat(p)["size"] == 0
    assert client.Create(p, 0, 0, "") == 0  # already there: fine (ranks race)
    data = torch.arange(8192, dtype=torch.int32)
    io = client.RegIOMEM(data.data_ptr(), data.numel() * 4)
    req = client.Write(p, 4096, [pygd2fs.SGE(data.data_ptr(), data.numel() * 4, io)], 0, "")
    assert client.Wait(-1) == [req] and req.Status() == 0, req
    back = torch.zeros_like(data)
    conn.read_into(p, back, offset=4096)
    assert torch.equal(back, data)
    client.DeregIOMEM(io)
    ha = _path()
    assert client.Create(ha, 0, 0, "pool=ha") == 0
    assert conn.stat(ha)["pool"] == "ha"
    with pytest.raises(pygd2fs.BadRequest, match="give 0"):
        client.Create(_path(), 5, 0, "")
    with pytest.raises(ValueError, match="unknown flags"):
        client.Create(_path(), 0, 1, "")
    with pytest.raises(pygd2fs.BadRequest):
        client.Create(_path(), 0, 0, "colour=red")
    with pytest.raises(ValueError):
        client.Create("relative/path", 0, 0, "")


def _established_from(local_ip: str, ports) -> set:
    """Remote ports of ESTABLISHED TCP sockets whose local address is
    local_ip (from /proc/net/tcp: the whole network namespace)."""
    want = socket.inet_aton(local_ip)[::-1].hex().upper()
    out = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            loc, rem, state = fields[1], fields[2], fields[3]
            if state != "01" or loc.split(":")[0] != want:
                continue
            port = int(rem.split(":")[1], 16)
            if port in ports:
                out.add(port)
    return out


def test_several_nics_spread_streams(cluster):
    """GD2FS_DEVICE_NICS makes vLLM's backend pass one data-plane address per
    NIC, comma-separated: every address is bound and streams to each server
    go out through each of them."""
    c = pygd2fs.Client(cluster.cpaddr, "tcp://127.0.0.1, tcp://127.0.0.2", cluster.name, iothreads=4, streams=2)
    try:
        p = _path()
        data = torch.randint(0, 255, (24 << 20,), dtype=torch.uint8)  # several chunks, all servers
        io = c.RegIOMEM(data.data_ptr(), data.numel())
        req = c.Write(p, 0, [pygd2fs.SGE(data.data_ptr(), data.numel(), io)], 0, "")
        assert c.Wait(-1) == [req] and req.Status() == 0, req
        back = torch.zeros_like(data)
        io2 = c.RegIOMEM(back.data_ptr(), back.numel())
        for _ in range(4):  # enough requests for both streams of every server
            req = c.Read(p, 0, [pygd2fs.SGE(back.data_ptr(), back.numel(), io2)], 0, "")
            assert c.Wait(-1) == [req] and req.Status() == 0, req
        assert torch.equal(back, data)
        ports = {int(a.rsplit(":", 1)[1]) for a in cluster.server_addrs}
        one, two = _established_from("127.0.0.1", ports), _established_from("127.0.0.2", ports)
        assert two, "no data-plane connection from 127.0.0.2"
        # Each server that has two streams open has one through each NIC.
        assert one & two, (one, two)
        c.DeregIOMEM(io)
        c.DeregIOMEM(io2)
    finally:
        c.Close()


def test_engine_answer_with_flags_commits(conn):
    """A prefill-only plan: flags go out in kvcache_params, the engine saves
    the prompt's whole blocks only (shorter than the reservation) and answers
    with its own kvcache_params, flags and all."""
    model = f"r2-{uuid.uuid4().hex[:8]}"
    conn.set_layout(model, layers=2, kv_heads=2, head_dim=8, dtype="fp32", page_tokens=16, layout="kv_first")
    sid = f"s-{uuid.uuid4().hex[:8]}"
    p = conn.plan(sid, token_ids=list(range(40)), model=model, decode_tokens=64, format="vllm", flags={"prefill-only": True})
    kp = p["kvcache_params"]
    assert kp["flags"] == {"prefill-only": True}
    # 40 + 64 rounded up to blocks of 16, cut where the prompt's whole blocks end
    assert [f["token_length"] for f in kp["fresh_kvcache"]] == [32, 80]
    fr = kp["fresh_kvcache"][0]
    per_token = 2 * 2 * 2 * 8 * 4
    saved = torch.arange(32 * per_token // 4, dtype=torch.float32)
    conn.write(fr["kv_uri"], saved, offset=fr["kv_start"])
    seg = dict(fr, token_length=32, kv_length=32 * per_token, from_the_future=True)
    answer = {"kvcache_params": {"id": sid, "stored_kvcache": [], "fresh_kvcache": [seg], "load_threshold": 0,
                                 "flags": {"prefill-only": True}, "another_new_field": [1, 2]}}
    s = conn.commit(sid, p, saved=answer)
    assert s["tokens"] == 32
    q = conn.plan(sid, token_ids=list(range(50)), model=model, format="vllm")
    assert q["cached_tokens"] == 32 and "flags" not in q["kvcache_params"]
    st = q["kvcache_params"]["stored_kvcache"][0]
    back = torch.zeros_like(saved)
    conn.read_into(st["kv_uri"], back, offset=st["kv_start"])
    assert torch.equal(back, saved)
    with pytest.raises(ValueError, match="of session"):
        conn.commit(sid, q, saved={"kvcache_params": {"id": "other", "fresh_kvcache": []}})
    with pytest.raises(pygd2fs.BadRequest, match="flags"):
        conn.plan(sid, token_ids=list(range(50)), model=model, flags={"prefill-only": True})  # not an engine plan
