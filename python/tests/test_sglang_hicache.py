"""pygd2fs.sglang, SGLang's HiCache L3 storage on gd2fs hash mode, loaded the
way SGLang loads it (--hicache-storage-backend dynamic: by module path) and
driven through SGLang's interface (batch_set_v1 / batch_exists / batch_get_v1
with host indices of the host memory pool) on real torch tensors, against a
cluster of separate processes. The engine side is a double where SGLang
cannot import (tests/doubles/README.md)."""

import importlib.util
import os
import sys
import uuid

import pytest
import torch

if importlib.util.find_spec("sglang") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "doubles"))

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

PAGE, LAYERS, HEADS, DIM, SLOTS = 4, 3, 2, 8, 64


def backend(cluster, pool, tp_rank=0, tp_size=1, mla=False, prefix=None):
    extra = {"backend_name": "gd2fs", "module_path": "pygd2fs.sglang", "class_name": "GD2FSHiCacheStorage",
             "interface_v1": 1, "master": cluster.master_url, "cluster": cluster.name,
             "key_prefix": prefix or f"sgl-{uuid.uuid4().hex[:8]}"}
    cfg = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                               is_page_first_layout=pool.layout == "page_first", model_name="m", extra_config=extra)
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    b.register_mem_pool_host(pool)
    return b


def mha(layout, seed=None):
    p = MHATokenToKVPoolHost(SLOTS, PAGE, LAYERS, HEADS, DIM, torch.bfloat16, layout)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        p.kv_buffer.copy_(torch.randn(p.kv_buffer.shape, generator=g).to(torch.bfloat16))
    return p


def slots(pages):
    return torch.tensor([p * PAGE + t for p in pages for t in range(PAGE)], dtype=torch.int64)


def same_tokens(a, a_slots, b, b_slots, kvs=(0, 1)):
    for i, j in zip(a_slots.tolist(), b_slots.tolist()):
        for kv in kvs:
            for layer in range(a.layer_num):
                if not torch.equal(a.token(kv, layer, i), b.token(kv, layer, j)):
                    return False
    return True


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_set_exists_get_round_trip(cluster, layout):
    src = mha(layout, seed=1)
    prefix = f"sgl-{uuid.uuid4().hex[:8]}"
    a = backend(cluster, src, prefix=prefix)
    keys = [f"h{i}" for i in range(5)]
    src_slots = slots([3, 7, 1, 9, 4])  # pages scattered in the pool
    assert a.batch_exists(keys) == 0
    assert a.batch_set_v1(keys[:3], src_slots[:3 * PAGE]) == [True] * 3
    assert a.batch_exists(keys) == 3  # the leading pages stored
    assert a.batch_set_v1(keys, src_slots) == [True] * 5  # the first 3 exist: only 2 written
    assert a.batch_exists(keys + ["missing", "h0"]) == 5
    # Another engine process (its own pool, other slots) loads them.
    dst = mha(layout)
    b = backend(cluster, dst, prefix=prefix)
    dst_slots = slots([10, 0, 5, 2, 14])
    assert b.batch_get_v1(keys, dst_slots) == [True] * 5
    assert same_tokens(src, src_slots, dst, dst_slots)
    # Slots not loaded are untouched.
    assert torch.count_nonzero(dst.token(0, 0, 6 * PAGE)) == 0
    # A miss is a False for that page; the engine stops at the first.
    assert b.batch_get_v1(["h0", "nope", "h2"], slots([11, 12, 13])) == [True, False, True]
    a.close()
    b.close()


def test_layouts_and_ranks_do_not_mix(cluster):
    """The same page hash in another layout, or of another TP rank, is
    another set of bytes: never a hit."""
    prefix = f"sgl-{uuid.uuid4().hex[:8]}"
    lf = backend(cluster, mha("layer_first", seed=2), prefix=prefix)
    assert lf.batch_set_v1(["x"], slots([0])) == [True]
    assert lf.exists("x")
    pf = backend(cluster, mha("page_first"), prefix=prefix)
    assert pf.batch_exists(["x"]) == 0 and pf.batch_get_v1(["x"], slots([0])) == [False]
    r1 = backend(cluster, mha("layer_first"), tp_rank=1, tp_size=2, prefix=prefix)
    r0 = backend(cluster, mha("layer_first"), tp_rank=0, tp_size=2, prefix=prefix)
    assert r1.batch_exists(["x"]) == 0 and r0.batch_exists(["x"]) == 0
    for b in (lf, pf, r1, r0):
        b.close()


def test_half_written_page_is_not_a_hit(cluster):
    """A page counts only when every buffer of it is stored (here one of a
    layer_first page's 2 x LAYERS blocks goes missing)."""
    src = mha("layer_first", seed=3)
    b = backend(cluster, src)
    assert b.batch_set_v1(["p0", "p1"], slots([0, 1])) == [True, True]
    b.kv.remove(f"{b.prefix}/p1/layer_first/{b.rank_tag}/3")
    assert b.batch_exists(["p0", "p1"]) == 1
    assert b.batch_get_v1(["p0", "p1"], slots([5, 6])) == [True, False]
    b.close()


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_mla_one_copy_for_all_ranks(cluster, layout):
    prefix = f"sgl-{uuid.uuid4().hex[:8]}"
    src = MLATokenToKVPoolHost(SLOTS, PAGE, LAYERS, 24, torch.float32, layout)
    src.kv_buffer.copy_(torch.randn(src.kv_buffer.shape))
    r0 = backend(cluster, src, tp_rank=0, tp_size=4, mla=True, prefix=prefix)
    assert r0.batch_set_v1(["m0", "m1"], slots([2, 3])) == [True, True]
    # Rank 3 finds rank 0's copy: nothing of its own is written.
    dst = MLATokenToKVPoolHost(SLOTS, PAGE, LAYERS, 24, torch.float32, layout)
    r3 = backend(cluster, dst, tp_rank=3, tp_size=4, mla=True, prefix=prefix)
    assert r3.batch_exists(["m0", "m1"]) == 2
    assert r3.batch_set_v1(["m0"], slots([9])) == [True]  # exists: not rewritten
    assert r3.batch_get_v1(["m0", "m1"], slots([7, 8])) == [True, True]
    assert same_tokens(src, slots([2, 3]), dst, slots([7, 8]), kvs=(0,))
    r0.close()
    r3.close()


def test_older_interface_flat_pages(cluster):
    """Without interface_v1 SGLang calls batch_set/batch_get with one flat
    tensor per page (get_data_page / get_dummy_flat_data_page)."""
    src, dst = mha("page_first", seed=4), mha("page_first")
    b = backend(cluster, src)
    data = [src.get_data_page(p * PAGE) for p in (1, 2)]
    assert b.batch_set(["f1", "f2"], data)
    got = b.batch_get(["f1", "f2", "f3"], [dst.get_dummy_flat_data_page() for _ in range(3)])
    assert got[2] is None and torch.equal(got[0], data[0]) and torch.equal(got[1], data[1])
    dst.set_from_flat_data_page(4 * PAGE, got[0])
    assert same_tokens(src, slots([1]), dst, slots([4]))
    b.close()


def test_refused_setups(cluster):
    extra = {"backend_name": "gd2fs", "module_path": "pygd2fs.sglang", "class_name": "GD2FSHiCacheStorage",
             "master": cluster.master_url}
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
                               model_name="m", should_split_heads=True, extra_config=extra)
    with pytest.raises(ValueError, match="should_split_heads"):
        StorageBackendFactory.create_backend("dynamic", cfg, None)
    cfg.should_split_heads = False
    b = StorageBackendFactory.create_backend("dynamic", cfg, None)
    p = mha("page_first")
    p.layout = "page_head"
    with pytest.raises(ValueError, match="hicache-mem-layout"):
        b.register_mem_pool_host(p)
    with pytest.raises(RuntimeError, match="register_mem_pool_host"):
        b.batch_exists(["a"])
    b.close()
    extra["cluster"] = "not-this-one"
    with pytest.raises(Exception, match="cluster"):
        StorageBackendFactory.create_backend("dynamic", cfg, None)
