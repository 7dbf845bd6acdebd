"""The launch configuration a Triton call uses when nothing was tuned for it: a checked-in table.

Keyed by (arch family, schedule, head-dim bucket, dtype, key-length bucket, whether the spec
masks keys); each entry is a
``TileConfig`` plus, for the split-KV schedules, ``waves`` (how many times over the key-axis
splits fill the GPU). First calls take it instead of tuning (tuning a prefill spec took 15 s
on an H100 and over 200 s with a per-head input on an H200); ``attncc tune`` writes tuned
entries that later calls prefer (attncc.runtime.autotune).

The 16-bit sm_90 rows are the tuner's picks from the sweeps and matrices already run (each
row names its measurement), the FP8 row at head dim 128 the best of an FP8 tile sweep, and the
float32 fused rows at head dims 64 and 128 the best of a float32 tile sweep (with a row of
their own for specs without a mask where full attention's best differs from causal's); other
FP8 and float32 rows are the 16-bit ones. The sm_80 / other rows were never measured:
they are the sm_90 row of their dtype (without TMA where the GPU has none) shrunk until it
fits that arch's shared memory, by the same estimate and steps the generated host's default
used.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import Any

import torch

from attncc.ir.nodes import AttentionKernel, TileConfig
from attncc.passes.tiling import PREFILL_RULES, SINGLE_QUERY_RULES

ARCHS = ("sm90", "sm80", "other", "cpu")
SCHEDULES = ("fused", "split_kv", "split_kv_paged", "naive")
# the inputs' dtype (an FP8 kernel's calls output bfloat16: keyed by their e4m3 inputs)
DTYPES = ("float16", "bfloat16", "float32", "float8_e4m3fn")
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1}
# upper bounds of the buckets (the last takes anything larger)
HEAD_DIM_BUCKETS = (64, 128, 256)
LENGTH_BUCKETS = (1024, 8192, 1 << 31)
# shared memory a program may use, per arch family (bytes): H100/H200 227 KB, A100 163 KB,
# sm_86/sm_89 99 KB; the interpreter has no limit
SHARED_MEMORY = {"sm90": 227 * 1024, "sm80": 163 * 1024, "other": 99 * 1024, "cpu": 1 << 30}


@dataclass(frozen=True, slots=True)
class Entry:
    tile: TileConfig
    waves: int = 0  # split-KV only (0: a fused or naive entry)

    def launch(self) -> dict[str, int]:
        """The generated module's ``config`` for this entry."""
        config = {
            "BLOCK_M": self.tile.block_m,
            "BLOCK_N": self.tile.block_n,
            "num_warps": self.tile.num_warps,
            "num_stages": self.tile.num_stages,
            "tma": int(self.tile.tma),
        }
        if self.waves:
            config["waves"] = self.waves
        return config


# arch, schedule, head-dim bucket, dtype, length bucket, masked (the spec has a mask)
Key = tuple[str, str, int, str, int, bool]

# sm_90, 16-bit inputs: (schedule, head-dim bucket, length bucket, entry); 0 = any length.
_SM90_16BIT: tuple[tuple[str, int, int, Entry], ...] = (
    # Tuned picks of document_mask at D=64, 1k-8k, bf16 and fp16 (H100 matrix, 2026-11-24:
    # matrix_h100.jsonl's config column); causal and full at D=64 were CUDA-target rows, so
    # this is the nearest measured Triton pick for them.
    ("fused", 64, 0, Entry(TileConfig(64, 64, 4, 3, tma=True))),
    # ... and at 16k (both dtypes) the wider key tile.
    ("fused", 64, 1 << 31, Entry(TileConfig(64, 128, 4, 3, tma=True))),
    # The sweep's best for causal (653.8 us) and full (1159.4 us) at 4,16,4096,128, H200
    # (benchmarks/sweep.py; 128x128 w8 s3 TMA within 0.4%); the tuned pick of document_mask
    # at D=128 at every length 1k-16k (H100 matrix; without TMA there, as a tile index asks).
    ("fused", 128, 0, Entry(TileConfig(64, 64, 4, 3, tma=True))),
    # Tuned pick at D=256, 4k: 64x64 w4 s3 TMA (H100 matrix); 3 stages exceed the host's
    # shared-memory estimate at D=256, so 2 (what the default path shrank it to).
    ("fused", 256, 0, Entry(TileConfig(64, 64, 4, 2, tma=True))),
    # Decode, GQA 32/8, D=128: 16x64 w4 s3, one wave was the best at B=1 8k (16.5 us) and B=8
    # 8k (70.9 us) in the H200 sweeps and the tuned pick at B=1 8k on the H100 (7 of 7 runs).
    ("split_kv", 256, 0, Entry(TileConfig(16, 64, 4, 3), 1)),
    # Past 8k: 16x32 w4 s3, two waves: within 4% of the best tuning candidate at B=1 and B=8
    # 32k (H200, `heuristic_check.py`: 41.0 against 16x128 s3's 39.5 us; 252.7 against 16x64
    # s3's 246.7), and at B=8 32k one of the H100's two picks. The H100's pick at B=1 32k,
    # 16x128 s3, exceeds the host's shared-memory estimate at D=128: shrunk to 2 stages it
    # ran 46.5 us (H200).
    ("split_kv", 256, 1 << 31, Entry(TileConfig(16, 32, 4, 3), 2)),
    # Paged decode (page 16): 16x32 w4 s3, two waves, the H100's pick at B=1 and B=8, 8k and
    # 32k (7 runs each, one exception at B=1 32k).
    ("split_kv_paged", 256, 0, Entry(TileConfig(16, 32, 4, 3), 2)),
    # Naive kernels were never tuned: the fused tile without TMA (which they do not use).
    ("naive", 256, 0, Entry(TileConfig(64, 64, 4, 3))),
)


# sm_90, FP8 inputs: where they differ from the 16-bit rows (others were never measured).
_SM90_FP8: tuple[tuple[str, int, int, Entry], ...] = (
    # 1,16,8192,128, full / causal (H200, `fp8_speed.py --configs`, docs/performance.md
    # "FP8 speed"): 64x128 w4 s3 819.5 / 468.5 us, 64x64 w4 s4 950.3 / 516.7, 128x128 w8 s3
    # 1003.9 / 550.2.
    ("fused", 128, 0, Entry(TileConfig(64, 128, 4, 3, tma=True))),
)


# sm_90, float32 inputs (exact products as tf32x3 unless TF32 is allowed): the best of each
# case's tuning candidates and smaller tiles, timed as CUDA-graph replays (H200,
# `heuristic_check.py --graphed --dtype fp32 --extra ...`, docs/performance.md "Float32 tiles").
# The 16-bit rows' 64 x 64 tiles, shrunk, ran 1.2-1.6x the best there.
_SM90_FP32: tuple[tuple[str, int, int, Entry], ...] = (
    # Head dim 64: 32x64 w4 s3 the best of causal at 64-2048 tokens (2,8,2048,64: 245.8 us
    # against 317.3 for 64x64 TMA) and of full at 512; full at 2048 ran 390.5 against
    # 128x64 w8's 332.4 (a key bucket holds both masks: causal's pick).
    ("fused", 64, 0, Entry(TileConfig(32, 64, 4, 3))),
    # Head dim 128: 32x32 w4 s3 the best of causal at 512 and 2048 tokens (524.0 us against
    # 753.9 for 64x64 TMA with 2 stages at 2,8,2048,128).
    ("fused", 128, 0, Entry(TileConfig(32, 32, 4, 3))),
)


# sm_90, float32, specs without a mask (every row sees every key): where a masked spec's
# (causal's) pick is not theirs.
_SM90_FP32_MASK_FREE: tuple[tuple[str, int, int, Entry], ...] = (
    # Head dim 64, 1025-8192 keys: 128x64 w8 s3 ran full 2,8,2048,64 in 332.4 us against
    # 390.5 for causal's 32x64 w4 (and 1.13x causal's time at causal 2,8,2048,64); at 512
    # keys 32x64 w4 stays the best (28.9 against 45.3 us) (H200, CUDA-graph replays,
    # `heuristic_fp32_sweep_h200.jsonl`).
    ("fused", 64, 8192, Entry(TileConfig(128, 64, 8, 3))),
)


def estimate_bytes(tile: TileConfig, head_dim: int, value_dim: int, itemsize: int) -> int:
    """The generated host's shared-memory estimate: Q once, K and V per stage, and a quarter
    on top for layout conversions."""
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    block_dv = max(16, 1 << (value_dim - 1).bit_length())
    tiles = tile.block_m * block_d + tile.num_stages * tile.block_n * (block_d + block_dv)
    return tiles * itemsize * 5 // 4


def fit(tile: TileConfig, head_dim: int, value_dim: int, itemsize: int, limit: int) -> TileConfig:
    """``tile`` shrunk until ``estimate_bytes`` fits ``limit``: stages down to 2, then the key
    tile, then the query tile down to 16 (the generated host's steps), then one stage (float32
    at head dim 256 on a 99 KB sm_86/sm_89 needs it)."""
    while estimate_bytes(tile, head_dim, value_dim, itemsize) > limit:
        if tile.num_stages > 2:
            tile = replace(tile, num_stages=tile.num_stages - 1)
        elif tile.block_n > 16:
            tile = replace(tile, block_n=tile.block_n // 2)
        elif tile.block_m > 16:
            tile = replace(tile, block_m=tile.block_m // 2)
        elif tile.num_stages > 1:
            tile = replace(tile, num_stages=1)
        else:
            break
    return tile


def _rule(
    own: tuple[tuple[tuple[str, int, int, Entry], ...], ...],
    rows: tuple[tuple[str, int, int, Entry], ...],
    schedule: str,
    d: int,
    n: int,
) -> Entry:
    """The most specific row for (schedule, head-dim bucket, length bucket): the smallest
    head-dim bound covering ``d``, a row of the first of ``own`` (the dtype's tables, the
    most specific first) that has one there over the shared ``rows``, then a row of length
    ``n`` over an any-length row."""
    for bound in HEAD_DIM_BUCKETS:
        if bound < d:
            continue
        for table in (*own, rows):
            found = [r for r in table if r[0] == schedule and r[1] == bound and r[2] in (n, 0)]
            if found:
                return max(found, key=lambda r: r[2] == n)[3]
    raise KeyError((schedule, d, n))


def _cpu_entry(schedule: str, d: int) -> Entry:
    """The interpreter runs the IR's default tiles (attncc.passes.tiling): the CPU tests
    were written against them."""
    if schedule.startswith("split_kv"):
        return Entry(SINGLE_QUERY_RULES[0][1], 1)
    tile = next(c for bound, c in PREFILL_RULES if bound == 0 or d <= bound)
    return Entry(replace(tile, tma=tile.tma and schedule == "fused"))


# the rows a dtype takes before the 16-bit ones (those where it differs), and before those
# the rows a spec without a mask takes
_ROWS = {"float8_e4m3fn": _SM90_FP8, "float32": _SM90_FP32}
_MASK_FREE_ROWS = {"float32": _SM90_FP32_MASK_FREE}


def _build() -> dict[Key, Entry]:
    table: dict[Key, Entry] = {}
    keys = itertools.product(
        ARCHS, SCHEDULES, HEAD_DIM_BUCKETS, DTYPES, LENGTH_BUCKETS, (True, False)
    )
    for key in keys:
        arch, schedule, d, dtype, n, masked = key
        if arch == "cpu":
            table[key] = _cpu_entry(schedule, d)
            continue
        mask_free = () if masked else _MASK_FREE_ROWS.get(dtype, ())
        entry = _rule((mask_free, _ROWS.get(dtype, ())), _SM90_16BIT, schedule, d, n)
        tile = entry.tile if arch == "sm90" else replace(entry.tile, tma=False)
        tile = fit(tile, d, d, ITEMSIZE[dtype], SHARED_MEMORY[arch])
        table[key] = replace(entry, tile=tile)
    return table


TABLE: dict[Key, Entry] = _build()


def bucket(value: int, bounds: tuple[int, ...]) -> int:
    """The first bound at least ``value`` (the last bound for anything larger)."""
    return next((b for b in bounds if value <= b), bounds[-1])


@functools.lru_cache(maxsize=16)
def arch_of(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    major = torch.cuda.get_device_capability(device)[0]
    return "sm90" if major == 9 else "sm80" if major == 8 else "other"


@functools.lru_cache(maxsize=16)
def shared_memory(device: torch.device) -> int:
    if device.type != "cuda":
        return SHARED_MEMORY["cpu"]
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024


def splits(kernel: AttentionKernel, sizes: dict[str, int]) -> bool:
    """Whether a call of these sizes runs the split-KV kernels."""
    rows = sizes[kernel.query_axis.dim] if kernel.query_axis is not None else 1
    return kernel.schedule == "split_kv" or rows <= kernel.split_max_queries


def schedule_of(kernel: AttentionKernel, sizes: dict[str, int]) -> str:
    """The table's schedule for a call: paged split-KV where the key axis is derived from
    others (``dims N = NP * PAGE``: keys read through a page table)."""
    if kernel.schedule == "naive":
        return "naive"
    if splits(kernel, sizes):
        return "split_kv_paged" if kernel.derived_dims else "split_kv"
    return "fused"


def key_for(
    kernel: AttentionKernel, sizes: dict[str, int], dtype: torch.dtype, device: torch.device
) -> Key:
    head_dim = max(sizes[kernel.head_axis.dim], sizes[kernel.value_axis.dim])
    return (
        arch_of(device),
        schedule_of(kernel, sizes),
        bucket(head_dim, HEAD_DIM_BUCKETS),
        "float8_e4m3fn" if kernel.fp8 else str(dtype).removeprefix("torch."),
        bucket(sizes[kernel.key_axis.dim], LENGTH_BUCKETS),
        bool(kernel.masks),
    )


def config_for(
    kernel: AttentionKernel, sizes: dict[str, int], dtype: torch.dtype, device: torch.device
) -> dict[str, Any]:
    """The table's launch configuration for a call, fitted to this GPU's shared memory at the
    call's head dims (a head dim past the last bucket, a GPU with less than its family's)."""
    key = key_for(kernel, sizes, dtype, device)
    entry = TABLE[key]
    tile = entry.tile
    if kernel.tile_index is not None:  # K/V tiles listed by the tile index: pointer loads
        tile = replace(tile, tma=False)
    tile = fit(
        tile,
        sizes[kernel.head_axis.dim],
        sizes[kernel.value_axis.dim],
        ITEMSIZE.get(key[3], dtype.itemsize),
        shared_memory(device),
    )
    return replace(entry, tile=tile).launch()
