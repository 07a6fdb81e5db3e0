"""A load that fails after its plan (issue 29): the data server holding a
planned segment is stopped (SIGSTOP) or killed (SIGKILL) after the plan.
The engine's load must come back -- never hang -- as a failed transfer, so
that vLLM's explicit-offloading worker reports the request's blocks in
get_block_ids_with_load_errors() (vLLM recomputes them) and SGLang's
backend raises (its prefetch finishes not ok). A stopped server answers
nothing and resets nothing: only the transfer's own deadline
(GD2FS_IO_TIMEOUT, default 10s, plus 1s per 8 MiB) ends the load, with
status TIMEOUT. Real processes; the engine side is the double in
tests/doubles (tensorfer/vllm explicit_offloading worker.py and
storage/gd2fs.py)."""

import asyncio
import json
import os
import signal
import sys
import urllib.parse
import urllib.request
import uuid

import torch

import pygd2fs
from gd2fs_cluster import Cluster
from pygd2fs import errors

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "doubles"))
from vllm.distributed.kv_transfer.kv_connector.v1.explicit_offloading.storage.gd2fs import GD2FSStorage  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.explicit_offloading.worker import (  # noqa: E402
    ExOffloadingConnectorWorker,
    LoadContext,
)

BLOCK = 16  # tokens per page
BLOCK_BYTES = 4096  # 2 layers x (k, v) x 2 heads x 8 dims x fp32 x 16 tokens
HUNG = 120  # seconds: far past any deadline; reaching it means a hang


def holder_index(cl, uri):
    path = urllib.parse.urlparse(uri).path
    with urllib.request.urlopen(cl.master_url + "/v1/files" + path, timeout=5) as r:
        f = json.load(r)
    (server,) = {rep["server"] for ch in f.get("chunks") or [] for rep in ch["replicas"]}
    return int(server.rsplit("-", 1)[1])


def stored_segment(cl, conn, worker, storage, kv):
    """Saves blocks 1 and 2 as a session's first 32 tokens, commits them and
    plans again: the returned stored segment is what the engine loads."""
    model = "lf-" + uuid.uuid4().hex[:6]
    conn.set_layout(model, layers=2, kv_heads=2, head_dim=8, dtype="fp32", page_tokens=BLOCK, layout="kv_first")
    sid = "s-" + uuid.uuid4().hex[:6]
    ids = list(range(200, 248))
    p = conn.plan(sid, token_ids=ids[:40], model=model, format="vllm")
    seg = p["kvcache_params"]["fresh_kvcache"][0]
    assert seg["token_length"] == 2 * BLOCK and seg["kv_length"] == 2 * BLOCK_BYTES, seg
    asyncio.run_coroutine_threadsafe(storage.save(seg["kv_uri"], seg["kv_start"], [[1, 2]]), worker._loop).result(HUNG)
    conn.commit(sid, p, saved=[seg])
    q = conn.plan(sid, token_ids=ids, model=model, format="vllm")
    (st,) = q["kvcache_params"]["stored_kvcache"]
    return st


def load(worker, st, rid):
    worker.start_load_kv([LoadContext(rid, st["kv_uri"], st["kv_start"], [[5, 6]])])
    assert worker.wait_finished(rid, HUNG), f"the load of {rid} hung"
    return worker.get_block_ids_with_load_errors()


def test_load_from_a_stopped_then_killed_server(binary):
    cl = Cluster(binary=binary, servers=2, name="loadfail").start()
    conn = pygd2fs.connect(cl.master_url)
    storage = GD2FSStorage({"cpaddr": cl.cpaddr, "cluster": cl.name, "iothreads": 2})
    worker = ExOffloadingConnectorWorker(storage)
    kv = torch.randint(0, 255, (8, BLOCK_BYTES), dtype=torch.uint8)
    storage.register_kvcache(kv)
    stopped = None
    try:
        st = stored_segment(cl, conn, worker, storage, kv)
        i = holder_index(cl, st["kv_uri"])
        pid = cl.servers[i].pid

        # Stopped after the plan: the load ends at its deadline, the
        # request's blocks are reported invalid, with the status.
        os.kill(pid, signal.SIGSTOP)
        stopped = pid
        assert load(worker, st, "r-stopped") == {5, 6}
        assert any("TIMEOUT : 19" in e for e in worker.errors), worker.errors

        # SGLang's backend: Read, then Wait(-1) until it completes.
        back = torch.zeros(2 * BLOCK_BYTES, dtype=torch.uint8)
        io = storage.client.RegIOMEM(back.data_ptr(), back.numel())
        req = storage.client.Read(st["kv_uri"], st["kv_start"], [pygd2fs.SGE(back.data_ptr(), back.numel(), io)], 0, "")
        assert storage.client.Wait(-1) == [req]
        assert req.Status() == errors.TIMEOUT, req
        assert "GD2FS_IO_TIMEOUT" in req.Error() and "stopped" in req.Error(), req
        ok, name, message, code = pygd2fs.InspectStatus(req)
        assert (ok, name, code) == (False, "TIMEOUT", errors.TIMEOUT) and message == req.Error()

        # Resumed: the same load succeeds, bytes as saved.
        os.kill(pid, signal.SIGCONT)
        stopped = None
        assert load(worker, st, "r-resumed") == set()
        assert torch.equal(kv[5], kv[1]) and torch.equal(kv[6], kv[2])

        # Killed after the plan: refused at once, reported the same way.
        worker.errors.clear()
        kv[5:7] = 0
        cl.kill_server(i)
        assert load(worker, st, "r-killed") == {5, 6}
        assert any("UNAVAILABLE : 8" in e for e in worker.errors), worker.errors
        storage.client.DeregIOMEM(io)
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        worker.shutdown()
        storage.client.Close()
        conn.close()
        cl.stop()
