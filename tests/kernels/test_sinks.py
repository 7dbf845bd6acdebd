"""Softmax sinks (gpt-oss): the language, the reference against a hand-written torch
definition, the fused Triton kernel, and the refusals of what has no sink yet."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attncc
from attncc.reference import reference
from attncc.reference_grad import eager_grads, gradient_terms, reference_grads
from attncc.tolerance import Verdict, compare_grad
from attncc.varlen import varlen

from ._support import example_path

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

SPEC = """attention s
dims B, H, M, N, D
in q[B, H, M, D]
in k[B, H, N, D]
in v[B, H, N, D]
in sinks[H]
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] / sqrt(D)
mask m >= n
p = softmax(s, n, sinks[h])
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""


def _definition(q, k, v, sinks, causal=True):
    """gpt-oss: the sink is a column of logits appended to the scores, dropped after softmax."""
    q, k, v, sinks = (t.double() for t in (q, k, v, sinks))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    m, n = s.shape[-2:]
    if causal:
        s = s.masked_fill(torch.arange(n)[None] > torch.arange(m)[:, None], float("-inf"))
    column = sinks[None, :, None, None].expand(*s.shape[:-1], 1)
    full = torch.cat([s, column], -1)
    lse = torch.logsumexp(full, -1)
    return torch.softmax(full, -1)[..., :-1] @ v, lse


def _inputs(m=7, n=7, seed=0):
    torch.manual_seed(seed)
    q, k, v = torch.randn(2, 3, m, 16), torch.randn(2, 3, n, 16), torch.randn(2, 3, n, 16)
    return q, k, v, torch.randn(3) * 2


def test_reference_is_the_gpt_oss_definition() -> None:
    q, k, v, sinks = _inputs()
    out, lse = reference(attncc.load(SPEC))(
        *(t.double().numpy() for t in (q, k, v, sinks)), return_lse=True
    )
    want, want_lse = _definition(q, k, v, sinks)
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse.numpy(), rtol=1e-12, atol=1e-12)


def test_fused_kernel_matches_the_definition() -> None:
    q, k, v, sinks = _inputs(m=37, n=37, seed=1)
    kernel = attncc.compile(SPEC)
    out, lse = kernel(q, k, v, sinks, return_lse=True)
    want, want_lse = _definition(q, k, v, sinks)
    assert torch.allclose(out.double(), want, atol=2e-5, rtol=2e-5)
    assert torch.allclose(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


def test_rows_without_keys_give_zero_and_the_sink_as_lse() -> None:
    q, k, v, sinks = _inputs(m=5, n=0, seed=2)
    out, lse = attncc.compile(SPEC)(q, k, v, sinks, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.allclose(lse, sinks[None, :, None].expand_as(lse))


def test_varlen_keeps_the_sink() -> None:
    q, k, v, sinks = _inputs(m=9, n=9, seed=3)
    packed = varlen(SPEC)
    lens = (4, 5)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    flat = [t[:, :, :].permute(0, 2, 1, 3) for t in (q, k, v)]
    # two sequences: batch 0's first 4 tokens, batch 1's first 5
    pq, pk, pv = (torch.cat([f[0, :4], f[1, :5]]) for f in flat)
    out = packed(pq, pk, pv, cu, cu, 5, 5, sinks=sinks)
    for i, (start, length) in enumerate(zip((0, 4), lens, strict=True)):
        want, _ = _definition(
            q[i : i + 1, :, :length], k[i : i + 1, :, :length], v[i : i + 1, :, :length], sinks
        )
        got = out[start : start + length].permute(1, 0, 2)[None]
        assert torch.allclose(got.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("schedule", ["naive", "split_kv"])
def test_other_schedules_refuse_sinks(schedule: str) -> None:
    with pytest.raises(ValueError, match="softmax sink runs fused only"):
        attncc.optimise(SPEC, schedule=schedule)  # type: ignore[arg-type]


def test_cuda_target_refuses_sinks_and_auto_picks_triton() -> None:
    with pytest.raises(ValueError, match="target cuda has no softmax sink yet"):
        attncc.api.build(SPEC, target="cuda")
    assert attncc.api.build(SPEC).target == "triton"


def _grad_verdicts(
    spec: str, given: dict[str, torch.Tensor], grad_out: torch.Tensor, **params: int
) -> dict[str, Verdict]:
    kernel = attncc.compile(spec, schedule="fused")
    leaves = {n: t.clone().requires_grad_() for n, t in given.items()}
    kernel(**leaves, **params).backward(grad_out)
    _, exact = reference_grads(spec, given, grad_out, params)
    eager = eager_grads(spec, given, grad_out, params, dtype=given["q"].dtype)
    terms = gradient_terms(spec, given, params)
    verdicts = {}
    for name, leaf in leaves.items():
        assert leaf.grad is not None and leaf.grad.dtype == given[name].dtype
        verdicts[name] = compare_grad(
            leaf.grad.double().numpy(),
            exact[name].numpy(),
            [e.numpy() for e in eager[name]],
            DTYPE_NAMES[leaf.grad.dtype],
            terms.get(name, 1),
        )
    return verdicts


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gradients_with_sinks_match_float64_reference(dtype: torch.dtype) -> None:
    """dq, dk, dv from P over the log-sum-exp that includes the sink, and d sinks = -sum over
    rows of P_sink * (delta - dlse) (the sink was refused a backward)."""
    q, k, v, sinks = _inputs(m=37, n=37, seed=4)
    given = {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype), "sinks": sinks}
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    for name, verdict in _grad_verdicts(SPEC, given, grad_out).items():
        assert verdict.ok, (name, verdict)


def test_gqa_window_sink_gradients_sum_each_heads_rows() -> None:
    """examples/sinks.attn: GQA (a kv head serves two query heads), a sliding window, and
    rows a window leaves without keys (window 0: every row gives all to the sink)."""
    gen = torch.Generator().manual_seed(6)
    given = {
        "q": torch.randn(2, 4, 21, 16, generator=gen),
        "k": torch.randn(2, 2, 25, 16, generator=gen),
        "v": torch.randn(2, 2, 25, 16, generator=gen),
        "sinks": torch.randn(4, generator=gen),
    }
    grad_out = torch.randn(2, 4, 21, 16, generator=gen)
    spec = example_path("sinks").read_text()
    for window in (7, 0):
        for name, verdict in _grad_verdicts(spec, given, grad_out, window=window).items():
            assert verdict.ok, (window, name, verdict)


def test_sink_gradient_through_the_returned_lse_is_the_gpt_oss_one() -> None:
    """A loss on the output and the returned log-sum-exp, against autograd over the gpt-oss
    definition in float64, bounded by the same in float32."""
    q, k, v, sinks = _inputs(m=23, n=23, seed=7)
    gen = torch.Generator().manual_seed(8)
    grad_out, grad_lse = (
        torch.randn(q.shape, generator=gen),
        torch.randn(q.shape[:-1], generator=gen),
    )
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = attncc.compile(SPEC)(*leaves, return_lse=True)
    ((out * grad_out).sum() + (lse * grad_lse).sum()).backward()

    exact = _definition_in(torch.float64, q, k, v, sinks, grad_out, grad_lse)
    eager = _definition_in(torch.float32, q, k, v, sinks, grad_out, grad_lse)
    for name, leaf, want, rough in zip("qkvs", leaves, exact, eager, strict=True):
        assert leaf.grad is not None
        verdict = compare_grad(leaf.grad.double().numpy(), want.numpy(), rough.numpy(), "float32")
        assert verdict.ok, (name, verdict)


def _definition_in(dtype: torch.dtype, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """The gpt-oss definition's gradients with every op in ``dtype``."""
    q, k, v, sinks, grad_out, grad_lse = (t.to(dtype) for t in tensors)
    ref = [t.requires_grad_() for t in (q, k, v, sinks)]
    s = ref[0] @ ref[1].transpose(-1, -2) / math.sqrt(q.shape[-1])
    m, n = s.shape[-2:]
    s = s.masked_fill(torch.arange(n)[None] > torch.arange(m)[:, None], float("-inf"))
    full = torch.cat([s, ref[3][None, :, None, None].expand(*s.shape[:-1], 1)], -1)
    o = torch.softmax(full, -1)[..., :-1] @ ref[2]
    loss = (o * grad_out).sum() + (torch.logsumexp(full, -1) * grad_lse).sum()
    return [g.double() for g in torch.autograd.grad(loss, ref)]


@pytest.mark.parametrize(
    ("sink", "message", "column"),
    [
        ("sinks[h] + n", "cannot use index 'n'", 19),
        ("s", "cannot read computed values", 19),
        ("m >= 0", "must be a number", 19),
    ],
)
def test_bad_sinks_are_pinned(sink: str, message: str, column: int) -> None:
    text = SPEC.replace("softmax(s, n, sinks[h])", f"softmax(s, n, {sink})")
    with pytest.raises(attncc.SpecError, match=message) as err:
        attncc.load(text)
    assert (err.value.span.line, err.value.span.column) == (9, column)


def test_a_sink_per_query_row_is_refused_by_the_compiler() -> None:
    text = SPEC.replace("in sinks[H]", "in sinks[M]").replace("sinks[h])", "sinks[m])")
    with pytest.raises(attncc.SpecError, match="batch indices only"):
        attncc.optimise(text)
