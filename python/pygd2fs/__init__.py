"""pygd2fs: the Python client of gd2fs, distributed storage for LLM inference.

Two layers over one Go client (loaded as libgd2fs.so.1 when the first client is
created):

* The engine-facing API that vLLM's explicit-offloading connector and
  SGLang's GD2FS storage backend call: ``Client(cpaddr, dpaddr, cluster,
  iothreads, memthreads, streams)``, ``RegIOMEM``/``DeregIOMEM``, ``SGE``,
  non-blocking ``Read``/``Write`` with ``Wait``, ``ReadAsync``/``WriteAsync``
  for asyncio, and ``Request.Status()``/``Value()``/``Error()``.
* A Pythonic layer: ``connect(masters, token=...)`` with files, hash-mode KV
  (``put``/``get``/``get_into``/``batch_put_from``/``batch_get_into``/
  ``batch_exists``/``remove_key``) and explicit sessions (``set_layout``/
  ``plan``/``commit``/``fork``/``delete``; plans take the prompt's token ids
  or its ``block_hashes``).

Bytes move between the sockets and the caller's memory without a copy in
Python; the GIL is released for the whole of every transfer.

Fork: a Go runtime does not survive ``fork()``. Fork first, then create
clients (or use the ``spawn`` start method); a client used in a child forked
after the library was loaded raises ``ForkError``.
"""

from ._conn import KV, Connection, File, connect
from ._engine import IOMEM, PENDING, SGE, Client, InspectedStatus, InspectStatus, Request, Status
from ._hashes import block_hashes
from .errors import (
    STATUS_NAMES,
    BadRequest,
    Cancelled,
    ChecksumError,
    Exists,
    ForkError,
    Gd2fsError,
    InternalError,
    IsDir,
    Moved,
    NoSpace,
    NotDir,
    NotEmpty,
    NotFound,
    OutOfRange,
    Sealed,
    Timeout,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnknownOp,
    VersionMismatch,
    status_name,
)

def _version() -> str:
    """gd2fs's version: written into _version.py by a build (wheel, pip
    install), else read from the checkout this package is used in place from."""
    try:
        from ._version import version

        return version
    except ImportError:
        pass
    import os

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "internal", "version", "VERSION")
    try:
        with open(here) as f:
            return f.read().strip()
    except OSError:
        return "0+unknown"


__version__ = _version()

__all__ = [
    "Client", "IOMEM", "SGE", "Request", "Status", "InspectStatus", "InspectedStatus", "PENDING",
    "connect", "Connection", "File", "KV", "block_hashes",
    "Gd2fsError", "NotFound", "Exists", "NotEmpty", "IsDir", "NotDir", "Sealed", "NoSpace",
    "Unavailable", "ChecksumError", "OutOfRange", "BadRequest", "TooLarge", "Unauthorized",
    "VersionMismatch", "UnknownOp", "Moved", "InternalError", "Cancelled", "Timeout", "ForkError",
    "STATUS_NAMES", "status_name",
]
