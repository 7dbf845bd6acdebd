"""The tensor maps of the CUDA target's tensor copies, on CPU: what a key-tile map asks the
driver to encode (the driver itself needs a GPU: tests/gpu/test_gpu_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from attncc.runtime import tensor_map


def key_tile_map(t: torch.Tensor, *layout: int) -> bytes:
    """What the host module encodes for ``t``: its pointer and its key-tile layout."""
    return tensor_map.encode(t.data_ptr(), *tensor_map.key_tile_layout(t, *layout))


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    calls: list[tuple[object, ...]] = []

    def record(*args: object) -> bytes:
        calls.append(args)
        return bytes(128)

    monkeypatch.setattr(tensor_map, "encode", record)
    return calls


def test_a_map_views_the_operand_as_head_dim_keys_and_program_base(
    encoded: list[tuple[object, ...]],
) -> None:
    """(head dim, key, base / 8): the key axis's stride in elements, and a third axis of
    16-byte steps long enough for every program's base offset."""
    k = torch.zeros(2, 3, 40, 64, dtype=torch.bfloat16)  # [B, H, N, D]
    assert key_tile_map(k, 2, 3, 40, 64, 128) == bytes(128)
    (ptr, dtype, cols, keys, key_stride, span, rows, key_major) = encoded[0]
    assert not key_major
    assert (ptr, dtype, cols, keys, key_stride, rows) == (
        k.data_ptr(),
        torch.bfloat16,
        64,
        40,
        64,
        128,
    )
    last_base = (2 - 1) * k.stride(0) + (3 - 1) * k.stride(1)
    assert span == last_base // 8 + 1


def test_strided_layouts_keep_their_key_stride(encoded: list[tuple[object, ...]]) -> None:
    """Sequence outside the heads (a transpose) and padded head-dim rows: the key stride is
    the tensor's own; a broadcast batch (stride 0) adds nothing to the base axis."""
    seq_first = torch.zeros(2, 50, 4, 128, dtype=torch.float16).transpose(1, 2)  # [B, H, N, D]
    key_tile_map(seq_first, 2, 3, 50, 128, 64)
    assert encoded[-1][4] == 4 * 128
    padded = torch.zeros(2, 4, 50, 136, dtype=torch.bfloat16)[..., :128]
    key_tile_map(padded, 2, 3, 50, 128, 64)
    assert encoded[-1][4] == 136
    broadcast = torch.zeros(1, 4, 50, 128, dtype=torch.bfloat16).expand(3, 4, 50, 128)
    key_tile_map(broadcast, 2, 3, 50, 128, 64)
    assert encoded[-1][5] == (4 - 1) * 50 * 128 // 8 + 1
