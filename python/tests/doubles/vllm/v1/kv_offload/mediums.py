"""Double of vllm.v1.kv_offload.mediums: GPULoadStoreSpec."""

import numpy as np

from vllm.v1.kv_offload.abstract import LoadStoreSpec


class GPULoadStoreSpec(LoadStoreSpec):
    def __init__(self, block_ids, group_sizes, block_indices=None):
        self.block_ids = np.array(block_ids, dtype=np.int64)
        assert sum(group_sizes) == len(block_ids)
        assert block_indices is None or len(block_indices) == len(group_sizes)
        self.group_sizes = group_sizes
        self.block_indices = block_indices

    @staticmethod
    def medium() -> str:
        return "GPU"
