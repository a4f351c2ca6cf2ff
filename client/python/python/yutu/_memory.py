"""Turning the memory arguments of a call into (pointer, size) spans.

A call names memory by a raw pointer (an ``int``, which must lie in a range registered with
``register_buffer``, as in Mooncake), or by an object: anything with the buffer protocol
(``bytes``, ``bytearray``, ``memoryview``, numpy arrays) or a CPU tensor (through
``data_ptr()``, without importing torch). Objects need no registration: the list of ``keep``
objects returned here holds them (and their exports) until the call returns.

This is Python rather than Rust because the buffer protocol is in CPython's stable ABI only
from 3.11, and the package's one wheel serves 3.9 and later.
"""

import ctypes
import numbers
import operator

from ._errors import InvalidArgument


def _buffer_span(obj, size, writable, keep):
    try:
        view = memoryview(obj)
    except TypeError:
        return None
    if not view.c_contiguous:
        raise InvalidArgument("the buffer is not C-contiguous")
    nbytes = view.nbytes
    if size is None:
        size = nbytes
    elif size > nbytes:
        raise InvalidArgument(f"size {size} is larger than the {nbytes}-byte buffer")
    if nbytes == 0:
        keep.append(view)
        return (0, 0, False)
    flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    if not view.readonly:
        holder = (ctypes.c_char * nbytes).from_buffer(flat)
        keep.append(holder)
        return (ctypes.addressof(holder), size, False)
    if writable:
        raise InvalidArgument(
            "the buffer is read-only; a get needs writable memory (bytearray, numpy array)"
        )
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        # A read-only numpy array: its data pointer, no copy.
        keep.append(obj)
        return (int(iface["data"][0]), size, False)
    if isinstance(obj, bytes):
        # The bytes object's own storage, no copy; `obj` stays referenced by `keep`.
        keep.append(obj)
        return (ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value, size, False)
    # Any other read-only export: a private copy.
    copy = (ctypes.c_char * nbytes).from_buffer_copy(flat)
    keep.append(copy)
    return (ctypes.addressof(copy), size, False)


def _tensor_span(obj, size, keep):
    device = getattr(obj, "device", None)
    kind = getattr(device, "type", "cpu") if device is not None else "cpu"
    if kind != "cpu":
        raise InvalidArgument(
            f"the tensor is on {kind}; this build moves host memory only"
        )
    if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
        raise InvalidArgument("the tensor is not contiguous")
    nbytes = int(obj.numel()) * int(obj.element_size())
    if size is None:
        size = nbytes
    elif size > nbytes:
        raise InvalidArgument(f"size {size} is larger than the {nbytes}-byte tensor")
    keep.append(obj)
    return (int(obj.data_ptr()), size, False)


def span(obj, size, writable, keep):
    """(pointer, size, must_be_registered) of one memory argument."""
    if isinstance(obj, bool):
        raise InvalidArgument("a pointer must be an int, not a bool")
    if isinstance(obj, numbers.Integral):
        # An int, or a numpy integer: a pointer.
        obj = operator.index(obj)
        if size is None:
            raise InvalidArgument("a pointer needs a size")
        if obj < 0:
            raise InvalidArgument(f"pointer {obj} is negative")
        return (obj, size, True)
    if size is not None and size < 0:
        raise InvalidArgument(f"size {size} is negative")
    found = _buffer_span(obj, size, writable, keep)
    if found is not None:
        return found
    if hasattr(obj, "data_ptr"):
        return _tensor_span(obj, size, keep)
    raise InvalidArgument(
        "expected a pointer, a buffer (bytes, bytearray, memoryview, numpy array) or a "
        f"tensor, got {type(obj).__name__}"
    )


def spans(objs, sizes, writable):
    """Three lists (pointers, sizes, checked) and the objects to keep alive."""
    objs = list(objs)
    if sizes is None:
        sizes = [None] * len(objs)
    else:
        sizes = list(sizes)
        if len(sizes) != len(objs):
            raise InvalidArgument(f"{len(objs)} buffers but {len(sizes)} sizes")
    keep = []
    ptrs, lens, checked = [], [], []
    for i, (obj, size) in enumerate(zip(objs, sizes)):
        if size is not None:
            try:
                size = operator.index(size)
            except TypeError:
                raise InvalidArgument(f"size {i} is not an int") from None
        try:
            p, n, c = span(obj, size, writable, keep)
        except InvalidArgument as e:
            raise InvalidArgument(f"buffer {i}: {e}") from None
        ptrs.append(p)
        lens.append(n)
        checked.append(c)
    return ptrs, lens, checked, keep
