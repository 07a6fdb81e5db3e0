"""Double of vllm.v1.kv_offload.factory: a spec not registered by name is
imported from spec_module_path."""

import importlib

from vllm.v1.kv_offload.spec import OffloadingSpec


class OffloadingSpecFactory:
    _registry: dict = {}

    @classmethod
    def create_spec(cls, config, kv_cache_config):
        extra = config.kv_transfer_config.kv_connector_extra_config
        name = extra.get("spec_name", "CPUOffloadingSpec")
        if name in cls._registry:
            spec_cls = cls._registry[name]()
        else:
            path = extra.get("spec_module_path")
            if path is None:
                raise ValueError(f"Unsupported spec type: {name}")
            spec_cls = getattr(importlib.import_module(path), name)
        assert issubclass(spec_cls, OffloadingSpec)
        return spec_cls(config, kv_cache_config)
