"""tiling: block sizes for the query and key axes, warps and pipeline stages."""

from __future__ import annotations

from dataclasses import dataclass, replace

from attncc.ir.nodes import AttentionKernel, Tiling


@dataclass(frozen=True)
class Tile:
    """Before: ``tiling`` is None. After: it holds the default (heuristic) configuration.

    The head dim is a runtime size, so the choice here is a default; the runtime may
    override it per call (smaller query blocks for short or single-query inputs, autotuned
    configurations on a GPU).
    """

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    name: str = "tiling"

    def run(self, kernel: AttentionKernel) -> AttentionKernel:
        block_m = self.block_m if kernel.query_axis is not None else 16
        return replace(
            kernel, tiling=Tiling(block_m, self.block_n, self.num_warps, self.num_stages)
        )
