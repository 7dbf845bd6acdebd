"""Tensor maps (TMA descriptors) for the CUDA target's Hopper kernel, and launches that pass
them by value.

A CUtensorMap is a 128-byte descriptor the driver encodes on the host
(``cuTensorMapEncodeTiled``); the kernel takes it as a ``__grid_constant__`` parameter and
its copy engine reads boxes of the tensor through it. cuda.core's launcher passes scalars
and pointers only, so these launches go through the driver API (``cuLaunchKernel`` through
ctypes, on PyTorch's current stream) with every parameter as raw bytes.

The fused kernel copies K and V tiles: a box of 64 head-dim columns (128 bytes, the
128-byte swizzle's line) by ``rows`` keys. Its map views an operand as three dimensions:
the head dim (contiguous), the key axis (its stride) and the program's base offset in
16-byte units (stride 16 bytes), so one map serves every program of a launch whatever the
tensor's other axes are: a program passes its base offset / 8 as the third coordinate.
The map's view overlaps itself along that axis, which addressing allows; elements past the
key axis's length or the head dim arrive as zeros (the kernel's zero-fill of ragged tiles).
"""

from __future__ import annotations

import ctypes
import functools
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

# CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion (cuda.h)
_DATA_TYPES = {torch.float16: 6, torch.bfloat16: 9}
_SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3
_MAP_BYTES = 128
_BOX_COLUMNS = 64  # 128 bytes of 16-bit elements
# cuFuncSetAttribute's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_MAX_DYNAMIC_SHARED = 8


class TensorMapRefused(RuntimeError):
    """The driver would not encode a tensor map for these strides or sizes."""


@functools.lru_cache(maxsize=1)
def _driver() -> Any:
    lib = ctypes.CDLL("libcuda.so.1")
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
    lib.cuTensorMapEncodeTiled.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
        u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ]  # fmt: skip
    lib.cuLaunchKernel.restype = ctypes.c_int
    lib.cuLaunchKernel.argtypes = [
        ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
    ]  # fmt: skip
    lib.cuKernelGetFunction.restype = ctypes.c_int
    lib.cuKernelGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    lib.cuFuncSetAttribute.restype = ctypes.c_int
    lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.cuGetErrorName.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


def _error(code: int) -> str:
    name = ctypes.c_char_p()
    _driver().cuGetErrorName(code, ctypes.byref(name))
    return (name.value or b"").decode() or f"CUresult {code}"


def key_tile_map(
    t: torch.Tensor, key_axis: int, col_axis: int, keys: int, cols: int, rows: int
) -> bytes:
    """The encoded map of ``t``'s tiles of ``rows`` keys by 64 head-dim columns (the
    module's docstring): keys [0, ``keys``) along ``key_axis``, columns [0, ``cols``) along
    ``col_axis`` (contiguous); every other stride and the start 16-byte aligned (the
    caller's 16-byte-load check)."""
    others = [a for a in range(t.dim()) if a not in (key_axis, col_axis)]
    span = sum((t.shape[a] - 1) * t.stride(a) for a in others) // 8 + 1
    return _encode(t.data_ptr(), t.dtype, cols, keys, t.stride(key_axis), span, rows)


@functools.lru_cache(maxsize=256)
def _encode(
    ptr: int, dtype: torch.dtype, cols: int, keys: int, key_stride: int, span: int, rows: int
) -> bytes:
    element = 2
    dims = (ctypes.c_uint64 * 3)(cols, keys, span)
    strides = (ctypes.c_uint64 * 2)(key_stride * element, 16)
    box = (ctypes.c_uint32 * 3)(_BOX_COLUMNS, rows, 1)
    steps = (ctypes.c_uint32 * 3)(1, 1, 1)
    # the map must sit on a 64-byte boundary: a buffer with room to align it
    raw = ctypes.create_string_buffer(_MAP_BYTES + 64)
    at = (ctypes.addressof(raw) + 63) // 64 * 64
    code = _driver().cuTensorMapEncodeTiled(
        ctypes.c_void_p(at), _DATA_TYPES[dtype], 3, ctypes.c_void_p(ptr), dims, strides,
        box, steps, 0, _SWIZZLE_128B, _L2_PROMOTION_256B, 0,
    )  # fmt: skip
    if code != 0:
        raise TensorMapRefused(
            f"cuTensorMapEncodeTiled: {_error(code)} (dims {cols}, {keys}, {span}; "
            f"key stride {key_stride} elements; box 64 x {rows})"
        )
    return ctypes.string_at(at, _MAP_BYTES)


# (CUkernel handle, device index) -> [its CUfunction, the dynamic shared memory it may use]
_FUNCTIONS: dict[tuple[int, int], list[int]] = {}


def _function(kernel: Any, device_index: int, shared_bytes: int) -> int:
    """The CUfunction of a cuda.core kernel (a CUkernel) in the current context, allowed
    ``shared_bytes`` of dynamic shared memory (raised once, as nvrtc's opt-in for cuda.core's
    launches: not on every launch)."""
    key = (int(kernel.handle), device_index)
    found = _FUNCTIONS.get(key)
    lib = _driver()
    if found is None:
        function = ctypes.c_void_p()
        code = lib.cuKernelGetFunction(ctypes.byref(function), ctypes.c_void_p(key[0]))
        if code != 0:
            raise RuntimeError(f"attncc: cuKernelGetFunction: {_error(code)}")
        found = _FUNCTIONS[key] = [int(function.value or 0), 0]
    if found[1] < shared_bytes:
        code = lib.cuFuncSetAttribute(ctypes.c_void_p(found[0]), _MAX_DYNAMIC_SHARED, shared_bytes)
        if code != 0:
            raise RuntimeError(
                f"attncc: cannot give a CUDA kernel {shared_bytes} bytes of shared memory "
                f"({_error(code)})"
            )
        found[1] = shared_bytes
    return found[0]


# struct codes of the numpy scalars a launch passes (pointers, ints, floats)
_CODES = {np.uint64: "Q", np.int64: "q", np.uint32: "I", np.int32: "i", np.float32: "f"}
# a parameter list's kinds (a scalar's type, an encoded map's length) -> its packing
_LAYOUTS: dict[tuple[Any, ...], tuple[struct.Struct, tuple[int, ...]]] = {}


def _layout(kinds: tuple[Any, ...]) -> tuple[struct.Struct, tuple[int, ...]]:
    """One struct for a parameter list: each value at an 8-byte boundary, and the offsets."""
    fmt, offsets, at = "<", [], 0
    for kind in kinds:
        offsets.append(at)
        if isinstance(kind, int):  # an encoded map's bytes
            fmt += f"{kind}s{-kind % 8}x"
            at += kind + -kind % 8
        else:
            code = _CODES[kind]
            fmt += f"{code}{8 - struct.calcsize(code)}x"
            at += 8
    return struct.Struct(fmt), tuple(offsets)


def _parameters(args: Sequence[np.generic | bytes]) -> tuple[Any, Any]:
    """cuLaunchKernel's parameter array for ``args`` and the buffer it points into (keep it
    alive until the launch returns): every value's bytes in one buffer, each at an 8-byte
    boundary (the driver copies each parameter from its pointer). Packed by one cached
    struct: per-value bytes and copies cost ~40 us a launch (session 10's profile)."""
    kinds = tuple(len(a) if isinstance(a, bytes) else type(a) for a in args)
    layout = _LAYOUTS.get(kinds)
    if layout is None:
        layout = _LAYOUTS[kinds] = _layout(kinds)
    packer, offsets = layout
    blob = ctypes.create_string_buffer(packer.pack(*args), packer.size)
    base = ctypes.addressof(blob)
    return (ctypes.c_void_p * len(offsets))(*[base + at for at in offsets]), blob


def prepare(
    kernel: Any,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    args: Sequence[np.generic | bytes],
    device: torch.device,
    shared_bytes: int,
) -> Callable[[], None]:
    """A launch of ``kernel`` on PyTorch's current stream of ``device`` (whose context is
    current), every parameter packed: numpy scalars (pointers, ints, floats) and encoded
    maps, in parameter order. Calling it issues the launch and nothing else."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    function = ctypes.c_void_p(_function(kernel, index, shared_bytes))
    params, blob = _parameters(args)
    stream = ctypes.c_void_p(int(torch.cuda.current_stream(device).cuda_stream))

    def issue(_buffer: Any = blob) -> None:  # the buffer `params` points into, kept alive
        code = _driver().cuLaunchKernel(function, *grid, *block, shared_bytes, stream, params, None)
        if code != 0:
            raise RuntimeError(f"attncc: cuLaunchKernel: {_error(code)}")

    return issue
