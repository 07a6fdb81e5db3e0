"""The Pythonic layer: files, hash-mode KV and explicit sessions, with
bytes, bytearray, memoryview, numpy arrays and torch tensors."""

import os
import uuid

import numpy as np
import pytest
import torch

import pygd2fs
from pygd2fs import errors


def key():
    return "test/" + uuid.uuid4().hex


def test_files(conn):
    d = "/files/" + uuid.uuid4().hex
    p = d + "/a.bin"
    data = np.random.default_rng(1).integers(0, 255, 3 << 20, dtype=np.uint8)
    assert conn.write(p, data) == data.nbytes
    assert conn.write(p, b"tail", offset=data.nbytes) == 4
    st = conn.stat(p)
    assert st["size"] == data.nbytes + 4 and st["pool"] == "perf" and not st["is_dir"]
    out = np.zeros_like(data)
    assert conn.read_into(p, out) == data.nbytes
    assert np.array_equal(out, data)
    t = torch.zeros(1 << 20, dtype=torch.uint8)
    assert conn.read_into(p, t, offset=1 << 20) == 1 << 20
    assert t.numpy().tobytes() == data[1 << 20: 2 << 20].tobytes()
    mv = memoryview(bytearray(8))
    assert conn.read_into(p, mv, offset=data.nbytes - 4) == 8
    assert bytes(mv) == data[-4:].tobytes() + b"tail"
    assert conn.read(p, 4, offset=data.nbytes) == b"tail"
    assert [e["path"] for e in conn.list(d)] == [p]
    assert conn.exists(p)

    with conn.open(d + "/b.bin", "x", pool="ha") as f:
        assert f.write(b"hello ") == 6
        assert f.write(bytearray(b"world")) == 5
        assert f.size == 11
    with pytest.raises(pygd2fs.Exists):
        conn.open(d + "/b.bin", "x")
    with conn.open(d + "/b.bin") as f:
        assert f.read() == b"hello world"
        assert f.read(5, offset=6) == b"world"
    st = conn.stat(d + "/b.bin")
    assert st["sealed"] and st["pool"] == "ha"
    with pytest.raises(pygd2fs.Sealed):
        conn.write(d + "/b.bin", b"more", offset=11)

    conn.remove(p)
    assert not conn.exists(p)
    with pytest.raises(pygd2fs.NotFound):
        conn.stat(p)
    with pytest.raises(pygd2fs.NotFound):
        conn.read_into(p, bytearray(4))


def test_buffers_refused(conn):
    p = "/files/" + uuid.uuid4().hex
    conn.write(p, b"x" * 64)
    t = torch.zeros(8, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="not contiguous"):
        conn.read_into(p, t.t())
    with pytest.raises(ValueError, match="not contiguous"):
        conn.put(key(), t[:, ::2])
    with pytest.raises(ValueError, match="not C-contiguous"):
        conn.read_into(p, np.zeros((8, 8), dtype=np.uint8)[:, ::2])
    with pytest.raises(ValueError, match="read-only"):
        conn.read_into(p, b"immutable")
    with pytest.raises(TypeError, match="exposes no memory"):
        conn.read_into(p, [0] * 8)
    with pytest.raises(ValueError, match="exceeds"):
        conn.get_into(key(), bytearray(4), 8)
    with pytest.raises(ValueError, match="absolute"):
        conn.read_into("x", bytearray(4))


def test_kv(conn):
    k = key()
    v = np.arange(1000, dtype=np.float32)
    assert conn.put(k, v) is False
    assert conn.put(k, b"ignored") is True  # write-once: kept
    assert conn.get(k) == v.tobytes()
    out = torch.zeros(1000, dtype=torch.float32)
    assert conn.get_into(k, out) == 4000
    assert torch.equal(out, torch.from_numpy(v))
    # An address and a size, as engines pass them.
    out2 = torch.zeros(1000, dtype=torch.float32)
    assert conn.get_into(k, out2.data_ptr(), 4000) == 4000
    assert torch.equal(out2, out)
    with pytest.raises(pygd2fs.TooLarge):
        conn.get_into(k, bytearray(10))
    with pytest.raises(pygd2fs.NotFound):
        conn.get(key())
    assert conn.kv().stat(k)["size"] == 4000
    conn.remove_key(k)
    with pytest.raises(pygd2fs.NotFound):
        conn.get(k)
    with pytest.raises(ValueError, match="empty"):
        conn.put("", b"x")
    with pytest.raises(TypeError, match="key"):
        conn.put(5, b"x")


def test_kv_batches(conn):
    n, size = 32, 64 << 10
    keys = [key() for _ in range(n)]
    src = torch.randint(0, 255, (n, size), dtype=torch.uint8)
    res = conn.batch_put_from(keys, [src[i].data_ptr() for i in range(n)], [size] * n)
    assert res == [0] * n
    hits, prefix = conn.batch_exists(keys[:10] + [key()] + keys[10:])
    assert prefix == 10 and hits == [True] * 10 + [False] + [True] * (n - 10)
    dst = torch.zeros(n + 1, size, dtype=torch.uint8)
    got = conn.batch_get_into(keys + [key()], [dst[i].data_ptr() for i in range(n + 1)], [size] * (n + 1))
    assert got == [size] * n + [-errors.NOT_FOUND]
    assert torch.equal(dst[:n], src)
    # Buffers instead of addresses, sizes taken from them.
    bufs = [bytearray(size) for _ in range(2)]
    assert conn.batch_get_into(keys[:2], bufs) == [size, size]
    assert bytes(bufs[1]) == src[1].numpy().tobytes()
    # Another pool.
    ha = conn.kv("ha")
    assert ha.batch_put_from(keys[:2], [b"a", b"bb"]) == [0, 0]
    assert ha.get(keys[1]) == b"bb"
    assert ha.remove_prefix(keys[0]) == 3  # three copies in the ha pool
    assert conn.batch_get_into([], [], []) == []
    with pytest.raises(ValueError, match="2 keys but 1"):
        conn.batch_get_into(keys[:2], [bytearray(4)])


def test_sessions(conn):
    model = "m-" + uuid.uuid4().hex[:8]
    conn.set_layout(model, layers=2, kv_heads=2, head_dim=8, dtype="fp16", page_tokens=4, layout="page_first")
    assert conn.get_layout(model)["layers"] == 2
    s = "s-" + uuid.uuid4().hex[:8]
    ids = list(range(100, 124))  # the conversation's token ids
    with pytest.raises(ValueError, match="token_ids"):
        conn.plan(s, prompt_tokens=16, model=model)  # says nothing of the content
    plan = conn.plan(s, token_ids=ids[:16], model=model)
    assert plan["cached_tokens"] == 0 and plan["fresh_kv_cache"]
    # Write the fresh range where the plan says (its kv_uri names this cluster).
    for r in plan["fresh_kv_cache"]:
        conn.write(r["kv_uri"], bytes([7]) * r["kv_length"], offset=r["kv_start"])
    sess = conn.commit(s, plan)
    assert sess["tokens"] == 16
    assert sess["hashed_tokens"] == 16
    # An edit of token 9 (same length): only the blocks before it are stored.
    edited = ids[:9] + [7] + ids[10:16]
    assert conn.plan(s, token_ids=edited, model=model)["cached_tokens"] == 8
    hashes = pygd2fs.block_hashes(edited, 4)
    assert conn.plan(s, prompt_tokens=16, block_hashes=hashes, model=model)["cached_tokens"] == 8
    # On counts alone (unsafe) it would be all 16.
    assert conn.plan(s, prompt_tokens=16, unsafe_count_only=True, model=model)["cached_tokens"] == 16
    plan2 = conn.plan(s, token_ids=ids, model=model)
    assert plan2["cached_tokens"] == 16
    stored = plan2["stored_kv_cache"][0]
    buf = bytearray(stored["kv_length"])
    conn.read_into(stored["kv_uri"], buf, offset=stored["kv_start"])
    assert buf == bytes([7]) * len(buf)
    f = conn.fork(s, s + "-fork")
    assert f["tokens"] == 16
    assert conn.session(s + "-fork")["id"] == s + "-fork"
    assert s in [x["id"] for x in conn.sessions()]
    conn.delete(s + "-fork")
    conn.delete(s)
    with pytest.raises(pygd2fs.NotFound):
        conn.session(s)


def test_engine_format_plan_and_uris(conn, client, cluster):
    """A vllm-format plan hands out dialable kv_uris
    (gd2fs://host:port/path?cluster=name); both layers take them as paths."""
    model = "e-" + uuid.uuid4().hex[:8]
    conn.set_layout(model, layers=2, kv_heads=4, head_dim=8, dtype="bf16", page_tokens=16, layout="kv_first", tp_size=2)
    s = "s-" + uuid.uuid4().hex[:8]
    plan = conn.plan(s, token_ids=list(range(40)), model=model, format="vllm")
    # Cut where the prompt's whole blocks end (32): prompt tokens, then room.
    fresh = plan["kvcache_params"]["fresh_kvcache"]
    assert [f["token_length"] for f in fresh] == [32, 16] and fresh[0]["kv_uri"].startswith("gd2fs://" + cluster.hostport + "/")
    fresh = fresh[:1]
    r = fresh[0]
    data = torch.randint(0, 255, (r["kv_length"],), dtype=torch.uint8)
    io = client.RegIOMEM(data.data_ptr(), r["kv_length"])
    req = client.Write(r["kv_uri"], r["kv_start"], [pygd2fs.SGE(data.data_ptr(), r["kv_length"], io)], 0, "")
    assert client.Wait(-1) == [req] and req.Status() == 0, req
    conn.commit(s, plan, saved=fresh)
    plan2 = conn.plan(s, token_ids=list(range(80)), model=model, format="vllm")
    stored = plan2["kvcache_params"]["stored_kvcache"]
    assert plan2["cached_tokens"] == r["token_length"]
    back = torch.zeros_like(data)
    assert conn.read_into(stored[0]["kv_uri"], back, offset=stored[0]["kv_start"]) == data.numel()
    assert torch.equal(back, data)
    client.DeregIOMEM(io)
    # A URI of another cluster, or one that names none, is refused.
    wrong = r["kv_uri"].replace("cluster=pytest", "cluster=prod")
    with pytest.raises(ValueError, match="cluster 'prod'"):
        conn.read_into(wrong, back)
    with pytest.raises(ValueError, match="no cluster"):
        conn.read_into(r["kv_uri"].split("?")[0], back)
    with pytest.raises(pygd2fs.BadRequest, match="no valid port"):
        conn.read_into("gd2fs://h:x/p?cluster=pytest", back)
    conn.delete(s)


def test_connect_errors(cluster):
    with pytest.raises(pygd2fs.BadRequest, match="serves cluster"):
        pygd2fs.connect(cluster.master_url, cluster="other")
    with pytest.raises(pygd2fs.Unavailable):
        pygd2fs.connect("http://127.0.0.1:1")
    c = pygd2fs.connect(cluster.hostport, token="")
    assert c.cluster == cluster.name
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.get("x")


def test_timeouts_from_environment(cluster):
    """Engines build Client with their own arguments: GD2FS_IO_TIMEOUT and
    GD2FS_MASTER_RETRY, set when the process starts (Go reads the
    environment when the library loads), tune it; a bad value is a clear
    error."""
    import subprocess
    import sys

    prog = (
        "import sys, torch, pygd2fs\n"
        "c = pygd2fs.connect(sys.argv[1])\n"
        "k = 'env-' + sys.argv[2]\n"
        "c.put(k, torch.arange(16, dtype=torch.uint8))\n"
        "out = torch.zeros(16, dtype=torch.uint8)\n"
        "assert c.batch_get_into([k], [out]) == [16]\n"
        "assert torch.equal(out, torch.arange(16, dtype=torch.uint8))\n"
        "print('ok')\n"
    )
    pypath = os.path.dirname(os.path.dirname(os.path.abspath(pygd2fs.__file__)))

    def run(**env):
        e = dict(os.environ, PYTHONPATH=pypath, **env)
        return subprocess.run([sys.executable, "-c", prog, cluster.master_url, uuid.uuid4().hex],
                              env=e, capture_output=True, text=True, timeout=60)

    bad = run(GD2FS_IO_TIMEOUT="soon")
    assert bad.returncode != 0 and "GD2FS_IO_TIMEOUT" in bad.stderr, bad.stderr
    good = run(GD2FS_IO_TIMEOUT="3s", GD2FS_MASTER_RETRY="0")
    assert good.returncode == 0 and good.stdout.strip() == "ok", good.stderr


def test_threads_share_a_connection(conn):
    """Blocking calls release the GIL in Go; several threads use one
    connection at once and every byte lands where it should."""
    import threading

    n, size = 8, 256 << 10
    keys = [key() for _ in range(n)]
    src = torch.randint(0, 255, (n, size), dtype=torch.uint8)
    failures = []

    def worker(i):
        try:
            p = f"/files/threads/{uuid.uuid4().hex}"
            conn.write(p, src[i])
            conn.put(keys[i], src[i])
            out = torch.zeros(2, size, dtype=torch.uint8)
            assert conn.read_into(p, out[0]) == size
            assert conn.batch_get_into([keys[i]], [out[1]]) == [size]
            assert torch.equal(out[0], src[i]) and torch.equal(out[1], src[i])
        except BaseException as e:  # reported below
            failures.append(e)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts)
    assert not failures, failures


def test_read_into_short_file_raises(conn):
    """A read that cannot fill the buffer raises OutOfRange (issue 25 item
    19), unless partial=True asks for what there is."""
    p = "/files/" + uuid.uuid4().hex
    conn.write(p, b"0123456789")
    buf = bytearray(16)
    with pytest.raises(pygd2fs.OutOfRange, match="read 10 of 16 bytes"):
        conn.read_into(p, buf)
    with pytest.raises(pygd2fs.OutOfRange, match="read 0 of 4 bytes at offset 10"):
        conn.read_into(p, bytearray(4), offset=10)
    empty = "/files/" + uuid.uuid4().hex
    conn.write(empty, b"")
    with pytest.raises(pygd2fs.OutOfRange):
        conn.read_into(empty, torch.zeros(8, dtype=torch.uint8))
    assert conn.read_into(p, buf, partial=True) == 10 and bytes(buf[:10]) == b"0123456789"
    assert conn.read_into(p, bytearray(4), offset=10, partial=True) == 0
    assert conn.read_into(p, bytearray(0)) == 0
    assert conn.read(p, 100) == b"0123456789"
