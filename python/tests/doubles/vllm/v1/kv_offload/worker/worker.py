"""Double of vllm.v1.kv_offload.worker.worker: OffloadingHandler,
TransferResult and the OffloadingWorker that dispatches by medium."""

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass
class TransferResult:
    job_id: int
    success: bool
    transfer_size: int = None
    transfer_time: float = None
    transfer_type: tuple = None


class OffloadingHandler(ABC):
    @abstractmethod
    def transfer_async(self, job_id, spec) -> bool:
        pass

    @abstractmethod
    def get_finished(self) -> list:
        pass

    @abstractmethod
    def wait(self, job_ids) -> None:
        pass

    def shutdown(self) -> None:
        pass


class OffloadingWorker:
    def __init__(self):
        self.handlers = set()
        self.by_type = {}

    def register_handler(self, src_cls, dst_cls, handler):
        t = (src_cls.medium(), dst_cls.medium())
        assert t not in self.by_type
        self.handlers.add(handler)
        self.by_type[t] = handler

    def transfer_async(self, job_id, spec) -> bool:
        src, dst = spec
        h = self.by_type[(src.medium(), dst.medium())]
        try:
            return h.transfer_async(job_id, spec)
        except Exception:
            return False

    def get_finished(self):
        out = []
        for h in self.handlers:
            out.extend(h.get_finished())
        return out

    def wait(self, job_ids):
        for h in self.handlers:
            h.wait(job_ids)
