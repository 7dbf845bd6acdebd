"""The one tolerance rule (FlexAttention-style), with its constants in one place.

A kernel output passes when its RMS error against the float64 reference is within
``ERROR_FACTOR`` times the RMS error of the same math done naively in the kernel's dtype
(every materialised intermediate rounded to that dtype, as eager PyTorch would), plus a floor
for outputs whose naive error is near zero. FlexAttention's tests apply this rule to the mean
error. A single max-error element is noisier (the fused kernel rounds unnormalised
probabilities, the naive math normalised ones), so the max error gets its own, wider factor:
it still catches a wrong tile or row, whose error is O(1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

ERROR_FACTOR = 2.0
MAX_ERROR_FACTOR = 4.0
# floor = max(FLOOR_ABS, FLOOR_EPS * eps(dtype))
FLOOR_ABS = 1e-5
FLOOR_EPS = 0.25
EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
# FP8 (e4m3) q, k and v: the naive error is that of plain per-tensor FP8 done eagerly
# (``reference(spec, rounding="float8_e4m3")``: inputs and probabilities requantised to e4m3,
# one scale per tensor), the same factors apply; the floor is that of the bfloat16 output.
EPS["float8_e4m3"] = EPS["bfloat16"]


@dataclass(frozen=True)
class Verdict:
    error: float  # max abs error of the kernel
    bound: float  # what the rule allows for the max error
    rms_error: float
    rms_bound: float
    ok: bool
    reason: str = ""


def floor(dtype: str) -> float:
    return max(FLOOR_ABS, FLOOR_EPS * EPS[dtype])


def compare(
    actual: npt.NDArray[np.float64],
    exact: npt.NDArray[np.float64],
    naive: npt.NDArray[np.float64],
    dtype: str,
) -> Verdict:
    """``actual`` (the kernel) against ``exact`` (float64), allowing what ``naive`` misses by.

    Non-finite values must agree exactly (e.g. lse = -inf for fully masked rows); a NaN in
    the kernel's output always fails.
    """
    if actual.shape != exact.shape:
        return Verdict(np.inf, 0.0, np.inf, 0.0, False, f"shape {actual.shape} != {exact.shape}")
    if np.isnan(actual).any():
        return Verdict(np.inf, 0.0, np.inf, 0.0, False, "NaN in kernel output")
    finite = np.isfinite(exact)
    if not np.array_equal(np.isfinite(actual), finite) or not np.array_equal(
        actual[~finite], exact[~finite]
    ):
        return Verdict(np.inf, 0.0, np.inf, 0.0, False, "non-finite values differ")
    if not finite.any():
        return Verdict(0.0, 0.0, 0.0, 0.0, True)
    err = np.abs(actual[finite] - exact[finite])
    naive_err = np.abs(np.where(np.isfinite(naive[finite]), naive[finite], 0.0) - exact[finite])
    base = floor(dtype)
    bound = MAX_ERROR_FACTOR * float(naive_err.max()) + base
    rms = float(np.sqrt(np.mean(err**2)))
    rms_bound = ERROR_FACTOR * float(np.sqrt(np.mean(naive_err**2))) + base
    ok = float(err.max()) <= bound and rms <= rms_bound
    return Verdict(float(err.max()), bound, rms, rms_bound, ok, "" if ok else "error above bound")


# Gradients, as flash-attn's tests check them: the kernel's max error against float64 within
# GRAD_ERROR_FACTOR times the max error of the same math done eagerly in the kernel's dtype
# (attncc.reference_grad.eager_grads: the larger of its two evaluations'), plus the floor
# above for exact-zero cases. The floor is what one term may miss by; a side input's gradient
# element sums many scores' terms (ALiBi's slopes: every visible score of a head), whose
# independent roundings add in quadrature, so its floor is sqrt(terms) times that
# (attncc.reference_grad.gradient_terms counts them). Where the exact gradient is zero the
# eager evaluations can be exact too (one key per row: P = 1, dS = dP - delta cancels in
# autograd's softmax backward) while the kernel's recomputed P = exp2(s - lse) is 1 within
# rounding: fp32 ALiBi, B=1 H=1 M=9 N=1 D=96, dslopes off by 3.5e-5, a sum of 9 rows'
# terms, against 3.4e-5 allowed with one term's floor.
GRAD_ERROR_FACTOR = 3.0


def compare_grad(
    actual: npt.NDArray[np.float64],
    exact: npt.NDArray[np.float64],
    eager: npt.NDArray[np.float64] | Sequence[npt.NDArray[np.float64]],
    dtype: str,
    terms: int = 1,
) -> Verdict:
    """A gradient ``actual`` against ``exact`` (float64), allowing what ``eager`` (the same
    math in the kernel's dtype; several evaluations of it: the largest error) misses by; any
    NaN or infinity fails. ``terms``: the most per-score terms one element of the gradient
    sums (``gradient_terms``; 1 for q, k, v and a per-score bias), which scales the floor."""
    if actual.shape != exact.shape:
        return Verdict(np.inf, 0.0, np.inf, 0.0, False, f"shape {actual.shape} != {exact.shape}")
    if not np.isfinite(actual).all():
        return Verdict(np.inf, 0.0, np.inf, 0.0, False, "NaN or infinity in the gradient")
    if actual.size == 0:
        return Verdict(0.0, 0.0, 0.0, 0.0, True)
    err = np.abs(actual - exact)
    evaluations = [eager] if isinstance(eager, np.ndarray) else list(eager)
    eager_err = max(float(np.abs(e - exact).max()) for e in evaluations)
    bound = GRAD_ERROR_FACTOR * eager_err + floor(dtype) * math.sqrt(max(terms, 1))
    rms = float(np.sqrt(np.mean(err**2)))
    ok = float(err.max()) <= bound
    return Verdict(float(err.max()), bound, rms, bound, ok, "" if ok else "error above bound")
