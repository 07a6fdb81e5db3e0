"""A local demo of gd2fs's hash-mode doors inside each engine, with no GPU and
no engine installed: SGLang's HiCache storage backend (pygd2fs.sglang) and
vLLM's offloading spec (pygd2fs.vllm), loaded by module path the way each
engine loads them, moving real torch tensors through a running cluster.
Where SGLang / vLLM do not import, the engine side comes from
python/tests/doubles (the engines' interfaces; see its README).

    go run ./cmd/gd2fs up &                                   # a local cluster
    PYTHONPATH=python /usr/bin/python3 python/examples/engine_doors.py --master http://127.0.0.1:7070
"""

import argparse
import importlib.util
import os
import sys
import types
import uuid

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DOUBLES = os.path.join(os.path.dirname(HERE), "tests", "doubles")


INSTALLED = {m: importlib.util.find_spec(m) is not None for m in ("sglang", "vllm")}


def need(module):
    if not INSTALLED[module]:
        if DOUBLES not in sys.path:
            sys.path.insert(0, DOUBLES)
        return f"{module} (engine side: the double in python/tests/doubles)"
    return f"{module} (installed)"


def sglang(master):
    print("SGLang:", need("sglang"))
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.pool_host import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    extra = {"backend_name": "gd2fs", "module_path": "pygd2fs.sglang", "class_name": "GD2FSHiCacheStorage",
             "interface_v1": 1, "master": master, "key_prefix": f"demo-{uuid.uuid4().hex[:6]}"}
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="demo", extra_config=extra)
    pages = []
    for _ in range(2):  # two engine processes, each with its host pool
        pool = MHATokenToKVPoolHost(256, 16, 4, 2, 64, torch.bfloat16, "page_first")
        b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
        b.register_mem_pool_host(pool)
        pages.append((pool, b))
    (src, a), (dst, b) = pages
    src.kv_buffer.copy_(torch.randn(src.kv_buffer.shape).to(torch.bfloat16))
    keys = [f"page-{i}" for i in range(4)]
    idx = torch.arange(4 * 16, dtype=torch.int64)
    print("  batch_set_v1:", a.batch_set_v1(keys, idx), " batch_exists:", b.batch_exists(keys + ["x"]))
    print("  batch_get_v1:", b.batch_get_v1(keys, idx + 64))
    ok = torch.equal(src.kv_buffer[:, :64], dst.kv_buffer[:, 64:128])
    print("  the second process's pool holds the first's pages:", ok)
    a.clear()
    return ok


def vllm(master):
    print("vLLM:", need("vllm"))
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.mediums import GPULoadStoreSpec
    from vllm.v1.kv_offload.spec import CanonicalKVCaches, CanonicalKVCacheTensor
    from vllm.v1.kv_offload.worker.worker import OffloadingWorker

    ns = types.SimpleNamespace
    extra = {"spec_name": "GD2FSOffloadingSpec", "spec_module_path": "pygd2fs.vllm", "gd2fs_master": master,
             "gd2fs_key_prefix": f"demo-{uuid.uuid4().hex[:6]}"}
    vc = ns(kv_transfer_config=ns(kv_connector="OffloadingConnector", kv_connector_extra_config=extra),
            cache_config=ns(block_size=16), parallel_config=ns(tensor_parallel_size=1, pipeline_parallel_size=1),
            model_config=ns(model="demo", use_mla=False))
    kc = ns(kv_cache_groups=[ns(kv_cache_spec=ns(block_size=16))])
    procs = []
    for _ in range(2):
        spec = OffloadingSpecFactory.create_spec(vc, kc)
        layers = [torch.zeros(2, 32, 16, 2, 64) for _ in range(4)]
        canon = CanonicalKVCaches([CanonicalKVCacheTensor(t[kv], t[kv][0].numel() * 4) for t in layers for kv in (0, 1)], [])
        w = OffloadingWorker()
        for s, d, h in spec.get_handlers(canon):
            w.register_handler(s, d, h)
        procs.append((spec.get_manager(), w, layers))
    (m1, w1, l1), (m2, w2, l2) = procs
    for t in l1:
        t.copy_(torch.randn(t.shape))
    hashes = [uuid.uuid4().bytes for _ in range(3)]
    out = m1.prepare_store(hashes)
    w1.transfer_async(1, (GPULoadStoreSpec([4, 5, 6], group_sizes=[3]), out.store_spec))
    w1.wait({1})
    print("  store:", [r.success for r in w1.get_finished()])
    m1.complete_store(hashes)
    print("  lookup from the second process:", m2.lookup(hashes))
    w2.transfer_async(2, (m2.prepare_load(hashes), GPULoadStoreSpec([0, 1, 2], group_sizes=[3])))
    w2.wait({2})
    print("  load:", [r.success for r in w2.get_finished()])
    ok = all(torch.equal(a[:, 4:7], b[:, 0:3]) for a, b in zip(l1, l2))
    print("  the second process's KV cache holds the first's blocks:", ok)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--master", default=os.environ.get("GD2FS_MASTER", "http://127.0.0.1:7070"))
    args = ap.parse_args()
    ok = sglang(args.master) and vllm(args.master)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
