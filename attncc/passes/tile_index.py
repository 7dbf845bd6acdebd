"""tile-index: plan a block-sparse list of key tiles for fused kernels with separable masks.

Masks like ``doc[b, m] == doc[b, n]`` leave most key tiles of a query tile either dead (no
pair of the two tiles can pass) or full (every pair passes), and which is known only from the
tensors at call time. Rather than have every attention program scan its key range, small
kernels classify each (query tile, key tile) once per call from the value ranges of both
tiles, and the attention kernel walks two compact lists: partial tiles with every mask
applied per element, and full tiles with no mask arithmetic (FlexAttention's BlockMask, but
derived from the IR).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from attncc.ir import nodes as ir
from attncc.ir.verify import indices_of


def index_axes(
    kernel: ir.AttentionKernel, masks: tuple[ir.SeparableMask, ...]
) -> tuple[ir.Axis, ...]:
    """The batch axes a tile's classification depends on: those read by the key bounds and
    by either side of ``masks``, in batch order."""
    plan = kernel.mask_plan
    assert plan is not None
    read: set[str] = set()
    for bound in (*plan.lower, *plan.upper):
        read |= indices_of(bound.expr)
    for sep in masks:
        read |= indices_of(sep.row) | indices_of(sep.key)
    return tuple(a for a in kernel.batch_axes if a.index in read)


@dataclass(frozen=True)
class BuildTileIndex:
    """Before: ``schedule`` and ``mask_plan`` are set; ``tile_index`` is None.
    After: ``tile_index`` is set iff the kernel runs fused, has a query axis and its mask plan
    lists separable masks. It tests every separable mask, varies over exactly the batch axes
    that the bounds and those masks read, and allows full tiles iff every residual mask is
    one of them.
    """

    name: str = "tile-index"

    def run(self, kernel: ir.AttentionKernel) -> ir.AttentionKernel:
        plan = kernel.mask_plan
        assert plan is not None
        if kernel.schedule != "fused" or kernel.query_axis is None or not plan.separable:
            return kernel
        masks = plan.separable
        full = all(any(s.is_form_of(r) for s in masks) for r in plan.residual)
        index = ir.TileIndex(index_axes(kernel, masks), masks, full)
        return replace(kernel, tile_index=index)
