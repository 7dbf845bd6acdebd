"""The GPU gradient test's inputs, kernel calls and comparison (tests/grad_cases.py) at tiny
sizes in the Triton interpreter, for every example it covers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from grad_cases import NAMES, draw, gradient_verdicts

from attncc.runtime import autograd

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_at_tiny_sizes(name: str) -> None:
    given, params = draw(name, 1, 4, 24, 16, torch.bfloat16, "cpu")
    verdicts = gradient_verdicts(name, given, params)
    assert all(v.ok for v in verdicts.values()), verdicts
    assert ("slopes" in verdicts) == (name == "alibi")
    assert ("bias" in verdicts) == (name == "bias")
    assert ("rel" in verdicts) == (name == "relative_bias")


def test_a_wrong_gradient_fails_at_tiny_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    right = autograd.Backward.run

    def wrong(self: autograd.Backward, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        grads = right(self, *args, **kwargs)
        return [grads[0] * 1.05, *grads[1:]]  # q's

    monkeypatch.setattr(autograd.Backward, "run", wrong)
    given, params = draw("causal", 1, 4, 24, 16, torch.bfloat16, "cpu")
    verdicts = gradient_verdicts("causal", given, params)
    assert [n for n, v in verdicts.items() if not v.ok] == ["q"]


def test_the_backward_backend_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """ATTNCC_BACKWARD picks the backward: a value it does not know is one clear error, and
    "cuda" where the sm_90a kernel cannot run (a CPU call) takes the Triton backward, saying
    why."""
    given, params = draw("causal", 1, 2, 32, 16, torch.float32, "cpu")
    monkeypatch.setenv("ATTNCC_BACKWARD", "cudnn")
    with pytest.raises(ValueError, match=r"ATTNCC_BACKWARD.*auto, cuda or triton, not 'cudnn'"):
        gradient_verdicts("causal", given, params)
    monkeypatch.setenv("ATTNCC_BACKWARD", "cuda")
    verdicts = gradient_verdicts("causal", given, params)
    assert all(v.ok for v in verdicts.values()), verdicts
    assert autograd.last_backend().startswith("triton: "), autograd.last_backend()
