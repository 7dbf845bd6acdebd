"""The pass pipeline from a lowered kernel to one ready for code generation."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attncc.ir.nodes import AttentionKernel, Schedule
from attncc.ir.verify import verify
from attncc.passes.base import Pass
from attncc.passes.gqa import GqaMapping
from attncc.passes.mask_analysis import MaskAnalysis
from attncc.passes.schedule import ChooseSchedule
from attncc.passes.tile_index import BuildTileIndex
from attncc.passes.tiling import Tile


def default_passes(
    schedule: Schedule | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> list[Pass]:
    """The pipeline; the tiling options pin a block size, warps or stages in every rule."""
    tile = Tile(block_m, block_n, num_warps, num_stages)
    return [GqaMapping(), MaskAnalysis(), ChooseSchedule(schedule), BuildTileIndex(), tile]


PASS_NAMES = tuple(p.name for p in default_passes())


def run_passes(
    kernel: AttentionKernel,
    passes: Sequence[Pass] | None = None,
    *,
    after_each: Callable[[Pass, AttentionKernel], None] | None = None,
    check: bool = True,
) -> AttentionKernel:
    """Run ``passes`` in order, verifying the IR after each one when ``check``."""
    for p in passes if passes is not None else default_passes():
        kernel = p.run(kernel)
        if check:
            verify(kernel)
        if after_each is not None:
            after_each(p, kernel)
    return kernel
