"""``attncc.compile``: spec → IR → passes → Triton or CUDA source → a callable ``Kernel``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attncc.codegen import cuda as cuda_backend
from attncc.codegen import triton as triton_backend
from attncc.ir import lower
from attncc.ir.nodes import AttentionKernel, Schedule
from attncc.passes import default_passes, run_passes
from attncc.runtime.kernel import Kernel
from attncc.spec import CheckedSpec, load

TARGETS = ("triton", "cuda")
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
    return checked, run_passes(lower(checked), default_passes(schedule, **options))


def build(
    spec: str | Path | CheckedSpec,
    target: str = "triton",
    schedule: Schedule | None = None,
    **options: Any,
) -> Built:
    """Generate the source for a spec without loading it (``attncc compile -o``).

    ``source`` is the kernel source of the target (a Triton module, or CUDA C++); ``host``
    the Python module a ``Kernel`` loads (for Triton the same text)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; available: {', '.join(TARGETS)}")
    checked, kernel = optimise(spec, schedule, **options)
    if target == "cuda":
        cuda = cuda_backend.render(kernel, checked.spec.source)
        return Built(checked, kernel, cuda.source, cuda.entry, cuda.host, target)
    rendered = triton_backend.render(kernel, checked.spec.source)
    return Built(checked, kernel, rendered.source, rendered.entry, rendered.source, target)


@dataclass(frozen=True)
class Built:
    spec: CheckedSpec
    ir: AttentionKernel
    source: str
    entry: str
    host: str
    target: str = "triton"


def compile(
    spec: str | Path | CheckedSpec,
    target: str = "triton",
    schedule: Schedule | None = None,
    **options: Any,
) -> Kernel:
    """Compile a spec (text, path to a ``.attn`` file, or checked spec) to a ``Kernel``.

    ``target="cuda"`` renders CUDA C++ instead of Triton, compiled with NVRTC on first call
    (CUDA tensors only)."""
    built = build(spec, target, schedule, **options)
    return Kernel(
        built.ir.name, built.spec, built.ir, built.source, built.entry, built.target, built.host
    )
