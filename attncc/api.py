"""``attncc.compile``: spec → IR → passes → Triton or CUDA source → a callable ``Kernel``.

The target is "auto" unless asked for: resolved after the passes by ``attncc.target``."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attncc.codegen import cuda as cuda_backend
from attncc.codegen import triton as triton_backend
from attncc.ir import lower
from attncc.ir.nodes import AttentionKernel, Schedule
from attncc.passes import default_passes, run_passes
from attncc.runtime import triton_warm
from attncc.runtime.kernel import Kernel
from attncc.spec import CheckedSpec, load
from attncc.target import TARGETS, check_target, decided_by_rule, resolve_target

__all__ = ["TARGETS", "Built", "build", "compile", "optimise"]
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
    target: str = "auto",
    schedule: Schedule | None = None,
    **options: Any,
) -> Built:
    """Generate the source for a spec without loading it (``attncc compile -o``).

    ``target`` is "triton", "cuda" or "auto" (``attncc.target.auto_target``: CUDA for fused
    prefill on an sm_90 GPU, Triton otherwise); ``Built.target`` is the one used. ``source``
    is the kernel source of the target (a Triton module, or CUDA C++); ``host`` the Python
    module a ``Kernel`` loads (for Triton the same text)."""
    check_target(target)  # before parsing: a typo should not wait for the passes
    checked = load(spec)
    if target == "cuda" and (schedule or checked.schedule) == "naive":
        # refused before the passes run (the CUDA backend has no naive kernels)
        raise ValueError(
            f"attncc {checked.name}: schedule 'naive' is not available for target cuda "
            "(use schedule 'fused' or 'split_kv', or target 'triton')"
        )
    checked, kernel = optimise(checked, schedule, **options)
    target = resolve_target(target, kernel)
    if target == "cuda":
        cuda = cuda_backend.render(kernel, checked.spec)
        return Built(checked, kernel, cuda.source, cuda.entry, cuda.host, target)
    rendered = triton_backend.render(kernel, checked.spec)
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
    target: str = "auto",
    schedule: Schedule | None = None,
    **options: Any,
) -> Kernel:
    """Compile a spec (text, path to a ``.attn`` file, or checked spec) to a ``Kernel``.

    ``target="cuda"`` renders CUDA C++ instead of Triton, compiled with NVRTC on first call
    (CUDA tensors only). The default, ``"auto"``, picks CUDA where it is the faster backend
    (fused prefill, sm_90 GPU, cuda-python installed) and Triton
    elsewhere; ``Kernel.target`` says which. A kernel auto made CUDA runs the calls its sm_90a
    kernels cannot take (CPU tensors, fp32, head dims past 256, ...) on the spec's Triton
    kernel (``Kernel.fallback``)."""
    if target != "cuda" and torch.cuda.is_available():
        # a Triton kernel, or one whose calls auto may hand to Triton: Triton's one-time
        # start-up work begins beside the code generation (attncc.runtime.triton_warm)
        triton_warm.start()
    built = build(spec, target, schedule, **options)
    fallback = None
    if built.target == "cuda" and decided_by_rule(target):
        # the rule chose CUDA: the calls without an sm_90a kernel go to Triton (attncc.target)
        fallback = functools.partial(compile, built.spec, "triton", schedule, **options)
    return Kernel(
        built.ir.name,
        built.spec,
        built.ir,
        built.source,
        built.entry,
        built.target,
        built.host,
        fallback,
    )
