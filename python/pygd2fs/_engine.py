"""The engine-facing API: what vLLM's and SGLang's GD2FS backends call.

::

    client = pygd2fs.Client("gd2fs://10.0.0.1:7070", "tcp://10.0.0.5", "prod",
                            iothreads=4, memthreads=1, streams=4)
    iomem = client.RegIOMEM(kv.data_ptr(), kv.numel() * kv.element_size())
    sges = [pygd2fs.SGE(addr, length, iomem) for addr, length in runs]
    req = client.Write("/kv/llama/0/abc", 0, sges, 0, "")   # returns at once
    done = client.Wait(-1)                                  # [req]
    assert req.Status() == 0 and req.Value() == sum(s.length for s in sges)
    req = await client.ReadAsync("/kv/llama/0/abc", 0, sges, 0)
    client.DeregIOMEM(iomem)
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from . import _lib
from .errors import BAD_REQUEST, CANCELLED, ForkError, status_name

_OP_READ, _OP_WRITE = 0, 1
_QUEUE_WAIT, _QUEUE_ASYNC = 0, 1
_BATCH = 256  # completions collected per library call

PENDING = -1
"""What ``Request.Status()`` returns before the request completes."""


def _int(name: str, v, minimum: Optional[int] = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        # numpy and torch integer scalars have __index__
        if hasattr(v, "__index__") and not isinstance(v, bool):
            v = v.__index__()
        else:
            raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} = {v}: must be >= {minimum}")
    return v


def _flags_opts(flags, opts) -> Tuple[int, str]:
    """Checks the flags and opts arguments of a transfer or Create: flags
    must be 0 (none is defined), opts a str (None is taken as "")."""
    flags = _int("flags", flags, 0)
    if flags != 0:
        raise ValueError(f"flags = {flags:#x}: unknown flags (none is defined; pass 0)")
    if opts is None:
        opts = ""
    if not isinstance(opts, str):
        raise TypeError(f"opts must be a str such as '' or 'pool=ha', not {type(opts).__name__}")
    return flags, opts


def resolve_path(path, client: Optional["Client"] = None) -> str:
    """The namespace path a Read/Write/stat argument names.

    Accepted: an absolute path such as ``/kv/llama/0/abc``, and the two
    ``gd2fs://`` URI forms of session plans' ``kv_uri`` --
    ``gd2fs://<cluster>/<path>`` and
    ``gd2fs://<host:port>[,<host:port>]/<path>?cluster=<name>`` -- when they
    name ``client``'s cluster. URIs are parsed by the Go client
    (``client.ParseURI``), so both languages read them alike. Plain paths
    never leave Python here (the Go side checks them again)."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"path must be a str, not {type(path).__name__}")
    if "\x00" in path:
        raise ValueError(f"path {path!r} contains a NUL byte")
    if path.startswith("gd2fs://"):
        if client is None:
            raise ValueError(f"path {path!r}: a gd2fs:// URI needs a client to check its cluster against")
        u = client._parse_uri(path)
        if u["cluster"] != client.cluster:
            named = f"cluster {u['cluster']!r}" if u["cluster"] else "no cluster (add ?cluster=<name>)"
            raise ValueError(
                f"path {path!r} names {named}, but this client is connected to cluster {client.cluster!r}"
            )
        path = u["path"]
    if not path.startswith("/"):
        raise ValueError(f"path {path!r}: want an absolute path such as /kv/model/0")
    return path


class IOMEM:
    """Memory registered with a client for transfers (``Client.RegIOMEM``).

    On the TCP data plane it is bookkeeping: every SGE must lie inside a live
    IOMEM of the client it is used with, which is what keeps a wrong address
    from being written to. ``addr`` and ``length`` say what it covers."""

    __slots__ = ("addr", "length", "_id", "_client", "_live", "__weakref__")

    def __init__(self, addr: int, length: int, client: "Client", id_: int):
        self.addr = addr
        self.length = length
        self._id = id_
        self._client = client
        self._live = True

    @property
    def registered(self) -> bool:
        """False once deregistered (or its client closed)."""
        return self._live and not self._client._closed

    def __repr__(self) -> str:
        state = "" if self.registered else " deregistered"
        return f"<pygd2fs.IOMEM [{self.addr:#x}, {self.addr + self.length:#x}) {self.length} bytes{state}>"


class SGE:
    """One scatter-gather element: ``length`` bytes at ``addr``, inside
    ``iomem``. A transfer moves the file range ``[offset, offset +
    sum(lengths))`` into (Read) or out of (Write) its SGEs, in order."""

    __slots__ = ("addr", "length", "iomem")

    def __init__(self, addr: int, length: int, iomem: IOMEM):
        addr = _int("SGE addr", addr, 1)
        length = _int("SGE length", length, 1)
        if not isinstance(iomem, IOMEM):
            raise TypeError(f"SGE iomem must be a pygd2fs.IOMEM (from Client.RegIOMEM), not {type(iomem).__name__}")
        _check_inside(addr, length, iomem)
        self.addr = addr
        self.length = length
        self.iomem = iomem

    def __repr__(self) -> str:
        return f"pygd2fs.SGE({self.addr:#x}, {self.length}, {self.iomem!r})"


def _check_inside(addr: int, length: int, iomem: IOMEM) -> None:
    if not iomem._live:
        raise ValueError(f"SGE [{addr:#x}, +{length}): {iomem!r} is deregistered")
    if addr < iomem.addr or addr + length > iomem.addr + iomem.length:
        raise ValueError(
            f"SGE [{addr:#x}, {addr + length:#x}) lies outside its IOMEM "
            f"[{iomem.addr:#x}, {iomem.addr + iomem.length:#x})"
        )


class Request:
    """One transfer submitted by ``Client.Read``/``Write`` (or the async
    forms). ``Status()`` is 0 on success, a code of ``pygd2fs.errors``
    otherwise (``PENDING`` until it completes); ``Value()`` is the bytes
    moved; ``Error()`` says what went wrong."""

    __slots__ = ("op", "path", "offset", "length", "_id", "_status", "_value", "_error", "_sges", "__weakref__")

    def __init__(self, op: str, path: str, offset: int, length: int, id_: int, sges):
        self.op = op
        self.path = path
        self.offset = offset
        self.length = length
        self._id = id_
        self._status = PENDING
        self._value = 0
        self._error = ""
        self._sges = sges  # keeps the SGEs (and so their IOMEMs) alive

    def _complete(self, status: int, value: int, error: str) -> None:
        self._status, self._value, self._error = status, value, error
        self._sges = None

    def Status(self) -> int:
        """0 on success, a status code (``pygd2fs.status_name``) on failure,
        ``PENDING`` (-1) while in flight."""
        return self._status

    def Value(self) -> int:
        """Bytes moved (the sum of the SGE lengths on success)."""
        return self._value

    def Error(self) -> str:
        """What went wrong (path, range, cause); "" on success."""
        return self._error

    def Done(self) -> bool:
        """True once completed (successfully or not)."""
        return self._status != PENDING

    def __repr__(self) -> str:
        rng = f"[{self.offset}, {self.offset + self.length})"
        if self._status == PENDING:
            return f"<pygd2fs.Request {self.op} {self.path} {rng} pending>"
        s = f"<pygd2fs.Request {self.op} {self.path} {rng} status={self._status} ({status_name(self._status)}) value={self._value}"
        if self._error:
            s += f" error={self._error!r}"
        return s + ">"

    __str__ = __repr__


class Status(int):
    """The answer of a blocking engine call (``Client.Create``): an int, the
    status code (0 = success), with a Request's ``Status()``, ``Value()`` and
    ``Error()`` so either way of checking it works."""

    _error: str

    def __new__(cls, code: int, error: str = ""):
        self = super().__new__(cls, code)
        self._error = error
        return self

    def Status(self) -> int:
        return int(self)

    def Value(self) -> int:
        return 0

    def Error(self) -> str:
        return self._error

    def Done(self) -> bool:
        return True

    def __repr__(self) -> str:
        if int(self) == 0:
            return "<pygd2fs.Status 0 (OK)>"
        return f"<pygd2fs.Status {int(self)} ({status_name(int(self))}) error={self._error!r}>"

    __str__ = __repr__


class InspectedStatus(str):
    """What ``InspectStatus`` returns: the log line (a ``str``), which also
    unpacks as four fields, ``ok, name, message, code = InspectStatus(s)``
    -- the form vLLM's explicit-offloading ``storage/gd2fs.py`` unpacks
    (``_, klass, _, code = pygd2fs.InspectStatus(status)``) before it raises
    on a failed load: ``ok`` (bool), ``name`` (``"UNAVAILABLE"``),
    ``message`` (what went wrong, "" when unknown), ``code`` (the int)."""

    ok: bool
    name: str
    message: str
    code: int

    def __new__(cls, line: str, code: int, message: str = ""):
        self = super().__new__(cls, line)
        self.ok = code == 0
        self.name = "PENDING" if code == PENDING else status_name(code)
        self.message = message
        self.code = code
        return self

    def __iter__(self):
        return iter((self.ok, self.name, self.message, self.code))


def InspectStatus(status) -> InspectedStatus:
    """Say what a status means, for a log line: ``InspectStatus(1)`` is
    ``"NOT_FOUND (1)"``; given a ``Request`` (or a ``Status``) it adds what
    went wrong and, for a Request, the op, path and range. The newest engine
    branches call ``pygd2fs.InspectStatus(...)`` on every failed transfer;
    some unpack it (``InspectedStatus``)."""
    if isinstance(status, Request):
        code = status.Status()
        rng = f"[{status.offset}, {status.offset + status.length})"
        s = f"{status.op} {status.path} {rng}: "
        s += "pending" if code == PENDING else f"{status_name(code)} ({code})"
        if status.Error():
            s += f": {status.Error()}"
        return InspectedStatus(s, code, status.Error())
    if isinstance(status, bool) or not hasattr(status, "__index__"):
        raise TypeError(f"InspectStatus takes a status code or a pygd2fs.Request, not {type(status).__name__}")
    code = status.__index__()
    if code == PENDING:
        return InspectedStatus("PENDING (-1): the request is still in flight", code)
    s = f"{status_name(code)} ({code})"
    err = status.Error() if isinstance(status, Status) else ""
    return InspectedStatus(f"{s}: {err}" if err else s, code, err)


class _Results(threading.local):
    """Per-thread arrays the library fills with completions."""

    def __init__(self):
        self.ids = (ctypes.c_int64 * _BATCH)()
        self.status = (ctypes.c_int64 * _BATCH)()
        self.values = (ctypes.c_int64 * _BATCH)()
        self.msgs = (ctypes.c_void_p * _BATCH)()


class Client:
    """A client of one gd2fs cluster, as inference engines use it.

    ``cpaddr``: the masters, ``gd2fs://host:port[,gd2fs://host:port]`` (or
    ``gd2fs://h1:p1,h2:p2``). ``dpaddr``: data-plane kind and local address,
    ``tcp://127.0.0.1`` (several comma-separated for several NICs; a loopback
    address lets the kernel choose); ``rdma://`` is refused: this build has no
    RDMA data plane. ``cluster`` must equal the master's cluster name.
    ``iothreads``: transfers that run at once (more queue); ``streams``: TCP
    connections per data server; ``memthreads`` is accepted and unused on TCP
    (bytes land in place, nothing is copied). ``token``: the cluster token
    (default ``$GD2FS_TOKEN``).

    Creating the first client loads the Go library; see ``ForkError`` for
    what that means for processes that fork."""

    def __init__(
        self,
        cpaddr: str,
        dpaddr: str,
        cluster: str,
        iothreads: int = 1,
        memthreads: int = 1,
        streams: int = 1,
        *,
        token: Optional[str] = None,
    ):
        self._closed = True  # until the library handle exists
        self._h = 0
        for name, v in (("cpaddr", cpaddr), ("dpaddr", dpaddr), ("cluster", cluster)):
            if not isinstance(v, str):
                raise TypeError(f"{name} must be a str, not {type(v).__name__}")
            if "\x00" in v:
                raise ValueError(f"{name} contains a NUL byte")
        if not cluster:
            raise ValueError("cluster must name the cluster (the master's --cluster, e.g. 'local')")
        iothreads = _int("iothreads", iothreads, 1)
        memthreads = _int("memthreads", memthreads, 1)
        streams = _int("streams", streams, 1)
        if token is None:
            token = os.environ.get("GD2FS_TOKEN", "")
        self._init(cpaddr, dpaddr, cluster, token, iothreads, memthreads, streams)

    def _init(self, cpaddr: str, dpaddr: str, cluster: str, token: str, iothreads: int, memthreads: int, streams: int) -> None:
        self._h = _lib.call(
            "gd2fs_new", cpaddr.encode(), dpaddr.encode(), cluster.encode(), token.encode(),
            iothreads, memthreads, streams,
        )
        self._closed = False
        self._pid = os.getpid()
        self.cpaddr, self.dpaddr = cpaddr, dpaddr
        self.iothreads, self.memthreads, self.streams = iothreads, memthreads, streams
        out = ctypes.c_void_p()
        _lib.call("gd2fs_cluster", self._h, ctypes.byref(out))
        self.cluster = _lib.take_string(_lib.lib(), out)
        self._lock = threading.Lock()
        self._reqs: Dict[int, Request] = {}
        self._waiting = 0  # requests of the Wait queue not yet returned by Wait
        self._futures: Dict[int, "asyncio.Future[Request]"] = {}
        self._readers: Dict[asyncio.AbstractEventLoop, int] = {}
        self._afd = -1
        self._results = _Results()

    # -- lifecycle ---------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise ValueError("pygd2fs client is closed")
        _lib.check_pid()

    def Close(self) -> None:
        """Cancel the transfers in flight, wait for them to stop touching
        caller memory, and release the connections. Pending requests complete
        with status CANCELLED."""
        if self._closed:
            return
        if not _lib.loaded_here():
            # A forked child: the Go runtime is not here; drop the handle.
            self._closed = True
            return
        self._closed = True
        deferred = False
        for loop in list(self._readers):
            deferred |= self._remove_reader(loop)
        _lib.lib().gd2fs_close(self._h)
        with self._lock:
            reqs, self._reqs = self._reqs, {}
            futs, self._futures = self._futures, {}
        for id_, req in reqs.items():
            if not req.Done():
                req._complete(CANCELLED, 0, f"{req.op} {req.path}: the client was closed")
            f = futs.get(id_)
            if f is not None:
                _resolve_threadsafe(f, req)
        # A loop running in another thread drops the reader later: leave the
        # descriptor open for it rather than let its number be reused.
        if self._afd >= 0 and not deferred:
            os.close(self._afd)
        self._afd = -1

    close = Close

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.Close()

    def __del__(self):
        try:
            if not self._closed and _lib.loaded_here():
                self.Close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"cluster {getattr(self, 'cluster', '?')!r}"
        return f"<pygd2fs.Client {getattr(self, 'cpaddr', '?')} {state}>"

    def _parse_uri(self, uri: str) -> dict:
        import json

        self._check()
        out = ctypes.c_void_p()
        _lib.call("gd2fs_call", self._h, b"parse_uri", json.dumps({"path": uri}).encode(), ctypes.byref(out))
        return json.loads(_lib.take_string(_lib.lib(), out))

    # -- memory ------------------------------------------------------------

    def RegIOMEM(self, addr: int, length: int) -> IOMEM:
        """Register ``length`` bytes at ``addr`` (e.g. ``t.data_ptr()``,
        ``t.numel() * t.element_size()`` of a CPU tensor) for transfers."""
        self._check()
        addr = _int("RegIOMEM addr", addr, 1)
        length = _int("RegIOMEM length", length, 1)
        id_ = _lib.call("gd2fs_reg_iomem", self._h, addr, length)
        return IOMEM(addr, length, self, id_)

    def DeregIOMEM(self, iomem: IOMEM) -> None:
        """Deregister an IOMEM. Transfers in flight that use it are waited
        for, so the memory may be freed once this returns."""
        self._check()
        if not isinstance(iomem, IOMEM):
            raise TypeError(f"DeregIOMEM takes a pygd2fs.IOMEM, not {type(iomem).__name__}")
        if iomem._client is not self:
            raise ValueError(f"{iomem!r} belongs to another client")
        if not iomem._live:
            raise ValueError(f"{iomem!r} is already deregistered")
        iomem._live = False
        _lib.call("gd2fs_dereg_iomem", self._h, iomem._id)

    # -- transfers ---------------------------------------------------------

    def _submit(self, op: int, path, offset: int, sges: Sequence[SGE], flags: int, opts: str, queue: int) -> Request:
        self._check()
        path = resolve_path(path, self)
        offset = _int("offset", offset, 0)
        flags, opts = _flags_opts(flags, opts)
        if isinstance(sges, SGE):
            sges = [sges]
        if not isinstance(sges, (list, tuple)):
            raise TypeError(f"sges must be a list of pygd2fs.SGE, not {type(sges).__name__}")
        n = len(sges)
        if n == 0:
            raise ValueError("sges is empty: a transfer needs at least one SGE")
        addrs = (ctypes.c_void_p * n)()
        lens = (ctypes.c_int64 * n)()
        ids = (ctypes.c_int64 * n)()
        total = 0
        for i, s in enumerate(sges):
            if not isinstance(s, SGE):
                raise TypeError(f"sges[{i}] is a {type(s).__name__}, not a pygd2fs.SGE")
            if s.iomem._client is not self:
                raise ValueError(f"sges[{i}]: {s.iomem!r} belongs to another client")
            _check_inside(s.addr, s.length, s.iomem)
            addrs[i], lens[i], ids[i] = s.addr, s.length, s.iomem._id
            total += s.length
        name = "read" if op == _OP_READ else "write"
        with self._lock:  # registered before it can complete
            id_ = _lib.invoke(
                _lib.loaded(), "gd2fs_submit", self._h, op, path.encode(), offset, addrs, lens, ids, n, flags, opts.encode(), queue
            )
            req = Request(name, path, offset, total, id_, list(sges))
            self._reqs[id_] = req
            if queue == _QUEUE_WAIT:
                self._waiting += 1
        return req

    def Read(self, path: str, offset: int, sges: Sequence[SGE], flags: int = 0, opts: str = "") -> Request:
        """Start reading the file range ``[offset, offset + sum(sge.length))``
        into the SGEs, in order; returns at once. Collect it with ``Wait``.
        Reading past the end, a missing file or a dead server complete it
        with a non-zero status. Bad arguments raise at once."""
        return self._submit(_OP_READ, path, offset, sges, flags, opts, _QUEUE_WAIT)

    def Write(self, path: str, offset: int, sges: Sequence[SGE], flags: int = 0, opts: str = "") -> Request:
        """Start writing the SGEs to the file range starting at ``offset``;
        returns at once. A missing file is created (pool ``perf``, or
        ``opts="pool=ha"``; ``chunk_size=N`` too) and extended as needed; the
        bytes are visible to other clients when the request completes —
        except in a session's file (a plan's ``kv_uri``), whose bytes become
        visible with the session commit that names them (the master records
        their size then; no Sync is sent). A sealed file completes it with
        status SEALED."""
        return self._submit(_OP_WRITE, path, offset, sges, flags, opts, _QUEUE_WAIT)

    def Create(self, path, size: int = 0, flags: int = 0, opts: str = "") -> "Status":
        """Create ``path`` as an empty file (pool ``perf`` unless ``opts``
        says, e.g. ``"pool=ha"``), as the first ``Write`` would; a file that
        exists already is left as it is (status 0: ranks may race to create
        it). The newest engine branches call ``Create(path, 0, 0, "")``
        before they write. ``size`` must be 0 (a file grows as it is
        written) and ``flags`` 0: bad arguments raise at once. Blocking; the
        answer is a ``Status``: 0 on success, else the code, which is also an
        int (``if client.Create(...) != 0``), with ``Status()`` and
        ``Error()`` as a Request has."""
        self._check()
        path = resolve_path(path, self)
        size = _int("size", size, 0)
        flags, opts = _flags_opts(flags, opts)
        import json

        from .errors import BadRequest, Gd2fsError

        out = ctypes.c_void_p()
        try:
            _lib.call("gd2fs_call", self._h, b"create",
                      json.dumps({"path": path, "size": size, "opts": opts}).encode(), ctypes.byref(out))
        except BadRequest:
            raise
        except Gd2fsError as e:
            return Status(e.code, f"create {path}: {e}")
        if out.value:
            _lib.take_string(_lib.lib(), out)
        return Status(0, "")

    def Wait(self, timeout: float = -1) -> List[Request]:
        """Return the requests (of ``Read``/``Write``) that completed since
        the last call. ``timeout`` is in milliseconds: -1 (or any negative)
        waits until at least one completes, 0 only collects. It returns an
        empty list at once when none is in flight."""
        self._check()
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of milliseconds, not {type(timeout).__name__}")
        forever = timeout < 0
        deadline = time.monotonic() + timeout / 1000.0
        while True:
            # Wait in slices so Ctrl-C (handled between calls) still works.
            ms = 200 if forever else max(0, min(200, int((deadline - time.monotonic()) * 1000)))
            got = self._collect(_QUEUE_WAIT, ms)
            if got:
                return got
            if forever:
                with self._lock:
                    if self._waiting == 0:
                        return []
            elif time.monotonic() >= deadline:
                return []

    def GetFd(self) -> int:
        """A file descriptor that is readable while completed requests wait
        to be collected by ``Wait`` (for an event loop: on readable, call
        ``Wait(0)``). Valid until the client is closed."""
        self._check()
        return _lib.call("gd2fs_fd", self._h, _QUEUE_WAIT)

    def _collect(self, queue: int, timeout_ms: int) -> List[Request]:
        l = _lib.loaded()  # callers checked the pid
        r = self._results
        err = ctypes.c_void_p()
        n = l.gd2fs_wait(self._h, queue, timeout_ms, r.ids, r.status, r.values, r.msgs, _BATCH, ctypes.byref(err))
        if n < 0:
            from .errors import error_for

            raise error_for(-n, _lib.take_string(l, err))
        out = []
        if n == 0:
            return out
        with self._lock:
            for i in range(n):
                msg = _lib.take_string(l, ctypes.c_void_p(r.msgs[i])) if r.msgs[i] else ""
                req = self._reqs.pop(r.ids[i], None)
                if req is None:  # pragma: no cover - closed meanwhile
                    continue
                req._complete(int(r.status[i]), int(r.values[i]), msg)
                if queue == _QUEUE_WAIT:
                    self._waiting -= 1
                out.append(req)
        return out

    # -- asyncio -----------------------------------------------------------

    async def ReadAsync(self, path: str, offset: int, sges: Sequence[SGE], flags: int = 0, opts: str = "") -> Request:
        """``Read`` for asyncio: resolves to the completed Request (check
        its ``Status()``). Cancelling the awaiting task cancels the
        transfer."""
        return await self._async(_OP_READ, path, offset, sges, flags, opts)

    async def WriteAsync(self, path: str, offset: int, sges: Sequence[SGE], flags: int = 0, opts: str = "") -> Request:
        """``Write`` for asyncio: resolves to the completed Request."""
        return await self._async(_OP_WRITE, path, offset, sges, flags, opts)

    async def _async(self, op, path, offset, sges, flags, opts) -> Request:
        loop = asyncio.get_running_loop()
        self._ensure_reader(loop)
        fut = loop.create_future()
        req = self._submit(op, path, offset, sges, flags, opts, _QUEUE_ASYNC)
        with self._lock:
            # Collected already (by the reader, for another request)?
            if req.Done():
                return req
            self._futures[req._id] = fut
        # The reader was registered before the submit, and the eventfd stays
        # readable while results wait, so the completion cannot be missed.
        try:
            return await fut
        except asyncio.CancelledError:
            if not self._closed and _lib.loaded_here():
                _lib.lib().gd2fs_cancel(self._h, req._id)
            raise

    def _ensure_reader(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop in self._readers:
            return
        self._check()
        if self._afd < 0:
            # Our own descriptor of the async queue's eventfd, so that event
            # loops never watch a number the library has closed.
            self._afd = os.dup(_lib.call("gd2fs_fd", self._h, _QUEUE_ASYNC))
        for old in [l for l in self._readers if l.is_closed()]:
            del self._readers[old]
        loop.add_reader(self._afd, self._on_async_ready)
        self._readers[loop] = self._afd

    def _remove_reader(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Stop watching the async eventfd in loop; True when that had to be
        left to the loop's own thread."""
        fd = self._readers.pop(loop, None)
        if fd is None or loop.is_closed():
            return False
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop or not loop.is_running():
            loop.remove_reader(fd)
            return False
        loop.call_soon_threadsafe(loop.remove_reader, fd)
        return True

    def _on_async_ready(self) -> None:
        if self._closed or not _lib.loaded_here():
            return
        while True:
            done = self._collect(_QUEUE_ASYNC, 0)
            for req in done:
                with self._lock:
                    fut = self._futures.pop(req._id, None)
                if fut is not None:
                    _resolve_threadsafe(fut, req)
            # A short batch emptied the queue; later completions make the
            # eventfd readable again, so there is no need to ask once more.
            if len(done) < _BATCH:
                return


def _resolve(fut: "asyncio.Future[Request]", req: Request) -> None:
    if not fut.done():
        fut.set_result(req)


def _resolve_threadsafe(fut: "asyncio.Future[Request]", req: Request) -> None:
    loop = fut.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        _resolve(fut, req)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(_resolve, fut, req)


__all__ = ["Client", "IOMEM", "SGE", "Request", "Status", "InspectStatus", "InspectedStatus", "PENDING", "ForkError", "BAD_REQUEST", "resolve_path"]
