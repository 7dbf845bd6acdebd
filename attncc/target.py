"""``target="auto"`` (the default): which backend a kernel compiles for.

"auto" is decided once, at build time, from the optimised IR and this process's GPU; a built
kernel names the backend it got ("triton" or "cuda"), never "auto". The CUDA target wins only
where it was measured to (H100, bf16, D=128; docs/performance.md): fused
prefill on an sm_90 GPU. Everywhere else Triton is as fast or faster, autotunes,
and runs CPU tensors through its interpreter.

``ATTNCC_TARGET=triton|cuda`` makes "auto" mean that target instead (``auto`` or unset: the
rule below); an explicit ``target="triton"`` or ``"cuda"`` ignores it.
"""

from __future__ import annotations

import os

import torch

from attncc.codegen import cuda as cuda_codegen
from attncc.ir.nodes import AttentionKernel
from attncc.runtime import nvrtc

TARGETS = ("auto", "triton", "cuda")
TARGET_ENV = "ATTNCC_TARGET"


def check_target(target: str) -> None:
    """Raise ValueError unless ``target`` is one of ``TARGETS``."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; available: {', '.join(TARGETS)}")


def resolve_target(target: str, kernel: AttentionKernel) -> str:
    """The concrete backend ("triton" or "cuda") ``target`` means for ``kernel``: itself, or
    for "auto" ``$ATTNCC_TARGET`` when set, else ``auto_target(kernel)``."""
    check_target(target)
    if target == "auto":
        target = os.environ.get(TARGET_ENV) or "auto"
        if target not in TARGETS:
            raise ValueError(
                f"{TARGET_ENV}={target!r} is not a target; set it to one of {', '.join(TARGETS)}"
            )
    return auto_target(kernel) if target == "auto" else target


def decided_by_rule(target: str) -> bool:
    """Whether ``resolve_target(target, ...)`` applies ``auto_target`` (not a target asked for
    by name or through ``$ATTNCC_TARGET``): only then may a call fall back to Triton."""
    return target == "auto" and (os.environ.get(TARGET_ENV) or "auto") == "auto"


def auto_target(kernel: AttentionKernel) -> str:
    """``"cuda"`` when ``kernel`` (after every pass) is fused prefill, the current CUDA device
    is sm_90 and cuda-python's bindings are installed; else ``"triton"``. Document masks (a
    tile index) included: the CUDA target runs them at 1.26-1.40x FlexAttention, Triton at
    1.08-1.11x (H100, docs/performance.md).

    The IR conditions go first: they cost nothing, and a decode kernel then never
    initialises CUDA or looks for cuda-python just to be told "triton".
    """
    # What the CUDA target cannot render (softmax sinks, value scales read by key, ...) runs
    # on Triton. So do FP8 specs: the Triton FP8 kernel takes its causal query tiles in
    # pairs (435.8 against the CUDA FP8 kernel's 510.0 us causal at 1,16,8192,128; full
    # 828.7 against 822.3; H200, benchmarks/fp8_speed.py), and the two agree within the
    # Triton kernel's error on every descale form (tests/gpu/test_gpu_cuda.py).
    if kernel.fp8 or cuda_codegen.unsupported(kernel) is not None:
        return "triton"
    # Decode (split_kv, or a fused kernel without a query axis) measured equal or slower on
    # the CUDA target; naive has no CUDA kernels at all.
    if kernel.schedule != "fused" or kernel.query_axis is None:
        return "triton"
    # The CUDA target's lead (1.15-1.25x Triton on causal, full and GQA prefill) comes from
    # its wgmma kernels, an sm_90 instruction; other GPUs get mma.sync kernels, not measured
    # faster than Triton, and CPU tensors need the Triton interpreter.
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return "triton"
    # NVRTC comes through cuda-python: without it the CUDA kernels cannot compile.
    if not nvrtc.available():
        return "triton"
    return "cuda"
