"""benchmarks/fp8_softmax_model.py's model, small enough for the CPU test run: the claims the
CUDA FP8 kernel's softmax rests on (hopper.cu.jinja, prefill.cu.jinja's softmax_weights)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from script_module import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fp8_softmax_model.py"


@pytest.fixture(scope="module")
def model() -> ModuleType:
    return load_script(SCRIPT, "fp8_softmax_model_script")


def test_an_exact_max_keeps_peaked_rows_accurate(model: ModuleType) -> None:
    """With scores peaked (K's descale x4), a lazy max rounds each row's largest weight and
    doubles the error; the exact max with weights times 2^8 beats weights in [0, 1]."""
    found = model.errors(4.0, model.SOFTMAXES, heads=2, seqlen=512)
    assert found["lazy"] > 2 * found["triton"]
    assert found["exact"] < found["triton"]
    flat = model.errors(1.0, model.SOFTMAXES, heads=2, seqlen=512)
    assert flat["lazy"] < 1.2 * flat["exact"]  # near-flat rows: the max hardly matters


def test_value_scales_fold_only_where_no_largest_weight_rounds(model: ModuleType) -> None:
    found = model.errors(4.0, model.FOLDS, heads=2, seqlen=512, value_blocks=True)
    assert found["exact, fold any"] > 2 * found["exact, no fold"]
    assert found["exact, fold"] < 1.1 * found["exact, no fold"]
    assert found["exact, fold"] < found["triton"]
