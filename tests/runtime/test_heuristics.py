"""The heuristic table first calls take: an entry for every key, each a launchable
configuration for its schedule and arch, and the lookup a call makes."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

import attncc
from attncc.runtime import heuristics
from attncc.runtime.heuristics import (
    ARCHS,
    DTYPES,
    HEAD_DIM_BUCKETS,
    LENGTH_BUCKETS,
    SCHEDULES,
    SHARED_MEMORY,
    TABLE,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CPU = torch.device("cpu")


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def test_every_arch_schedule_dtype_head_dim_and_length_has_an_entry() -> None:
    keys = itertools.product(
        ARCHS, SCHEDULES, HEAD_DIM_BUCKETS, DTYPES, LENGTH_BUCKETS, (True, False)
    )
    assert set(TABLE) == set(keys)


@pytest.mark.parametrize("key", sorted(TABLE), ids=str)
def test_every_entry_is_a_valid_configuration_for_its_schedule(
    key: tuple[str, str, int, str, int, bool],
) -> None:
    arch, schedule, head_dim, dtype, _, _ = key
    entry = TABLE[key]
    tile = entry.tile
    assert _power_of_two(tile.block_m) and _power_of_two(tile.block_n)
    assert tile.block_m >= 16 and tile.block_n >= 16  # tl.dot's minimum
    assert tile.num_warps in (4, 8) and tile.num_stages >= 1
    # TMA copies need sm_90 (the interpreter runs them too), and only fused kernels have them
    assert not tile.tma or (arch in ("sm90", "cpu") and schedule == "fused")
    split = schedule.startswith("split_kv")
    assert (entry.waves >= 1) if split else (entry.waves == 0)
    if split:
        assert tile.block_m == 16  # the host sizes the split kernels' rows itself
    used = heuristics.estimate_bytes(tile, head_dim, head_dim, heuristics.ITEMSIZE[dtype])
    assert used <= SHARED_MEMORY[arch]
    config = entry.launch()
    assert ("waves" in config) == split and config["tma"] == int(tile.tma)


def test_sm90_16_bit_entries_are_the_measured_picks() -> None:
    # H200 sweep (causal/full 4k D=128) and H100 matrix picks: see heuristics._SM90_16BIT
    assert TABLE["sm90", "fused", 128, "bfloat16", 8192, True].launch() == {
        "BLOCK_M": 64,
        "BLOCK_N": 64,
        "num_warps": 4,
        "num_stages": 3,
        "tma": 1,
    }
    assert TABLE["sm90", "fused", 64, "float16", 1 << 31, True].tile.block_n == 128
    decode = TABLE["sm90", "split_kv", 128, "bfloat16", 8192, True]
    assert (decode.tile.block_n, decode.tile.num_stages, decode.waves) == (64, 3, 1)
    long_decode = TABLE["sm90", "split_kv", 128, "bfloat16", 1 << 31, True]
    assert (long_decode.tile.block_n, long_decode.tile.num_stages, long_decode.waves) == (32, 3, 2)
    paged = TABLE["sm90", "split_kv_paged", 128, "bfloat16", 1 << 31, True]
    assert (paged.tile.block_n, paged.waves) == (32, 2)
    # no TMA without sm_90, and float32 tiles shrunk to the arch's shared memory
    assert not TABLE["sm80", "fused", 128, "bfloat16", 8192, True].tile.tma
    assert TABLE["sm90", "fused", 256, "float32", 8192, True].tile.block_n < 64


def test_buckets() -> None:
    assert heuristics.bucket(1, LENGTH_BUCKETS) == 1024
    assert heuristics.bucket(1025, LENGTH_BUCKETS) == 8192
    assert heuristics.bucket(1 << 40, LENGTH_BUCKETS) == LENGTH_BUCKETS[-1]
    assert heuristics.bucket(96, HEAD_DIM_BUCKETS) == 128
    assert heuristics.bucket(512, HEAD_DIM_BUCKETS) == 256


@pytest.mark.parametrize(
    ("example", "sizes", "schedule"),
    [
        ("causal", {"B": 1, "H": 2, "M": 64, "N": 64, "D": 64}, "fused"),
        ("decode", None, "split_kv"),
        ("paged_decode", None, "split_kv_paged"),
        ("naive", {"B": 1, "H": 2, "M": 64, "N": 64, "D": 64}, "naive"),
    ],
)
def test_a_call_looks_up_its_schedule(
    example: str, sizes: dict[str, int] | None, schedule: str
) -> None:
    kernel = attncc.compile(EXAMPLES / f"{example}.attn").ir
    if sizes is None:
        sizes = {dim: 16 for dim in kernel.dims}
    key = heuristics.key_for(kernel, sizes, torch.float16, CPU)
    assert key[0] == "cpu" and key[1] == schedule and key[3] == "float16"


def test_the_lookup_drops_tma_under_a_tile_index_and_fits_large_head_dims() -> None:
    doc = attncc.compile(EXAMPLES / "document_mask.attn").ir
    assert doc.tile_index is not None
    sizes = {dim: 64 for dim in doc.dims} | {"D": 128}
    assert heuristics.config_for(doc, sizes, torch.bfloat16, CPU)["tma"] == 0
    causal = attncc.compile(EXAMPLES / "causal.attn").ir
    wide = {"B": 1, "H": 1, "M": 64, "N": 64, "D": 1024}
    config = heuristics.config_for(causal, wide, torch.float32, CPU)
    assert config == TABLE["cpu", "fused", 256, "float32", 1024, True].launch()  # no limit on CPU
    tile = heuristics.fit(
        TABLE["sm90", "fused", 256, "bfloat16", 1024, True].tile, 1024, 1024, 2, 227 * 1024
    )
    assert heuristics.estimate_bytes(tile, 1024, 1024, 2) <= 227 * 1024


def test_float32_takes_its_measured_rows_at_every_length() -> None:
    """float32 fused calls at head dims 64 and 128 take the float32 sweep's tiles (no TMA),
    at every key length: the 16-bit row for 16k keys does not outrank them."""
    for n in LENGTH_BUCKETS:
        assert TABLE["sm90", "fused", 64, "float32", n, True].launch() == {
            "BLOCK_M": 32,
            "BLOCK_N": 64,
            "num_warps": 4,
            "num_stages": 3,
            "tma": 0,
        }
        tile = TABLE["sm90", "fused", 128, "float32", n, True].tile
        assert (tile.block_m, tile.block_n, tile.num_stages, tile.tma) == (32, 32, 3, False)
    # other schedules and head dim 256 keep the 16-bit rows, fitted to float32's bytes
    assert TABLE["sm90", "split_kv", 128, "float32", 8192, True].waves == 1
    assert TABLE["sm90", "fused", 256, "float32", 1024, True].tile.block_m == 64


def test_float32_without_a_mask_takes_wider_tiles_where_measured() -> None:
    """A spec without a mask (every row sees every key) takes its own float32 row at head dim
    64 and 1025-8192 keys (128 x 64, 8 warps: full attention's best, not causal's); at other
    lengths, and for a spec with any mask, the masked rows; 16-bit rows do not depend on it."""
    full = attncc.compile(EXAMPLES / "fused.attn").ir
    causal = attncc.compile(EXAMPLES / "causal.attn").ir
    sizes = {"B": 2, "H": 8, "M": 2048, "N": 2048, "D": 64}
    assert heuristics.key_for(full, sizes, torch.float32, CPU)[5] is False
    assert heuristics.key_for(causal, sizes, torch.float32, CPU)[5] is True
    wide = TABLE["sm90", "fused", 64, "float32", 8192, False].tile
    assert (wide.block_m, wide.block_n, wide.num_warps, wide.num_stages, wide.tma) == (
        128,
        64,
        8,
        3,
        False,
    )
    for n in (1024, 1 << 31):
        assert (
            TABLE["sm90", "fused", 64, "float32", n, False]
            == TABLE["sm90", "fused", 64, "float32", n, True]
        )
    assert TABLE["sm90", "fused", 128, "float32", 8192, False].tile.block_m == 32
    for arch, schedule, d, dtype, n, masked in TABLE:
        if dtype != "float32" and not masked:
            assert (
                TABLE[arch, schedule, d, dtype, n, False]
                == TABLE[arch, schedule, d, dtype, n, True]
            )


def test_fp8_kernels_take_their_own_rows() -> None:
    """An FP8 kernel's calls output bfloat16; the table keys them by their e4m3 inputs, whose
    tiles take half the shared memory (FP8 P·V wants wider key tiles than bfloat16)."""
    fp8 = attncc.compile(EXAMPLES / "fp8_block.attn").ir
    sizes = {"B": 1, "H": 2, "M": 4096, "N": 4096, "D": 128, "MB": 32, "NB": 32}
    key = heuristics.key_for(fp8, sizes, torch.bfloat16, CPU)
    assert key[3] == "float8_e4m3fn"
    fp8_tile = TABLE["sm90", "fused", 128, "float8_e4m3fn", 8192, True].tile
    assert fp8_tile != TABLE["sm90", "fused", 128, "bfloat16", 8192, True].tile
    assert (fp8_tile.block_m, fp8_tile.block_n, fp8_tile.num_warps) == (64, 128, 4)
