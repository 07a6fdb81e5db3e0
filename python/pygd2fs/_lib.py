"""Loading libgd2fs.so.1 (the Go client) and calling into it.

The library is loaded when the first client is created, never at import: a
Go runtime does not survive ``fork()``, so a process that forks workers after
importing pygd2fs is fine as long as no client exists yet. Once loaded, every
call first checks that this is still the process that loaded it and raises
``ForkError`` otherwise, instead of calling into a Go runtime whose threads
were left behind in the parent (which would hang).

ctypes releases the GIL around every call into a CDLL, so transfers of
several Python threads run in parallel in Go.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Optional

from .errors import ForkError, error_for

c_int64_p = ctypes.POINTER(ctypes.c_int64)
c_void_pp = ctypes.POINTER(ctypes.c_void_p)

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_pid: Optional[int] = None
_forked = False


def library_path() -> str:
    """Where libgd2fs.so.1 is: $GD2FS_LIBRARY, else beside this module.

    (".so.1", not ".so": pkgutil and help() would list a plain ".so" in the
    package as an extension module, which it is not.)"""
    env = os.environ.get("GD2FS_LIBRARY")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libgd2fs.so.1")


def _after_fork_in_child() -> None:
    global _forked
    if _lib is not None:
        _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_message() -> str:
    return (
        f"pygd2fs: this process (pid {os.getpid()}) was forked from pid {_pid} after the gd2fs Go "
        "library was loaded there (by creating a client), and a Go runtime does not survive fork(): "
        "its threads stay in the parent, so this client cannot work here. Fix: create pygd2fs "
        "clients only after forking (in each worker), or start workers with "
        "multiprocessing.set_start_method('spawn') / 'forkserver'."
    )


def check_pid() -> None:
    """Raise ForkError when called in a child forked after loading."""
    if _forked or (_pid is not None and os.getpid() != _pid):
        raise ForkError(fork_message())


def loaded_here() -> bool:
    """True when the library is loaded and usable in this process."""
    return _lib is not None and not _forked and os.getpid() == _pid


def lib() -> ctypes.CDLL:
    """The library, loaded on first use in this process."""
    global _lib, _pid
    if _lib is not None:
        check_pid()
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if not os.path.exists(path):
                raise ImportError(
                    f"pygd2fs: {path} is missing: build it with `make -C python` "
                    "(or install with `pip install ./python`), or point GD2FS_LIBRARY at it"
                )
            l = ctypes.CDLL(path)
            _declare(l)
            _pid = os.getpid()
            _lib = l
    return _lib


def _declare(l: ctypes.CDLL) -> None:
    i64, i32, vp, cp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    err = ctypes.POINTER(ctypes.c_void_p)
    sigs = {
        "gd2fs_new": [cp, cp, cp, cp, i32, i32, i32, err],
        "gd2fs_close": [i64],
        "gd2fs_cluster": [i64, err, err],
        "gd2fs_reg_iomem": [i64, vp, i64, err],
        "gd2fs_dereg_iomem": [i64, i64, err],
        "gd2fs_submit": [i64, i32, cp, i64, c_void_pp, c_int64_p, c_int64_p, i32, ctypes.c_uint32, cp, i32, err],
        "gd2fs_cancel": [i64, i64],
        "gd2fs_wait": [i64, i32, i64, c_int64_p, c_int64_p, c_int64_p, c_void_pp, i32, err],
        "gd2fs_fd": [i64, i32, err],
        "gd2fs_read_into": [i64, cp, i64, vp, i64, err],
        "gd2fs_write_from": [i64, cp, i64, vp, i64, cp, err],
        "gd2fs_file_open": [i64, cp, cp, cp, err],
        "gd2fs_file_io": [i64, i64, i32, vp, i64, i64, err],
        "gd2fs_file_size": [i64, i64, err],
        "gd2fs_file_close": [i64, i64, err],
        "gd2fs_kv_put": [i64, cp, cp, i64, vp, i64, i32, err],
        "gd2fs_kv_get_into": [i64, cp, cp, i64, vp, i64, err],
        "gd2fs_kv_get": [i64, cp, cp, i64, c_void_pp, err],
        "gd2fs_kv_batch": [i64, i32, cp, cp, c_int64_p, i32, c_void_pp, c_int64_p, c_int64_p, err],
        "gd2fs_kv_batch_exists": [i64, cp, cp, c_int64_p, i32, ctypes.POINTER(ctypes.c_uint8), err],
        "gd2fs_call": [i64, cp, cp, err, err],
    }
    for name, args in sigs.items():
        f = getattr(l, name)
        f.argtypes = args
        f.restype = i64
    l.gd2fs_free.argtypes = [vp]
    l.gd2fs_free.restype = None


def take_string(l: ctypes.CDLL, p: ctypes.c_void_p) -> str:
    """Copy a malloc'd C string from the library and free it."""
    if not p.value:
        return ""
    try:
        return ctypes.string_at(p.value).decode("utf-8", "replace")
    finally:
        l.gd2fs_free(p.value)


def call(name: str, *args) -> int:
    """Call library function ``name`` (its last argument is the error out
    parameter, added here) and raise the mapped exception on failure."""
    return invoke(lib(), name, *args)


def loaded() -> ctypes.CDLL:
    """The loaded library, for callers that checked the pid already in this
    call (each check is a getpid system call)."""
    assert _lib is not None
    return _lib


def invoke(l: ctypes.CDLL, name: str, *args) -> int:
    """``call`` without the load and pid check."""
    err = ctypes.c_void_p()
    r = getattr(l, name)(*args, ctypes.byref(err))
    if r < 0:
        raise error_for(-r, take_string(l, err) or f"{name} failed with status {-r}")
    if err.value:  # not expected on success, but never leak it
        l.gd2fs_free(err.value)
    return r
