"""Scores with a magnitude bound (soft-capping: |cap * tanh(s / cap)| <= |cap|): the fused
Triton kernel may take a softmax reference fixed from the bound (FIXED_REFERENCE,
plan.FIXED_REFERENCE_FLOOR), with no row max. Which specs get the switch
(plan.score_bound), which calls take it (the host's _fixed_reference), and its results
against the float64 reference and the online max's, on rows whose every score sits far
below the bound too (their weights down to 2^-(bound + reference))."""

from __future__ import annotations

import math

import pytest
import torch

import attncc
from attncc.codegen import plan
from attncc.ir import nodes as ir
from attncc.runtime.jit import interpreter

from ._support import compiled, evaluate

CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}

SINK_SOFTCAP = """
attention softcap_sink
dims  B, H, M, N, D
in    q[B, H, M, D]
in    k[B, H, N, D]
in    v[B, H, N, D]
in    sinks[H]: f32
param cap: f32 = 30
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] / sqrt(D)
s = cap * tanh(s / cap)
p = softmax(s, n, sinks[h])
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""


def _bound(text: str) -> ir.Expr | None:
    kernel = attncc.optimise(text)[1]
    return plan.score_bound(kernel.score_mods)


def test_the_bound_of_a_squashed_score_scaled_and_shifted_by_params() -> None:
    spec = attncc.optimise("examples/softcap.attn")[1]
    cap = ir.Param("cap", "float")
    assert plan.score_bound(spec.score_mods) == ir.Call("abs", (cap,), "float")
    # unbounded: no mods, a bias read from a tensor after the cap, the score itself
    assert plan.score_bound(attncc.optimise("examples/causal.attn")[1].score_mods) is None
    assert plan.score_bound(attncc.optimise("examples/alibi.attn")[1].score_mods) is None
    tanh = ir.Call("tanh", (ir.Score(),), "float")
    two = ir.Const(2.0, "float")
    shifted = ir.BinOp("-", ir.BinOp("*", cap, tanh, "float"), two, "float")
    expected = ir.BinOp(
        "+", ir.Call("abs", (cap,), "float"), ir.Call("abs", (two,), "float"), "float"
    )
    assert plan.score_bound((shifted,)) == expected
    assert plan.score_bound((ir.BinOp("+", ir.Score(), tanh, "float"),)) is None


def test_only_the_fused_kernel_of_a_bounded_spec_without_a_sink_has_the_switch() -> None:
    softcap = compiled("softcap", "fused")
    assert "FIXED_REFERENCE: tl.constexpr" in softcap.source
    assert "FIXED_REFERENCE" not in compiled("causal", "fused").source
    assert "FIXED_REFERENCE" not in attncc.compile(SINK_SOFTCAP, target="triton").source


@pytest.mark.parametrize(
    ("cap", "dtype", "taken"),
    [
        (30.0, torch.bfloat16, True),
        (-30.0, torch.bfloat16, True),
        (30.0, torch.float32, True),
        (30.0, torch.float16, False),  # its weights would fall below float16's normals
        (50.0, torch.bfloat16, True),  # Gemma-2's
        (56.8, torch.bfloat16, True),  # 56.8 log2(e) = 81.9: weights in [2^-100, 2^63.9]
        (57.0, torch.bfloat16, False),  # 57 log2(e) = 82.2 > plan.FIXED_REFERENCE_LIMIT
        (math.inf, torch.bfloat16, False),
    ],
)
def test_a_call_takes_the_bound_where_its_weights_stay_normal(
    cap: float, dtype: torch.dtype, taken: bool
) -> None:
    module = compiled("softcap", "fused").module(interpreted=True)
    assert module._fixed_reference({"cap": cap, "scale": 0.1}, {}, dtype) is taken


def _inputs(
    rows: int, keys: int, far_below: bool, dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows + keys)
    q = torch.randn(1, 2, rows, 32, generator=gen)
    k, v = (torch.randn(1, 2, keys, 32, generator=gen) for _ in range(2))
    if far_below:
        # every score of head 1 near -cap: q and k point opposite ways, |q . k| >> cap
        k[:, 1] = k[:, 1].abs() * 4.0
        q[:, 1] = -q[:, 1].abs() * 4.0
    return {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype)}


@pytest.mark.parametrize("far_below", [False, True], ids=["random", "far-below-the-cap"])
@pytest.mark.parametrize(
    ("cap", "dtype"),
    [
        (30.0, torch.bfloat16),
        (50.0, torch.bfloat16),  # Gemma-2's
        (56.8, torch.bfloat16),  # 56.8 log2(e) = 81.9: the largest, weights down to 2^-100
        (56.8, torch.float32),
    ],
    ids=["bf16-cap30", "bf16-cap50", "bf16-cap56.8", "fp32-cap56.8"],
)
def test_the_bound_as_reference_matches_the_reference_and_the_online_max(
    far_below: bool, cap: float, dtype: torch.dtype
) -> None:
    kernel = compiled("softcap", "fused")
    inputs = _inputs(37, 53, far_below, dtype)
    params = {"cap": cap}
    verdict, lse_verdict, _, lse = evaluate(kernel, inputs, params, dtype)
    assert verdict.ok, verdict
    assert lse_verdict.ok, lse_verdict
    if far_below:
        assert (lse[:, 1] < -20.0).all()  # the case it is about: scores far below the bound
    module = kernel.module(interpreted=True)
    with interpreter(True):
        tensors, given = module._bind([], {**inputs, **params})
        sizes, dtype, device = module._check(tensors, given)
        full = module._param_defaults(sizes, dict(given))
        launch = (tensors, full, True, sizes, dtype, device, CONFIG)
        assert module._fixed_reference(full, sizes, dtype)
        fixed = module._launch(*launch)
        take_bound = module._fixed_reference
        try:
            module._fixed_reference = lambda *_: False  # the online max, as float16 calls
            online = module._launch(*launch)
        finally:
            module._fixed_reference = take_bound
    torch.testing.assert_close(fixed[0].float(), online[0].float(), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(fixed[1], online[1], rtol=1e-5, atol=1e-4)
