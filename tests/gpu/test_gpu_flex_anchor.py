"""The benchmark's Flex anchor for soft-capping compiles with tanh on tanh.approx.f32
(attncc.flex_tanh) and computes the spec: its output and gradients beside attncc's, within
what bfloat16 and the approximate tanh allow. Run on the device by benchmarks/gpu_suite.sh;
without a GPU it is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attncc
from attncc.bench import Shape, anchor_runners, bench_inputs, sizes_for
from attncc.flex_tanh import approx_tanh

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_flex_anchor_caps_scores_with_the_approximate_tanh() -> None:
    assert approx_tanh() is not None
    kernel = attncc.compile(EXAMPLES / "softcap.attn")
    sizes = sizes_for(kernel.ir, Shape.parse("1,4,1024,128"))
    # leaves before the runner: it reads the tensors it is given (as benchmarks/backward.py)
    inputs = {
        name: t.requires_grad_(True)
        for name, t in bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=1).items()
    }
    params = {**kernel.param_defaults(sizes), "cap": 5.0}
    runners = anchor_runners(kernel.ir, inputs, sizes, params, ["flex"], 0.5)
    flex = runners["flex"]
    assert flex is not None
    args = [inputs[name] for name in kernel.input_names]
    with torch.no_grad():
        expected = kernel(*args, cap=5.0).float()
    out = flex()
    got = out.detach().float()
    assert (got - expected).abs().max().item() < 2e-2 * expected.abs().max().item()
    # Flex's backward differentiates the custom op (its registered 1 - tanh^2)
    grads = torch.autograd.grad(out.float().sum(), args)
    assert all(torch.isfinite(g).all() for g in grads)
