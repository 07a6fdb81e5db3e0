"""Time to first token of the test engine (python/tests/test_engine_loop.py)
for each turn of a long chat, with gd2fs (through `gd2fs router`: load the
stored KV, prefill the rest) and without (the same prompt sent to the engine
directly: prefill everything), in the same run, on a model larger than the
test's (8 layers, 8 heads of 64, float32, blocks of 16, 2 TP ranks).

    /usr/bin/python3 python/bench/engine_ttft.py [turns]

Prints per turn: prompt tokens, cached tokens, the engine's time to first
token (loading stored KV + prefill) without gd2fs (median of 3) and with it,
and their ratio."""

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import test_engine_loop as tel  # noqa: E402

tel.LAYERS, tel.HEADS, tel.DIM = 8, 8, 64
tel.RANK_HEADS = tel.HEADS // tel.TP
tel.torch.set_num_threads(1)  # steadier on a shared machine

import pygd2fs  # noqa: E402
from gd2fs_cluster import Cluster, _wait_line, gd2fs_binary  # noqa: E402


def post(url, doc, session=None):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(doc).encode())
    if session:
        req.add_header("X-Session-ID", session)
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        a = json.load(r)
    return time.perf_counter() - t0, a


def main():
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    binary = gd2fs_binary()
    c = Cluster(binary=binary, name="ttft").start()
    conn = pygd2fs.connect(c.master_url)
    conn.set_layout(tel.MODEL, layers=tel.LAYERS, kv_heads=tel.HEADS, head_dim=tel.DIM, dtype="fp32",
                    page_tokens=tel.BLOCK, layout="kv_first", tp_size=tel.TP)
    engine = tel.Engine(c, blocks=2048)
    srv = tel.serve(engine)
    direct = "http://%s:%d" % srv.server_address
    log = os.path.join(c.dir, "router.log")
    router = subprocess.Popen([binary, "router", "--listen", "127.0.0.1:0", "--master", c.master_url, "--model", tel.MODEL,
                               "--shared-sessions", "--upstream", direct], stderr=open(log, "w"), start_new_session=True)
    url = _wait_line(log, r"gd2fs router on (http://\S+)", router).group(1)
    try:
        prompt = "You are a careful assistant. " * 20
        print(f"{'turn':>4} {'tokens':>6} {'cached':>6} {'no gd2fs ms':>11} {'gd2fs ms':>9} {'ratio':>6}")
        for turn in range(1, turns + 1):
            prompt += f" User turn {turn} asks about item {turn * 7}. " * 6
            # Without gd2fs: the whole prompt, three times, median of the
            # engine's own time to first token (load + prefill).
            base = statistics.median(post(direct, {"prompt": prompt, "max_tokens": 1})[1]["gd2fs_test"]["ttft"] for _ in range(3))
            # With gd2fs, through the router: the turn itself (one shot: it
            # changes the session); the router's own cost is measured apart
            # (go test -bench RouterLatency ./internal/router).
            _, a = post(url, {"prompt": prompt, "max_tokens": 1}, session="long-chat")
            t = a["gd2fs_test"]
            with_s = t["ttft"]
            print(f"{turn:>4} {len(prompt):>6} {t['cached']:>6} {base * 1e3:>11.1f} {with_s * 1e3:>9.1f} {base / with_s:>6.2f}x")
            prompt += a["choices"][0]["text"]
    finally:
        router.kill()
        srv.shutdown()
        engine.client.Close()
        conn.close()
        c.stop()


if __name__ == "__main__":
    main()
