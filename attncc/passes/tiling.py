"""tiling: block sizes for the query and key axes, warps and pipeline stages."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from attncc.ir.nodes import AttentionKernel, TileConfig, Tiling

# The module's own defaults, for calls that bypass a Kernel (a standalone module, pinned
# tiling options) and for the interpreter; Kernel calls on a GPU take the per-arch table of
# attncc/runtime/heuristics.py or a tuned entry.
# Hopper defaults (see docs/performance.md): at head dims 65-128, 64x64 tiles of one warp
# group with TMA copies, two programs a multiprocessor (the tuner's pick for causal, full and
# GQA attention on the H100 and the H200, 10-13% faster than 128x64 with 8 warps; without TMA
# where a tile index lists the key tiles, the sweep's pick for document masks); wide query
# tiles at head dims up to 64; narrower tiles past 128.
PREFILL_RULES = (
    (64, TileConfig(128, 64, 4, 3)),
    (128, TileConfig(64, 64, 4, 3, tma=True)),
    (0, TileConfig(64, 32, 4, 2)),
)
# One query row (decode): the tile's rows are mostly padding, keep it at the dot minimum.
SINGLE_QUERY_RULES = ((0, TileConfig(16, 64, 4, 3)),)


@dataclass(frozen=True)
class Tile:
    """Before: ``tiling`` is None (``tile_index`` set, if the kernel has one). After: default
    configurations by head dim.

    The head dim is a runtime size, so these are defaults; the runtime may override them per
    call (smaller query tiles for short inputs, autotuned configurations on a GPU). Giving
    any of ``block_m``, ``block_n``, ``num_warps``, ``num_stages`` pins it in every rule.
    """

    block_m: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    name: str = "tiling"

    def run(self, kernel: AttentionKernel) -> AttentionKernel:
        rules: tuple[tuple[int, TileConfig], ...] = (
            PREFILL_RULES if kernel.schedule != "split_kv" else SINGLE_QUERY_RULES
        )
        if kernel.tile_index is not None:
            rules = tuple((bound, replace(c, tma=False)) for bound, c in rules)
        pinned: dict[str, Any] = {
            key: value
            for key, value in (
                ("block_m", self.block_m),
                ("block_n", self.block_n),
                ("num_warps", self.num_warps),
                ("num_stages", self.num_stages),
            )
            if value is not None
        }
        tiling = Tiling(tuple((bound, replace(c, **pinned)) for bound, c in rules))
        return replace(kernel, tiling=tiling)
