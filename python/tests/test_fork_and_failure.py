"""Fork before and after the Go library is loaded (each in a fresh
interpreter, so this test process never forks a Go runtime), and a data
server killed (SIGKILL) during a batch."""

import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import torch

import pygd2fs
from gd2fs_cluster import Cluster
from pygd2fs import errors

PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRELUDE = """
import ctypes, os, sys
sys.path.insert(0, {pydir!r})
import pygd2fs
CP, NAME = {cp!r}, {name!r}

def roundtrip(client, path):
    # ctypes buffers: importing torch in each child would cost seconds
    src = (ctypes.c_uint8 * 4096)(*[i % 251 for i in range(4096)])
    dst = (ctypes.c_uint8 * 4096)()
    io = client.RegIOMEM(ctypes.addressof(src), 4096)
    w = client.Write(path, 0, [pygd2fs.SGE(ctypes.addressof(src), 4096, io)], 0, "")
    assert client.Wait(-1) == [w] and w.Status() == 0, w
    io2 = client.RegIOMEM(ctypes.addressof(dst), 4096)
    r = client.Read(path, 0, [pygd2fs.SGE(ctypes.addressof(dst), 4096, io2)], 0, "")
    assert client.Wait(-1) == [r] and r.Status() == 0, r
    assert bytes(src) == bytes(dst)
"""


def run(cluster, body, timeout=60):
    code = PRELUDE.format(pydir=PYDIR, cp=cluster.cpaddr, name=cluster.name) + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p.stdout


def test_fork_before_first_client(cluster):
    out = run(cluster, """
        pid = os.fork()
        if pid == 0:
            try:
                c = pygd2fs.Client(CP, "tcp://127.0.0.1", NAME)
                roundtrip(c, "/fork/before/child")
                c.Close()
                os._exit(0)
            except BaseException as e:
                print("child failed:", repr(e), flush=True)
                os._exit(3)
        _, st = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(st) == 0, st
        c = pygd2fs.Client(CP, "tcp://127.0.0.1", NAME)
        roundtrip(c, "/fork/before/parent")
        print("ok")
    """)
    assert "ok" in out


def test_fork_after_first_client(cluster):
    out = run(cluster, """
        c = pygd2fs.Client(CP, "tcp://127.0.0.1", NAME)
        roundtrip(c, "/fork/after/parent1")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            msgs = []
            for attempt in (lambda: roundtrip(c, "/fork/after/child"),
                            lambda: pygd2fs.Client(CP, "tcp://127.0.0.1", NAME),
                            lambda: c.Wait(0)):
                try:
                    attempt()
                    msgs.append("no error")
                except pygd2fs.ForkError as e:
                    msgs.append(str(e))
            os.write(w, "\\n".join(msgs).encode())
            c.Close()  # a no-op here, never a hang
            del c
            os._exit(0)
        os.close(w)
        _, st = os.waitpid(pid, 0)
        text = os.read(r, 65536).decode()
        assert os.waitstatus_to_exitcode(st) == 0, st
        roundtrip(c, "/fork/after/parent2")  # the parent is unaffected
        print(text)
    """)
    lines = out.strip().splitlines()
    assert len(lines) >= 3 and "no error" not in out, out
    assert "forked" in out and "spawn" in out and "after forking" in out, out


@pytest.fixture
def small_cluster(binary):
    c = Cluster(servers=3, name="killtest", binary=binary).start()
    yield c
    c.stop()


def test_server_killed_during_batch(small_cluster):
    cl = small_cluster
    client = pygd2fs.Client(cl.cpaddr, "tcp://127.0.0.1", cl.name, iothreads=8, streams=2)
    conn = pygd2fs.connect(cl.master_url)
    size = 16 << 20
    src = torch.randint(0, 255, (size,), dtype=torch.uint8)
    io = client.RegIOMEM(src.data_ptr(), size)
    p = "/kill/" + uuid.uuid4().hex
    # 1 MiB chunks in the perf pool (one copy): every server holds some.
    client.Write(p, 0, [pygd2fs.SGE(src.data_ptr(), size, io)], 0, "pool=perf,chunk_size=1048576")
    assert client.Wait(-1)[0].Status() == 0
    keys = [f"kill/{i}" for i in range(64)]
    blocks = torch.randint(0, 255, (64, 4096), dtype=torch.uint8)
    assert conn.batch_put_from(keys, [blocks[i] for i in range(64)]) == [0] * 64

    dst = torch.zeros(size, dtype=torch.uint8)
    dio = client.RegIOMEM(dst.data_ptr(), size)
    piece = size // 8
    reqs = [client.Read(p, i * piece, [pygd2fs.SGE(dst.data_ptr() + i * piece, piece, dio)], 0, "")
            for i in range(8)]
    cl.kill_server(1)
    start = time.monotonic()
    done = []
    while len(done) < len(reqs):
        assert time.monotonic() - start < 60, "requests hung after a server died"
        done += client.Wait(-1)
    assert set(done) == set(reqs)
    for r in reqs:
        assert r.Status() in (0, errors.UNAVAILABLE), r
        if r.Status():
            assert "unavailable" in r.Error() and p in r.Error(), r
    # Reads that need the dead server fail, clearly, every time from now on.
    req = client.Read(p, 0, [pygd2fs.SGE(dst.data_ptr(), size, dio)], 0, "")
    client.Wait(-1)
    assert req.Status() == errors.UNAVAILABLE, req
    assert "no replica answered" in req.Error() and "perf" in req.Error(), req

    # KV batches: keys owned by the dead server are misses (-1), never a hang.
    out = torch.zeros(64, 4096, dtype=torch.uint8)
    t0 = time.monotonic()
    got = conn.batch_get_into(keys, [out[i] for i in range(64)])
    assert time.monotonic() - t0 < 60
    assert 0 < got.count(-errors.NOT_FOUND) < 64, got
    for i, n in enumerate(got):
        if n == 4096:
            assert torch.equal(out[i], blocks[i])
    client.Close()
    conn.close()
