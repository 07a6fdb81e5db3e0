"""Doubles of SGLang's host KV pools (pool_host/mha.py, mla.py): the buffer
shapes of init_kv_buffer and the addresses get_page_buffer_meta gives, per
layout, on real CPU tensors. Indices are token slots; a page is page_size
consecutive slots starting at a multiple of page_size."""

import torch


def _itemsize(dtype):
    return torch.empty(0, dtype=dtype).element_size()  # torch < 2.1 has no dtype.itemsize


class MHATokenToKVPoolHost:
    def __init__(self, size, page_size, layer_num, head_num, head_dim, dtype, layout):
        self.size, self.page_size, self.layer_num = size, page_size, layer_num
        self.head_num, self.head_dim, self.dtype, self.layout = head_num, head_dim, dtype, layout
        self.page_num = size // page_size
        if layout == "layer_first":
            dims = (2, layer_num, size, head_num, head_dim)
        elif layout == "page_first":
            dims = (2, size, layer_num, head_num, head_dim)
        elif layout == "page_first_direct":
            dims = (2, self.page_num, layer_num, page_size, head_num, head_dim)
        else:
            raise ValueError(layout)
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    def token(self, kv, layer, index):
        """The [head_num, head_dim] K (kv=0) or V of one layer at one slot."""
        if self.layout == "layer_first":
            return self.kv_buffer[kv, layer, index]
        if self.layout == "page_first":
            return self.kv_buffer[kv, index, layer]
        return self.kv_buffer[kv, index // self.page_size, layer, index % self.page_size]

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        item = _itemsize(self.dtype)
        unit = self.head_num * self.head_dim * item  # one token of one layer
        base = self.kv_buffer.data_ptr()
        v_off = self.layer_num * self.size * unit
        idx = indices.tolist()
        ptrs = []
        if self.layout == "layer_first":
            for i in range(0, len(idx), self.page_size):
                for layer in range(self.layer_num):
                    k = base + idx[i] * unit + layer * self.size * unit
                    ptrs += [k, k + v_off]
            size = self.page_size * unit
        else:
            for i in range(0, len(idx), self.page_size):
                k = base + idx[i] * self.layer_num * unit
                ptrs += [k, k + v_off]
            size = self.layer_num * self.page_size * unit
        return ptrs, [size] * len(ptrs)

    # the older, copying interface
    def get_dummy_flat_data_page(self):
        return torch.zeros(2 * self.layer_num * self.page_size * self.head_num * self.head_dim, dtype=self.dtype)

    def _page_view(self, index):
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, index:index + self.page_size]
        if self.layout == "page_first":
            return self.kv_buffer[:, index:index + self.page_size]
        return self.kv_buffer[:, index // self.page_size]

    def get_data_page(self, index, flat=True):
        return self._page_view(index).flatten()

    def set_from_flat_data_page(self, index, data_page):
        v = self._page_view(index)
        v.copy_(data_page.reshape(v.shape))


class MLATokenToKVPoolHost:
    def __init__(self, size, page_size, layer_num, kv_cache_dim, dtype, layout):
        self.size, self.page_size, self.layer_num = size, page_size, layer_num
        self.kv_cache_dim, self.dtype, self.layout = kv_cache_dim, dtype, layout
        self.page_num = size // page_size
        if layout == "layer_first":
            dims = (layer_num, size, 1, kv_cache_dim)
        elif layout == "page_first":
            dims = (size, layer_num, 1, kv_cache_dim)
        elif layout == "page_first_direct":
            dims = (self.page_num, layer_num, page_size, 1, kv_cache_dim)
        else:
            raise ValueError(layout)
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    def token(self, kv, layer, index):
        assert kv == 0
        if self.layout == "layer_first":
            return self.kv_buffer[layer, index]
        if self.layout == "page_first":
            return self.kv_buffer[index, layer]
        return self.kv_buffer[index // self.page_size, layer, index % self.page_size]

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        unit = self.kv_cache_dim * _itemsize(self.dtype)
        base = self.kv_buffer.data_ptr()
        idx = indices.tolist()
        ptrs = []
        if self.layout == "layer_first":
            for i in range(0, len(idx), self.page_size):
                for layer in range(self.layer_num):
                    ptrs.append(base + idx[i] * unit + layer * self.size * unit)
            size = self.page_size * unit
        else:
            for i in range(0, len(idx), self.page_size):
                ptrs.append(base + idx[i] * self.layer_num * unit)
            size = self.layer_num * self.page_size * unit
        return ptrs, [size] * len(ptrs)
