"""The engine-facing API, used the way vLLM's explicit-offloading connector
(storage/gd2fs.py) and SGLang's GD2FS storage backend use it, against a real
cluster on loopback."""

import asyncio
import ctypes
import select
import threading
import uuid

import pytest
import torch

import pygd2fs
from pygd2fs import errors

LAYERS, BLOCKS, BLOCK_TOKENS, HEADS, DIM = 4, 32, 16, 4, 64


def paged_cache(seed=None):
    """Per-layer KV tensors shaped like vLLM's paged cache:
    (2 [K, V], blocks, block_tokens, kv_heads, head_dim), bf16."""
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    out = []
    for _ in range(LAYERS):
        if g is None:
            out.append(torch.zeros(2, BLOCKS, BLOCK_TOKENS, HEADS, DIM, dtype=torch.bfloat16))
        else:
            out.append(torch.randn(2, BLOCKS, BLOCK_TOKENS, HEADS, DIM, generator=g).to(torch.bfloat16))
    return out


def block_bytes(t):
    return t[0, 0].numel() * t.element_size()


def runs(block_ids):
    """[(first, count)] of consecutive block ids."""
    out = []
    for b in block_ids:
        if out and out[-1][0] + out[-1][1] == b:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((b, 1))
    return out


def sges_for(layers, iomems, block_ids):
    """One SGE per (run of blocks, layer, K/V): the file holds, per run, every
    layer's K then V bytes of those blocks."""
    sges = []
    for first, count in runs(block_ids):
        for t, io in zip(layers, iomems):
            bb = block_bytes(t)
            for kv in range(2):
                addr = t.data_ptr() + (kv * BLOCKS + first) * bb
                sges.append(pygd2fs.SGE(addr, count * bb, io))
    return sges


def register(client, layers):
    return [client.RegIOMEM(t.data_ptr(), t.numel() * t.element_size()) for t in layers]


def path():
    return f"/kv/test/{uuid.uuid4().hex}"


def check(req, expect):
    assert req is not None
    assert req.Status() == 0, req
    assert req.Value() == expect, req
    assert req.Error() == ""


def test_paged_cache_async_round_trip(client):
    src, dst = paged_cache(seed=1), paged_cache()
    src_io, dst_io = register(client, src), register(client, dst)
    block_ids = [2, 3, 4, 9, 17, 18, 31]
    p = path()

    async def go():
        sges = sges_for(src, src_io, block_ids)
        expect = sum(s.length for s in sges)
        req = await client.WriteAsync(p, 0, sges, 0)
        check(req, expect)
        req = await client.ReadAsync(p, 0, sges_for(dst, dst_io, block_ids), 0)
        check(req, expect)
        # Several loads in flight at once on one event loop.
        reqs = await asyncio.gather(*[
            client.ReadAsync(p, 0, sges_for(dst, dst_io, block_ids), 0) for _ in range(8)])
        for r in reqs:
            check(r, expect)

    asyncio.run(go())
    for s, d in zip(src, dst):
        for b in range(BLOCKS):
            if b in block_ids:
                assert torch.equal(s[:, b].view(torch.int16), d[:, b].view(torch.int16)), b
            else:
                assert not d[:, b].view(torch.int16).any(), b  # untouched
    for io in src_io + dst_io:
        client.DeregIOMEM(io)


def test_bounce_policy_like_vllm(client):
    """vLLM's default TCP policy: a pinned host tensor registered per
    transfer, deregistered in finally."""
    src = paged_cache(seed=2)
    p = path()

    async def save_then_load():
        flat = torch.cat([t.flatten() for t in src])
        n = flat.numel() * flat.element_size()
        io = client.RegIOMEM(flat.data_ptr(), n)
        try:
            check(await client.WriteAsync(p, 0, [pygd2fs.SGE(flat.data_ptr(), n, io)], 0), n)
        finally:
            client.DeregIOMEM(io)
        host = torch.empty_like(flat)
        io = client.RegIOMEM(host.data_ptr(), n)
        try:
            check(await client.ReadAsync(p, 0, [pygd2fs.SGE(host.data_ptr(), n, io)], 0), n)
        finally:
            client.DeregIOMEM(io)
        return flat, host

    flat, host = asyncio.run(save_then_load())
    assert torch.equal(flat.view(torch.int16), host.view(torch.int16))


def test_sglang_style_read_write_wait(client):
    src = torch.randint(0, 255, (3 << 20,), dtype=torch.uint8)
    n = src.numel()
    p = path()
    io = client.RegIOMEM(src.data_ptr(), n)
    req = client.Write(p, 0, [pygd2fs.SGE(src.data_ptr(), n, io)], 0, "")
    reqs = client.Wait(-1)
    assert reqs == [req] and reqs[0] is req
    check(req, n)
    client.DeregIOMEM(io)

    dst = torch.zeros_like(src)
    io = client.RegIOMEM(dst.data_ptr(), n)
    fd = client.GetFd()
    req = client.Read(p, 0, [pygd2fs.SGE(dst.data_ptr(), n, io)], 0, "")
    handlers = {req: lambda: None}  # Requests are dict keys in SGLang
    r, _, _ = select.select([fd], [], [], 30)
    assert r == [fd], "the fd turns readable when a request completes"
    done = client.Wait(0)
    assert done == [req]
    del handlers[req]
    check(req, n)
    assert torch.equal(src, dst)
    assert client.Wait(0) == []
    assert client.Wait(-1) == [], "nothing in flight: Wait(-1) returns at once"
    r, _, _ = select.select([fd], [], [], 0)
    assert r == [], "the fd is not readable once everything is collected"
    client.DeregIOMEM(io)


def test_threads_read_write_wait_loops(cluster):
    client = pygd2fs.Client(cluster.cpaddr, "tcp://127.0.0.1", cluster.name, iothreads=8, streams=2)
    threads, rounds, size = 4, 10, 256 << 10
    bufs = [torch.randint(0, 255, (size,), dtype=torch.uint8) for _ in range(threads)]
    outs = [torch.zeros(size, dtype=torch.uint8) for _ in range(threads)]
    ios = [(client.RegIOMEM(b.data_ptr(), size), client.RegIOMEM(o.data_ptr(), size)) for b, o in zip(bufs, outs)]
    failures = []

    def wait_for(req):
        while not req.Done():
            client.Wait(-1)  # may collect other threads' requests too

    def worker(i):
        try:
            for k in range(rounds):
                p = f"/kv/threads/{i}/{k}"
                w = client.Write(p, 0, [pygd2fs.SGE(bufs[i].data_ptr(), size, ios[i][0])], 0, "")
                wait_for(w)
                check(w, size)
                r = client.Read(p, 0, [pygd2fs.SGE(outs[i].data_ptr() + size // 2, size // 2, ios[i][1]),
                                       pygd2fs.SGE(outs[i].data_ptr(), size // 2, ios[i][1])], 0, "")
                wait_for(r)
                check(r, size)
                assert torch.equal(outs[i][size // 2:], bufs[i][:size // 2])
                assert torch.equal(outs[i][:size // 2], bufs[i][size // 2:])
        except BaseException as e:  # reported below
            failures.append(e)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts), "a thread hung"
    assert not failures, failures
    client.Close()


def test_write_creates_extends_and_pools(client, conn):
    data = bytearray(range(256)) * 16  # 4 KiB
    buf = (ctypes.c_char * len(data)).from_buffer(data)
    addr = ctypes.addressof(buf)
    io = client.RegIOMEM(addr, len(data))
    p = path()
    client.Write(p, 0, [pygd2fs.SGE(addr, 4096, io)], 0, "")
    check(client.Wait(-1)[0], 4096)
    client.Write(p, 8192, [pygd2fs.SGE(addr, 4096, io)], 0, "")  # extends, leaving a hole
    check(client.Wait(-1)[0], 4096)
    st = conn.stat(p)
    assert st["size"] == 12288 and st["pool"] == "perf"
    got = conn.read(p)
    assert got[:4096] == data and got[4096:8192] == bytes(4096) and got[8192:] == data

    ha = path()
    client.Write(ha, 0, [pygd2fs.SGE(addr, 4096, io)], 0, "pool=ha")
    check(client.Wait(-1)[0], 4096)
    assert conn.stat(ha)["pool"] == "ha"
    assert len(conn.stat(ha)["chunks"][0]["replicas"]) == 3

    # A sealed file: the write completes with SEALED, never a crash.
    sealed = path()
    with conn.open(sealed, "w", pool="perf") as f:
        f.write(b"x" * 10)
    req = client.Write(sealed, 0, [pygd2fs.SGE(addr, 16, io)], 0, "")
    client.Wait(-1)
    assert req.Status() == errors.SEALED, req
    assert "sealed" in req.Error() and sealed in req.Error()
    client.DeregIOMEM(io)
    del buf


def test_read_failures_complete_with_status(client):
    dst = torch.zeros(8192, dtype=torch.uint8)
    io = client.RegIOMEM(dst.data_ptr(), 8192)
    p = path()
    client.Write(p, 0, [pygd2fs.SGE(dst.data_ptr(), 4096, io)], 0, "")
    check(client.Wait(-1)[0], 4096)
    cases = {
        "/kv/test/missing-" + uuid.uuid4().hex: errors.NOT_FOUND,
        p: errors.OUT_OF_RANGE,  # 8 KiB from a 4 KiB file
    }
    for path_, code in cases.items():
        req = client.Read(path_, 0, [pygd2fs.SGE(dst.data_ptr(), 8192, io)], 0, "")
        assert client.Wait(-1) == [req]
        assert req.Status() == code, req
        assert path_ in req.Error() and "[0, 8192)" in req.Error()
        assert path_ in repr(req) and pygd2fs.status_name(code) in repr(req)
    req = client.Read(p, 4096, [pygd2fs.SGE(dst.data_ptr(), 1, io)], 0, "")
    client.Wait(-1)
    assert req.Status() == errors.OUT_OF_RANGE
    client.DeregIOMEM(io)


def test_bad_input_raises(cluster, client):
    t = torch.zeros(4096, dtype=torch.uint8)
    base = t.data_ptr()
    io = client.RegIOMEM(base, 4096)
    ok = pygd2fs.SGE(base, 4096, io)
    p = path()

    with pytest.raises(ValueError, match="outside its IOMEM"):
        pygd2fs.SGE(base + 1, 4096, io)
    with pytest.raises(ValueError, match="outside its IOMEM"):
        pygd2fs.SGE(base - 1, 1, io)
    with pytest.raises(ValueError, match=">= 1"):
        pygd2fs.SGE(base, 0, io)
    with pytest.raises(ValueError, match=">= 1"):
        pygd2fs.SGE(base, -5, io)
    with pytest.raises(TypeError, match="IOMEM"):
        pygd2fs.SGE(base, 16, None)
    with pytest.raises(TypeError, match="int"):
        pygd2fs.SGE("0x10", 16, io)
    with pytest.raises(ValueError, match="negative|>= 0"):
        client.Read(p, -1, [ok], 0, "")
    with pytest.raises(ValueError, match="unknown flags"):
        client.Read(p, 0, [ok], 4, "")
    with pytest.raises(ValueError, match="empty"):
        client.Read(p, 0, [], 0, "")
    with pytest.raises(TypeError, match="SGE"):
        client.Read(p, 0, [(base, 16)], 0, "")
    with pytest.raises(TypeError, match="list"):
        client.Read(p, 0, "sges", 0, "")
    with pytest.raises(TypeError, match="path"):
        client.Read(42, 0, [ok], 0, "")
    with pytest.raises(ValueError, match="absolute"):
        client.Read("relative/path", 0, [ok], 0, "")
    with pytest.raises(ValueError, match="cluster"):
        client.Read("gd2fs://elsewhere/x", 0, [ok], 0, "")
    with pytest.raises(TypeError, match="opts"):
        client.Write(p, 0, [ok], 0, {"pool": "ha"})
    with pytest.raises(pygd2fs.BadRequest, match="unknown option"):
        client.Write(p, 0, [ok], 0, "colour=blue")
    with pytest.raises(pygd2fs.BadRequest, match="no options"):
        client.Read(p, 0, [ok], 0, "pool=ha")
    with pytest.raises(pygd2fs.BadRequest, match=r"\.\."):
        client.Read("/kv/../etc", 0, [ok], 0, "")
    with pytest.raises(ValueError, match=">= 1"):
        client.RegIOMEM(0, 16)
    with pytest.raises(ValueError, match=">= 1"):
        client.RegIOMEM(base, 0)

    # An SGE changed after it was made is checked again at submit.
    moved = pygd2fs.SGE(base, 16, io)
    moved.addr = base + 4090
    with pytest.raises(ValueError, match="outside its IOMEM"):
        client.Read(p, 0, [moved], 0, "")

    # And the Go side checks on its own, whatever Python let through.
    from pygd2fs import _lib

    addrs = (ctypes.c_void_p * 1)(base + 4000)
    lens = (ctypes.c_int64 * 1)(200)
    ids = (ctypes.c_int64 * 1)(io._id)
    with pytest.raises(pygd2fs.BadRequest, match="outside its IOMEM"):
        _lib.call("gd2fs_submit", client._h, 0, p.encode(), 0, addrs, lens, ids, 1, 0, b"", 0)
    ids[0] = 999999
    lens[0] = 16
    with pytest.raises(pygd2fs.BadRequest, match="not registered"):
        _lib.call("gd2fs_submit", client._h, 0, p.encode(), 0, addrs, lens, ids, 1, 0, b"", 0)

    # IOMEM of another client, and a deregistered one.
    other = pygd2fs.Client(cluster.cpaddr, "tcp://127.0.0.1", cluster.name)
    oio = other.RegIOMEM(base, 4096)
    with pytest.raises(ValueError, match="another client"):
        client.Read(p, 0, [pygd2fs.SGE(base, 16, oio)], 0, "")
    other.Close()
    client.DeregIOMEM(io)
    with pytest.raises(ValueError, match="deregistered"):
        client.Read(p, 0, [ok], 0, "")
    with pytest.raises(ValueError, match="deregistered"):
        pygd2fs.SGE(base, 16, io)
    with pytest.raises(ValueError, match="already deregistered"):
        client.DeregIOMEM(io)
    # Go refuses the deregistered id too.
    ids[0] = io._id
    addrs[0] = base
    with pytest.raises(pygd2fs.BadRequest, match="not registered"):
        _lib.call("gd2fs_submit", client._h, 0, p.encode(), 0, addrs, lens, ids, 1, 0, b"", 0)


def test_client_arguments(cluster):
    with pytest.raises(pygd2fs.BadRequest, match="RDMA data plane not available in this build"):
        pygd2fs.Client(cluster.cpaddr, "rdma://10.0.0.1", cluster.name)
    with pytest.raises(pygd2fs.BadRequest, match="serves cluster 'pytest'|serves cluster \"pytest\""):
        pygd2fs.Client(cluster.cpaddr, "tcp://127.0.0.1", "prod")
    with pytest.raises(pygd2fs.BadRequest, match="host:port"):
        pygd2fs.Client("gd2fs://nohost", "tcp://127.0.0.1", cluster.name)
    with pytest.raises(pygd2fs.BadRequest, match="not an address of this machine"):
        pygd2fs.Client(cluster.cpaddr, "tcp://203.0.113.7", cluster.name)
    with pytest.raises(ValueError, match="iothreads"):
        pygd2fs.Client(cluster.cpaddr, "tcp://127.0.0.1", cluster.name, iothreads=0)
    with pytest.raises(TypeError, match="cpaddr"):
        pygd2fs.Client(None, "tcp://127.0.0.1", cluster.name)
    # Both spellings of several masters; the second is unreachable.
    for cp in (f"{cluster.cpaddr},gd2fs://127.0.0.1:1", f"{cluster.cpaddr},127.0.0.1:1"):
        c = pygd2fs.Client(cp, "tcp://127.0.0.1", cluster.name)
        assert c.cluster == cluster.name
        c.Close()
    with pytest.raises(pygd2fs.Unavailable, match="cannot reach"):
        pygd2fs.Client("gd2fs://127.0.0.1:1", "tcp://127.0.0.1", cluster.name)


def test_cancel_and_close(cluster):
    client = pygd2fs.Client(cluster.cpaddr, "tcp://127.0.0.1", cluster.name, iothreads=1)
    size = 8 << 20
    t = torch.randint(0, 255, (size,), dtype=torch.uint8)
    io = client.RegIOMEM(t.data_ptr(), size)
    p = path()
    client.Write(p, 0, [pygd2fs.SGE(t.data_ptr(), size, io)], 0, "")
    check(client.Wait(-1)[0], size)

    async def cancelled():
        task = asyncio.ensure_future(client.ReadAsync(p, 0, [pygd2fs.SGE(t.data_ptr(), size, io)], 0))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    client.DeregIOMEM(io)  # waits for the cancelled transfer to let go

    io = client.RegIOMEM(t.data_ptr(), size)
    reqs = [client.Read(p, 0, [pygd2fs.SGE(t.data_ptr(), size, io)], 0, "") for _ in range(4)]
    client.Close()
    for r in reqs:
        assert r.Done()
        assert r.Status() in (0, errors.CANCELLED), r
    with pytest.raises(ValueError, match="closed"):
        client.Read(p, 0, [pygd2fs.SGE(t.data_ptr(), 16, io)], 0, "")


def test_async_from_several_loops_and_threads(cluster):
    """One client, an event loop per thread (as engines with several worker
    loops have), each awaiting its own transfers."""
    client = pygd2fs.Client(cluster.cpaddr, "tcp://127.0.0.1", cluster.name, iothreads=4, streams=2)
    size = 64 << 10
    failures = []

    def worker(i):
        async def go():
            src = torch.full((size,), i, dtype=torch.uint8)
            dst = torch.zeros(size, dtype=torch.uint8)
            io = client.RegIOMEM(src.data_ptr(), size)
            dio = client.RegIOMEM(dst.data_ptr(), size)
            for k in range(5):
                p = f"/kv/loops/{i}/{k}"
                check(await client.WriteAsync(p, 0, [pygd2fs.SGE(src.data_ptr(), size, io)], 0), size)
                check(await client.ReadAsync(p, 0, [pygd2fs.SGE(dst.data_ptr(), size, dio)], 0), size)
                assert torch.equal(src, dst)
            client.DeregIOMEM(io)
            client.DeregIOMEM(dio)

        try:
            asyncio.run(go())
        except BaseException as e:  # reported below
            failures.append(e)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts), "a loop hung"
    assert not failures, failures
    client.Close()
