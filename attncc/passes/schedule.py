"""choose-schedule: fix how the kernel runs when the spec (or caller) did not say."""

from __future__ import annotations

from dataclasses import dataclass, replace

from attncc.ir import nodes as ir
from attncc.ir.verify import indices_of

# Up to this many queries per sequence (decode, speculative decoding), fused kernels switch to
# split-KV at run time: too few query rows to fill the GPU with one program per head.
SPLIT_MAX_QUERIES = 16


def group_subscript(kernel: ir.AttentionKernel) -> ir.Expr | None:
    """The key subscript ``h / (H / KVH)`` of a GQA kernel."""
    if kernel.group is None:
        return None
    head, kv_dim = kernel.group.head, kernel.group.kv_dim
    return ir.BinOp(
        "/",
        ir.Index(head.index),
        ir.BinOp("/", ir.Dim(head.dim), ir.Dim(kv_dim), "int"),
        "int",
    )


def fused_only_reason(kernel: ir.AttentionKernel) -> str | None:
    """FP8 tiles and a per-key value scale are written for the fused kernel only."""
    if kernel.fp8:
        return "FP8 inputs run fused only (for now)"
    if kernel.value_scale is not None:
        return "a value scale runs fused only (for now)"
    return None


def split_kv_blocker(kernel: ir.AttentionKernel) -> str | None:
    """Why this kernel cannot run split-KV, or None when it can.

    Split-KV gives one program all query heads of a kv head, so the query head varies across
    the program's rows: keys and values may read it only through the GQA mapping, and the
    visible key range may not depend on it.
    """
    if kernel.sink is not None:
        # the split-KV kernels and their merge have no sink term yet
        return "a softmax sink runs fused only (for now)"
    fused_only = fused_only_reason(kernel)
    if fused_only is not None:
        return fused_only
    if kernel.group is None:
        return None
    head = kernel.group.head.index
    mapping = group_subscript(kernel)
    for operand in (kernel.key, kernel.value):
        for sub in operand.indices:
            if sub != mapping and head in indices_of(sub):
                return f"'{operand.tensor}' reads head index '{head}' other than through GQA"
    assert kernel.mask_plan is not None
    for bound in (*kernel.mask_plan.lower, *kernel.mask_plan.upper):
        if head in indices_of(bound.expr):
            return f"the visible key range depends on head index '{head}'"
    return None


@dataclass(frozen=True)
class ChooseSchedule:
    """Before: ``schedule`` may be None; ``group`` and ``mask_plan`` are set.
    After: ``schedule`` is naive, fused or split_kv, and ``split_max_queries`` says up to how
    many queries a fused kernel dispatches to split-KV at run time.

    ``override`` (from ``attncc.compile(schedule=...)``) wins over the spec's `schedule` line.
    Without either: single-query specs (decode) run split-KV; others run fused, and switch to
    split-KV for short query lengths where split-KV can run.
    """

    override: ir.Schedule | None = None
    name: str = "choose-schedule"

    def run(self, kernel: ir.AttentionKernel) -> ir.AttentionKernel:
        chosen = self.override or kernel.schedule
        blocker = split_kv_blocker(kernel)
        if chosen == "split_kv" and blocker is not None:
            raise ValueError(f"attncc {kernel.name}: cannot run split_kv: {blocker}")
        if chosen == "naive" and kernel.sink is not None:
            raise ValueError(
                f"attncc {kernel.name}: cannot run naive: a softmax sink runs fused only (for now)"
            )
        if chosen == "naive" and fused_only_reason(kernel) is not None:
            raise ValueError(f"attncc {kernel.name}: cannot run naive: {fused_only_reason(kernel)}")
        if chosen is None:
            chosen = "split_kv" if kernel.query_axis is None and blocker is None else "fused"
        explicit = (self.override or kernel.schedule) is not None
        auto_split = chosen == "fused" and not explicit and blocker is None
        return replace(
            kernel, schedule=chosen, split_max_queries=SPLIT_MAX_QUERIES if auto_split else 0
        )
