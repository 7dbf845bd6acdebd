"""Replayed launches of kernels taking Triton tensor descriptors (attncc.runtime.
tensor_descriptors), on CPU with a launcher shaped like Triton's descriptor wrapper: the
expansion a replay passes, and a kept map moved to another base by one word. The compiled
path itself runs on a GPU (tests/runtime/test_triton_plan.py in the `kernels` step)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pytest

from attncc.runtime import tensor_descriptors, tensor_map


def _wrapper(launcher: Any, tensordesc_indices: set[int], tensordesc_meta: list[Any]) -> Any:
    """As Triton's wrap_handle_tensordesc builds its launcher (the names it closes over)."""

    def inner(*args: Any) -> Any:
        return launcher, tensordesc_indices, tensordesc_meta

    return inner


def _raw(*args: Any) -> None:
    pass


def test_a_launch_without_the_descriptor_wrapper_is_left_as_it_is() -> None:
    assert tensor_descriptors.raw_launch(_raw) is None
    assert tensor_descriptors.raw_launch(_wrapper(_raw, set(), [])) is None
    assert tensor_descriptors.raw_launch(_wrapper(_raw, {1}, [None])) is _raw
    assert tensor_descriptors.expand({}, [1, 2], {}, lambda s: 0) is None


def _compiled(signature: dict[str, Any], tensordesc_meta: Any) -> Any:
    return SimpleNamespace(
        src=SimpleNamespace(signature=signature),
        metadata=SimpleNamespace(tensordesc_meta=tensordesc_meta),
    )


def test_descriptor_positions_and_metadata_come_from_the_compiled_kernel() -> None:
    """As Triton's launcher reads them: the signature's tensordesc arguments in order, each
    with its entry of the metadata's tensordesc_meta (None throughout when it is empty)."""
    signature = {"q": "*bf16", "k": "tensordesc<bf16[64, 64]>", "n": "i32",
                 "v": "tensordesc<bf16[64, 64]>", "BLOCK": "constexpr"}  # fmt: skip
    encoded = tensor_descriptors.metas(_compiled(signature, [{"swizzle": 3}, {"swizzle": 2}]))
    assert encoded == {1: {"swizzle": 3}, 3: {"swizzle": 2}}
    assert tensor_descriptors.metas(_compiled(signature, None)) == {1: None, 3: None}
    assert tensor_descriptors.metas(_compiled({"q": "*bf16"}, None)) == {}


def test_an_unencoded_descriptor_expands_to_its_base_pointer_shape_and_strides() -> None:
    """A descriptor Triton passes unencoded becomes its base (a pointer slot filled from the
    descriptor's base each call), shape, strides, the NaN-padding flag, shape and strides
    again; the other arguments keep their positions' sources."""
    source = ("desc", ("input", "k"), (64, 32), (32, 1), (16, 32), "zero")
    types = ["*fp16", "tensordesc<bf16[16, 32]>", "i32"]
    expanded = tensor_descriptors.expand(
        {1: None}, [None, None, 7], {0: ("input", "q"), 1: source}, lambda s: 0, types
    )
    assert expanded is not None
    assert expanded.patches == () and expanded.maps == ()
    assert expanded.values == [None, None, 64, 32, 32, 1, False, 64, 32, 32, 1, 7]
    assert expanded.slots == [(0, ("input", "q")), (1, ("input", "k"))]
    # as Triton's launcher declares them: the base, shape and strides twice, the NaN flag
    assert expanded.types == [
        "*fp16", "*bf16", "i64", "i64", "i64", "i64", "i1", "i32", "i32", "i64", "i64", "i32",
    ]  # fmt: skip


class _Map:
    """A map object as Triton's fill_tma_descriptor returns it, its map in a ctypes buffer."""

    def __init__(self, encoded: bytes) -> None:
        self.buffer = ctypes.create_string_buffer(encoded, 128)


def _shifted(address: int) -> bytes:
    return bytes(8) + ((address >> 4) | (3 << 60)).to_bytes(8, "little") + bytes(range(112))


def test_an_encoded_descriptors_map_is_made_once_and_moved_by_one_word(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The map is encoded at the recorded call's base, its address word found from a few
    probe encodings; moving it to another base makes exactly that base's encoding."""
    made: list[int] = []

    def make(desc: Any, meta: Any) -> list[Any]:
        made.append(desc.base.data_ptr())
        return [_Map(_shifted(desc.base.data_ptr())), *desc.shape, *desc.strides]

    monkeypatch.setattr(tensor_descriptors, "map_address", lambda m: ctypes.addressof(m.buffer))
    import triton.backends.nvidia.driver as nvidia_driver

    monkeypatch.setattr(nvidia_driver, "make_tensordesc_arg", make)
    source = ("desc", ("input", "v"), (64, 32), (32, 1), (16, 32), "zero")
    recorded = 2**36 + 4096
    expanded = tensor_descriptors.expand(
        {0: {"swizzle": 3}},
        [None],
        {0: source},
        lambda s: recorded,
        ["tensordesc<fp16[16, 32]>"],
    )
    assert expanded is not None
    values, slots, ((move, base),) = expanded.values, expanded.slots, expanded.patches
    assert made[0] == recorded and made[-1] == recorded  # probes between them
    assert values[1:] == [64, 32, 32, 1] and slots == [] and base == ("input", "v")
    ((position, field, map_base),) = expanded.maps
    assert position == 0 and map_base == base and field.offset == 8 and field.shift == 4
    assert expanded.types == ["nvTmaDesc", "i32", "i32", "i64", "i64"]
    move(2**40 + 16 * 99)
    assert ctypes.string_at(ctypes.addressof(values[0].buffer), 128) == _shifted(2**40 + 16 * 99)


def test_a_map_without_an_address_word_keeps_tritons_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def make(desc: Any, meta: Any) -> list[Any]:
        scrambled = bytes((desc.base.data_ptr() * 2654435761 >> i) & 0xFF for i in range(128))
        return [_Map(scrambled), *desc.shape, *desc.strides]

    monkeypatch.setattr(tensor_descriptors, "map_address", lambda m: ctypes.addressof(m.buffer))
    import triton.backends.nvidia.driver as nvidia_driver

    monkeypatch.setattr(nvidia_driver, "make_tensordesc_arg", make)
    source = ("desc", ("input", "v"), (64, 32), (32, 1), (16, 32), "zero")
    metas = {0: {"swizzle": 3}}
    assert tensor_descriptors.expand(metas, [None], {0: source}, lambda s: 2**36) is None
    assert tensor_map.address_field(lambda a: bytes(128), 2**36) is None  # nothing moves
