"""pygd2fs against the Go client, on one loopback cluster, in one run.

    make -C python lib && go build -o bin/gd2fs ./cmd/gd2fs && go build -o bin/goref ./python/bench/goref
    /usr/bin/python3 python/bench/bench.py            # or: make -C python bench

Measures, each beside the Go client doing the same (python/bench/goref, a
separate process with the same client settings):
  1. a 1 GiB file read into one registered torch tensor with ReadAsync
     (Go: File.ReadAt into one []byte);
  2. batch_get_into of 128 x 1 MiB KV blocks (Go: KV.BatchGetInto);
  3. the per-call time of a 4 KiB ReadAsync, and of Read + Wait(-1)
     (Go: File.ReadAt of 4 KiB), sequential, random offsets.
Buffers are touched before timing on both sides; each figure is the best of
``--rounds`` x ``--reps`` (Go and Python alternate by round), medians too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYDIR)
sys.path.insert(0, PYDIR)
sys.path.insert(0, os.path.join(PYDIR, "tests"))

import torch  # noqa: E402

import pygd2fs  # noqa: E402
from gd2fs_cluster import Cluster  # noqa: E402


def goref(cluster: Cluster, *args: str) -> list:
    out = subprocess.run([os.path.join(REPO, "bin", "goref"), "-master", cluster.master_url, *args],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["secs"]


def fmt_rate(nbytes: int, secs: float) -> str:
    return f"{nbytes / secs / 2**30:.2f} GiB/s"


def report(name: str, nbytes: int, go: list, py: list) -> dict:
    gb, pb = min(go), min(py)
    gm, pm = statistics.median(go), statistics.median(py)
    print(f"{name}: Go {fmt_rate(nbytes, gb)} (median {fmt_rate(nbytes, gm)}), "
          f"pygd2fs {fmt_rate(nbytes, pb)} (median {fmt_rate(nbytes, pm)}); "
          f"ratio {gb / pb:.2f} (medians {gm / pm:.2f})", flush=True)
    return {"go_best_s": gb, "py_best_s": pb, "ratio_best": gb / pb, "ratio_median": gm / pm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1 << 30, help="file size (default 1 GiB)")
    ap.add_argument("--blocks", type=int, default=128, help="KV blocks (default 128)")
    ap.add_argument("--block-size", type=int, default=1 << 20, help="KV block size (default 1 MiB)")
    ap.add_argument("--calls", type=int, default=2000, help="4 KiB reads per repetition")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--streams", type=int, default=4)
    a = ap.parse_args()
    binary = os.environ.get("GD2FS_BIN", os.path.join(REPO, "bin", "gd2fs"))
    per_server = max(256 << 20, a.size // 2)
    cl = Cluster(servers=3, name="bench", binary=binary, mem=f"{per_server >> 20}MiB",
                 kv_mem=f"{max(256, a.blocks * a.block_size // (1 << 20))}MiB").start()
    try:
        run(cl, a)
    finally:
        cl.stop()


def run(cl: Cluster, a) -> None:
    client = pygd2fs.Client(cl.cpaddr, "tcp://127.0.0.1", cl.name, iothreads=4, memthreads=1, streams=a.streams)
    conn = pygd2fs.connect(cl.master_url, streams=a.streams)
    path = "/bench/file"
    print(f"cluster: master {cl.master_url}, 3 servers (DRAM tier), streams={a.streams}; "
          f"{os.cpu_count()} CPUs; rounds={a.rounds} reps={a.reps}", flush=True)

    # 1. The file, written once through pygd2fs.
    src = torch.arange(a.size // 8, dtype=torch.int64).view(torch.uint8)
    io = client.RegIOMEM(src.data_ptr(), a.size)
    w = client.Write(path, 0, [pygd2fs.SGE(src.data_ptr(), a.size, io)], 0, "pool=perf")
    client.Wait(-1)
    assert w.Status() == 0, w
    client.DeregIOMEM(io)
    dst = torch.zeros(a.size, dtype=torch.uint8)
    dio = client.RegIOMEM(dst.data_ptr(), a.size)
    sge = [pygd2fs.SGE(dst.data_ptr(), a.size, dio)]

    async def read_all() -> float:
        t = time.perf_counter()
        r = await client.ReadAsync(path, 0, sge, 0)
        dt = time.perf_counter() - t
        assert r.Status() == 0 and r.Value() == a.size, r
        return dt

    go, py = [], []
    for _ in range(a.rounds):
        go += goref(cl, "-op", "read", "-path", path, "-size", str(a.size), "-reps", str(a.reps), "-streams", str(a.streams))
        py += [asyncio.run(read_all()) for _ in range(a.reps)]
    assert torch.equal(dst, src), "bytes differ"
    report(f"read {a.size >> 20} MiB file into one tensor (ReadAsync vs ReadAt)", a.size, go, py)
    client.DeregIOMEM(dio)
    del dst, src

    # 2. KV blocks.
    n, bs = a.blocks, a.block_size
    keys = [f"bench/kv/{i}" for i in range(n)]
    blocks = torch.randint(0, 255, (n, bs), dtype=torch.uint8)
    assert conn.batch_put_from(keys, [blocks[i].data_ptr() for i in range(n)], [bs] * n) == [0] * n
    out = torch.zeros(n, bs, dtype=torch.uint8)
    ptrs, sizes = [out[i].data_ptr() for i in range(n)], [bs] * n
    go, py = [], []
    for _ in range(a.rounds):
        go += goref(cl, "-op", "kv", "-keys", "bench/kv/", "-n", str(n), "-size", str(bs), "-reps", str(a.reps), "-streams", str(a.streams))
        for _ in range(a.reps):
            t = time.perf_counter()
            got = conn.batch_get_into(keys, ptrs, sizes)
            py.append(time.perf_counter() - t)
            assert got == [bs] * n, got
    assert torch.equal(out, blocks)
    report(f"batch_get_into {n} x {bs >> 10} KiB KV blocks (vs BatchGetInto)", n * bs, go, py)
    del out, blocks

    # 3. Per-call overhead of 4 KiB reads.
    small = torch.zeros(4096, dtype=torch.uint8)
    sio = client.RegIOMEM(small.data_ptr(), 4096)
    ssge = [pygd2fs.SGE(small.data_ptr(), 4096, sio)]
    rng = random.Random(1)
    offs = [rng.randrange(a.size // 4096) * 4096 for _ in range(a.calls)]

    async def small_async() -> float:
        t = time.perf_counter()
        for o in offs:
            r = await client.ReadAsync(path, o, ssge, 0)
            if r.Status():
                raise RuntimeError(r)
        return time.perf_counter() - t

    def small_wait() -> float:
        t = time.perf_counter()
        for o in offs:
            r = client.Read(path, o, ssge, 0, "")
            client.Wait(-1)
            if r.Status():
                raise RuntimeError(r)
        return time.perf_counter() - t

    go, pa, pw = [], [], []
    for _ in range(a.rounds):
        go += goref(cl, "-op", "small", "-path", path, "-n", str(a.calls), "-reps", str(a.reps), "-streams", str(a.streams))
        pa += [asyncio.run(small_async()) for _ in range(a.reps)]
        pw += [small_wait() for _ in range(a.reps)]
    us = lambda s: min(s) / a.calls * 1e6  # noqa: E731
    print(f"4 KiB read, per call: Go ReadAt {us(go):.1f} us, pygd2fs ReadAsync {us(pa):.1f} us "
          f"(+{us(pa) - us(go):.1f} us), Read+Wait(-1) {us(pw):.1f} us (+{us(pw) - us(go):.1f} us); "
          f"medians {statistics.median(go) / a.calls * 1e6:.1f} / {statistics.median(pa) / a.calls * 1e6:.1f} / "
          f"{statistics.median(pw) / a.calls * 1e6:.1f} us", flush=True)
    client.Close()
    conn.close()


if __name__ == "__main__":
    main()
