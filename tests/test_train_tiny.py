"""examples/train_tiny.py: a two-layer transformer trained through the attncc ALiBi kernel's
backward (Triton interpreter on the CPU) tracks the same model on SDPA step by step."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from script_module import load_script

from attncc.runtime import autograd

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_tiny.py"
# 12 of the example's 50 steps: each costs ~1 s of interpreter time for the two layers'
# forward and backward, and 12 already cross the loss's first fall
STEPS = 12

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


def load_example() -> ModuleType:
    return load_script(EXAMPLE, "train_tiny")


def test_training_through_the_kernel_tracks_sdpa() -> None:
    example = load_example()
    ours, theirs = example.main(steps=STEPS)
    assert len(ours) == len(theirs) == STEPS
    assert example.agree(ours, theirs) <= 1e-3  # every step, relative
    assert ours[0] == pytest.approx(math.log(example.VOCAB), rel=0.1)  # starts near uniform
    assert ours[-1] < ours[0] - 0.3  # and learns
    assert all(math.isfinite(x) for x in ours)


def test_the_example_catches_a_wrong_slope_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backward that got only the slopes' gradient wrong fails the example."""
    right = autograd.Backward.run

    def wrong(self: autograd.Backward, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        grads = right(self, *args, **kwargs)
        return [*grads[:-1], -grads[-1]]  # the slopes are alibi's last float input

    monkeypatch.setattr(autograd.Backward, "run", wrong)
    with pytest.raises(AssertionError, match="learnt slopes differ"):
        load_example().main(steps=2)
