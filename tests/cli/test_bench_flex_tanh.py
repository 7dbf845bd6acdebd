"""The Flex anchor's tanh (attncc.flex_tanh): the custom op computes tanh and its gradient
when run eagerly (the approximate instruction only appears where Inductor compiles it for a
CUDA kernel), and a score_mod built from the IR calls it in place of torch.tanh."""

from __future__ import annotations

from pathlib import Path

import torch

import attncc
from attncc.flex_tanh import approx_tanh
from attncc.torch_eval import evaluate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_op_is_tanh_with_its_gradient_when_eager() -> None:
    tanh = approx_tanh()
    assert tanh is not None and approx_tanh() is tanh  # registered once a process
    x = torch.linspace(-12.0, 12.0, 97, requires_grad=True)
    y = tanh(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(y, torch.tanh(x))
    assert torch.allclose(grad, 1 - torch.tanh(x.detach()) ** 2)


def test_a_score_mod_takes_the_given_tanh() -> None:
    """Soft-capping's modification evaluated with a tanh that records its calls."""
    kernel = attncc.compile(EXAMPLES / "softcap.attn", target="triton")
    calls: list[torch.Tensor] = []

    def recording(x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        return torch.tanh(x)

    score = torch.tensor([3.0, -40.0])
    env = {"b": 0, "h": 0, "m": 0, "n": 0}
    (mod,) = kernel.ir.score_mods
    params = kernel.param_defaults({"B": 1, "H": 1, "M": 1, "N": 1, "D": 64})
    plain = evaluate(mod, env, {}, params, {}, score)
    given = evaluate(mod, env, {}, params, {}, score, funcs={"tanh": recording})
    assert len(calls) == 1 and torch.equal(plain, given)
