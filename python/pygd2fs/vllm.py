"""A vLLM offloading spec that keeps offloaded KV blocks in gd2fs hash mode.

vLLM's own ``OffloadingConnector`` loads it by module path, with no change to
vLLM::

    vllm serve ... --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {
            "spec_name": "GD2FSOffloadingSpec", "spec_module_path": "pygd2fs.vllm",
            "gd2fs_master": "http://10.0.0.1:7070"}}'

Other keys of ``kv_connector_extra_config``: ``gd2fs_cluster`` (must equal
the master's when given), ``gd2fs_token`` (default ``$GD2FS_TOKEN``),
``gd2fs_pool`` (``perf``, the default, or ``ha``), ``gd2fs_key_prefix``
(default ``vllm/<model>/b<block size>/tp<ranks>``) and vLLM's own
``block_size`` (tokens per offloaded block, a multiple of the GPU block
size).

What is stored: per offloaded block (vLLM's block hash), one gd2fs KV block
per KV cache tensor per GPU block of it per rank, the tensor's bytes of that
block as the attention backend lays them out, moved by address (CPU tensors)
or through a pinned host buffer (GPU tensors). MLA (every rank holds the
same KV) keeps one copy: rank 0 writes it, every rank reads it. The
scheduler's manager marks a block loadable (a small ``.../ok`` key) only
after every rank's store completed (``complete_store``), so ``lookup`` never
counts a block some rank did not write. gd2fs evicts on its own (S3-FIFO or
LRU per server): a block evicted after its mark makes that load fail, which
the handler reports as a failed transfer (vLLM then recomputes).

docs/engines.md says what is known not to work.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

try:
    from vllm.v1.kv_offload.abstract import LoadStoreSpec, OffloadingManager, PrepareStoreOutput
    from vllm.v1.kv_offload.mediums import GPULoadStoreSpec
    from vllm.v1.kv_offload.spec import OffloadingSpec
    from vllm.v1.kv_offload.worker.worker import OffloadingHandler
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pygd2fs.vllm is an offloading spec for vLLM's OffloadingConnector and needs vllm importable "
        f"({e}); vLLM loads it by spec_module_path (docs/engines.md)"
    ) from e

try:
    from vllm.v1.kv_offload.worker.worker import TransferResult
except ImportError:  # older vLLM: (job_id, success) tuples
    TransferResult = None

from ._conn import Connection, connect

logger = logging.getLogger(__name__)

MEDIUM = "GD2FS"


class GD2FSLoadStoreSpec(LoadStoreSpec):
    """Where offloaded blocks are in gd2fs: their block hashes, in order."""

    def __init__(self, block_hashes: Iterable[Any]):
        self.block_hashes = list(block_hashes)

    @staticmethod
    def medium() -> str:
        return MEDIUM

    def __repr__(self) -> str:
        return f"GD2FSLoadStoreSpec({len(self.block_hashes)} blocks)"


def _hex(h: Any) -> str:
    if isinstance(h, (bytes, bytearray, memoryview)):
        return bytes(h).hex()
    if isinstance(h, int):
        return format(h & ((1 << 256) - 1), "x")
    return str(h)


class _Store:
    """What the manager and the handlers share: the connection and the keys."""

    def __init__(self, extra: Dict[str, Any], prefix: str):
        self.conn: Connection = connect(
            extra.get("gd2fs_master") or os.environ.get("GD2FS_MASTER") or "http://127.0.0.1:7070",
            extra.get("gd2fs_token"), cluster=extra.get("gd2fs_cluster", ""),
            kv_pool=extra.get("gd2fs_pool", "perf"))
        self.kv = self.conn.kv(extra.get("gd2fs_pool", "perf"))
        self.prefix = prefix.strip("/")

    def mark(self, h: Any) -> str:
        return f"{self.prefix}/{_hex(h)}/ok"

    def data(self, h: Any, rank: str, tensor: int, sub: int) -> str:
        return f"{self.prefix}/{_hex(h)}/{rank}/{tensor}/{sub}"


class GD2FSOffloadingManager(OffloadingManager):
    """Scheduler side: which offloaded blocks gd2fs holds (their marks)."""

    def __init__(self, store: _Store, block_size: int):
        self.store = store
        self.block_size = block_size

    def lookup(self, block_hashes: Iterable[Any]) -> int:
        hs = list(block_hashes)
        if not hs:
            return 0
        _, prefix = self.store.kv.batch_exists([self.store.mark(h) for h in hs])
        return prefix

    def prepare_load(self, block_hashes: Iterable[Any]) -> LoadStoreSpec:
        return GD2FSLoadStoreSpec(block_hashes)

    def touch(self, block_hashes: Iterable[Any]) -> None:
        return  # gd2fs's servers count uses themselves

    def complete_load(self, block_hashes: Iterable[Any]) -> None:
        return

    def prepare_store(self, block_hashes: Iterable[Any]) -> Optional[PrepareStoreOutput]:
        hs = list(block_hashes)
        hits, _ = self.store.kv.batch_exists([self.store.mark(h) for h in hs]) if hs else ([], 0)
        todo = [h for h, hit in zip(hs, hits) if not hit]
        return PrepareStoreOutput(block_hashes_to_store=todo, store_spec=GD2FSLoadStoreSpec(todo),
                                  block_hashes_evicted=[])

    def complete_store(self, block_hashes: Iterable[Any], success: bool = True) -> None:
        hs = list(block_hashes)
        if not success or not hs:
            return  # unmarked: never looked up as stored
        marks = [self.store.mark(h) for h in hs]
        res = self.store.kv.batch_put_from(marks, [b"1"] * len(marks))
        for h, r in zip(hs, res):
            if r != 0:
                logger.warning("gd2fs: block %s stored but not marked (status %d): it will be recomputed", _hex(h), -r)

    def take_events(self):
        return ()


class _Tensor:
    """One KV cache tensor, first dimension the GPU blocks."""

    def __init__(self, t):
        self.t = t
        self.block_bytes = t[0].numel() * t.element_size()
        if not t[0].is_contiguous():
            raise ValueError(f"gd2fs offloading: a KV cache tensor of shape {tuple(t.shape)} is not contiguous per "
                             "block; this attention backend's layout is not supported")
        self.cuda = t.is_cuda


class GD2FSOffloadingHandler(OffloadingHandler):
    """Worker side: moves blocks between the KV cache tensors and gd2fs, in
    a thread (the GIL is released while bytes move)."""

    def __init__(self, store: _Store, tensors: List[Any], factor: int, rank: str, writes: bool, load: bool):
        self.store = store
        self.tensors = [_Tensor(t) for t in tensors]
        self.factor = factor
        self.rank = rank
        self.writes = writes  # False on MLA ranks other than 0
        self.load = load
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gd2fs-offload")
        self._lock = threading.Lock()
        self._jobs: Dict[int, Any] = {}  # job id -> its Future
        self._done: List[Any] = []

    def _pairs(self, hashes: Sequence[Any], gpu_blocks: Sequence[int], skip: int) -> List[Tuple[Any, int, int]]:
        """(hash, sub-block, GPU block) for each GPU block, in order."""
        out = []
        pos = skip
        for g in gpu_blocks:
            i, sub = divmod(pos, self.factor)
            if i >= len(hashes):
                raise ValueError(f"{len(gpu_blocks)} GPU blocks (skipping {skip}) but {len(hashes)} offloaded blocks "
                                 f"of {self.factor}")
            out.append((hashes[i], sub, int(g)))
            pos += 1
        return out

    def _run(self, job_id: int, hashes, gpu_blocks, skip: int):
        start = time.monotonic()
        pairs = self._pairs(hashes, gpu_blocks, skip)
        nbytes = 0
        if self.load or self.writes:
            keys, ptrs, sizes, stage = [], [], [], []
            for ti, tt in enumerate(self.tensors):
                for h, sub, g in pairs:
                    keys.append(self.store.data(h, self.rank, ti, sub))
                    sizes.append(tt.block_bytes)
                    if tt.cuda:
                        import torch

                        host = torch.empty_like(tt.t[g], device="cpu").pin_memory()
                        if not self.load:
                            host.copy_(tt.t[g])
                        stage.append((tt.t[g], host))
                        ptrs.append(host.data_ptr())
                    else:
                        ptrs.append(tt.t[g].data_ptr())
            if self.load:
                got = self.store.kv.batch_get_into(keys, ptrs, sizes)
                bad = [k for k, n, s in zip(keys, got, sizes) if n != s]
                if bad:
                    raise LookupError(f"gd2fs: {len(bad)} of {len(keys)} blocks missing or short, e.g. {bad[0]}")
                for dev, host in stage:
                    dev.copy_(host)
            else:
                res = self.store.kv.batch_put_from(keys, ptrs, sizes)
                bad = [k for k, r in zip(keys, res) if r != 0]
                if bad:
                    raise IOError(f"gd2fs: {len(bad)} of {len(keys)} blocks not stored, e.g. {bad[0]}")
            nbytes = sum(sizes)
        return nbytes, time.monotonic() - start

    def transfer_async(self, job_id: int, spec) -> bool:
        src, dst = spec
        if self.load:
            hashes, gpu = src.block_hashes, dst
        else:
            hashes, gpu = dst.block_hashes, src
        if getattr(gpu, "group_sizes", None) is not None and len(gpu.group_sizes) > 1:
            raise ValueError("gd2fs offloading: several KV cache groups (hybrid models) are not supported")
        skip = 0
        bi = getattr(gpu, "block_indices", None)
        if self.load and bi:
            skip = int(bi[0]) % self.factor  # the first GPU block may start inside an offloaded block
        with self._lock:  # before it can finish
            self._jobs[job_id] = self._pool.submit(self._job, job_id, list(hashes), [int(b) for b in gpu.block_ids], skip)
        return True

    def _job(self, job_id: int, hashes, gpu_blocks, skip: int) -> None:
        """Runs a transfer and records its result before the job's future
        completes, so that get_finished after wait() has it."""
        err = None
        size = t = None
        try:
            size, t = self._run(job_id, hashes, gpu_blocks, skip)
        except Exception as e:  # reported as a failed transfer, as vLLM expects
            err = e
            logger.warning("gd2fs offloading job %d (%s) failed: %s", job_id, "load" if self.load else "store", e)
        kind = (MEDIUM, "GPU") if self.load else ("GPU", MEDIUM)
        if TransferResult is not None:
            r = TransferResult(job_id=job_id, success=err is None, transfer_size=size, transfer_time=t,
                               transfer_type=kind)
        else:
            r = (job_id, err is None)
        with self._lock:
            self._done.append(r)
            self._jobs.pop(job_id, None)

    def get_finished(self) -> list:
        with self._lock:
            out, self._done = self._done, []
        return out

    def wait(self, job_ids: set) -> None:
        with self._lock:
            futs = [f for j, f in self._jobs.items() if j in job_ids]
        for f in futs:
            f.result()  # _job does not raise

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


def _tp() -> Tuple[int, int]:
    try:
        from vllm.distributed.parallel_state import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        return int(get_tensor_model_parallel_rank()), int(get_tensor_model_parallel_world_size())
    except Exception:  # not initialised (a single process)
        return 0, 1


class GD2FSOffloadingSpec(OffloadingSpec):
    """vLLM ``OffloadingSpec``: ``get_manager()`` for the scheduler,
    ``get_handlers()`` for each worker."""

    def __init__(self, vllm_config, kv_cache_config=None):
        if kv_cache_config is None:
            super().__init__(vllm_config)
        else:
            super().__init__(vllm_config, kv_cache_config)
        extra = dict(self.extra_config or {})
        groups = getattr(kv_cache_config, "kv_cache_groups", None) if kv_cache_config is not None else None
        if groups is not None and len(groups) > 1:
            raise ValueError(
                "gd2fs offloading spec: this model has several KV cache groups (a hybrid model); "
                "only one group is supported: use the explicit-offloading connector (docs/engines.md)")
        gpu = tuple(getattr(self, "gpu_block_size", ()) or (vllm_config.cache_config.block_size,))
        self.gpu_block = int(gpu[0])
        self.block_tokens = int(getattr(self, "offloaded_block_size", 0) or self.gpu_block)
        if self.block_tokens % self.gpu_block:
            raise ValueError(f"offloaded block size {self.block_tokens} is not a multiple of the GPU block size {self.gpu_block}")
        self.factor = self.block_tokens // self.gpu_block
        par = vllm_config.parallel_config
        self.world = int(getattr(par, "tensor_parallel_size", 1) or 1)
        if int(getattr(par, "pipeline_parallel_size", 1) or 1) > 1:
            raise ValueError("gd2fs offloading spec: pipeline parallelism is not supported")
        self.use_mla = bool(getattr(vllm_config.model_config, "use_mla", False))
        model = str(getattr(vllm_config.model_config, "model", "model")).strip("/")
        self.prefix = extra.get("gd2fs_key_prefix") or f"vllm/{model}/b{self.block_tokens}/tp{self.world}"
        self._extra = extra
        self._store: Optional[_Store] = None
        self._manager: Optional[GD2FSOffloadingManager] = None
        self._handlers: Optional[Tuple[GD2FSOffloadingHandler, GD2FSOffloadingHandler]] = None

    def _get_store(self) -> _Store:
        if self._store is None:
            self._store = _Store(self._extra, self.prefix)
        return self._store

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = GD2FSOffloadingManager(self._get_store(), self.block_tokens)
        return self._manager

    def get_handlers(self, kv_caches, attn_backends=None) -> Iterator[tuple]:
        if self._handlers is None:
            tensors = _canonical(kv_caches)
            rank, world = _tp()
            if world != self.world:
                raise ValueError(f"gd2fs offloading spec: worker sees {world} TP ranks, the config {self.world}")
            tag = "mla" if self.use_mla else f"{rank}of{world}"
            writes = not self.use_mla or rank == 0
            st = self._get_store()
            self._handlers = (GD2FSOffloadingHandler(st, tensors, self.factor, tag, writes, load=False),
                              GD2FSOffloadingHandler(st, tensors, self.factor, tag, True, load=True))
        store, load = self._handlers
        yield GPULoadStoreSpec, GD2FSLoadStoreSpec, store
        yield GD2FSLoadStoreSpec, GPULoadStoreSpec, load


def _canonical(kv_caches) -> List[Any]:
    """The KV cache tensors, each with the GPU blocks first: vLLM's
    CanonicalKVCaches as they are, or a layer -> tensor dict of an older vLLM
    where a FlashAttention-style (2, num_blocks, ...) tensor is split into K
    and V."""
    if hasattr(kv_caches, "tensors"):
        return [c.tensor for c in kv_caches.tensors]
    out = []
    seen = set()
    for name, t in kv_caches.items():
        if t.data_ptr() in seen:
            continue  # layers sharing one tensor
        seen.add(t.data_ptr())
        if t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] != 2:
            out += [t[0], t[1]]
        else:
            out.append(t)
    return out


__all__ = ["GD2FSOffloadingSpec", "GD2FSLoadStoreSpec", "GD2FSOffloadingManager", "GD2FSOffloadingHandler"]
