"""Double of vllm.v1.kv_offload.spec: OffloadingSpec's constructor (what it
derives from the configs) and the canonical KV cache types."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from math import lcm

import torch


@dataclass
class CanonicalKVCacheTensor:
    tensor: torch.Tensor
    page_size_bytes: int


@dataclass
class CanonicalKVCacheRef:
    tensor_idx: int
    page_size_bytes: int


@dataclass
class CanonicalKVCaches:
    tensors: list
    group_data_refs: list


class OffloadingSpec(ABC):
    def __init__(self, vllm_config, kv_cache_config):
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.hash_block_size = vllm_config.cache_config.block_size
        self.gpu_block_size = tuple(g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups)
        self.offloaded_block_size = lcm(*self.gpu_block_size)
        bs = self.extra_config.get("block_size")
        if bs is not None:
            assert all(int(bs) % g == 0 for g in self.gpu_block_size)
            self.offloaded_block_size = int(bs)
        self.block_size_factors = tuple(self.offloaded_block_size // g for g in self.gpu_block_size)

    @abstractmethod
    def get_manager(self):
        pass

    @abstractmethod
    def get_handlers(self, kv_caches):
        pass
