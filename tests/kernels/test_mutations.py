"""The harness can fail: wrong kernels, judged against the causal spec's reference, fail.

Each mutant is a real compiled kernel whose ``spec`` (what ``check`` takes the reference from)
is the correct causal spec, while its IR and source come from a mutated spec or have a
mutated generated source.
"""

from __future__ import annotations

import dataclasses

import pytest

import attncc
from attncc.checking import check, table
from attncc.runtime.kernel import Kernel

from ._support import compiled, example_path

# Triton 3.6's interpreter calls int() on one-element arrays (deprecated since NumPy 1.25)
# thousands of times per test; the warning is Triton's, not attncc's.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


CAUSAL = example_path("causal").read_text()
MASK = "mask m >= n\n"
assert MASK in CAUSAL

SPEC_MUTANTS = {
    "mask removed": CAUSAL.replace(MASK, ""),
    "mask flipped": CAUSAL.replace(MASK, "mask m <= n\n"),
    "mask off by one": CAUSAL.replace(MASK, "mask m > n\n"),
    "bottom-right aligned": CAUSAL.replace(MASK, "mask m + N - M >= n\n"),
    "scale squared": CAUSAL.replace("* scale\n", "* scale * scale\n"),
    "window of 8": CAUSAL.replace(MASK, "mask m >= n and m - n < 8\n"),
}


def judged_by_causal(kernel: Kernel) -> Kernel:
    """The same generated kernel, checked against the causal spec's reference."""
    return dataclasses.replace(kernel, spec=compiled("causal", "fused").spec)


@pytest.mark.parametrize("schedule", ["naive", "fused", "split_kv"])
@pytest.mark.parametrize("mutant", sorted(SPEC_MUTANTS))
def test_checker_fails_a_wrong_spec(mutant: str, schedule: str) -> None:
    wrong = judged_by_causal(attncc.compile(SPEC_MUTANTS[mutant], schedule=schedule))
    results = check(wrong, trials=6, seed=0, max_len=80)
    assert not all(r.ok for r in results), f"{mutant} passed:\n{table(results)}"


def test_the_unmutated_kernel_passes_the_same_check() -> None:
    right = judged_by_causal(attncc.compile(CAUSAL))
    results = check(right, trials=6, seed=0, max_len=80)
    assert all(r.ok for r in results), table(results)


def test_poisoning_shows_an_unwritten_row() -> None:
    """A fused kernel that skips storing the last query row leaves NaN there, and fails."""
    kernel = compiled("causal", "fused")
    # inside the loop over a program's query tiles (causal kernels may take two)
    store = "mask=row_ok[:, None] & dv_ok[None, :],\n        )\n        if STORE_LSE"
    assert kernel.source.count(store) == 1
    source = kernel.source.replace(
        store, store.replace("row_ok[:, None]", "(offs_m[:, None] < d_M - 1)")
    )
    wrong = Kernel(kernel.name, kernel.spec, kernel.ir, source, kernel.entry)
    results = check(wrong, trials=3, seed=1, max_len=80)
    assert results and not any(r.ok for r in results), table(results)
    assert all(r.output.reason == "NaN in kernel output" for r in results)


def test_a_skipped_key_tile_fails() -> None:
    """Dropping the last partial key tile (the causal diagonal) is caught on long rows."""
    kernel = compiled("causal", "fused")
    loop = "for start_n in range(mid_hi, hi, BLOCK_N):"
    assert kernel.source.count(loop) == 1
    source = kernel.source.replace(loop, loop.replace("hi, BLOCK_N", "hi - BLOCK_N, BLOCK_N"))
    wrong = Kernel(kernel.name, kernel.spec, kernel.ir, source, kernel.entry)
    results = check(wrong, trials=4, seed=2, max_len=80)
    assert not all(r.ok for r in results), table(results)
