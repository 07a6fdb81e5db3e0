"""Status codes and exceptions of pygd2fs.

Every error of the Go client has a kind (package ``errs`` of gd2fs); each kind
is a status code here and an exception class. ``Request.Status()`` returns the
code, the batch calls return minus the code per key, and everything else
raises the class::

    try:
        conn.kv().get("missing")
    except pygd2fs.NotFound:
        ...
"""

from __future__ import annotations

from typing import Dict, Type

# Status codes. 0 is success. The Go side (python/bridge/engine.go) holds the
# same table.
OK = 0
NOT_FOUND = 1
EXISTS = 2
NOT_EMPTY = 3
IS_DIR = 4
NOT_DIR = 5
SEALED = 6
NO_SPACE = 7
UNAVAILABLE = 8
CHECKSUM = 9
OUT_OF_RANGE = 10
BAD_REQUEST = 11
TOO_LARGE = 12
UNAUTHORIZED = 13
VERSION = 14
UNKNOWN_OP = 15
MOVED = 16
INTERNAL = 17
CANCELLED = 18
TIMEOUT = 19

STATUS_NAMES: Dict[int, str] = {
    OK: "OK",
    NOT_FOUND: "NOT_FOUND",
    EXISTS: "EXISTS",
    NOT_EMPTY: "NOT_EMPTY",
    IS_DIR: "IS_DIR",
    NOT_DIR: "NOT_DIR",
    SEALED: "SEALED",
    NO_SPACE: "NO_SPACE",
    UNAVAILABLE: "UNAVAILABLE",
    CHECKSUM: "CHECKSUM",
    OUT_OF_RANGE: "OUT_OF_RANGE",
    BAD_REQUEST: "BAD_REQUEST",
    TOO_LARGE: "TOO_LARGE",
    UNAUTHORIZED: "UNAUTHORIZED",
    VERSION: "VERSION",
    UNKNOWN_OP: "UNKNOWN_OP",
    MOVED: "MOVED",
    INTERNAL: "INTERNAL",
    CANCELLED: "CANCELLED",
    TIMEOUT: "TIMEOUT",
}


def status_name(code: int) -> str:
    """The name of a status code (``status_name(1) == "NOT_FOUND"``)."""
    return STATUS_NAMES.get(abs(code), f"UNKNOWN({code})")


class Gd2fsError(Exception):
    """Base class of every error raised by the gd2fs cluster or client.

    ``code`` is the status code (see ``status_name``)."""

    code: int = INTERNAL

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class NotFound(Gd2fsError, LookupError):
    """A path, file, key or session that does not exist (a KV miss)."""

    code = NOT_FOUND


class Exists(Gd2fsError):
    """Creating something that is already there."""

    code = EXISTS


class NotEmpty(Gd2fsError):
    """Removing a directory that still has entries."""

    code = NOT_EMPTY


class IsDir(Gd2fsError):
    """A directory where a file was expected."""

    code = IS_DIR


class NotDir(Gd2fsError):
    """A file where a directory was expected."""

    code = NOT_DIR


class Sealed(Gd2fsError):
    """A write to a sealed (immutable) file."""

    code = SEALED


class NoSpace(Gd2fsError):
    """The servers are full and nothing can be evicted."""

    code = NO_SPACE


class Unavailable(Gd2fsError):
    """No live server holds the data, or the cluster cannot be reached."""

    code = UNAVAILABLE


class ChecksumError(Gd2fsError):
    """Bytes whose CRC32C did not match; never returned as data."""

    code = CHECKSUM


class OutOfRange(Gd2fsError):
    """An offset or length outside the file (a read past its end)."""

    code = OUT_OF_RANGE


class BadRequest(Gd2fsError, ValueError):
    """Malformed input (path, argument, address) refused by the Go side."""

    code = BAD_REQUEST


class TooLarge(Gd2fsError):
    """A length beyond a limit (a KV value larger than the buffer)."""

    code = TOO_LARGE


class Unauthorized(Gd2fsError):
    """A wrong or missing cluster token."""

    code = UNAUTHORIZED


class VersionMismatch(Gd2fsError):
    """A protocol version the peer does not speak."""

    code = VERSION


class UnknownOp(Gd2fsError):
    """An operation the server does not know."""

    code = UNKNOWN_OP


class Moved(Gd2fsError):
    """A KV owner changed while the call ran; retry."""

    code = MOVED


class InternalError(Gd2fsError):
    """A bug or an unexpected failure on the remote side."""

    code = INTERNAL


class Cancelled(Gd2fsError):
    """The transfer was cancelled (the client closed, or the caller gave up)."""

    code = CANCELLED


class Timeout(Gd2fsError, TimeoutError):
    """A deadline passed before the servers answered."""

    code = TIMEOUT


class ForkError(RuntimeError):
    """The Go library was loaded before this process was forked.

    The Go runtime does not survive ``fork()``: its threads are not copied
    into the child. Create clients in the child after the fork, or start
    workers with ``multiprocessing.set_start_method("spawn")``."""


_BY_CODE: Dict[int, Type[Gd2fsError]] = {
    c.code: c
    for c in (
        NotFound, Exists, NotEmpty, IsDir, NotDir, Sealed, NoSpace, Unavailable,
        ChecksumError, OutOfRange, BadRequest, TooLarge, Unauthorized,
        VersionMismatch, UnknownOp, Moved, InternalError, Cancelled, Timeout,
    )
}


def error_for(code: int, message: str) -> Gd2fsError:
    """The exception for status ``code`` (positive or negative)."""
    code = abs(code)
    return _BY_CODE.get(code, Gd2fsError)(message, code)
