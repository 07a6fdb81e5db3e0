"""Turning caller objects into (address, length) without copying.

Accepted: anything with the buffer protocol (bytes, bytearray, memoryview,
numpy arrays, array.array, mmap) and torch tensors (by ``data_ptr()``). The
object must be C-contiguous, in host memory, and writable when bytes are to
land in it. While a transfer runs the buffer stays exported (a bytearray
cannot be resized under it) and a reference to the object is held.
"""

from __future__ import annotations

import ctypes
from typing import Any, Tuple

PyBUF_WRITABLE = 0x0001
PyBUF_ND = 0x0008
PyBUF_STRIDES = 0x0010 | PyBUF_ND
PyBUF_C_CONTIGUOUS = 0x0020 | PyBUF_STRIDES


class _Py_buffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_get = ctypes.pythonapi.PyObject_GetBuffer
_get.argtypes = [ctypes.py_object, ctypes.POINTER(_Py_buffer), ctypes.c_int]
_get.restype = ctypes.c_int
_release = ctypes.pythonapi.PyBuffer_Release
_release.argtypes = [ctypes.POINTER(_Py_buffer)]
_release.restype = None


def is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


class Pinned:
    """An object's memory, pinned for a transfer: ``addr`` and ``nbytes``.

    Use as a context manager, or call ``release()``."""

    __slots__ = ("obj", "addr", "nbytes", "_view")

    def __init__(self, obj: Any, writable: bool, what: str = "buffer"):
        self.obj = obj
        self._view = None
        if is_tensor(obj):
            if obj.device.type != "cpu":
                raise ValueError(
                    f"{what}: a tensor on {obj.device}: the TCP data plane moves host memory only; "
                    "copy it to a (pinned) CPU tensor first"
                )
            if not obj.is_contiguous():
                raise ValueError(
                    f"{what}: the tensor is not contiguous (shape {tuple(obj.shape)}, strides "
                    f"{tuple(obj.stride())}): pass tensor.contiguous(), or one SGE per contiguous run"
                )
            self.addr = int(obj.data_ptr())
            self.nbytes = int(obj.numel() * obj.element_size())
            return
        try:
            mv = memoryview(obj)
        except TypeError:
            raise TypeError(
                f"{what}: {type(obj).__name__} exposes no memory: pass bytes, bytearray, memoryview, "
                "a numpy array or a torch tensor"
            ) from None
        with mv:
            if not mv.c_contiguous:
                raise ValueError(f"{what}: the buffer is not C-contiguous: pass a contiguous copy")
            if writable and mv.readonly:
                raise ValueError(
                    f"{what}: {type(obj).__name__} is read-only and bytes are to be read into it: "
                    "pass a bytearray, a writable numpy array or a tensor"
                )
        view = _Py_buffer()
        flags = PyBUF_C_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0)
        if _get(obj, ctypes.byref(view), flags) != 0:  # pragma: no cover - memoryview checked it
            raise ValueError(f"{what}: cannot export the buffer of {type(obj).__name__}")
        self._view = view
        self.addr = int(view.buf or 0)
        self.nbytes = int(view.len)

    def release(self) -> None:
        if self._view is not None:
            _release(ctypes.byref(self._view))
            self._view = None
        self.obj = None

    def __enter__(self) -> "Pinned":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def address_of(obj: Any) -> Tuple[int, int]:
    """(address, length) of obj's memory, for callers that keep obj alive."""
    with Pinned(obj, writable=False) as p:
        return p.addr, p.nbytes
