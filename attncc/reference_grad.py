"""Gradients of a spec by torch autograd over a float64 evaluation of its attention.

``reference_grads(spec, inputs, grad_out)`` evaluates the spec's attention with torch ops in
float64 and returns the output and the gradient of every float input. It reads the IR as
lowered from the checked spec (``attncc.ir.lower``, before any optimisation pass): operands
with their index expressions, the score scale, the score modifications, the masks, the
softmax and the output layout. It shares no code with the kernels' backward (no derivative
pass, no tiles), so it can judge them.

Everything is materialised (scores [*batch, M, N]), which suits test sizes. A row whose every
key is masked has probabilities 0, output 0 and gradient 0, never NaN (the forward's
convention). A softmax sink joins each row's normaliser as one more logit with no value.
``dtype`` other than float64 evaluates the same math naively in a lower precision (the
softmax in float32, rounded back, as eager PyTorch's softmax does), its softmax
differentiated by autograd or as flash backwards do (``eager_grads`` gives both): the flash-
attn tolerance rule (``attncc.tolerance.compare_grad``) measures kernels' gradients against
the float64 ones with the error of those evaluations.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from attncc.ir import lower
from attncc.ir import nodes as ir
from attncc.ir.verify import subexprs
from attncc.reference import _bind_sizes
from attncc.spec import CheckedSpec, load
from attncc.spec.check import dtype_type
from attncc.torch_eval import evaluate

__all__ = [
    "SOFTMAX_BACKWARDS",
    "attention",
    "eager_grads",
    "float_inputs",
    "gradient_terms",
    "reference_grads",
]

SoftmaxBackward = Literal["autograd", "flash"]
SOFTMAX_BACKWARDS: tuple[SoftmaxBackward, ...] = ("autograd", "flash")


def float_inputs(kernel: ir.AttentionKernel) -> tuple[str, ...]:
    """Inputs that have gradients: the float ones (integer and bool inputs index or mask)."""
    return tuple(t.name for t in kernel.tensors if dtype_type(t.dtype) == "float")


def _sizes(checked: CheckedSpec, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
    # only the shapes are read; a broadcast view allocates nothing
    shapes = {name: np.broadcast_to(np.empty(()), tuple(t.shape)) for name, t in tensors.items()}
    return _bind_sizes(checked, shapes)


def _params(
    kernel: ir.AttentionKernel, sizes: Mapping[str, int], given: Mapping[str, Any]
) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for p in kernel.params:
        if p.name in given:
            value = given[p.name]
        elif p.default is not None:
            value = evaluate(p.default, {}, sizes, params, {}, float_dtype=torch.float64)
            value = value.item() if isinstance(value, torch.Tensor) else value
        else:
            raise TypeError(f"missing param '{p.name}': it has no default")
        params[p.name] = float(value) if p.type == "float" else int(value)
    return params


def attention(
    kernel: ir.AttentionKernel,
    tensors: Mapping[str, torch.Tensor],
    sizes: Mapping[str, int],
    params: Mapping[str, Any],
    softmax_backward: SoftmaxBackward = "autograd",
) -> torch.Tensor:
    """The output of ``kernel`` (unoptimised IR) on ``tensors``, in their float dtype, laid out
    as the output's left-hand indices; differentiable wherever the inputs are. Below float64,
    ``softmax_backward`` picks how the softmax is differentiated (``_FlashSoftmaxValue``)."""
    batch = [a.index for a in kernel.batch_axes]
    query = kernel.query_axis.index if kernel.query_axis else None
    key, head, value = kernel.key_axis.index, kernel.head_axis.index, kernel.value_axis.index
    device = next(iter(tensors.values())).device
    wide = torch.promote_types(next(iter(tensors.values())).dtype, torch.float32)

    def grid(frame: list[str], fixed: Mapping[str, int]) -> dict[str, Any]:
        """Index tensors for ``frame``: arange along its own axis, size 1 elsewhere."""
        out: dict[str, Any] = {}
        for axis, name in enumerate(frame):
            shape = [1] * len(frame)
            size = fixed[name] if name in fixed else sizes[_dim(kernel, name)]
            shape[axis] = size
            out[name] = torch.arange(size, device=device).reshape(shape)
        return out

    # operands over (batch..., row, col): the query's rows are queries (one for decode)
    row_name = query or "_row"

    def operand(op: ir.Operand, row: str, col: str) -> torch.Tensor:
        frame = [*batch, row, col]
        fixed = {} if row != "_row" else {"_row": 1}
        load = ir.Load(op.tensor, op.indices, "float")
        return torch.as_tensor(
            evaluate(load, grid(frame, fixed), sizes, params, tensors, None, wide)
        )

    q = operand(kernel.query, row_name, head)
    k = operand(kernel.key, key, head)
    v = operand(kernel.value, key, value)
    scores = q @ k.transpose(-1, -2)
    scale = evaluate(kernel.score_scale, {}, sizes, params, tensors, None, wide)
    scores = scores * scale
    frame = grid([*batch, row_name, key], {"_row": 1} if query is None else {})
    # a modification that does not read the score (s = 0.5, s = bias[b, n]) keeps the shape
    # of its own indices: the scores stay a whole [batch..., rows, keys] tensor
    shape = scores.shape
    for mod in kernel.score_mods:
        scores = evaluate(mod, frame, sizes, params, tensors, scores, wide)
        scores = torch.broadcast_to(torch.as_tensor(scores, device=device), shape)
    visible: Any = True
    for mask in kernel.masks:
        visible = visible & torch.as_tensor(
            evaluate(mask, frame, sizes, params, tensors, None, wide)
        )
    visible = torch.broadcast_to(torch.as_tensor(visible, device=device), scores.shape)
    # the softmax in float32 at least, as eager PyTorch computes a 16-bit softmax
    logits = scores.to(wide).masked_fill(~visible, float("-inf"))
    if kernel.sink is not None:
        # the sink: one more logit per row, in the normaliser only (it has no value)
        sink = torch.as_tensor(evaluate(kernel.sink, frame, sizes, params, tensors, None, wide))
        sink = torch.broadcast_to(sink.to(device, wide), (*logits.shape[:-1], 1))
        logits = torch.cat([logits, sink], -1)
    # the weights meet V in V's dtype: a score term of index arithmetic alone (a float32
    # distance) has promoted the scores past 16-bit inputs, as eager PyTorch promotes them
    if wide == torch.float64 or softmax_backward == "autograd":
        probs = _softmax(logits)[..., : v.shape[-2]].to(v.dtype)
        out = probs @ v  # [*batch, rows, value]
    else:
        out = _FlashSoftmaxValue.apply(logits, v, v.dtype)  # type: ignore[no-untyped-call]
    if query is None:
        out = out.squeeze(-2)
        have = [*batch, value]
    else:
        have = [*batch, query, value]
    out = out.expand(*[sizes[_dim(kernel, i)] for i in have])
    return out.permute([have.index(i) for i in kernel.output.indices])


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    peak = logits.amax(-1, keepdim=True).detach()
    # a row with every key masked: shift by 0, so exp(-inf) = 0 rather than NaN
    peak = torch.where(torch.isneginf(peak), torch.zeros_like(peak), peak)
    weights = torch.exp(logits - peak)
    total = weights.sum(-1, keepdim=True)
    return weights / torch.where(total == 0, torch.ones_like(total), total)


class _FlashSoftmaxValue(torch.autograd.Function):
    """``softmax(logits)[..., :keys] @ v`` in a low precision, differentiated as every flash
    backward (and the kernels') does: dS = P * (dP - delta) with delta = rowsum(dO * O) from
    the rounded output. Autograd's softmax backward takes delta = rowsum(dP * P) from the
    same rounded dP instead, so each row of its dS sums to zero within rounding and a
    gradient reduced over the keys (ALiBi's slopes) misses by far less than any flash
    backward does: fp32, B=2 H=3 M=16 N=19 D=128, dslopes off by 1.6e-6 against 1.2e-4 for
    this evaluation and 1.1e-4 for the fused kernel. Columns past ``v``'s keys (a sink) join
    the normaliser only."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> Any:
        probs = _softmax(logits)
        out = probs[..., : v.shape[-2]].to(dtype) @ v
        ctx.save_for_backward(probs, v, out)
        ctx.dtype = dtype
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> Any:
        probs, v, out = ctx.saved_tensors
        keys = v.shape[-2]
        dp = (dout @ v.transpose(-1, -2)).to(probs.dtype)
        delta = (dout.to(probs.dtype) * out.to(probs.dtype)).sum(-1, keepdim=True)
        extra = probs.shape[-1] - keys
        dp = torch.cat([dp, dp.new_zeros((*dp.shape[:-1], extra))], -1)
        dlogits = probs * (dp - delta)
        dv = probs[..., :keys].to(ctx.dtype).transpose(-1, -2) @ dout
        return dlogits, dv, None


def _dim(kernel: ir.AttentionKernel, index: str) -> str:
    for axis in kernel.axes:
        if axis.index == index:
            return axis.dim
    raise KeyError(index)


def reference_grads(
    spec: str | Path | CheckedSpec,
    inputs: Mapping[str, torch.Tensor],
    grad_out: torch.Tensor,
    params: Mapping[str, Any] | None = None,
    dtype: torch.dtype = torch.float64,
    softmax_backward: SoftmaxBackward = "autograd",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The output and the gradient of ``sum(out * grad_out)`` for every float input, both
    evaluated in ``dtype`` (float64: the reference) and returned as float64 on the inputs'
    device. Integer and bool inputs get no gradient. ``softmax_backward`` matters below
    float64 only (see ``eager_grads``)."""
    checked = load(spec)
    kernel = lower(checked)
    floats = set(float_inputs(kernel))
    tensors: dict[str, torch.Tensor] = {}
    for t in kernel.tensors:
        given = inputs[t.name].detach()
        if t.name in floats:
            # an input declared with a dtype (an f32 sink beside bf16 q, k, v) keeps it
            keep = dtype != torch.float64 and t.dtype != "float"
            tensors[t.name] = given.to(given.dtype if keep else dtype).requires_grad_(True)
        else:
            tensors[t.name] = given.long() if given.dtype != torch.bool else given
    sizes = _sizes(checked, tensors)
    bound = _params(kernel, sizes, params or {})
    with torch.enable_grad():
        out = attention(kernel, tensors, sizes, bound, softmax_backward)
        wanted = [n for n in tensors if n in floats]
        grads = torch.autograd.grad(
            out,
            [tensors[n] for n in wanted],
            grad_out.to(dtype),
            allow_unused=True,
        )
    result = {
        name: (torch.zeros_like(tensors[name]) if g is None else g).to(torch.float64)
        for name, g in zip(wanted, grads, strict=True)
    }
    return out.detach().to(torch.float64), result


def eager_grads(
    spec: str | Path | CheckedSpec,
    inputs: Mapping[str, torch.Tensor],
    grad_out: torch.Tensor,
    params: Mapping[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, tuple[torch.Tensor, ...]]:
    """Every float input's gradient by each naive evaluation in ``dtype``: the softmax
    differentiated by autograd, and as flash backwards do (``SOFTMAX_BACKWARDS`` order).

    Both are the same math done naively in ``dtype``, and on a gradient reduced over many
    scores (ALiBi's slopes, a sink: few elements, each a sum over b, m and n) each gets lucky
    cancellations the other does not: on 60 drawn ALiBi trials (``attncc check --backward``,
    max length 48) the fused kernel's dslopes was more than 3x off autograd's error in 7
    (fp32 mostly: 89e-6 against 4e-6) and flash's in 5 (fp16 and bf16), never both. The
    tolerance rule (``attncc.tolerance.compare_grad``) takes the larger error of the two:
    one rounding sample of a handful of sums is a poor measure of what rounding costs."""
    evaluations = [
        reference_grads(spec, inputs, grad_out, params, dtype, how)[1] for how in SOFTMAX_BACKWARDS
    ]
    return {name: tuple(grads[name] for grads in evaluations) for name in evaluations[0]}


def gradient_terms(
    spec: str | Path | CheckedSpec,
    inputs: Mapping[str, torch.Tensor],
    params: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """For every float input a score modification or the softmax sink reads (a side input):
    the most terms any one element of its gradient sums, each one score's (or, for a sink,
    one row's) partial derivative. ALiBi's ``slopes[h]`` sums B * (visible scores of a head);
    a bias ``[B, H, M, N]`` element is one score's; a relative table ``rel[h, m - n + N - 1]``
    sums a diagonal. Masked scores are exact zeros everywhere and do not count. Inputs read
    only as q, k or v are absent (their gradients are contractions the tolerance's per-element
    floor already covers). ``attncc.tolerance.compare_grad`` scales its floor by the square root
    of this count: independent roundings of the terms add in quadrature."""
    checked = load(spec)
    kernel = lower(checked)
    floats = set(float_inputs(kernel))
    tensors = {
        name: t.detach().cpu().long()
        if name not in floats and t.dtype != torch.bool
        else t.detach().cpu()
        for name, t in inputs.items()
    }
    sizes = _sizes(checked, tensors)
    bound = _params(kernel, sizes, params or {})
    batch = [a.index for a in kernel.batch_axes]
    rows = kernel.query_axis.index if kernel.query_axis else "_row"
    frame = [*batch, rows, kernel.key_axis.index]
    shape = [1 if i == "_row" else sizes[_dim(kernel, i)] for i in frame]
    grid = {}
    for axis, index in enumerate(frame):
        view = [1] * len(frame)
        view[axis] = shape[axis]
        grid[index] = torch.arange(shape[axis]).reshape(view)
    visible = torch.ones(shape, dtype=torch.bool)
    for mask in kernel.masks:
        visible &= torch.as_tensor(evaluate(mask, grid, sizes, bound, tensors, None))
    row_grid = {i: grid[i][..., :1] for i in frame}  # a sink is one term per row

    counts: dict[str, torch.Tensor] = {}

    def count(load: ir.Load, where: Mapping[str, Any], live: torch.Tensor) -> None:
        subscripts = [
            torch.as_tensor(evaluate(sub, where, sizes, bound, tensors, None))
            for sub in load.indices
        ]
        subscripts = list(torch.broadcast_tensors(*subscripts, live))[:-1]  # type: ignore[no-untyped-call]
        total = counts.setdefault(load.tensor, torch.zeros(inputs[load.tensor].shape))
        if not subscripts:  # a 0-d input: every live score is a term
            total += live.sum()
            return
        index = tuple(s[live] for s in subscripts)
        total.index_put_(index, torch.ones(index[0].shape), accumulate=True)

    def float_loads(expr: ir.Expr) -> set[ir.Load]:
        # one term per load and expression: the derivative sums a load's occurrences
        return {e for e in subexprs(expr) if isinstance(e, ir.Load) and e.tensor in floats}

    for mod in kernel.score_mods:
        for e in float_loads(mod):
            count(e, grid, visible)
    if kernel.sink is not None:
        for e in float_loads(kernel.sink):
            count(e, row_grid, torch.ones([*shape[:-1], 1], dtype=torch.bool))
    return {name: int(total.max().item()) if total.numel() else 0 for name, total in counts.items()}
