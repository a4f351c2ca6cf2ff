"""Turning the memory arguments of a call into (pointer, size) spans.

A call names memory by a raw pointer (an ``int``, which must lie in a range registered with
``register_buffer``, as in Mooncake), or by an object: anything with the buffer protocol
(``bytes``, ``bytearray``, ``memoryview``, numpy arrays), a tensor (through ``device``,
``data_ptr()``, ``numel()``, ``element_size()``, ``is_contiguous()``, without importing
torch), or a GPU array with ``__cuda_array_interface__`` (CuPy, Numba). Objects need no
registration: the list of ``keep`` objects returned here holds them (and their exports)
until the call returns.

A span is on the host or on a GPU: CUDA tensors and ``__cuda_array_interface__`` objects
carry their device's ordinal; a raw pointer is on the device its registered range was
registered for (``register_buffer(ptr, size, device="cuda:N")``), which the native half
looks up.

This is Python rather than Rust because the buffer protocol is in CPython's stable ABI only
from 3.11, and the package's one wheel serves 3.9 and later.
"""

import ctypes
import numbers
import operator
import os
import threading

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
        return (0, 0, False, None)
    flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    if not view.readonly:
        holder = (ctypes.c_char * nbytes).from_buffer(flat)
        keep.append(holder)
        return (ctypes.addressof(holder), size, False, None)
    if writable:
        raise InvalidArgument(
            "the buffer is read-only; a get needs writable memory (bytearray, numpy array)"
        )
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        # A read-only numpy array: its data pointer, no copy.
        keep.append(obj)
        return (int(iface["data"][0]), size, False, None)
    if isinstance(obj, bytes):
        # The bytes object's own storage, no copy; `obj` stays referenced by `keep`.
        keep.append(obj)
        return (ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value, size, False, None)
    # Any other read-only export: a private copy.
    copy = (ctypes.c_char * nbytes).from_buffer_copy(flat)
    keep.append(copy)
    return (ctypes.addressof(copy), size, False, None)


def _sized(nbytes, size, what):
    if size is None:
        return nbytes
    if size > nbytes:
        raise InvalidArgument(f"size {size} is larger than the {nbytes}-byte {what}")
    return size


def _tensor_span(obj, size, keep):
    device = getattr(obj, "device", None)
    kind = getattr(device, "type", "cpu") if device is not None else "cpu"
    if kind not in ("cpu", "cuda"):
        raise InvalidArgument(
            f"the tensor is on {kind}; only host (cpu) and CUDA memory can be moved"
        )
    ordinal = None
    if kind == "cuda":
        ordinal = getattr(device, "index", None)
        if isinstance(ordinal, bool) or not isinstance(ordinal, numbers.Integral) or ordinal < 0:
            raise InvalidArgument(f"the CUDA tensor's device has no ordinal ({device!r})")
        ordinal = int(ordinal)
    if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
        raise InvalidArgument("the tensor is not contiguous")
    nbytes = int(obj.numel()) * int(obj.element_size())
    size = _sized(nbytes, size, "tensor")
    keep.append(obj)
    return (int(obj.data_ptr()), size, False, ordinal)


def _cuda_array_interface(obj):
    """``obj.__cuda_array_interface__``, or None (also when reading it fails: torch raises
    for a tensor that requires grad, and the tensor path takes those)."""
    try:
        iface = getattr(obj, "__cuda_array_interface__", None)
    except Exception:  # noqa: BLE001 - any failure means "not usable as such an array"
        return None
    return iface if isinstance(iface, dict) else None


def _cuda_array_span(obj, iface, size, writable, keep):
    """A span of a GPU array exposing ``__cuda_array_interface__`` (CuPy, Numba, ...)."""
    try:
        ptr, readonly = iface["data"]
        shape = tuple(int(n) for n in iface["shape"])
        itemsize = int(str(iface["typestr"])[2:])
    except (KeyError, TypeError, ValueError):
        raise InvalidArgument("a malformed __cuda_array_interface__") from None
    if iface.get("mask") is not None:
        raise InvalidArgument("a masked __cuda_array_interface__ array cannot be moved")
    count = 1
    for n in shape:
        count *= n
    nbytes = count * itemsize
    strides = iface.get("strides")
    if strides is not None and count > 0:
        expect = itemsize
        for n, st in reversed(list(zip(shape, strides))):
            if n > 1 and int(st) != expect:
                raise InvalidArgument("the CUDA array is not C-contiguous")
            expect *= n
    if writable and readonly:
        raise InvalidArgument("the CUDA array is read-only; a get needs writable memory")
    size = _sized(nbytes, size, "CUDA array")
    # The interface names no device: CuPy's arrays say it in ``device.id``, torch-like ones
    # in ``device.index``; otherwise device 0 (the driver refuses another device's memory).
    device = getattr(obj, "device", None)
    ordinal = getattr(device, "id", None)
    if ordinal is None:
        ordinal = getattr(device, "index", None)
    if isinstance(ordinal, bool) or not isinstance(ordinal, numbers.Integral) or ordinal < 0:
        ordinal = 0
    keep.append(obj)
    return (0 if ptr is None else int(ptr), size, False, int(ordinal))


def device_ordinal(device):
    """The CUDA ordinal ``register_buffer``'s ``device`` names: ``None``/``"cpu"`` (host
    memory), an ``int`` N, ``"cuda:N"``, or an object with ``type`` and ``index`` (a
    ``torch.device``)."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise InvalidArgument(f"not a device: {device!r}")
    if isinstance(device, numbers.Integral):
        n = operator.index(device)
        if n < 0:
            raise InvalidArgument(f"device {n} is negative")
        return n
    if isinstance(device, str):
        kind, _, index = device.strip().partition(":")
    elif hasattr(device, "type"):
        kind, index = device.type, getattr(device, "index", None)
        index = "" if index is None else str(index)
    else:
        raise InvalidArgument(f"not a device: {device!r} (use \"cuda:N\" or an ordinal)")
    if kind == "cpu" and not index:
        return None
    if kind == "cuda":
        if not index:
            raise InvalidArgument(f"name the GPU: \"cuda:N\", not {device!r}")
        if index.isdigit():
            return int(index)
    raise InvalidArgument(f"not a device: {device!r} (use \"cuda:N\" or an ordinal)")


def span(obj, size, writable, keep):
    """(pointer, size, must_be_registered, device) of one memory argument; ``device`` is a
    CUDA ordinal, or None for host memory and raw pointers (whose registration says)."""
    if isinstance(obj, bool):
        raise InvalidArgument("a pointer must be an int, not a bool")
    if isinstance(obj, numbers.Integral):
        # An int, or a numpy integer: a pointer.
        obj = operator.index(obj)
        if size is None:
            raise InvalidArgument("a pointer needs a size")
        if obj < 0:
            raise InvalidArgument(f"pointer {obj} is negative")
        return (obj, size, True, None)
    if size is not None and size < 0:
        raise InvalidArgument(f"size {size} is negative")
    found = _buffer_span(obj, size, writable, keep)
    if found is not None:
        return found
    if hasattr(obj, "data_ptr"):
        return _tensor_span(obj, size, keep)
    iface = _cuda_array_interface(obj)
    if iface is not None:
        return _cuda_array_span(obj, iface, size, writable, keep)
    raise InvalidArgument(
        "expected a pointer, a buffer (bytes, bytearray, memoryview, numpy array), a "
        f"tensor or a __cuda_array_interface__ array, got {type(obj).__name__}"
    )


def spans(objs, sizes, writable):
    """Four lists (pointers, sizes, checked, devices) and the objects to keep alive."""
    objs = list(objs)
    if sizes is None:
        sizes = [None] * len(objs)
    else:
        sizes = list(sizes)
        if len(sizes) != len(objs):
            raise InvalidArgument(f"{len(objs)} buffers but {len(sizes)} sizes")
    keep = []
    ptrs, lens, checked, devices = [], [], [], []
    for i, (obj, size) in enumerate(zip(objs, sizes)):
        if size is not None:
            try:
                size = operator.index(size)
            except TypeError:
                raise InvalidArgument(f"size {i} is not an int") from None
        try:
            p, n, c, d = span(obj, size, writable, keep)
        except InvalidArgument as e:
            raise InvalidArgument(f"buffer {i}: {e}") from None
        ptrs.append(p)
        lens.append(n)
        checked.append(c)
        devices.append(d)
    return ptrs, lens, checked, devices, keep


# --- host memory allocated through Yutu ---------------------------------------------------
#
# ``alloc_host`` maps a sealable memfd. A range registered inside one is handed to the node as
# that memfd (``register_buffer``), which the node maps itself: its copies are then plain
# ``memcpy``, where memory the process allocated otherwise (a numpy array) is reached through
# the process's memory file, page by page, at about half that speed.

_pools_lock = threading.Lock()
_pools = {}  # address -> (mmap, exported ctypes view, fd, length)


def alloc_host(n):
    """Maps ``n`` bytes of shared memory (populated) backed by a memfd and returns its
    address; falls back to anonymous shared memory where memfds are not available."""
    import mmap

    flags = getattr(os, "MFD_CLOEXEC", 0) | getattr(os, "MFD_ALLOW_SEALING", 0)
    try:
        fd = os.memfd_create("yutu-host-pool", flags)
    except (AttributeError, OSError):
        fd = -1
    try:
        if fd >= 0:
            os.ftruncate(fd, n)
            m = mmap.mmap(fd, n, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        else:
            m = mmap.mmap(-1, n, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    except OSError:
        if fd >= 0:
            os.close(fd)
        raise
    view = (ctypes.c_char * n).from_buffer(m)
    addr = ctypes.addressof(view)
    with _pools_lock:
        _pools[addr] = (m, view, fd, n)
    return addr


def free_host(addr):
    """Unmaps what ``alloc_host`` returned at ``addr`` (False for any other address). A
    store that registered it keeps its own mapping of the memfd until it unregisters it."""
    with _pools_lock:
        entry = _pools.pop(addr, None)
    if entry is None:
        return False
    m, view, fd, _n = entry
    del entry, view  # the last references to the export, so that the mmap can close
    try:
        m.close()
    except BufferError:
        # Still exported (a tensor over it lives on): unmapped when that goes.
        pass
    if fd >= 0:
        os.close(fd)
    return True


def host_memfd_locked(ptr, size):
    """``(fd, base, length)`` of the ``alloc_host`` mapping holding ``[ptr, ptr + size)``, or
    None. The caller holds ``_pools_lock`` until it is done with the fd (``register_buffer``
    maps the memfd before it returns), so that ``free_host`` cannot close it meanwhile."""
    if not isinstance(ptr, int) or not isinstance(size, int):
        return None
    for base, (_m, _view, fd, n) in _pools.items():
        if fd >= 0 and base <= ptr and ptr + size <= base + n:
            return fd, base, n
    return None
