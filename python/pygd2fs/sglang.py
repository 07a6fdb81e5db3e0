"""SGLang HiCache storage backend on gd2fs hash mode (the L3 tier of HiCache).

SGLang loads it by module path, with no change to SGLang::

    python -m sglang.launch_server --model-path ... --enable-hierarchical-cache \\
        --hicache-mem-layout page_first --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "gd2fs",
            "module_path": "pygd2fs.sglang", "class_name": "GD2FSHiCacheStorage",
            "interface_v1": 1, "master": "http://10.0.0.1:7070"}'

``interface_v1: 1`` makes SGLang's cache controller call the zero-copy
``batch_get_v1``/``batch_set_v1`` (without it SGLang uses the older
``batch_get``/``batch_set`` with one flat tensor per page, which this class
serves too, one copy slower). Other keys of the extra config: ``master``
(default ``$GD2FS_MASTER``, else ``http://127.0.0.1:7070``), ``cluster`` (must
equal the master's when given), ``token`` (default ``$GD2FS_TOKEN``),
``pool`` (``perf``: one copy, the default; ``ha``: three) and ``key_prefix``
(default the model name).

What is stored: one gd2fs KV block per buffer of a page, as the host pool
describes the page (``get_page_buffer_meta``): ``layer_first`` pages are one
K and one V buffer per layer (MLA: one per layer), ``page_first`` and
``page_first_direct`` pages one K and one V buffer for all layers (MLA: one).
Bytes go between the sockets and SGLang's host memory pool by address, with
no copy. A key names the page's hash, the layout (the bytes of a page differ
between layouts), the rank's share of the heads (``tp<rank>of<size>``; MLA
has one copy, ``mla``, that every rank reads and only missing blocks are
written) and the buffer's index. A page counts as stored only when all its
blocks are, so ``batch_exists`` — the count of leading pages stored — never
counts a page half written.

docs/engines.md says what is known not to work.
"""

from __future__ import annotations

import logging
import os
from typing import Any, List, Optional

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pygd2fs.sglang is a storage backend for SGLang's HiCache and needs sglang importable "
        f"({e}); SGLang loads it with --hicache-storage-backend dynamic (docs/engines.md)"
    ) from e

from ._conn import connect

logger = logging.getLogger(__name__)

_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


class GD2FSHiCacheStorage(HiCacheStorage):
    """HiCache L3 storage in gd2fs hash mode. ``storage_config`` is SGLang's
    ``HiCacheStorageConfig``; ``kwargs`` what SGLang's factory passes a
    dynamic backend (unused)."""

    def __init__(self, storage_config, kwargs: Optional[dict] = None):
        if storage_config is None:
            raise ValueError("GD2FSHiCacheStorage needs SGLang's HiCacheStorageConfig")
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        if getattr(storage_config, "should_split_heads", False):
            raise ValueError(
                "GD2FSHiCacheStorage: should_split_heads (prefill and decode with different TP sizes) "
                "is not supported: run both with the same --tp-size, or use MLA"
            )
        self.tp_rank = int(storage_config.tp_rank)
        self.tp_size = int(storage_config.tp_size)
        self.pp_rank = int(getattr(storage_config, "pp_rank", 0) or 0)
        self.pp_size = int(getattr(storage_config, "pp_size", 1) or 1)
        self.is_mla = bool(storage_config.is_mla_model)
        master = extra.get("master") or os.environ.get("GD2FS_MASTER") or "http://127.0.0.1:7070"
        token = extra.get("token")
        self.pool = extra.get("pool", "perf")
        prefix = extra.get("key_prefix") or getattr(storage_config, "model_name", None) or "sglang"
        self.prefix = str(prefix).strip("/")
        self.conn = connect(master, token, cluster=extra.get("cluster", ""), kv_pool=self.pool)
        self.kv = self.conn.kv(self.pool)
        if self.is_mla:
            self.rank_tag = "mla"
        else:
            self.rank_tag = f"tp{self.tp_rank}of{self.tp_size}"
        if self.pp_size > 1:
            self.rank_tag += f"-pp{self.pp_rank}of{self.pp_size}"
        self.mem_pool_host = None
        self.per_page = 0  # buffers per page
        self.page_size = 0

    # -- registration ------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        layout = getattr(mem_pool_host, "layout", None)
        if layout not in _LAYOUTS:
            raise ValueError(
                f"GD2FSHiCacheStorage: host memory layout {layout!r} is not supported: "
                f"use --hicache-mem-layout {' or '.join(_LAYOUTS)}"
            )
        if getattr(mem_pool_host, "kv_buffer", None) is None:
            raise ValueError("GD2FSHiCacheStorage: the host pool has no kv_buffer (DeepSeek V4 pools are not supported)")
        import torch

        self.mem_pool_host = mem_pool_host
        self.page_size = int(mem_pool_host.page_size)
        ptrs, sizes = mem_pool_host.get_page_buffer_meta(torch.arange(self.page_size, dtype=torch.int64))
        self.per_page = len(ptrs)
        self.buffer_sizes = [int(s) for s in sizes]
        self.layout = layout
        logger.info("gd2fs HiCache storage: %s layout, %d buffers per page, keys %s/<hash>/%s/%s/<i>",
                    layout, self.per_page, self.prefix, layout, self.rank_tag)

    # -- keys --------------------------------------------------------------

    def _keys(self, page_keys: List[str]) -> List[str]:
        if self.mem_pool_host is None:
            raise RuntimeError("GD2FSHiCacheStorage: register_mem_pool_host was not called")
        base = [f"{self.prefix}/{k}/{self.layout}/{self.rank_tag}/" for k in page_keys]
        return [b + str(i) for b in base for i in range(self.per_page)]

    def _flat_key(self, page_key: str) -> str:
        return f"{self.prefix}/{page_key}/{self.layout}-flat/{self.rank_tag}"

    def _meta(self, keys: List[str], host_indices) -> tuple:
        if len(host_indices) != len(keys) * self.page_size:
            raise ValueError(f"{len(keys)} pages but {len(host_indices)} host indices (page size {self.page_size})")
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if len(ptrs) != len(keys) * self.per_page:
            raise RuntimeError(f"host pool gave {len(ptrs)} buffers for {len(keys)} pages, want {self.per_page} each")
        return self._keys(keys), [int(p) for p in ptrs], [int(s) for s in sizes]

    # -- the zero-copy interface (interface_v1) -----------------------------

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        if not keys:
            return []
        ks, ptrs, sizes = self._meta(keys, host_indices)
        got = self.kv.batch_get_into(ks, ptrs, sizes)
        n = self.per_page
        # A page is loaded only when every buffer of it came back whole.
        return [all(got[i * n + j] == sizes[i * n + j] for j in range(n)) for i in range(len(keys))]

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        if not keys:
            return []
        ks, ptrs, sizes = self._meta(keys, host_indices)
        hits, _ = self.kv.batch_exists(ks)
        todo = [i for i, h in enumerate(hits) if not h]
        ok = [True] * len(ks)
        if todo:
            res = self.kv.batch_put_from([ks[i] for i in todo], [ptrs[i] for i in todo], [sizes[i] for i in todo])
            for i, r in zip(todo, res):
                ok[i] = r == 0
        n = self.per_page
        return [all(ok[i * n:(i + 1) * n]) for i in range(len(keys))]

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        if not keys:
            return 0
        _, prefix = self.kv.batch_exists(self._keys(keys))
        return prefix // self.per_page

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- the older interface: one flat tensor per page ---------------------

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        out = self.batch_get([key], [target_location] if target_location is not None else None)
        return out[0] if out else None

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None):
        if not keys:
            return []
        if target_locations is None or len(target_locations) != len(keys):
            raise ValueError("GD2FSHiCacheStorage.batch_get needs one target tensor per key (SGLang's dummy pages)")
        got = self.kv.batch_get_into([self._flat_key(k) for k in keys], list(target_locations))
        want = [t.numel() * t.element_size() for t in target_locations]
        return [t if g == w else None for t, g, w in zip(target_locations, got, want)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        if not keys:
            return True
        if values is None or len(values) != len(keys):
            raise ValueError("GD2FSHiCacheStorage.batch_set needs one value tensor per key")
        vals = [v.contiguous() for v in values]
        res = self.kv.batch_put_from([self._flat_key(k) for k in keys], vals)
        return all(r == 0 for r in res)

    def clear(self) -> None:
        """Remove every block under this backend's key prefix (all ranks')."""
        self.kv.remove_prefix(self.prefix + "/")

    def close(self) -> None:
        self.conn.close()


__all__ = ["GD2FSHiCacheStorage"]
