"""Explicit mode with a data server that dies (issue 29): a load planned
before the death fails clearly and promptly (the engine marks those blocks
invalid and recomputes them), never hangs; once the master sees the server
down, plans stop naming its bytes (shortened: server_down) and place the
fresh range on servers that are up. Real processes, real bytes."""

import json
import time
import urllib.parse
import urllib.request
import uuid

import torch

import pygd2fs
from gd2fs_cluster import Cluster
from pygd2fs import errors

BLOCK = 16


def holders(cl, uri):
    path = urllib.parse.urlparse(uri).path
    with urllib.request.urlopen(cl.master_url + "/v1/files" + path, timeout=5) as r:
        f = json.load(r)
    return {rep["server"] for ch in f.get("chunks") or [] for rep in ch["replicas"]}


def test_plan_and_load_with_a_dead_server(binary):
    cl = Cluster(binary=binary, servers=2, name="down").start()
    conn = pygd2fs.connect(cl.master_url)
    client = pygd2fs.Client(cl.cpaddr, "tcp://127.0.0.1", cl.name, iothreads=2, streams=1)
    try:
        model = "d-" + uuid.uuid4().hex[:6]
        conn.set_layout(model, layers=2, kv_heads=2, head_dim=8, dtype="fp32", page_tokens=BLOCK, layout="kv_first")
        sid = "s-" + uuid.uuid4().hex[:6]
        ids = list(range(100, 148))  # 48 tokens
        p = conn.plan(sid, token_ids=ids[:40], model=model, format="vllm")
        seg = p["kvcache_params"]["fresh_kvcache"][0]
        assert seg["token_start"] == 0 and seg["token_length"] == 32
        data = torch.randint(0, 255, (seg["kv_length"],), dtype=torch.uint8)
        io = client.RegIOMEM(data.data_ptr(), data.numel())
        req = client.Write(seg["kv_uri"], seg["kv_start"], [pygd2fs.SGE(data.data_ptr(), data.numel(), io)], 0, "")
        assert client.Wait(-1) == [req] and req.Status() == 0, req
        conn.commit(sid, p, saved=[seg])

        q = conn.plan(sid, token_ids=ids, model=model, format="vllm")
        st = q["kvcache_params"]["stored_kvcache"]
        assert q["cached_tokens"] == 32 and len(st) == 1 and "shortened" not in q
        (holder,) = holders(cl, st[0]["kv_uri"])
        cl.kill_server(int(holder.rsplit("-", 1)[1]))

        # The load planned before the death fails, clearly and at once.
        back = torch.zeros_like(data)
        bio = client.RegIOMEM(back.data_ptr(), back.numel())
        t0 = time.monotonic()
        req = client.Read(st[0]["kv_uri"], st[0]["kv_start"], [pygd2fs.SGE(back.data_ptr(), back.numel(), bio)], 0, "")
        assert client.Wait(-1) == [req]
        assert req.Status() == errors.UNAVAILABLE and time.monotonic() - t0 < 30, req

        # Once the master sees the server down, plans keep the engine off it.
        deadline = time.monotonic() + 30
        while not any(s["id"] == holder and s["state"] == "down" for s in cl.status()["servers"]):
            assert time.monotonic() < deadline, "the master did not see the server down"
            time.sleep(0.05)
        r = conn.plan(sid, token_ids=ids, model=model, format="vllm")
        assert r["shortened"] == "server_down" and r["shortened_tokens"] == 32, r
        assert r["cached_tokens"] == 0 and r["kvcache_params"]["stored_kvcache"] == [], r
        # Its fresh range is on the server that is up: the engine can save.
        f = r["kvcache_params"]["fresh_kvcache"][0]
        req = client.Write(f["kv_uri"], f["kv_start"], [pygd2fs.SGE(data.data_ptr(), data.numel(), io)], 0, "")
        assert client.Wait(-1) == [req] and req.Status() == 0, req
        assert holder not in holders(cl, f["kv_uri"])  # a new file: the old one ends on the dead server
        client.DeregIOMEM(io)
        client.DeregIOMEM(bio)
    finally:
        client.Close()
        conn.close()
        cl.stop()
