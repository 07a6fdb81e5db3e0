"""Double of SGLang's StorageBackendFactory, its `dynamic` path only."""

import importlib

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage


class StorageBackendFactory:
    @staticmethod
    def _load_backend_class(module_path, class_name, backend_name):
        module = importlib.import_module(module_path)
        cls = getattr(module, class_name)
        if not issubclass(cls, HiCacheStorage):
            raise TypeError(f"Backend class {class_name} must inherit from HiCacheStorage")
        return cls

    @classmethod
    def create_backend(cls, backend_name, storage_config, mem_pool_host, **kwargs):
        if backend_name != "dynamic" or storage_config.extra_config is None:
            raise ValueError(f"Unknown storage backend '{backend_name}' (the double knows 'dynamic' only)")
        cfg = storage_config.extra_config
        for field in ("backend_name", "module_path", "class_name"):
            if field not in cfg:
                raise ValueError(f"Missing required field '{field}' in backend config for 'dynamic' backend")
        backend_class = cls._load_backend_class(cfg["module_path"], cfg["class_name"], cfg["backend_name"])
        return backend_class(storage_config, kwargs)
