"""Autograd for plain eager calls: a ``torch.autograd.Function`` around a kernel's launch
and its backward (attncc.runtime.autograd.Backward).

The kernel's torch op (attncc.runtime.op) carries the same autograd for ``torch.compile``
and other tracers; called eagerly it costs the dispatcher twice and torch.library's
autograd wrapper. A plain eager call (no tracing, no dispatch mode or functorch transform,
plain tensors) needs none of that, so it takes this Function: the launch, the saved tensors
and the backward, the gradients the op's backward would give. A forward of causal
1,16,2048,128 bf16 with inputs requiring grad took 113 us of CPU through the op, 83 through
this Function, against FA2's 49 (H200, best of three processes,
``benchmarks/backward_host.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable


class EagerAttention(torch.autograd.Function):
    """``apply(kernel, params, *inputs)`` -> (out, lse): ``kernel`` an
    attncc.runtime.kernel.Kernel with a Backward, ``params`` the call's params by name,
    ``inputs`` its tensors in declaration order."""

    @staticmethod
    def forward(kernel: Any, params: dict[str, Any], *inputs: torch.Tensor) -> Any:
        tensors = dict(zip(kernel.input_names, inputs, strict=True))
        # a copy: a first call's launch fills in the params' defaults, and the backward's
        # record of a call geometry is keyed by the params as the caller gave them
        return kernel._launch(tensors, dict(params), True)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        kernel, params, *tensors = inputs
        out, lse = output
        ctx.save_for_backward(*tensors, out, lse)
        ctx.kernel, ctx.params = kernel, params

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor) -> tuple[Any, ...]:
        kernel = ctx.kernel
        *inputs, out, lse = ctx.saved_tensors
        names = kernel.input_names
        needs = ctx.needs_input_grad[2:]  # after kernel and params
        backward = kernel._backward
        wanted = [bool(needs[names.index(name)]) for name in backward.floats]
        tensors = dict(zip(names, inputs, strict=True))
        grads = backward.run(
            kernel._host, tensors, ctx.params, out, lse, grad_out, grad_lse, needs=wanted
        )
        result: list[Any] = [None] * len(names)
        for name, grad, need in zip(backward.floats, grads, wanted, strict=True):
            if need:
                result[names.index(name)] = grad
        return (None, None, *result)
