"""Double of sglang.srt.mem_cache.hicache_storage: the interface a HiCache
storage backend implements (see ../../../../README.md)."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        pass

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        pass

    @abstractmethod
    def get(self, key, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        pass

    @abstractmethod
    def batch_get(self, keys, target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None):
        pass

    @abstractmethod
    def set(self, key, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        pass

    @abstractmethod
    def batch_set(self, keys, values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        pass

    @abstractmethod
    def exists(self, key: str) -> bool:
        pass

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        for i, k in enumerate(keys):
            if not self.exists(k):
                return i
        return len(keys)
