"""ckptfs_cuda — save GPU tensors into a ckptfs mount at the speed of the
device-to-host copy, and load them back (docs/gpu.md).

    import ckptfs_cuda
    h = ckptfs_cuda.save("/mnt/ckpt/step_100/model.safetensors", model.state_dict(),
                         metadata={"step": "100"})
    # returns once every tensor is copied out of GPU memory: training goes on
    h.wait()            # the file is closed and in place (ckptfs drains it)
    ckptfs_cuda.load("/mnt/ckpt/step_100/model.safetensors", model.state_dict())

The file is safetensors: any safetensors reader opens it. Tensors are
described by duck typing, so no framework is a dependency: anything with
`__cuda_array_interface__` (CuPy, Numba, JAX arrays through it),
`data_ptr()` (torch), `__array_interface__` (NumPy: host memory, for the
host library), or a plain `(address, nbytes)` pair. Tensors must be
contiguous.

The library: $CKPTFS_CUDA_LIB if set (the tests point it at the host-only
build, libckptfs_gpuhost.so, which copies with memcpy and takes host
addresses), else libckptfs_cuda.so next to this file, in the checkout's
build/, or on the loader's path. Pinned staging: $CKPTFS_CUDA_PINNED
(default 512M, as 2 buffers).
"""

import atexit
import ctypes
import json
import os
import threading
import weakref

__all__ = ["save", "load", "read_header", "engine", "shutdown", "SaveHandle"]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("ptr", ctypes.c_uint64),
        ("nbytes", ctypes.c_uint64),
    ]


_lib = None
_lib_lock = threading.Lock()
_pending = weakref.WeakSet()


def _find_library():
    env = os.environ.get("CKPTFS_CUDA_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "libckptfs_cuda.so"),
                 os.path.join(here, "..", "..", "build", "libckptfs_cuda.so")):
        if os.path.exists(cand):
            return cand
    return "libckptfs_cuda.so"


def _library():
    global _lib
    with _lib_lock:
        if _lib is None:
            path = _find_library()
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                raise OSError(f"ckptfs_cuda: cannot load {path}: {e} "
                              "(build it with `CUDA=1 make`, or set CKPTFS_CUDA_LIB)") from None
            lib.ckptfs_engine.restype = ctypes.c_char_p
            lib.ckptfs_last_error.restype = ctypes.c_char_p
            lib.ckptfs_save_start.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Tensor), ctypes.c_size_t,
                                              ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
                                              ctypes.POINTER(ctypes.c_void_p)]
            lib.ckptfs_save_wait.argtypes = [ctypes.c_void_p]
            lib.ckptfs_save_cancel.argtypes = [ctypes.c_void_p]
            lib.ckptfs_save_done.argtypes = [ctypes.c_void_p]
            lib.ckptfs_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Tensor), ctypes.c_size_t]
            lib.ckptfs_read_header.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
            lib.ckptfs_free.argtypes = [ctypes.c_void_p]
            _lib = lib
        return _lib


def _raise(lib, err):
    msg = lib.ckptfs_last_error().decode("utf-8", "replace")
    raise OSError(err, f"{os.strerror(err)}: {msg}")


def engine():
    """'cuda' or 'host': which copies the loaded library makes."""
    return _library().ckptfs_engine().decode()


_TORCH = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16", "torch.float64": "F64",
          "torch.int64": "I64", "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8",
          "torch.uint8": "U8", "torch.bool": "BOOL", "torch.float8_e4m3fn": "F8_E4M3",
          "torch.float8_e5m2": "F8_E5M2", "torch.complex64": "C64"}
_TYPESTR = {"f2": "F16", "f4": "F32", "f8": "F64", "i1": "I8", "i2": "I16", "i4": "I32", "i8": "I64",
            "u1": "U8", "u2": "U16", "u4": "U32", "u8": "U64", "b1": "BOOL", "c8": "C64"}


def _from_typestr(typestr, what):
    if typestr[0] == ">" or typestr[1:] not in _TYPESTR:
        raise TypeError(f"{what}: dtype {typestr!r} has no safetensors name (little-endian numbers only)")
    return _TYPESTR[typestr[1:]]


def _describe(what, t):
    """(dtype, shape, address, nbytes) of a tensor-like, or raises TypeError."""
    if isinstance(t, (tuple, list)) and len(t) == 2 and all(isinstance(x, int) for x in t):
        return "U8", None, t[0], t[1]
    if hasattr(t, "data_ptr") and hasattr(t, "element_size"):
        # torch first: a CUDA tensor also has __cuda_array_interface__, but
        # that raises for bfloat16 and for tensors that require grad.
        if not t.is_contiguous():
            raise TypeError(f"{what}: not contiguous (call .contiguous())")
        dtype = _TORCH.get(str(t.dtype))
        if dtype is None:
            raise TypeError(f"{what}: dtype {t.dtype} has no safetensors name")
        return dtype, tuple(int(d) for d in t.shape), int(t.data_ptr()), t.numel() * t.element_size()
    iface = getattr(t, "__cuda_array_interface__", None)
    if iface is None:
        iface = getattr(t, "__array_interface__", None)
    if iface is not None:
        shape = tuple(int(d) for d in iface["shape"])
        dtype = _from_typestr(iface["typestr"], what)
        size = int(iface["typestr"][2:])
        strides = iface.get("strides")
        if strides is not None:
            expect, ok = size, True
            for d, s in zip(reversed(shape), reversed(strides)):
                ok = ok and (d <= 1 or s == expect)
                expect *= d
            if not ok:
                raise TypeError(f"{what}: not contiguous")
        n = size
        for d in shape:
            n *= d
        return dtype, shape, int(iface["data"][0]), n
    raise TypeError(f"{what}: not a tensor (want __cuda_array_interface__, data_ptr(), "
                    f"__array_interface__ or (address, nbytes)), got {type(t).__name__}")


def _tensors(tensors, saving):
    """A ctypes array of _Tensor and what keeps its strings alive."""
    if isinstance(tensors, dict):
        items = list(tensors.items())
    else:
        items = []
        for i, t in enumerate(tensors):
            if isinstance(t, tuple) and len(t) == 2 and isinstance(t[0], str):
                items.append(t)
            else:
                items.append((f"t{i}" if saving else None, t))
    arr = (_Tensor * max(1, len(items)))()
    keep = []
    for i, (name, t) in enumerate(items):
        what = f"tensor {name!r}" if name is not None else f"tensor {i}"
        dtype, shape, ptr, nbytes = _describe(what, t)
        name_b = name.encode() if name is not None else None
        dtype_b = dtype.encode() if (saving or dtype != "U8" or shape is not None) else None
        keep += [name_b, dtype_b]
        arr[i].name = name_b
        arr[i].dtype = dtype_b
        if shape is None:
            arr[i].ndim = -1
        else:
            dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
            keep.append(dims)
            arr[i].ndim = len(shape)
            arr[i].shape = dims
        arr[i].ptr = ptr
        arr[i].nbytes = nbytes
    return arr, len(items), keep


class SaveHandle:
    """A save whose device-to-host copies are done and whose file is being
    written. wait() returns once it is closed and renamed into place."""

    def __init__(self, lib, handle, path):
        self._lib, self._h, self.path = lib, handle, path
        self._lock = threading.Lock()
        self._result = None

    def done(self):
        with self._lock:
            return self._h is None or bool(self._lib.ckptfs_save_done(self._h))

    def cancel(self):
        """Stops the write and removes the partial file; True if it had not finished."""
        with self._lock:
            return self._h is not None and bool(self._lib.ckptfs_save_cancel(self._h))

    def wait(self):
        """Waits for the file; raises OSError if it could not be written."""
        with self._lock:
            if self._h is not None:
                self._result = self._lib.ckptfs_save_wait(self._h), self._lib.ckptfs_last_error()
                self._h = None
        err, msg = self._result
        if err:
            raise OSError(err, f"{os.strerror(err)}: {msg.decode('utf-8', 'replace')}")

    def __del__(self):
        # The C handle must be waited for once; a dropped handle still
        # lets its file land (errors are lost: call wait() to see them).
        try:
            self.wait()
        except Exception:
            pass


def save(path, tensors, metadata=None, wait=False):
    """Saves `tensors` (a dict name -> tensor, or a list) into `path` as
    safetensors; returns a SaveHandle once the tensors may change again."""
    lib = _library()
    arr, n, keep = _tensors(tensors, True)
    meta = metadata or {}
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("metadata keys and values must be str")
    kv = [s.encode() for pair in meta.items() for s in pair]
    meta_arr = (ctypes.c_char_p * max(1, len(kv)))(*kv)
    out = ctypes.c_void_p()
    err = lib.ckptfs_save_start(os.fsencode(path), arr, n, meta_arr, len(meta), ctypes.byref(out))
    if err:
        _raise(lib, err)
    h = SaveHandle(lib, out, os.fspath(path))
    _pending.add(h)
    if wait:
        h.wait()
    return h


def load(path, tensors):
    """Loads into `tensors` (a dict name -> tensor: by name; a list: all of
    the file's tensors, in order). Sizes and dtypes must match."""
    lib = _library()
    arr, n, keep = _tensors(tensors, False)
    err = lib.ckptfs_load(os.fsencode(path), arr, n)
    if err:
        _raise(lib, err)


def read_header(path):
    """The file's header: {name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}."""
    lib = _library()
    out = ctypes.c_void_p()
    err = lib.ckptfs_read_header(os.fsencode(path), ctypes.byref(out))
    if err:
        _raise(lib, err)
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        lib.ckptfs_free(out)


def shutdown():
    """Waits for the saves in flight and frees the pinned buffers."""
    for h in list(_pending):
        try:
            h.wait()
        except OSError:
            pass
    if _lib is not None:
        _lib.ckptfs_shutdown()


atexit.register(shutdown)
