"""Every example, under every schedule, passes ``attncc.checking.check`` on the interpreter.

``check`` pairs the i-th trial's dtype and layout (``trial % 3`` for both); three rotations of
the dtype list cover all nine dtype x layout pairs. Explicit split-KV kernels take at most 128
(query head, query) rows per kv head, so they are checked on shorter sequences.
"""

from __future__ import annotations

import pytest
import torch

from attncc.checking import LAYOUTS, Result, check, operand_dtype, table

from ._support import ALL_SCHEDULES, DEVICE, EXAMPLES, compiled

# Triton 3.6's interpreter calls int() on one-element arrays (deprecated since NumPy 1.25)
# thousands of times per test; the warning is Triton's, not attncc's.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ROTATIONS = [DTYPES[i:] + DTYPES[:i] for i in range(3)]


def checked(name: str, schedule: str, dtypes: tuple[torch.dtype, ...], seed: int) -> list[Result]:
    kernel = compiled(name, schedule)
    max_len = 40 if schedule == "split_kv" else 80
    return check(kernel, trials=3, seed=seed, device=DEVICE, dtypes=dtypes, max_len=max_len)


# schedules a spec has no kernel for: compiling it is one clear error
REFUSED = {
    ("sinks", "naive"): "a softmax sink runs fused only",
    ("sinks", "split_kv"): "a softmax sink runs fused only",
    ("fp8_block", "naive"): "FP8 inputs run fused only",
    ("fp8_block", "split_kv"): "FP8 inputs run fused only",
    ("fp8_causal", "naive"): "FP8 inputs run fused only",
    ("fp8_causal", "split_kv"): "FP8 inputs run fused only",
}


@pytest.mark.parametrize("schedule", ALL_SCHEDULES)
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_passes_check(name: str, schedule: str) -> None:
    if (name, schedule) in REFUSED:
        with pytest.raises(ValueError, match=REFUSED[name, schedule]):
            compiled(name, schedule)
        return
    results = [
        r
        for seed, dtypes in enumerate(ROTATIONS)
        for r in checked(name, schedule, dtypes, seed=100 + seed)
    ]
    assert all(r.ok for r in results), f"{name} ({schedule}):\n{table(results)}"
    combos = {(r.case.dtype, r.case.layout) for r in results}
    # q, k and v declared in one dtype (FP8) are drawn in it
    dtypes = [operand_dtype(compiled(name, schedule).ir)] if name.startswith("fp8_") else DTYPES
    assert combos == {(d, layout) for d in dtypes for layout in LAYOUTS}
    # real comparisons happened: finite errors within bounds, bounds above the floor
    assert all(0.0 <= r.output.error <= r.output.bound for r in results)
    assert sum(r.output.bound > 0.0 for r in results) >= len(results) - 1


def test_check_draws_params_and_shapes() -> None:
    """The first trial keeps defaults, the rest draw params; shapes vary across trials."""
    results = check(compiled("sliding_window", "fused"), trials=4, seed=3, max_len=80)
    assert results[0].case.params == {}
    assert all(set(r.case.params) == {"scale", "window"} for r in results[1:])
    assert len({tuple(r.case.sizes.items()) for r in results}) == 4
    assert all(r.ok for r in results), table(results)


def test_check_of_an_explicit_split_kv_kernel_draws_shapes_it_takes() -> None:
    results = check(compiled("gqa_causal", "split_kv"), trials=8, seed=0, max_len=96)
    assert all(r.ok for r in results), table(results)
