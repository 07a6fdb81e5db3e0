"""Double of the explicit-offloading connector's gd2fs storage (tensorfer/vllm,
``explicit_offloading/storage/gd2fs.py`` at 74962caa/dc2a9660), the load and
save paths only, with its TCP ("bounce") policy: each segment's bytes go
through a host buffer registered for the transfer, one ``ReadAsync`` or
``WriteAsync`` per piece, and a request that did not move every byte raises
after unpacking ``pygd2fs.InspectStatus(status)`` into four fields, as the
engine does. The KV cache here is one CPU tensor of ``[blocks, block_bytes]``
uint8 (the engine's per-layer regions do not matter to what is tested: how a
failed load comes back)."""

from __future__ import annotations

import asyncio
from typing import List

import torch

import pygd2fs

PIECE = 4 << 20  # the engine's bounce chunk


class GD2FSStorage:
    def __init__(self, config: dict):
        self.client = pygd2fs.Client(config["cpaddr"], config.get("dpaddr", "tcp://127.0.0.1"), config["cluster"],
                                     iothreads=config.get("iothreads", 1), memthreads=config.get("memthreads", 1),
                                     streams=config.get("streams", 1))
        self.kv = None

    def register_kvcache(self, kv: torch.Tensor) -> None:
        self.kv = kv

    def _check_req_result(self, req, expect: int) -> None:
        status = req.Status()
        if status != 0:
            _, klass, _, code = pygd2fs.InspectStatus(status)  # the engine unpacks four fields
            raise RuntimeError(f"GD2FS request {req} error: {klass} : {code}")
        if req.Value() != expect:
            raise RuntimeError(f"GD2FS unexpected length {req}, expect {expect}")

    def _blocks(self, block_ids: List[List[int]]) -> List[int]:
        return [b for group in block_ids for b in group]

    async def _move(self, write: bool, filepath: str, offset: int, block_ids: List[List[int]]) -> None:
        blocks = self._blocks(block_ids)
        if not blocks:
            return
        host = torch.empty(len(blocks), self.kv.shape[1], dtype=torch.uint8)
        if write:
            host.copy_(self.kv[blocks])
        n = host.numel()
        io = self.client.RegIOMEM(host.data_ptr(), n)
        try:
            async def piece(off: int) -> None:
                ln = min(PIECE, n - off)
                sge = pygd2fs.SGE(host.data_ptr() + off, ln, io)
                op = self.client.WriteAsync if write else self.client.ReadAsync
                self._check_req_result(await op(filepath, offset + off, [sge], 0), ln)

            await asyncio.gather(*[piece(o) for o in range(0, n, PIECE)])
        finally:
            self.client.DeregIOMEM(io)
        if not write:
            self.kv[blocks] = host

    async def load(self, filepath: str, offset: int, block_ids: List[List[int]]) -> None:
        await self._move(False, filepath, offset, block_ids)

    async def save(self, filepath: str, offset: int, block_ids: List[List[int]]) -> None:
        await self._move(True, filepath, offset, block_ids)
