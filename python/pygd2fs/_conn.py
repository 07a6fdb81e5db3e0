"""The Pythonic layer: files, hash-mode KV and explicit sessions.

::

    import pygd2fs, torch
    conn = pygd2fs.connect("http://m1:7070,http://m2:7070", token="s3cret")
    conn.write("/data/x.bin", b"hello")            # creates (pool perf) or extends
    buf = bytearray(5); conn.read_into("/data/x.bin", buf)
    conn.put("llama/tp0/9f2c", kv_block)            # any buffer or CPU tensor
    n = conn.get_into("llama/tp0/9f2c", dst_tensor)
    hits, prefix = conn.batch_exists(chunk_keys)
    plan = conn.plan("chat-42", token_ids=prompt_ids, model="llama-3-8b")

Buffers: bytes, bytearray, memoryview, numpy arrays, CPU torch tensors
(contiguous). Where a call takes ``ptr`` and ``size`` an int address is
accepted too and trusted as it is (it must point to ``size`` bytes you own);
pass the object instead to have it checked.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _lib
from ._buffers import Pinned
from ._engine import Client, _int, resolve_path
from ._hashes import _ids as _hash_ids
from .errors import NotFound, OutOfRange

Buffer = Any  # bytes-like, numpy array or torch tensor
PtrOrBuffer = Union[int, Buffer]


def _opts(pool: Optional[str], chunk_size: Optional[int]) -> bytes:
    parts = []
    if pool:
        if not isinstance(pool, str) or any(c in pool for c in ",;="):
            raise ValueError(f"pool {pool!r}: want a pool name such as 'perf' or 'ha'")
        parts.append(f"pool={pool}")
    if chunk_size is not None:
        parts.append(f"chunk_size={_int('chunk_size', chunk_size, 1)}")
    return ",".join(parts).encode()


def _snake(v: Any) -> Any:
    """Go field names (``ChunkSize``, ``IsDir``, ``ID``) to snake_case keys."""
    if isinstance(v, dict):
        return {re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", k).lower(): _snake(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_snake(x) for x in v]
    return v


def _key(k) -> bytes:
    if isinstance(k, str):
        k = k.encode()
    if not isinstance(k, (bytes, bytearray)):
        raise TypeError(f"a KV key must be str or bytes, not {type(k).__name__}")
    if not k:
        raise ValueError("empty KV key")
    return bytes(k)


class _Pins:
    """Pins a list of (ptr-or-buffer, size) for one call."""

    def __init__(self, ptrs: Sequence[PtrOrBuffer], sizes: Optional[Sequence[int]], writable: bool, what: str):
        self.pins: List[Pinned] = []
        n = len(ptrs)
        if sizes is not None and len(sizes) != n:
            raise ValueError(f"{n} buffers but {len(sizes)} sizes")
        self.addrs = (ctypes.c_void_p * max(n, 1))()
        self.sizes = (ctypes.c_int64 * max(n, 1))()
        try:
            for i, p in enumerate(ptrs):
                size = None if sizes is None else _int(f"sizes[{i}]", sizes[i], 0)
                if isinstance(p, int) and not isinstance(p, bool):
                    if size is None:
                        raise ValueError(f"{what}[{i}] is an address: give its size")
                    if p <= 0 and size > 0:
                        raise ValueError(f"{what}[{i}]: address {p} is not valid")
                    self.addrs[i], self.sizes[i] = p, size
                    continue
                pin = Pinned(p, writable, f"{what}[{i}]")
                self.pins.append(pin)
                if size is None:
                    size = pin.nbytes
                elif size > pin.nbytes:
                    raise ValueError(f"{what}[{i}]: size {size} exceeds the buffer's {pin.nbytes} bytes")
                self.addrs[i], self.sizes[i] = pin.addr, size
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        for p in self.pins:
            p.release()
        self.pins = []

    def __enter__(self) -> "_Pins":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _one(ptr: PtrOrBuffer, size: Optional[int], writable: bool, what: str) -> _Pins:
    return _Pins([ptr], None if size is None else [size], writable, what)


class KV:
    """Hash-mode KV cache of one pool: write-once blocks, key -> bytes.

    Keys are str (UTF-8) or bytes, up to 1 KiB. Batches are pipelined to
    every owner server at once."""

    def __init__(self, conn: "Connection", pool: str = "perf"):
        self._conn = conn
        self.pool = pool
        self._pool = pool.encode()

    def __repr__(self) -> str:
        return f"<pygd2fs.KV pool={self.pool!r}>"

    def put(self, key: Union[str, bytes], buffer: Buffer, overwrite: bool = False) -> bool:
        """Store ``buffer`` under ``key``. A key that exists is kept as it is
        (blocks are write-once) unless ``overwrite``; returns whether it
        existed."""
        k = _key(key)
        with _one(buffer, None, False, "buffer") as p:
            return bool(self._conn._call("gd2fs_kv_put", self._pool, k, len(k), p.addrs[0], p.sizes[0], int(bool(overwrite))))

    def get(self, key: Union[str, bytes]) -> bytes:
        """The value of ``key``; raises ``NotFound`` on a miss."""
        k = _key(key)
        val = ctypes.c_void_p()
        n = self._conn._call("gd2fs_kv_get", self._pool, k, len(k), ctypes.byref(val))
        try:
            return ctypes.string_at(val.value, n) if n else b""
        finally:
            if val.value:
                _lib.lib().gd2fs_free(val.value)

    def get_into(self, key: Union[str, bytes], ptr: PtrOrBuffer, size: Optional[int] = None) -> int:
        """Read ``key``'s value straight into ``ptr`` (a buffer, or an address
        with ``size``) and return its length. A miss raises ``NotFound``; a
        value larger than ``size`` raises ``TooLarge``."""
        k = _key(key)
        with _one(ptr, size, True, "ptr") as p:
            return self._conn._call("gd2fs_kv_get_into", self._pool, k, len(k), p.addrs[0], p.sizes[0])

    def _batch(self, put: bool, keys: Sequence, ptrs: Sequence[PtrOrBuffer], sizes: Optional[Sequence[int]]) -> List[int]:
        ks = [_key(k) for k in keys]
        if len(ptrs) != len(ks):
            raise ValueError(f"{len(ks)} keys but {len(ptrs)} buffers")
        n = len(ks)
        if n == 0:
            return []
        lens = (ctypes.c_int64 * n)(*[len(k) for k in ks])
        out = (ctypes.c_int64 * n)()
        with _Pins(ptrs, sizes, not put, "ptrs") as p:
            self._conn._call("gd2fs_kv_batch", int(put), self._pool, b"".join(ks), lens, n, p.addrs, p.sizes, out)
        return list(out)

    def batch_put_from(self, keys: Sequence, ptrs: Sequence[PtrOrBuffer], sizes: Optional[Sequence[int]] = None) -> List[int]:
        """Store ``sizes[i]`` bytes at ``ptrs[i]`` under ``keys[i]``, pipelined.
        Returns per key 0, or minus a status code (``pygd2fs.status_name``)."""
        return self._batch(True, keys, ptrs, sizes)

    def batch_get_into(self, keys: Sequence, ptrs: Sequence[PtrOrBuffer], sizes: Optional[Sequence[int]] = None) -> List[int]:
        """Read each key straight into ``ptrs[i]`` (at most ``sizes[i]``
        bytes). Returns per key the value's length, or minus a status code:
        -1 (NOT_FOUND) for a miss or an unreachable owner."""
        return self._batch(False, keys, ptrs, sizes)

    def batch_exists(self, keys: Sequence) -> Tuple[List[bool], int]:
        """(hits, prefix_len): which keys are stored, and how many leading
        keys all are (with a prompt's chunk hashes in order: the cached
        prefix)."""
        ks = [_key(k) for k in keys]
        n = len(ks)
        if n == 0:
            return [], 0
        lens = (ctypes.c_int64 * n)(*[len(k) for k in ks])
        hits = (ctypes.c_uint8 * n)()
        prefix = self._conn._call("gd2fs_kv_batch_exists", self._pool, b"".join(ks), lens, n, hits)
        return [bool(h) for h in hits], prefix

    def exists(self, key: Union[str, bytes]) -> bool:
        """Whether ``key`` is stored."""
        return self.batch_exists([key])[0][0]

    def stat(self, key: Union[str, bytes]) -> Dict[str, Any]:
        """Size, tier and server of ``key``'s block; ``NotFound`` on a miss."""
        return _snake(self._conn._json("kv_stat", pool=self.pool, key=_key(key).decode("utf-8", "surrogateescape")))

    def remove(self, key: Union[str, bytes]) -> None:
        """Remove ``key`` from every copy (a missing key is not an error)."""
        self._conn._json("kv_delete", pool=self.pool, key=_key(key).decode("utf-8", "surrogateescape"))

    def _retain(self, key: Union[str, bytes], **change: Any) -> Dict[str, Any]:
        return self._conn._json("kv_retain", pool=self.pool, key=_key(key).decode("utf-8", "surrogateescape"), retain=change)

    def pin(self, key: Union[str, bytes], tier: str = "dram") -> None:
        """Keep ``key``'s block in DRAM (``tier="dram"``) or stored on disk
        (``"disk"``) until unpinned: eviction passes it over. Each server
        bounds its pins (``gd2fs server --kv-pin-quota``); a pin beyond
        raises ``NoSpace``. ``NotFound`` when the key is not stored."""
        self._retain(key, pin=tier)

    def unpin(self, key: Union[str, bytes]) -> None:
        """Let ``key``'s block be evicted again."""
        self._retain(key, pin="none")

    def pin_prefix(self, prefix: str, tier: str = "dram") -> int:
        """Pin every block whose key starts with ``prefix`` (``"none"``
        unpins); returns how many changed."""
        if not prefix:
            raise ValueError("empty prefix: refusing to pin every key")
        return int(self._conn._json("kv_retain", pool=self.pool, prefix=prefix, retain={"pin": tier}))

    def set_priority(self, key: Union[str, bytes], priority: int) -> None:
        """Eviction priority of ``key``'s block, -7 to 7 (0 by default):
        lower priorities leave DRAM first."""
        self._retain(key, priority=int(priority))

    def expire(self, key: Union[str, bytes], seconds: float) -> bool:
        """Give ``key`` a time to live (as Redis's EXPIRE: 0 or less deletes
        it at once). Returns whether the key was stored."""
        try:
            self._retain(key, ttl_ms=max(0, int(seconds * 1000)))
        except NotFound:
            return False
        return True

    def persist(self, key: Union[str, bytes]) -> None:
        """Remove ``key``'s time to live."""
        self._retain(key, persist=True)

    def retention(self, key: Union[str, bytes]) -> Dict[str, Any]:
        """``{"pin": "" | "dram" | "disk", "priority": int, "ttl": seconds
        left or None}``; ``NotFound`` when the key is not stored."""
        r = self._retain(key)
        ms = r.get("ttl_ms", 0)
        return {"pin": r.get("pin", ""), "priority": r.get("priority", 0), "ttl": ms / 1000 if ms > 0 else None}

    def remove_prefix(self, prefix: str) -> int:
        """Remove every key that starts with ``prefix``; returns how many."""
        if not prefix:
            raise ValueError("empty prefix: refusing to remove every key")
        return int(self._conn._json("kv_delete_prefix", pool=self.pool, prefix=prefix))


class File:
    """An open gd2fs file (``Connection.open``). Reads and writes are
    positional and may run from several threads. Closing a file that was
    written seals it: it is immutable from then on."""

    def __init__(self, conn: "Connection", path: str, mode: str, fh: int):
        self._conn = conn
        self.path = path
        self.mode = mode
        self._fh = fh
        self._pos = 0

    def __repr__(self) -> str:
        return f"<pygd2fs.File {self.path} mode={self.mode!r}{' closed' if self._fh is None else ''}>"

    def _handle(self) -> int:
        if self._fh is None:
            raise ValueError(f"{self.path}: the file is closed")
        return self._fh

    @property
    def size(self) -> int:
        """The size as this handle sees it (its own writes included)."""
        return self._conn._call("gd2fs_file_size", self._handle())

    def read_into(self, buffer: PtrOrBuffer, offset: int = 0, size: Optional[int] = None) -> int:
        """Read into ``buffer`` at ``offset``; returns the bytes read (fewer
        at the end of the file)."""
        offset = _int("offset", offset, 0)
        with _one(buffer, size, True, "buffer") as p:
            return self._conn._call("gd2fs_file_io", self._handle(), 0, p.addrs[0], p.sizes[0], offset)

    def read(self, size: int = -1, offset: Optional[int] = None) -> bytes:
        """Read ``size`` bytes (all, when negative) at ``offset`` (default:
        the current position, which then advances)."""
        pos = self._pos if offset is None else _int("offset", offset, 0)
        if size < 0:
            size = max(0, self.size - pos)
        buf = bytearray(size)
        n = self.read_into(buf, pos)
        if offset is None:
            self._pos = pos + n
        return bytes(buf[:n])

    def write(self, buffer: Buffer, offset: Optional[int] = None) -> int:
        """Write ``buffer`` at ``offset`` (default: the current position,
        which then advances); returns the bytes written."""
        pos = self._pos if offset is None else _int("offset", offset, 0)
        with _one(buffer, None, False, "buffer") as p:
            n = self._conn._call("gd2fs_file_io", self._handle(), 1, p.addrs[0], p.sizes[0], pos)
        if offset is None:
            self._pos = pos + n
        return n

    def close(self) -> None:
        """Close; a file this handle wrote is sealed (committed, immutable)."""
        if self._fh is not None:
            fh, self._fh = self._fh, None
            self._conn._call("gd2fs_file_close", fh)

    def __enter__(self) -> "File":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Connection:
    """A connection to a gd2fs cluster (``pygd2fs.connect``): files,
    hash-mode KV (``put``/``get``/... on the default pool, ``kv(pool)`` for
    another) and explicit-mode sessions."""

    def __init__(self, client: Client, kv_pool: str = "perf"):
        self.client = client
        self._kv = KV(self, kv_pool)

    def __repr__(self) -> str:
        return f"<pygd2fs.Connection {self.client.cpaddr} cluster={self.client.cluster!r}>"

    @property
    def cluster(self) -> str:
        """The master's cluster name."""
        return self.client.cluster

    def close(self) -> None:
        """Release the connections (transfers in flight are cancelled)."""
        self.client.Close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, name: str, *args) -> int:
        self.client._check()
        return _lib.call(name, self.client._h, *args)

    def _json(self, method: str, **params) -> Any:
        out = ctypes.c_void_p()
        self._call("gd2fs_call", method.encode(), json.dumps(params).encode(), ctypes.byref(out))
        text = _lib.take_string(_lib.lib(), out)
        return json.loads(text) if text else None

    # -- files -------------------------------------------------------------

    def open(self, path: str, mode: str = "r", pool: Optional[str] = None, chunk_size: Optional[int] = None) -> File:
        """Open ``path``: mode ``"r"`` (must exist), ``"w"`` (create,
        replacing an existing file) or ``"x"`` (create; ``Exists`` if it is
        there). ``pool`` (``"ha"``: 3 copies, the default for new files;
        ``"perf"``: 1) and ``chunk_size`` apply to new files."""
        path = resolve_path(path, self.client)
        if mode not in ("r", "w", "x", "rb", "wb", "xb"):
            raise ValueError(f"mode {mode!r}: want 'r', 'w' or 'x'")
        mode = mode[0]
        fh = self._call("gd2fs_file_open", path.encode(), mode.encode(), _opts(pool, chunk_size))
        return File(self, path, mode, fh)

    def read_into(self, path: str, buffer: PtrOrBuffer, offset: int = 0, size: Optional[int] = None,
                  *, partial: bool = False) -> int:
        """Read ``path`` at ``offset`` straight into ``buffer`` (or ``size``
        bytes at an address) and return the bytes read: all of the buffer,
        or ``OutOfRange`` is raised when the file ends before it is full (a
        short or empty file would otherwise leave a tensor half stale with
        nothing said). ``partial=True`` accepts fewer bytes at the end of
        the file and returns how many (0 at or past the end)."""
        path = resolve_path(path, self.client)
        offset = _int("offset", offset, 0)
        with _one(buffer, size, True, "buffer") as p:
            want = p.sizes[0]
            n = self._call("gd2fs_read_into", path.encode(), offset, p.addrs[0], want)
        if n < want and not partial:
            raise OutOfRange(f"{path}: read {n} of {want} bytes at offset {offset}: the file ends at byte {offset + n}"
                             " (pass partial=True to accept a short read)")
        return n

    def read(self, path: str, size: int = -1, offset: int = 0) -> bytes:
        """Read ``size`` bytes (the rest of the file when negative)."""
        if size < 0:
            size = max(0, int(self.stat(path)["size"]) - offset)
        buf = bytearray(size)
        n = self.read_into(path, buf, offset, partial=True)
        return bytes(buf[:n])

    def write(self, path: str, buffer: Buffer, offset: int = 0, pool: Optional[str] = None) -> int:
        """Write ``buffer`` at ``offset`` of ``path``, creating the file (pool
        ``perf`` unless ``pool``) or extending it; the bytes are visible to
        other clients when this returns (in a session's file, a plan's
        ``kv_uri``: with the session commit that names them). The file stays open for more writes
        (``open(path, "w")`` and ``close()`` seal one)."""
        path = resolve_path(path, self.client)
        offset = _int("offset", offset, 0)
        with _one(buffer, None, False, "buffer") as p:
            return self._call("gd2fs_write_from", path.encode(), offset, p.addrs[0], p.sizes[0], _opts(pool, None))

    def stat(self, path: str) -> Dict[str, Any]:
        """Size, pool, chunks and replicas of ``path``."""
        return _snake(self._json("stat", path=resolve_path(path, self.client)))

    def list(self, dir: str = "/") -> List[Dict[str, Any]]:
        """The entries of directory ``dir``."""
        return _snake(self._json("list", dir=resolve_path(dir, self.client)) or [])

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def mkdir(self, dir: str) -> None:
        """Create ``dir`` and its parents."""
        self._json("mkdir", dir=resolve_path(dir, self.client))

    def remove(self, path: str) -> None:
        """Remove a file or an empty directory."""
        self._json("remove", path=resolve_path(path, self.client))

    def status(self) -> Dict[str, Any]:
        """The cluster overview: servers, pools, totals."""
        return self._json("status")

    # -- hash-mode KV --------------------------------------------------------

    def kv(self, pool: str = "perf") -> KV:
        """The KV cache of ``pool`` (``"perf"``: 1 copy, ``"ha"``: 3)."""
        return KV(self, pool)

    def put(self, key: Union[str, bytes], buffer: Buffer, overwrite: bool = False) -> bool:
        """``KV.put`` on the default pool."""
        return self._kv.put(key, buffer, overwrite)

    def get(self, key: Union[str, bytes]) -> bytes:
        """``KV.get`` on the default pool."""
        return self._kv.get(key)

    def get_into(self, key: Union[str, bytes], ptr: PtrOrBuffer, size: Optional[int] = None) -> int:
        """``KV.get_into`` on the default pool."""
        return self._kv.get_into(key, ptr, size)

    def batch_put_from(self, keys: Sequence, ptrs: Sequence[PtrOrBuffer], sizes: Optional[Sequence[int]] = None) -> List[int]:
        """``KV.batch_put_from`` on the default pool."""
        return self._kv.batch_put_from(keys, ptrs, sizes)

    def batch_get_into(self, keys: Sequence, ptrs: Sequence[PtrOrBuffer], sizes: Optional[Sequence[int]] = None) -> List[int]:
        """``KV.batch_get_into`` on the default pool."""
        return self._kv.batch_get_into(keys, ptrs, sizes)

    def batch_exists(self, keys: Sequence) -> Tuple[List[bool], int]:
        """``KV.batch_exists`` on the default pool."""
        return self._kv.batch_exists(keys)

    def remove_key(self, key: Union[str, bytes]) -> None:
        """``KV.remove`` on the default pool."""
        self._kv.remove(key)

    # -- explicit sessions -----------------------------------------------------

    def set_layout(
        self, model: str, layers: int, kv_heads: int, head_dim: int, dtype: str = "bf16",
        page_tokens: int = 16, layout: str = "layer_first", tp_size: int = 1, replicated: bool = False,
        kv_layers: int = 0,
    ) -> None:
        """Register (or replace) the KV layout of ``model``: ``layout`` is
        ``layer_first``, ``page_first``, ``kv_first`` or ``kv_inner``;
        ``tp_size`` the tensor-parallel ranks the KV heads are sharded over;
        ``replicated`` when every rank holds the same KV (MLA); ``kv_layers``
        how many layers hold KV (hybrid models; 0: all)."""
        self._json("set_layout", layout={
            "model": model, "layers": layers, "kv_heads": kv_heads, "head_dim": head_dim,
            "dtype": dtype, "page_tokens": page_tokens, "layout": layout,
            "tp_size": _int("tp_size", tp_size, 1), "replicated": bool(replicated),
            "kv_layers": _int("kv_layers", kv_layers, 0),
        })

    def get_layout(self, model: str) -> Dict[str, Any]:
        """The KV layout of ``model``."""
        return self._json("get_layout", model=model)

    def plan(
        self, session: str, prompt_tokens: int = 0, model: str = "", decode_tokens: int = 0,
        prefixes: Optional[Sequence[str]] = None, new_file: bool = False,
        format: str = "", load_threshold: int = 0, flags: Optional[Dict[str, Any]] = None, *,
        token_ids: Optional[Sequence[int]] = None, block_hashes: Optional[Sequence[str]] = None,
        unsafe_count_only: bool = False,
    ) -> Dict[str, Any]:
        """Ask what ``session`` has stored for a prompt and reserve where the
        new KV goes: a dict with ``plan_id``, ``stored_kv_cache``,
        ``fresh_kv_cache``, ``cached_tokens``, ``verified_tokens``, ... The
        session is created (for ``model``) on its first plan. With
        ``format="vllm"`` the answer holds ``kvcache_params`` as vLLM's
        explicit-offloading connector takes them (docs/kv-cache.md);
        ``flags`` (vllm format only) go into ``kvcache_params.flags``, e.g.
        ``{"prefill-only": True}``: the engine saves only the prompt.

        The plan checks content: give the prompt's ``token_ids`` (then
        ``prompt_tokens`` may be left out) or its ``block_hashes``
        (``pygd2fs.block_hashes(ids, page_tokens)``, with ``prompt_tokens``).
        Stored KV is used only as far as the content matches what the
        session stored. ``unsafe_count_only=True`` plans on ``prompt_tokens``
        alone: a user's edit of an earlier message then gets KV of other
        text."""
        req: Dict[str, Any] = {"model": model, "prompt_tokens": _int("prompt_tokens", prompt_tokens, 0),
                               "decode_tokens": _int("decode_tokens", decode_tokens, 0), "new_file": bool(new_file)}
        if token_ids is not None and block_hashes is not None:
            raise ValueError("give token_ids or block_hashes, not both")
        if token_ids is not None:
            req["token_ids"] = _hash_ids(token_ids)
        elif block_hashes is not None:
            req["block_hashes"] = [str(h) for h in block_hashes]
        elif not unsafe_count_only:
            raise ValueError("a plan checks the prompt's content: give token_ids=[...] (or block_hashes=... with "
                             "prompt_tokens); unsafe_count_only=True plans on counts alone (wrong KV after an edit)")
        if unsafe_count_only:
            req["unsafe_count_only"] = True
        if prefixes:
            req["prefixes"] = list(prefixes)
        if format:
            req["format"] = format
        if load_threshold:
            req["load_threshold"] = _int("load_threshold", load_threshold, 0)
        if flags:
            if not isinstance(flags, dict):
                raise TypeError(f"flags must be a dict such as {{'prefill-only': True}}, not {type(flags).__name__}")
            req["flags"] = dict(flags)
        return self._json("plan", session=session, plan=req)

    def commit(
        self, session: str, plan: Union[int, Dict[str, Any]], saved: Any = None,
    ) -> Dict[str, Any]:
        """Record a plan's fresh range as stored (write its bytes first). For
        a ``format="vllm"`` plan, ``saved`` is what the engine saved: its
        answer's ``kv_transfer_params``, their ``kvcache_params`` (taken as
        the engine returns them: fields gd2fs does not know, such as
        ``flags``, are ignored) or the ``fresh_kvcache`` list (``[]`` when it
        saved nothing)."""
        plan_id = plan["plan_id"] if isinstance(plan, dict) else plan
        params: Dict[str, Any] = {"session": session, "plan_id": _int("plan_id", plan_id, 1)}
        if isinstance(saved, dict):
            kp = saved.get("kvcache_params", saved)
            if not isinstance(kp, dict) or not isinstance(kp.get("fresh_kvcache", []), list):
                raise ValueError("saved: want the engine's kv_transfer_params, kvcache_params or a fresh_kvcache list")
            if kp.get("id") not in (None, "", session):
                raise ValueError(f"saved: kvcache_params are of session {kp.get('id')!r}, not {session!r}")
            saved = kp.get("fresh_kvcache", [])
        if saved is not None:
            params["saved"] = list(saved)
        return self._json("commit", **params)

    def fork(self, session: str, new_session: str) -> Dict[str, Any]:
        """Make ``new_session`` share ``session``'s stored ranges (no copy)."""
        return self._json("fork", session=session, new_id=new_session)

    def delete(self, session: str) -> None:
        """Remove a session; its files go when no fork still uses them."""
        self._json("delete_session", session=session)

    def session(self, session: str) -> Dict[str, Any]:
        """A session and its committed ranges."""
        return self._json("get_session", session=session)

    def sessions(self, after: str = "", limit: int = 100) -> List[Dict[str, Any]]:
        """Up to ``limit`` sessions with ids after ``after``, in id order."""
        return self._json("list_sessions", after=after, limit=limit) or []


def connect(
    masters: str = "http://127.0.0.1:7070",
    token: Optional[str] = None,
    *,
    cluster: str = "",
    dpaddr: str = "tcp://127.0.0.1",
    streams: int = 4,
    iothreads: int = 16,
    kv_pool: str = "perf",
) -> Connection:
    """Connect to a gd2fs cluster.

    ``masters``: one or more master addresses, comma-separated
    (``http://m1:7070,http://m2:7070``; ``gd2fs://`` or bare ``host:port``
    work too). ``token``: the cluster token (default ``$GD2FS_TOKEN``).
    ``cluster``: when given, must equal the master's cluster name. The
    default KV pool of ``put``/``get``/... is ``kv_pool``."""
    if token is None:
        token = os.environ.get("GD2FS_TOKEN", "")
    c = Client.__new__(Client)
    c._closed = True
    c._h = 0
    for name, v in (("masters", masters), ("token", token), ("cluster", cluster), ("dpaddr", dpaddr)):
        if not isinstance(v, str):
            raise TypeError(f"{name} must be a str, not {type(v).__name__}")
    c._init(masters, dpaddr, cluster, token, _int("iothreads", iothreads, 1), 1, _int("streams", streams, 1))
    return Connection(c, kv_pool)
