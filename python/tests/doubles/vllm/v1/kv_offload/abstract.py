"""Double of vllm.v1.kv_offload.abstract (see ../../../README.md)."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterable


class LoadStoreSpec(ABC):
    @staticmethod
    @abstractmethod
    def medium() -> str:
        pass


@dataclass
class PrepareStoreOutput:
    block_hashes_to_store: list
    store_spec: LoadStoreSpec
    block_hashes_evicted: list


class OffloadingManager(ABC):
    @abstractmethod
    def lookup(self, block_hashes: Iterable[Any]) -> int:
        pass

    @abstractmethod
    def prepare_load(self, block_hashes: Iterable[Any]) -> LoadStoreSpec:
        pass

    def touch(self, block_hashes: Iterable[Any]):
        return

    def complete_load(self, block_hashes: Iterable[Any]):
        return

    @abstractmethod
    def prepare_store(self, block_hashes: Iterable[Any]):
        pass

    def complete_store(self, block_hashes: Iterable[Any], success: bool = True):
        return

    def take_events(self):
        return ()
