"""``attncc.compile``: spec → IR → passes → Triton source → a callable ``Kernel``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attncc.codegen import triton as triton_backend
from attncc.ir import lower
from attncc.ir.nodes import AttentionKernel, Schedule
from attncc.passes import run_passes
from attncc.passes.gqa import GqaMapping
from attncc.passes.mask_analysis import MaskAnalysis
from attncc.passes.schedule import ChooseSchedule
from attncc.passes.tiling import Tile
from attncc.runtime.kernel import Kernel
from attncc.spec import CheckedSpec, load

TARGETS = ("triton",)
_TILING_OPTIONS = ("block_m", "block_n", "num_warps", "num_stages")


def optimise(
    spec: str | Path | CheckedSpec, schedule: Schedule | None = None, **options: Any
) -> tuple[CheckedSpec, AttentionKernel]:
    """The checked spec and its kernel IR after every pass."""
    unknown = sorted(set(options) - set(_TILING_OPTIONS))
    if unknown:
        raise TypeError(
            f"unknown option {', '.join(unknown)}; options are {', '.join(_TILING_OPTIONS)}"
        )
    checked = load(spec)
    passes = [ChooseSchedule(schedule), GqaMapping(), MaskAnalysis(), Tile(**options)]
    return checked, run_passes(lower(checked), passes)


def compile(  # noqa: A001 - the public name users expect
    spec: str | Path | CheckedSpec,
    target: str = "triton",
    schedule: Schedule | None = None,
    **options: Any,
) -> Kernel:
    """Compile a spec (text, path to a ``.attn`` file, or checked spec) to a ``Kernel``."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; available: {', '.join(TARGETS)}")
    checked, kernel = optimise(spec, schedule, **options)
    rendered = triton_backend.render(kernel, checked.spec.source)
    return Kernel(kernel.name, checked, kernel, rendered.source, rendered.entry)
