"""pygd2fs.vllm, an offloading spec for vLLM's OffloadingConnector that keeps
offloaded blocks in gd2fs hash mode, loaded as vLLM loads it (spec_name +
spec_module_path in kv_connector_extra_config) and driven through vLLM's
interface: the scheduler's OffloadingManager (lookup / prepare_store /
complete_store / prepare_load) and the worker's OffloadingHandlers (by
medium, transfer_async / wait / get_finished), on real torch tensors against a
cluster of separate processes. The engine side is a double where vLLM cannot
import (tests/doubles/README.md)."""

import importlib.util
import os
import sys
import types
import uuid

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "doubles"))

from vllm.distributed import parallel_state  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402
from vllm.v1.kv_offload.mediums import GPULoadStoreSpec  # noqa: E402
from vllm.v1.kv_offload.spec import CanonicalKVCaches, CanonicalKVCacheTensor  # noqa: E402
from vllm.v1.kv_offload.worker.worker import OffloadingWorker  # noqa: E402

LAYERS, BLOCKS, BT, HEADS, DIM = 2, 16, 4, 2, 8


def config(cluster, prefix, tp=1, mla=False, block_size=None, groups=1):
    extra = {"spec_name": "GD2FSOffloadingSpec", "spec_module_path": "pygd2fs.vllm",
             "gd2fs_master": cluster.master_url, "gd2fs_cluster": cluster.name, "gd2fs_key_prefix": prefix}
    if block_size:
        extra["block_size"] = block_size
    ns = types.SimpleNamespace
    vc = ns(kv_transfer_config=ns(kv_connector="OffloadingConnector", kv_connector_extra_config=extra),
            cache_config=ns(block_size=BT), parallel_config=ns(tensor_parallel_size=tp, pipeline_parallel_size=1,
                                                                world_size=tp),
            model_config=ns(model="org/model", use_mla=mla))
    kc = ns(kv_cache_groups=[ns(kv_cache_spec=ns(block_size=BT)) for _ in range(groups)])
    return vc, kc


def caches(seed=None):
    """Per layer a FlashAttention-shaped (2, blocks, block_tokens, heads,
    dim) tensor, canonicalised as vLLM does: K and V each blocks-first."""
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    layers = [torch.randn(2, BLOCKS, BT, HEADS, DIM, generator=g) if g else torch.zeros(2, BLOCKS, BT, HEADS, DIM)
              for _ in range(LAYERS)]
    canon = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(t[kv], t[kv][0].numel() * 4) for t in layers for kv in (0, 1)],
        group_data_refs=[])
    return layers, canon


def engine(cluster, prefix, rank=0, tp=1, mla=False, seed=None, block_size=None):
    """What one vLLM process builds: the spec (by module path), its manager
    (scheduler) and a worker with the spec's handlers registered."""
    parallel_state.RANK, parallel_state.WORLD = rank, tp
    vc, kc = config(cluster, prefix, tp=tp, mla=mla, block_size=block_size)
    spec = OffloadingSpecFactory.create_spec(vc, kc)
    layers, canon = caches(seed)
    worker = OffloadingWorker()
    for src, dst, h in spec.get_handlers(canon):
        worker.register_handler(src, dst, h)
    return spec, spec.get_manager(), worker, layers


def run(worker, job, spec):
    assert worker.transfer_async(job, spec)
    worker.wait({job})
    res = worker.get_finished()
    assert [r.job_id for r in res] == [job]
    return res[0]


def hashes(n):
    return [uuid.uuid4().bytes for _ in range(n)]


def test_store_lookup_load_across_processes(cluster):
    prefix = f"vt-{uuid.uuid4().hex[:8]}"
    spec, mgr, worker, layers = engine(cluster, prefix, seed=1)
    hs = hashes(4)
    assert mgr.lookup(hs) == 0
    out = mgr.prepare_store(hs)
    assert out.block_hashes_to_store == hs and out.block_hashes_evicted == []
    src = [5, 2, 9, 11]
    r = run(worker, 1, (GPULoadStoreSpec(src, group_sizes=[4]), out.store_spec))
    assert r.success and r.transfer_size == 4 * LAYERS * 2 * BT * HEADS * DIM * 4 and r.transfer_type == ("GPU", "GD2FS")
    assert mgr.lookup(hs) == 0  # not loadable before complete_store
    mgr.complete_store(hs)
    assert mgr.lookup(hs) == 4 and mgr.lookup(hs[:2] + hashes(1) + hs[2:]) == 2
    assert mgr.prepare_store(hs).block_hashes_to_store == []
    # Another engine process loads the first three into other GPU blocks.
    spec2, mgr2, worker2, layers2 = engine(cluster, prefix)
    assert mgr2.lookup(hs) == 4
    dst = [0, 7, 3]
    r = run(worker2, 2, (mgr2.prepare_load(hs[:3]), GPULoadStoreSpec(dst, group_sizes=[3], block_indices=[0])))
    assert r.success and r.transfer_type == ("GD2FS", "GPU")
    for s, d in zip(src, dst):
        for a, b in zip(layers, layers2):
            assert torch.equal(a[:, s], b[:, d])
    assert torch.count_nonzero(layers2[0][:, 1]) == 0  # untouched


def test_failed_load_is_reported(cluster):
    prefix = f"vt-{uuid.uuid4().hex[:8]}"
    spec, mgr, worker, layers = engine(cluster, prefix)
    r = run(worker, 3, (mgr.prepare_load(hashes(2)), GPULoadStoreSpec([1, 2], group_sizes=[2])))
    assert not r.success
    # A store that failed is not marked: never looked up as stored.
    hs = hashes(1)
    mgr.complete_store(hs, success=False)
    assert mgr.lookup(hs) == 0


def test_tensor_parallel_ranks_keep_their_own_shards(cluster):
    prefix = f"vt-{uuid.uuid4().hex[:8]}"
    hs = hashes(2)
    ranks = [engine(cluster, prefix, rank=r, tp=2, seed=10 + r) for r in range(2)]
    for r, (spec, mgr, worker, layers) in enumerate(ranks):
        assert run(worker, 10 + r, (GPULoadStoreSpec([3, 4], group_sizes=[2]), mgr.prepare_store(hs).store_spec)).success
    ranks[0][1].complete_store(hs)  # the scheduler, after every rank finished
    for r in range(2):
        spec, mgr, worker, layers = engine(cluster, prefix, rank=r, tp=2)
        assert mgr.lookup(hs) == 2
        assert run(worker, 20 + r, (mgr.prepare_load(hs), GPULoadStoreSpec([8, 9], group_sizes=[2]))).success
        for a, b in zip(ranks[r][3], layers):
            assert torch.equal(a[:, 3:5], b[:, 8:10])


def test_mla_one_copy(cluster):
    prefix = f"vt-{uuid.uuid4().hex[:8]}"
    hs = hashes(1)
    r0 = engine(cluster, prefix, rank=0, tp=2, mla=True, seed=5)
    r1 = engine(cluster, prefix, rank=1, tp=2, mla=True, seed=6)  # would differ if it wrote
    for i, (spec, mgr, worker, layers) in enumerate((r0, r1)):
        assert run(worker, 30 + i, (GPULoadStoreSpec([2], group_sizes=[1]), mgr.prepare_store(hs).store_spec)).success
    r0[1].complete_store(hs)
    spec, mgr, worker, layers = engine(cluster, prefix, rank=1, tp=2, mla=True)
    assert run(worker, 40, (mgr.prepare_load(hs), GPULoadStoreSpec([6], group_sizes=[1]))).success
    for a, b in zip(r0[3], layers):
        assert torch.equal(a[:, 2], b[:, 6])


def test_offloaded_block_of_two_gpu_blocks_loaded_from_inside(cluster):
    """block_size 8 = 2 GPU blocks per offloaded block; a load whose first
    GPU block is the second half of an offloaded block (block_indices[0] odd)
    skips the first half."""
    prefix = f"vt-{uuid.uuid4().hex[:8]}"
    spec, mgr, worker, layers = engine(cluster, prefix, seed=7, block_size=2 * BT)
    hs = hashes(2)
    assert run(worker, 50, (GPULoadStoreSpec([1, 2, 3, 4], group_sizes=[4]), mgr.prepare_store(hs).store_spec)).success
    mgr.complete_store(hs)
    spec2, mgr2, worker2, layers2 = engine(cluster, prefix, block_size=2 * BT)
    assert run(worker2, 51, (mgr2.prepare_load(hs), GPULoadStoreSpec([10, 11, 12], group_sizes=[1 + 2],
                                                                       block_indices=[1]))).success
    for s, d in zip([2, 3, 4], [10, 11, 12]):
        assert torch.equal(layers[0][:, s], layers2[0][:, d])


def test_refused(cluster):
    vc, kc = config(cluster, "x", groups=2)
    with pytest.raises(ValueError, match="KV cache groups"):
        OffloadingSpecFactory.create_spec(vc, kc)
    parallel_state.RANK, parallel_state.WORLD = 0, 2
    vc, kc = config(cluster, "x", tp=1)
    spec = OffloadingSpecFactory.create_spec(vc, kc)
    with pytest.raises(ValueError, match="TP ranks"):
        list(spec.get_handlers(caches()[1]))
    parallel_state.RANK, parallel_state.WORLD = 0, 1
