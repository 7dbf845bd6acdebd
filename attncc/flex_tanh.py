"""tanh on the GPU's ``tanh.approx.f32`` inside FlexAttention's score_mod, for the benchmark.

attncc's CUDA kernels compute soft-capping's tanh with ``tanh.approx.f32`` (one MUFU
instruction); Inductor lowers ``torch.tanh`` to libdevice's exact tanh, several times the
instructions a score. FlexAttention users who cap scores use the approximate instruction
too (attention-gym's soft-capping mod lowers a custom op to it through
``inline_asm_elementwise``), so the benchmark's Flex anchor does the same: a comparison
against Flex's exact tanh would flatter attncc.

``approx_tanh()`` is that op (``attncc_bench::tanh_approx``): exact ``torch.tanh`` when run
eagerly (on the CPU, in tests), the approximate instruction once Inductor compiles it for a
CUDA kernel, with a backward of ``1 - tanh^2`` so Flex's backward can differentiate the
score_mod. It leans on Inductor internals (``register_lowering``, ``make_pointwise``,
``ops.inline_asm_elementwise``): where they are missing it returns None and the anchor keeps
``torch.tanh``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

_ASM = "tanh.approx.f32 $0, $1;"


@functools.cache
def approx_tanh() -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The op (registered once a process), or None where this torch cannot lower it."""
    try:
        from torch._inductor.lowering import make_pointwise, register_lowering
        from torch._inductor.virtualized import ops
    except ImportError:
        return None

    @torch.library.custom_op("attncc_bench::tanh_approx", mutates_args=())
    def tanh_approx(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)

    @tanh_approx.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(output)

    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        result: torch.Tensor = grad * (1 - y * y)
        return result

    tanh_approx.register_autograd(backward, setup_context=setup_context)

    def lowering(x: Any) -> Any:
        asm = functools.partial(ops.inline_asm_elementwise, asm=_ASM, dtype=torch.float32)
        return make_pointwise(asm)(x)

    try:
        register_lowering(torch.ops.attncc_bench.tanh_approx)(lowering)
    except Exception:  # another Inductor's lowering registry: keep the exact tanh
        return None
    return tanh_approx
