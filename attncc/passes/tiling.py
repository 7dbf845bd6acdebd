"""tiling: block sizes for the query and key axes, warps and pipeline stages."""

from __future__ import annotations

from dataclasses import dataclass, replace

from attncc.ir.nodes import AttentionKernel, TileConfig, Tiling

# Hopper defaults (see docs/performance.md): wide query tiles and 8 warps while the fp32
# accumulator fits in registers; narrower tiles past head dim 128.
PREFILL_RULES = (
    (64, TileConfig(128, 64, 4, 3)),
    (128, TileConfig(128, 64, 8, 3)),
    (0, TileConfig(64, 32, 4, 2)),
)
# One query row (decode): the tile's rows are mostly padding, keep it at the dot minimum.
SINGLE_QUERY_RULES = ((0, TileConfig(16, 64, 4, 3)),)


@dataclass(frozen=True)
class Tile:
    """Before: ``tiling`` is None. After: default configurations by head dim.

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
        rules = PREFILL_RULES if kernel.schedule != "split_kv" else SINGLE_QUERY_RULES
        pinned = {
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
