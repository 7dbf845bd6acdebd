"""choose-schedule: fix how the kernel runs when the spec (or caller) did not say."""

from __future__ import annotations

from dataclasses import dataclass, replace

from attncc.ir.nodes import AttentionKernel, Schedule


@dataclass(frozen=True)
class ChooseSchedule:
    """Before: ``schedule`` may be None. After: it is naive, fused or split_kv.

    ``override`` (from ``attncc.compile(schedule=...)``) wins over the spec's `schedule` line.
    Without either, ``fused`` is chosen: one pass over K and V with an online softmax.
    """

    override: Schedule | None = None
    name: str = "choose-schedule"

    def run(self, kernel: AttentionKernel) -> AttentionKernel:
        schedule = self.override or kernel.schedule or "fused"
        return replace(kernel, schedule=schedule)
