"""A real engine loop end to end (issue 10): a small transformer in PyTorch
with a paged KV cache (blocks of 16 tokens, per-layer K and V tensors, two
tensor-parallel ranks) behind a minimal OpenAI-compatible HTTP front that
honours kv_transfer_params the way vLLM's explicit-offloading connector
does: it loads the stored segments through pygd2fs into its blocks, prefills
only the uncached tokens, saves the fresh whole blocks through pygd2fs
(kv_first bytes, one region per rank) and answers with what it saved.
Chats go through `gd2fs router`. Every turn's logits must equal a full
recompute without any cache, and the tokens prefilled must drop by exactly
the cached amount."""

from __future__ import annotations

import json
import os
import re
import string
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

torch = pytest.importorskip("torch")

import pygd2fs  # noqa: E402
from gd2fs_cluster import Cluster, _wait_line  # noqa: E402

ALPHA = string.ascii_letters + string.digits + " ."  # 64 tokens, one per character
BLOCK, LAYERS, HEADS, DIM, TP = 16, 2, 4, 8, 2
RANK_HEADS = HEADS // TP
MODEL = "tiny-tp2"


def tokenize(text: str) -> list:
    return [ALPHA.index(c) if c in ALPHA else len(ALPHA) - 1 for c in text]


def detokenize(ids) -> str:
    return "".join(ALPHA[i] for i in ids)


class Tiny(torch.nn.Module):
    """Decoder-only transformer: learned positions, causal attention over a
    paged cache (float32; a cache hit and a recompute agree to rounding)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1234)
        d = HEADS * DIM

        def p(*shape):
            return torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=torch.float32) * 0.3)

        self.emb, self.pos = p(len(ALPHA), d), p(4096, d)
        self.wq = torch.nn.ParameterList([p(d, d) for _ in range(LAYERS)])
        self.wk = torch.nn.ParameterList([p(d, d) for _ in range(LAYERS)])
        self.wv = torch.nn.ParameterList([p(d, d) for _ in range(LAYERS)])
        self.wo = torch.nn.ParameterList([p(d, d) for _ in range(LAYERS)])
        self.out = p(d, len(ALPHA))

    @torch.no_grad()
    def forward(self, ids, start, kv_write, kv_read):
        """Logits of tokens ids at positions start.. ; kv_write(layer, pos,
        k, v) stores each new token's K and V ([n, HEADS, DIM]); kv_read(layer,
        n) returns K and V of positions 0..n-1."""
        n = len(ids)
        x = self.emb[torch.tensor(ids)] + self.pos[start:start + n]
        for layer in range(LAYERS):
            q = (x @ self.wq[layer]).view(n, HEADS, DIM)
            k = (x @ self.wk[layer]).view(n, HEADS, DIM)
            v = (x @ self.wv[layer]).view(n, HEADS, DIM)
            kv_write(layer, start, k, v)
            K, V = kv_read(layer, start + n)  # [T, HEADS, DIM]
            att = torch.einsum("nhd,thd->hnt", q, K) / DIM ** 0.5
            mask = torch.arange(start + n)[None, :] > (start + torch.arange(n))[:, None]
            att = att.masked_fill(mask[None], float("-inf")).softmax(-1)
            x = x + torch.einsum("hnt,thd->nhd", att, V).reshape(n, HEADS * DIM) @ self.wo[layer]
        return x @ self.out


def full_logits(model, ids):
    """A full recompute of ids with no cache at all."""
    ks, vs = [None] * LAYERS, [None] * LAYERS

    def w(layer, pos, k, v):
        ks[layer], vs[layer] = k, v

    return model(ids, 0, w, lambda layer, n: (ks[layer], vs[layer]))


class Engine:
    """The engine: paged K/V per rank and layer, [blocks, BLOCK, RANK_HEADS, DIM]."""

    def __init__(self, cluster: Cluster, blocks: int = 512):
        self.model = Tiny()
        self.client = pygd2fs.Client(cluster.cpaddr, "tcp://127.0.0.1", cluster.name, iothreads=2, streams=2)
        self.K = [[torch.zeros(blocks, BLOCK, RANK_HEADS, DIM, dtype=torch.float32) for _ in range(LAYERS)] for _ in range(TP)]
        self.V = [[torch.zeros(blocks, BLOCK, RANK_HEADS, DIM, dtype=torch.float32) for _ in range(LAYERS)] for _ in range(TP)]
        self.free = list(range(blocks))
        self.lock = threading.Lock()
        self.rank_token_bytes = 2 * LAYERS * RANK_HEADS * DIM * 4

    # kv_first bytes of one rank's blocks: [k|v][layer][block][token][head][dim]
    def gather(self, rank, table):
        return torch.stack([torch.stack([side[rank][layer][table] for layer in range(LAYERS)]) for side in (self.K, self.V)])

    def scatter(self, rank, table, t):
        for s, side in enumerate((self.K, self.V)):
            for layer in range(LAYERS):
                side[rank][layer][table] = t[s, layer]

    def transfer(self, write, uri, kv_start, buf):
        path = urllib.parse.urlparse(uri).path  # as vLLM's GD2FS backend does
        flat = buf.view(torch.uint8).reshape(-1)
        iomem = self.client.RegIOMEM(flat.data_ptr(), flat.numel())
        try:
            sges = [pygd2fs.SGE(flat.data_ptr(), flat.numel(), iomem)]
            req = (self.client.Write if write else self.client.Read)(path, kv_start, sges, 0)
            done = self.client.Wait(-1)
            assert req in done and req.Status() == 0 and req.Value() == flat.numel(), repr(req)
        finally:
            self.client.DeregIOMEM(iomem)

    def complete(self, doc: dict) -> dict:
        t0 = time.perf_counter()
        ids = tokenize(doc["prompt"])
        max_tokens = int(doc.get("max_tokens", 8))
        params = (doc.get("kv_transfer_params") or {}).get("kvcache_params")
        with self.lock:
            nblocks = (len(ids) + max_tokens + BLOCK - 1) // BLOCK
            table, self.free = self.free[:nblocks], self.free[nblocks:]
        try:
            cached = 0
            for seg in (params or {}).get("stored_kvcache", []):
                assert seg["token_start"] == cached and seg["token_length"] % BLOCK == 0, seg
                blocks = table[seg["token_start"] // BLOCK:(seg["token_start"] + seg["token_length"]) // BLOCK]
                region = seg["token_length"] * self.rank_token_bytes
                assert seg["kv_length"] == TP * region, seg
                for rank in range(TP):
                    buf = torch.empty(2, LAYERS, len(blocks), BLOCK, RANK_HEADS, DIM, dtype=torch.float32)
                    self.transfer(False, seg["kv_uri"], seg["kv_start"] + rank * region, buf)
                    self.scatter(rank, blocks, buf)
                cached += seg["token_length"]

            tab = torch.tensor(table)

            def kv_write(layer, pos, k, v):
                at = torch.arange(pos, pos + k.shape[0])
                b, o = tab[at // BLOCK], at % BLOCK
                for rank in range(TP):
                    hs = slice(rank * RANK_HEADS, (rank + 1) * RANK_HEADS)
                    self.K[rank][layer][b, o] = k[:, hs]
                    self.V[rank][layer][b, o] = v[:, hs]

            def kv_read(layer, n):
                nb = (n + BLOCK - 1) // BLOCK
                K = torch.cat([self.K[r][layer][table[:nb]] for r in range(TP)], dim=2).reshape(nb * BLOCK, HEADS, DIM)
                V = torch.cat([self.V[r][layer][table[:nb]] for r in range(TP)], dim=2).reshape(nb * BLOCK, HEADS, DIM)
                return K[:n], V[:n]

            logits = self.model(ids[cached:], cached, kv_write, kv_read)
            ttft = time.perf_counter() - t0  # loading the stored KV and the prefill
            prompt_logits = logits
            out = []
            for _ in range(max_tokens):
                nxt = int(logits[-1].argmax())
                out.append(nxt)
                if len(out) == max_tokens:
                    break
                logits = self.model([nxt], len(ids) + len(out) - 1, kv_write, kv_read)
            computed = len(ids) + len(out) - 1  # the last token's KV is computed next turn
            saved = []
            for seg in (params or {}).get("fresh_kvcache", []):
                end = min(seg["token_start"] + seg["token_length"], computed // BLOCK * BLOCK)
                n = end - seg["token_start"]
                if n <= 0:
                    continue
                blocks = table[seg["token_start"] // BLOCK:end // BLOCK]
                region = n * self.rank_token_bytes
                for rank in range(TP):
                    self.transfer(True, seg["kv_uri"], seg["kv_start"] + rank * region, self.gather(rank, blocks).contiguous())
                saved.append(dict(seg, token_length=n, kv_length=TP * region))
        finally:
            with self.lock:
                self.free += table
        answer = {"choices": [{"text": detokenize(out), "index": 0}],
                  "gd2fs_test": {"prefilled": len(ids) - cached, "cached": cached, "ttft": ttft, "logits": prompt_logits.tolist()}}
        if params is not None:
            answer["kv_transfer_params"] = {"kvcache_params": {"id": params["id"], "fresh_kvcache": saved}}
        return answer


def serve(engine: Engine) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize":  # as vLLM answers: the ids, their count
                ids = tokenize(doc["prompt"])
                body = {"count": len(ids), "max_model_len": 4096, "tokens": ids}
            else:
                body = engine.complete(doc)
            b = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def loop(binary):
    # A session quota of a few chats' KV, so the test sees an eviction.
    quota = 6 * 128 * TP * 2 * LAYERS * RANK_HEADS * DIM * 4  # about six chats of 128 tokens
    c = Cluster(binary=binary, name="loop", master_args=["--session-quota", str(quota)]).start()
    conn = pygd2fs.connect(c.master_url)
    conn.set_layout(MODEL, layers=LAYERS, kv_heads=HEADS, head_dim=DIM, dtype="fp32", page_tokens=BLOCK,
                    layout="kv_first", tp_size=TP)
    engine = Engine(c)
    srv = serve(engine)
    log = os.path.join(c.dir, "router.log")
    router = subprocess.Popen([binary, "router", "--listen", "127.0.0.1:0", "--master", c.master_url, "--model", MODEL,
                               "--shared-sessions", "--upstream", "http://%s:%d" % srv.server_address], stderr=open(log, "w"), start_new_session=True)
    url = _wait_line(log, r"gd2fs router on (http://\S+)", router).group(1)
    yield url, engine, conn
    router.kill()
    router.wait()
    srv.shutdown()
    engine.client.Close()
    conn.close()
    c.stop()


def chat(url, session, prompt, max_tokens=8):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(
        {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}).encode(), headers={"X-Session-ID": session, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics") as r:
        m = re.search(r"^%s (\S+)$" % name, r.read().decode(), re.M)
    return float(m.group(1)) if m else 0.0


def settled(url):
    """Wait until the router has committed (or failed to commit) every plan
    it made: it commits after the client has the whole answer, and a chat's
    next turn must be planned after that commit, as a person typing would."""
    deadline = time.monotonic() + 30
    while True:
        plans = metric(url, "gd2fs_router_plans_total")
        if metric(url, "gd2fs_router_commits_total") + metric(url, "gd2fs_router_commit_failures_total") >= plans:
            return
        assert time.monotonic() < deadline, "the router did not commit its plans"
        time.sleep(0.01)


def turn(loop, session, prompt, want_cached=None):
    url, engine, _ = loop
    a = chat(url, session, prompt)
    settled(url)
    t = a["gd2fs_test"]
    ids = tokenize(prompt)
    full = full_logits(engine.model, ids)
    got = torch.tensor(t["logits"], dtype=torch.float32)
    assert t["cached"] + t["prefilled"] == len(ids)
    assert torch.allclose(got, full[t["cached"]:], atol=1e-4, rtol=1e-4), \
        f"{session}: logits with {t['cached']} cached tokens differ from a full recompute"
    if want_cached is not None:
        assert t["cached"] == want_cached, (session, t["cached"], want_cached)
    return prompt + a["choices"][0]["text"], t


def test_engine_loop(loop):
    url, engine, conn = loop
    system = "You are a small model. Answer in short words please. " * 2  # 106 tokens
    # A system turn, then two chats forked from it share its KV.
    conv, t = turn(loop, "sys", system, want_cached=0)
    assert t["prefilled"] == len(system)
    conn.fork("sys", "chat-a")
    conn.fork("sys", "chat-b")
    # Whole blocks of the system prompt: the engine saved the answer's KV
    # too, but the store knows the ids of prompt tokens only, so it vouches
    # for (and loads) nothing past the prompt.
    saved = len(system) // BLOCK * BLOCK
    a, t = turn(loop, "chat-a", conv + " hello there", want_cached=saved)
    b, t = turn(loop, "chat-b", conv + " another question", want_cached=saved)
    # More turns: each prefill is only the new tokens (and the last partial block).
    for i in range(3):
        before = len(a)
        prompt = a + " next %d" % i
        a, t = turn(loop, "chat-a", prompt)
        assert t["cached"] >= (before - 1) // BLOCK * BLOCK - BLOCK and t["prefilled"] < 40, t["prefilled"]
    # Edits, on a fork of chat-a (deleted after, so the quota below sees the
    # same sessions as before). The last answer regenerated: the same prompt
    # again. What was stored of it is used, never the KV of the answer being
    # replaced.
    conn.fork("chat-a", "chat-e")
    _, t = turn(loop, "chat-e", prompt)
    assert t["cached"] >= (len(prompt) - 1) // BLOCK * BLOCK - BLOCK, t
    # The user edits an earlier message without changing the prompt's
    # length: the stored KV of the tokens after the edit was computed for
    # other text and must not be loaded (the logits check fails if it is;
    # a plan on counts alone would load it).
    k = len(conv) + 3
    same = prompt[:k] + ("Z" if prompt[k] != "Z" else "Y") + prompt[k + 1:]
    assert len(same) == len(prompt)
    _, t = turn(loop, "chat-e", same)
    assert t["cached"] <= k // BLOCK * BLOCK, t
    # An edit that makes the prompt longer.
    longer = prompt[:k] + " a longer edit" + prompt[k:]
    _, t = turn(loop, "chat-e", longer)
    assert t["cached"] <= k // BLOCK * BLOCK, t
    conn.delete("chat-e")
    # A rewind: the user edits an earlier message; the stale turns must not
    # be served (the logits check would fail if they were).
    edit = a[:len(conv) + 5] + " edited"
    a2, t = turn(loop, "chat-a", edit)
    assert t["cached"] <= len(conv) + 5
    a3, t = turn(loop, "chat-a", a2 + " and on")
    assert t["cached"] >= len(edit) // BLOCK * BLOCK - BLOCK
    # Evictions under the small quota: many other chats; an evicted chat
    # recomputes from scratch and is still right.
    for i in range(8):
        turn(loop, "filler-%d" % i, "Filler chat number %d. " % i * 6)
    b2, t = turn(loop, "chat-b", b + " back again")
    sessions = {s["id"] for s in conn.sessions(limit=100)}
    assert "chat-b" in sessions
    evicted = [s for s in ("sys", "filler-0") if s not in sessions]
    assert evicted, f"no session was evicted under the quota: {sorted(sessions)}"
    # The router's metrics count what it saved.
    with urllib.request.urlopen(url + "/metrics") as r:
        m = r.read().decode()
    cached = float(re.search(r"^gd2fs_router_cached_tokens_total (\S+)$", m, re.M).group(1))
    assert cached > len(system), m
    assert "gd2fs_router_commit_failures_total 0" in m, m
