"""Tensor maps (TMA descriptors) for the CUDA target's Hopper kernel.

A CUtensorMap is a 128-byte descriptor the driver encodes on the host
(``cuTensorMapEncodeTiled``); the kernel takes it as a ``__grid_constant__`` parameter and
its copy engine reads boxes of the tensor through it (launches: attncc.runtime.driver).

The fused kernel copies K and V tiles: a box of 128 bytes of head-dim columns (the 128-byte
swizzle's line: 64 16-bit columns, 128 FP8 ones) by ``rows`` keys. Its map views an operand
as three dimensions: the head dim (contiguous), the key axis (its stride) and the program's
base offset in 16-byte units (stride 16 bytes), so one map serves every program of a launch
whatever the tensor's other axes are: a program passes its base offset in 16-byte units as
the third coordinate. An FP8 V is key-major (keys contiguous, as FP8 MMAs read it): its map
is (key, head dim, program base), a box of a line of keys by every head-dim column.
The map's view overlaps itself along that axis, which addressing allows; elements past the
key axis's length or the head dim arrive as zeros (the kernel's zero-fill of ragged tiles).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attncc.runtime import driver

# CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion (cuda.h)
_DATA_TYPES = {torch.float16: 6, torch.bfloat16: 9, torch.float8_e4m3fn: 0}  # FP8 as UINT8
_SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3
_MAP_BYTES = 128
_LINE_BYTES = 128  # the swizzle's line: a box's innermost extent


class TensorMapRefused(RuntimeError):
    """The driver would not encode a tensor map for these strides or sizes."""


# (dtype, cols, keys, stride, span, rows, key_major): encode_map's arguments after the pointer
MapLayout = tuple[torch.dtype, int, int, int, int, int, bool]


def key_tile_layout(
    t: torch.Tensor,
    key_axis: int,
    col_axis: int,
    keys: int,
    cols: int,
    rows: int,
    key_major: bool = False,
) -> MapLayout:
    """``encode``'s arguments after the pointer for the map of ``t``'s tiles of ``rows`` keys
    by a 128-byte line of head-dim columns (the module's docstring): keys [0, ``keys``) along
    ``key_axis``, columns [0, ``cols``) along ``col_axis`` (contiguous); every other stride
    and the start 16-byte aligned (the caller's 16-byte-load check). ``key_major``: the keys
    contiguous instead (an FP8 V), a box of ``rows`` keys (one line) by ``cols`` columns. The
    same for every tensor of ``t``'s dtype, sizes and strides, so a launch plan keeps them
    and encodes each call's pointer."""
    others = [a for a in range(t.dim()) if a not in (key_axis, col_axis)]
    per_unit = 16 // t.element_size()  # elements a 16-byte unit of the program base
    span = sum((t.shape[a] - 1) * t.stride(a) for a in others) // per_unit + 1
    stride = t.stride(col_axis if key_major else key_axis)
    return t.dtype, cols, keys, stride, span, rows, key_major


def encode_map(
    ptr: int,
    dtype: torch.dtype,
    cols: int,
    keys: int,
    stride: int,
    span: int,
    rows: int,
    key_major: bool = False,
) -> bytes:
    """The driver's map of the tensor at ``ptr`` with ``key_tile_layout``'s layout (the
    module's docstring); ``encode`` keeps the last 256."""
    element = dtype.itemsize
    if key_major:  # (key, column, program base): a box of `rows` keys by every column
        dims = (ctypes.c_uint64 * 3)(keys, cols, span)
        box = (ctypes.c_uint32 * 3)(rows, cols, 1)
    else:  # (column, key, program base): a box of a line of columns by `rows` keys
        dims = (ctypes.c_uint64 * 3)(cols, keys, span)
        box = (ctypes.c_uint32 * 3)(_LINE_BYTES // element, rows, 1)
    strides = (ctypes.c_uint64 * 2)(stride * element, 16)
    steps = (ctypes.c_uint32 * 3)(1, 1, 1)
    # the map must sit on a 64-byte boundary: a buffer with room to align it
    raw = ctypes.create_string_buffer(_MAP_BYTES + 64)
    at = (ctypes.addressof(raw) + 63) // 64 * 64
    code = driver.lib().cuTensorMapEncodeTiled(
        ctypes.c_void_p(at), _DATA_TYPES[dtype], 3, ctypes.c_void_p(ptr), dims, strides,
        box, steps, 0, _SWIZZLE_128B, _L2_PROMOTION_256B, 0,
    )  # fmt: skip
    if code != 0:
        raise TensorMapRefused(
            f"cuTensorMapEncodeTiled: {driver.error_name(code)} (dims {list(dims)}; stride "
            f"{stride} elements; box {list(box)})"
        )
    return ctypes.string_at(at, _MAP_BYTES)


encode = functools.lru_cache(maxsize=256)(encode_map)


_WORD = 2**64 - 1
# pointers an address probe encodes beside the caller's: the next 16-byte step, a carry
# through the low bits, and one 4 GiB away (the driver checks alignment, not the memory)
_PROBES = (16, 16 * 0x1003, (1 << 32) + 16 * 7)


@dataclass(frozen=True)
class AddressField:
    """Where an encoded map holds its global address: the 64-bit little-endian word at byte
    ``offset`` is ``bias + (address >> shift)`` (mod 2**64), every other byte independent of
    the address. A launch then moves a map to another tensor of the same layout by
    rewriting that word, where encoding it again costs 5.7-11.7 us of CPU (H200,
    benchmarks/call_parts.py)."""

    offset: int
    shift: int
    bias: int

    def word(self, address: int) -> int:
        return (self.bias + (address >> self.shift)) & _WORD

    def patched(self, encoded: bytes, address: int) -> bytes:
        end = self.offset + 8
        return encoded[: self.offset] + self.word(address).to_bytes(8, "little") + encoded[end:]


def address_field(encode_at: Callable[[int], bytes], address: int) -> AddressField | None:
    """How the maps ``encode_at`` encodes (one layout, the address varying) hold their
    address: found by encoding at ``address`` (16-byte aligned) and at a few other
    addresses, and kept only where rewriting one word reproduces every one of those
    encodings exactly; None otherwise (the caller then encodes each call's map). The
    descriptor's format is the driver's own, so it is read from the driver, never assumed."""
    try:
        base = encode_at(address)
        probes = [(address + step, encode_at(address + step)) for step in _PROBES]
    except TensorMapRefused:
        return None
    if any(len(probe) != len(base) for _, probe in probes):
        return None
    changed = [
        i for _, probe in probes for i, (a, b) in enumerate(zip(base, probe, strict=True)) if a != b
    ]
    if not changed:
        return None
    offset = min(changed) // 8 * 8
    if max(changed) >= offset + 8 or offset + 8 > len(base):
        return None
    first = int.from_bytes(base[offset : offset + 8], "little")
    for shift in (0, 4):
        field = AddressField(offset, shift, (first - (address >> shift)) & _WORD)
        if all(field.patched(base, at) == probe for at, probe in probes):
            return field
    return None


def layout_address_field(layout: MapLayout, address: int) -> AddressField | None:
    """``address_field`` of key-tile maps of ``layout`` (``key_tile_layout``'s), probed at
    ``address`` (a launch plan finds it once, for all its calls)."""
    return address_field(lambda at: encode_map(at, *layout), address)
