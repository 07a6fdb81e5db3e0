"""Double of the explicit-offloading connector's worker (tensorfer/vllm,
``explicit_offloading/worker.py`` at 89abb5dd), the load side: loads run on an
asyncio loop in a thread; a load that raises marks every block of its request
invalid, which vLLM's scheduler collects with
``get_block_ids_with_load_errors()`` and recomputes; the request is finished
either way (``get_finished``). A load that never returns would hold its
request forever: that is what gd2fs must never cause."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import List, Set, Tuple

import pygd2fs  # noqa: F401  (the storage's client)


@dataclass
class LoadContext:
    request_id: str
    filepath: str  # a segment's kv_uri or path
    offset: int  # its kv_start
    block_ids: List[List[int]]


class ExOffloadingConnectorWorker:
    def __init__(self, storage):
        self.storage = storage
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._lock = threading.Condition()
        self._finished: Set[str] = set()
        self._invalid: Set[int] = set()
        self.errors: List[str] = []  # what the engine logs

    async def _load(self, ctx: LoadContext) -> None:
        try:
            await self.storage.load(ctx.filepath, ctx.offset, ctx.block_ids)
        except Exception as e:
            with self._lock:
                self.errors.append(f"({ctx.request_id}) Failed loading kv cache: {e}")
                self._invalid.update(b for g in ctx.block_ids for b in g)
        with self._lock:
            self._finished.add(ctx.request_id)
            self._lock.notify_all()

    def start_load_kv(self, ctxs: List[LoadContext]) -> None:
        async def run():
            await asyncio.gather(*[self._load(c) for c in ctxs])

        asyncio.run_coroutine_threadsafe(run(), self._loop)

    def get_finished(self) -> Tuple[Set[str], Set[str]]:
        with self._lock:
            done, self._finished = self._finished, set()
        return set(), done

    def wait_finished(self, request_id: str, timeout: float) -> bool:
        """Test helper (vLLM polls get_finished every step): True once the
        request's load finished, False if it did not within timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: request_id in self._finished, timeout)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        with self._lock:
            out, self._invalid = self._invalid, set()
        return out

    def shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
