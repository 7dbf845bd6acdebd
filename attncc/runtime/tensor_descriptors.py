"""Triton's host tensor descriptors in a replayed launch: expanded once, their maps moved.

Triton's launcher for a kernel taking ``TensorDescriptor`` arguments wraps the compiled
launch function in Python (``wrap_handle_tensordesc``): every call it expands each descriptor
into the kernel's parameters, encoding a new CUtensorMap (``fill_tma_descriptor``, the
driver's ``cuTensorMapEncodeTiled``) from the descriptor's base, shape, strides and block.
In a replayed call (attncc.runtime.triton_plan) all of that but the base pointer is fixed by
the call geometry. ``expand`` therefore calls the compiled launch function directly, with
each descriptor expanded once when the plan is made: its map encoded then and moved to each
call's tensor by rewriting the one word that holds its address (tensor_map.AddressField,
read from the driver's own encodings), or, for a descriptor Triton passes unencoded, its
base as a plain pointer argument.

Which arguments are descriptors and how each is passed (encoded or not) comes from the
compiled kernel (``metas``), as Triton's launcher reads it, so a launch through attncc's own
launcher never needs Triton's built. Where a map's address field cannot be found ``expand``
returns None, and where Triton's launcher is not the wrapper this module knows (another
Triton version) ``raw_launch`` does: the replay then keeps Triton's path.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from attncc.runtime import tensor_map

# a tensor's source in a recorded call (attncc.runtime.triton_plan.Source)
Source = tuple[Any, ...]
_MAP_BYTES = 128


class Expanded(NamedTuple):
    values: list[Any]  # the kernel's arguments, descriptors expanded
    slots: list[tuple[int, Source]]  # pointer slots: (position in values, source)
    patches: tuple[tuple[Callable[[int], None], Source], ...]  # (move a kept map, its base)
    # each argument's type in the launcher's signature (``types`` given to expand), and each
    # kept map's (position in values, address field, its base's source)
    types: list[str]
    maps: tuple[tuple[int, tensor_map.AddressField, Source], ...]


def metas(compiled: Any) -> dict[int, Any]:
    """Each descriptor argument's position among a compiled kernel's arguments, with the
    metadata its launcher expands it by (None: passed unencoded), as Triton's
    ``CudaLauncher`` reads them: the signature's tensordesc types, the compiled metadata's
    ``tensordesc_meta`` in their order."""
    signature = getattr(getattr(compiled, "src", None), "signature", {})
    indices = [
        at
        for at, kind in enumerate(signature.values())
        if isinstance(kind, str) and kind.startswith("tensordesc")
    ]
    found = getattr(compiled.metadata, "tensordesc_meta", None) or [None] * len(indices)
    if len(found) != len(indices):
        return {}
    return dict(zip(indices, found, strict=True))


def raw_launch(launch: Any) -> Callable[..., Any] | None:
    """The compiled launch function inside Triton's descriptor wrapper ``launch`` (None:
    not the wrapper this module knows)."""
    unwrapped = _unwrapped(launch)
    return None if unwrapped is None else unwrapped[0]


def expand(
    metas: dict[int, Any],
    values: Sequence[Any],
    slots: dict[int, Source],
    pointer: Callable[[Source], int],
    types: Sequence[str] = (),
) -> Expanded | None:
    """A kernel's argument ``values`` (None at ``slots``, positions filled each call from
    their source) with the descriptors at ``metas``' positions expanded as Triton's
    launcher would; ``pointer`` gives a source's pointer in the recorded call (where the
    maps are first encoded); ``types``, the arguments' signature types where given,
    expanded alike. None: no descriptor, or one this module cannot expand."""
    if not metas:
        return None
    try:
        from triton.backends.nvidia.driver import make_tensordesc_arg
    except ImportError:
        return None
    out: list[Any] = []
    out_types: list[str] = []
    out_slots: list[tuple[int, Source]] = []
    patches: list[tuple[Callable[[int], None], Source]] = []
    maps: list[tuple[int, tensor_map.AddressField, Source]] = []
    for at, value in enumerate(values):
        source = slots.get(at)
        kind = types[at] if at < len(types) else ""
        if at not in metas:
            if source is not None and source[0] == "desc":
                return None  # a descriptor where the wrapper expects none
            if source is not None:
                out_slots.append((len(out), source))
            out.append(value)
            out_types.append(kind)
            continue
        meta = metas[at]
        if source is None:  # a descriptor over a buffer the module keeps: the same each call
            expansion = make_tensordesc_arg(value, meta)
            out_types += _descriptor_types(kind, meta, len(expansion))
            out.extend(expansion)
            continue
        if source[0] != "desc":
            return None
        _, base, shape, strides, _block, padding = source
        if meta is None:
            # passed unencoded: [base, *shape, *strides, padding is NaN, *shape, *strides]
            out_slots.append((len(out), base))
            expansion = [None, *shape, *strides, padding == "nan", *shape, *strides]
            out_types += _descriptor_types(kind, meta, len(expansion))
            out.extend(expansion)
            continue
        moving = _moving_map(make_tensordesc_arg, meta, shape, strides, padding, pointer(base))
        if moving is None:
            return None
        expansion, move, field = moving
        maps.append((len(out), field, base))
        out_types += _descriptor_types(kind, meta, len(expansion))
        out.extend(expansion)
        patches.append((move, base))
    return Expanded(out, out_slots, tuple(patches), out_types, tuple(maps))


def _descriptor_types(kind: str, meta: Any, length: int) -> list[str]:
    """A descriptor argument's expansion's types, as Triton's launcher declares them: an
    encoded map, its shape (i32) and strides (i64); unencoded, its base pointer, shape and
    strides (i64), the NaN-padding flag (i1), shape (i32) and strides (i64)."""
    ndim = (length - 1) // 2 if meta is not None else (length - 2) // 4
    if meta is not None:
        return ["nvTmaDesc", *["i32"] * ndim, *["i64"] * ndim]
    element = kind[len("tensordesc<") :].split("[", 1)[0] if kind.startswith("tensordesc<") else ""
    return [f"*{element}", *["i64"] * (2 * ndim), "i1", *["i32"] * ndim, *["i64"] * ndim]


def _unwrapped(launch: Any) -> tuple[Callable[..., Any], dict[int, Any]] | None:
    """The compiled launch function inside Triton's descriptor wrapper, and each descriptor
    argument's position with its metadata (None: passed unencoded), from the names the
    wrapper closes over."""
    code, closure = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
    if code is None or not closure:
        return None
    try:
        cells = {
            name: cell.cell_contents for name, cell in zip(code.co_freevars, closure, strict=True)
        }
    except ValueError:  # an empty cell
        return None
    raw, indices, metas = (
        cells.get(n) for n in ("launcher", "tensordesc_indices", "tensordesc_meta")
    )
    if not callable(raw) or not indices or metas is None or len(metas) != len(indices):
        return None
    # the wrapper hands out metadata in the order of the positions
    return raw, dict(zip(sorted(indices), metas, strict=True))


class _Base:
    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


class _Descriptor:
    """What ``make_tensordesc_arg`` reads of a TensorDescriptor, at a given base address."""

    def __init__(self, address: int, shape: Any, strides: Any, padding: Any) -> None:
        self.base = _Base(address)
        self.shape, self.strides, self.padding = list(shape), list(strides), padding


def map_address(holder: Any) -> int | None:
    """Where Triton's map object holds its CUtensorMap: its last 128 bytes (the struct's
    128-byte-aligned last member); None for another kind of object."""
    size = getattr(type(holder), "__basicsize__", 0)
    if type(holder).__name__ != "PyCUtensorMap" or size < _MAP_BYTES + 16:
        return None
    return id(holder) + size - _MAP_BYTES


def _moving_map(
    make: Callable[[Any, Any], list[Any]],
    meta: Any,
    shape: Any,
    strides: Any,
    padding: Any,
    address: int,
) -> tuple[list[Any], Callable[[int], None], tensor_map.AddressField] | None:
    """A descriptor's expansion with its map encoded at ``address``, the function that
    moves that map to another base address, and its address field; None where the address
    field is not found."""

    def encoded(at: int) -> bytes:
        holder = make(_Descriptor(at, shape, strides, padding), meta)[0]
        where = map_address(holder)
        if where is None:
            raise tensor_map.TensorMapRefused("not a map object")
        return ctypes.string_at(where, _MAP_BYTES)

    try:
        field = tensor_map.address_field(encoded, address)
    except (RuntimeError, ValueError, TypeError):  # the encoder refused a probe
        return None
    if field is None:
        return None
    expansion = make(_Descriptor(address, shape, strides, padding), meta)
    holder = expansion[0]
    where = map_address(holder)
    if where is None:
        return None
    word = ctypes.c_uint64.from_address(where + field.offset)

    def move(base: int, holder: Any = holder) -> None:  # holder: keeps the map alive
        word.value = field.word(base)

    return expansion, move, field
