"""Layouts and plan rules that engines' newest code depends on (issue 28):
kv_layers for hybrid models, stored_kvcache never longer than the prompt at
every boundary, an SGLang turn that ends inside a 16-token page stored with
SGLang's own page size and byte order, and tensor parallelism wider than the
KV heads without MLA. Real cluster, real bytes."""

import uuid

import pytest
import torch

import pygd2fs


def _model(conn, **kw):
    m = f"l2-{uuid.uuid4().hex[:8]}"
    conn.set_layout(m, **kw)
    return m


def _sid():
    return f"s-{uuid.uuid4().hex[:8]}"


def test_kv_layers_size_ranges(conn):
    m = _model(conn, layers=8, kv_layers=2, kv_heads=2, head_dim=8, dtype="fp32", page_tokens=16, layout="kv_first")
    assert conn.get_layout(m)["kv_layers"] == 2
    # Sizes, not content: on counts alone (one fresh range, not cut at the prompt).
    p = conn.plan(_sid(), prompt_tokens=20, model=m, format="vllm", unsafe_count_only=True)
    fr = p["kvcache_params"]["fresh_kvcache"][0]
    assert fr["token_length"] == 32 and fr["kv_length"] == 32 * 2 * 2 * 2 * 8 * 4  # 2 KV layers, not 8
    with pytest.raises(pygd2fs.BadRequest, match="kv_layers"):
        conn.set_layout(f"bad-{uuid.uuid4().hex[:6]}", layers=4, kv_layers=5, kv_heads=2, head_dim=8, dtype="fp32")


@pytest.mark.parametrize("fmt,layout", [("vllm", "page_first"), ("vllm", "kv_first"), ("sglang", "page_first")])
def test_stored_never_longer_than_the_prompt(conn, fmt, layout):
    """vLLM now fails a request whose stored_kvcache covers more tokens than
    the prompt. A 16-token session, 4-token blocks; every prompt length from
    1 to 21 (each boundary and both sides of it): stored segments are whole
    blocks, end before the prompt's last token (one token left to compute)
    and start where the fresh ones do. A page_first range is cut to the
    prompt's whole blocks; a kv_first one is used whole or not at all (no
    prefix of its bytes is a prefix of its tokens)."""
    m = _model(conn, layers=1, kv_heads=1, head_dim=4, dtype="fp32", page_tokens=4, layout=layout)
    sid = _sid()
    p = conn.plan(sid, token_ids=list(range(16)), model=m, format=fmt)
    fr = p["kvcache_params"]["fresh_kvcache"][0]
    conn.write(fr["kv_uri"], torch.zeros(fr["kv_length"] // 4), offset=fr["kv_start"])
    conn.commit(sid, p, saved=p["kvcache_params"])
    for prompt in range(1, 22):
        q = conn.plan(sid, token_ids=list(range(prompt)), model=m, format=fmt)
        kp = q["kvcache_params"]
        stored = sum(s["token_length"] for s in kp["stored_kvcache"])
        assert stored <= prompt - 1, (prompt, kp)
        want = min(16, (prompt - 1) // 4 * 4) if layout == "page_first" else (16 if prompt > 16 else 0)
        assert stored == want, (prompt, stored)
        assert all(s["token_length"] % 4 == 0 and s["token_start"] % 4 == 0 for s in kp["stored_kvcache"])
        assert kp["fresh_kvcache"][0]["token_start"] == stored
        assert q["cached_tokens"] == stored


def test_sglang_turn_ending_inside_a_page(conn):
    """SGLang's session cache saves up to the request's last token, in
    [k|v][layer][token] order. Registered with 16-token pages, a 29-token
    turn has no correct whole-block prefix of its bytes (token 16's K is not
    after token 15's V). Registered as SGLang holds it — kv_first with
    page_tokens 1 — every token is a whole block: the turn is stored whole
    and reads back in SGLang's own order."""
    layers, heads, dim = 2, 2, 4
    m = _model(conn, layers=layers, kv_heads=heads, head_dim=dim, dtype="fp32", page_tokens=1, layout="kv_first")
    sid = _sid()
    p = conn.plan(sid, token_ids=list(range(29)), model=m, format="sglang")
    fr = p["kvcache_params"]["fresh_kvcache"][0]
    assert fr["token_length"] == 29
    kv = torch.randn(2, layers, 29, heads, dim)  # SGLang's bytes of the turn
    conn.write(fr["kv_uri"], kv, offset=fr["kv_start"])
    s = conn.commit(sid, p, saved={"kvcache_params": {"id": sid, "fresh_kvcache": [fr]}})
    assert s["tokens"] == 29
    q = conn.plan(sid, token_ids=list(range(40)), model=m, format="sglang")
    st = q["kvcache_params"]["stored_kvcache"]
    assert q["cached_tokens"] == 29 and len(st) == 1 and st[0]["token_length"] == 29
    back = torch.zeros_like(kv)
    conn.read_into(st[0]["kv_uri"], back, offset=st[0]["kv_start"])
    assert torch.equal(back, kv)
    # The same turn with 16-token pages is refused, not cut (cutting the tail
    # would keep the wrong bytes): nothing is recorded.
    m16 = _model(conn, layers=layers, kv_heads=heads, head_dim=dim, dtype="fp32", page_tokens=16, layout="kv_first")
    sid16 = _sid()
    p16 = conn.plan(sid16, token_ids=list(range(29)), model=m16, format="sglang")
    f16 = dict(p16["kvcache_params"]["fresh_kvcache"][0], token_length=29)
    with pytest.raises(pygd2fs.BadRequest, match="whole blocks"):
        conn.commit(sid16, p16, saved=[f16])


def test_tp_wider_than_kv_heads_without_mla(conn):
    """2 KV heads over 4 ranks, no MLA: each rank holds one head (ranks 0,1
    head 0; 2,3 head 1). vLLM reports kv_length = tokens x rank bytes x 4 and
    every rank writes its region at kv_start + rank x region: gd2fs's layout
    keeps 4 regions, and each rank loads exactly the bytes it wrote."""
    tp, heads, dim, layers = 4, 2, 4, 2
    m = _model(conn, layers=layers, kv_heads=heads, head_dim=dim, dtype="fp32", page_tokens=4, layout="kv_first",
               tp_size=tp)
    sid = _sid()
    # Sizes, not content: on counts alone (one fresh range, not cut at the prompt).
    p = conn.plan(sid, prompt_tokens=9, model=m, format="vllm", unsafe_count_only=True)
    fr = p["kvcache_params"]["fresh_kvcache"][0]
    tokens = 8  # the engine saves whole blocks
    region = tokens * 2 * layers * 1 * dim * 4
    assert fr["kv_length"] == 12 * 2 * layers * dim * 4 * tp  # reserved: 3 blocks x 4 regions
    ranks = [torch.randn(2, layers, tokens, 1, dim) for _ in range(tp)]
    for r, t in enumerate(ranks):
        conn.write(fr["kv_uri"], t, offset=fr["kv_start"] + r * region)
    seg = dict(fr, token_length=tokens, kv_length=region * tp)
    assert conn.commit(sid, p, saved=[seg])["tokens"] == tokens
    q = conn.plan(sid, prompt_tokens=12, model=m, format="vllm", unsafe_count_only=True)
    st = q["kvcache_params"]["stored_kvcache"][0]
    assert st["kv_length"] == region * tp
    for r, t in enumerate(ranks):
        back = torch.zeros_like(t)
        conn.read_into(st["kv_uri"], back, offset=st["kv_start"] + r * region)
        assert torch.equal(back, t), f"rank {r}"


def test_tp_wider_than_heads_only_rank0_wrote_is_refused(conn):
    """An engine that reports every rank's region saved while only rank 0
    wrote (an engine bug) gets a clear refusal, and nothing is recorded."""
    m = _model(conn, layers=2, kv_heads=2, head_dim=4, dtype="fp32", page_tokens=4, layout="kv_first", tp_size=4)
    sid = _sid()
    p = conn.plan(sid, prompt_tokens=9, model=m, format="vllm", unsafe_count_only=True)
    fr = p["kvcache_params"]["fresh_kvcache"][0]
    region = 8 * 2 * 2 * 4 * 4
    conn.write(fr["kv_uri"], torch.randn(region // 4), offset=fr["kv_start"])
    with pytest.raises(pygd2fs.Gd2fsError, match="not written"):
        conn.commit(sid, p, saved=[dict(fr, token_length=8, kv_length=region * 4)])
    assert conn.plan(sid, prompt_tokens=9, model=m, format="vllm", unsafe_count_only=True)["cached_tokens"] == 0


def test_tp_wider_than_heads_a_middle_rank_missing_is_refused(conn):
    """4 ranks over 2 KV heads, no MLA: ranks 0 and 3 wrote their regions,
    ranks 1 and 2 did not, and the engine reports the whole segment saved.
    The bytes written reach the segment's end, but the servers
    hold no write of rank 1's region: the commit is refused naming rank 1
    and the engine as the cause, and nothing is recorded (a hole reads as
    zeros: loading it would be wrong KV served as a hit). Once every rank
    wrote, the same segment commits and each rank loads its own bytes."""
    tp, layers, dim = 4, 2, 4
    m = _model(conn, layers=layers, kv_heads=2, head_dim=dim, dtype="fp32", page_tokens=4, layout="kv_first", tp_size=tp)
    sid = _sid()
    p = conn.plan(sid, prompt_tokens=9, model=m, format="vllm", unsafe_count_only=True)
    fr = p["kvcache_params"]["fresh_kvcache"][0]
    tokens = 8
    region = tokens * 2 * layers * 1 * dim * 4
    ranks = [torch.randn(2, layers, tokens, 1, dim) for _ in range(tp)]
    for r in (0, 3):
        conn.write(fr["kv_uri"], ranks[r], offset=fr["kv_start"] + r * region)
    seg = dict(fr, token_length=tokens, kv_length=region * tp)
    with pytest.raises(pygd2fs.BadRequest, match=r"TP rank 1's region .* not written .* bug of the engine"):
        conn.commit(sid, p, saved={"kvcache_params": {"id": sid, "fresh_kvcache": [seg]}})
    assert conn.plan(sid, prompt_tokens=9, model=m, format="vllm", unsafe_count_only=True)["cached_tokens"] == 0
    p = conn.plan(sid, prompt_tokens=9, model=m, format="vllm", unsafe_count_only=True)
    fr = p["kvcache_params"]["fresh_kvcache"][0]
    for r in range(tp):
        conn.write(fr["kv_uri"], ranks[r], offset=fr["kv_start"] + r * region)
    seg = dict(fr, token_length=tokens, kv_length=region * tp)
    assert conn.commit(sid, p, saved={"kvcache_params": {"id": sid, "fresh_kvcache": [seg]}})["tokens"] == tokens
    st = conn.plan(sid, prompt_tokens=12, model=m, format="vllm", unsafe_count_only=True)["kvcache_params"]["stored_kvcache"][0]
    for r, t in enumerate(ranks):
        back = torch.zeros_like(t)
        conn.read_into(st["kv_uri"], back, offset=st["kv_start"] + r * region)
        assert torch.equal(back, t), f"rank {r}"
