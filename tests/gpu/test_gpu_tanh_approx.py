"""tanh.approx.f32 saturates by itself: for every float32 x with |x| >= 8 it returns exactly
+-1, and NaN stays NaN. The bfloat16 soft-capping kernels rely on it (they call the
instruction without a clamp of their own; attncc.codegen.plan.TANH_APPROX_SATURATION), so a
GPU where it does not hold fails here rather than in a log-sum-exp.

Run on the device by benchmarks/gpu_suite.sh; without a GPU every test here is skipped."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from attncc.codegen import plan

pytestmark = pytest.mark.gpu


@triton.jit
def _tanh_approx(x):
    return tl.inline_asm_elementwise(
        "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _count_unsaturated(first_bits, n, sign, counts, BLOCK: tl.constexpr):
    # the floats of bit patterns first_bits .. first_bits + n - 1, times sign
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = (first_bits + offs).to(tl.int32).to(tl.float32, bitcast=True) * sign
    bad = (offs < n) & (_tanh_approx(x) != sign)
    tl.atomic_add(counts, tl.sum(bad.to(tl.int32), 0))


@triton.jit
def _apply(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, _tanh_approx(x), mask=offs < n)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_every_float_past_the_saturation_point_gives_exactly_one(sign: float) -> None:
    first = torch.tensor(plan.TANH_APPROX_SATURATION, dtype=torch.float32).view(torch.int32)
    infinity = torch.tensor(float("inf"), dtype=torch.float32).view(torch.int32)
    n = int(infinity) - int(first) + 1  # 8.0 .. inf: about 10^9 floats
    counts = torch.zeros(1, dtype=torch.int32, device="cuda")
    block = 4096
    _count_unsaturated[(triton.cdiv(n, block),)](int(first), n, sign, counts, BLOCK=block)
    assert int(counts.item()) == 0


def test_below_the_saturation_point_and_nan() -> None:
    x = torch.tensor([7.99, 4.0, 0.5, -7.99, float("nan")], device="cuda")
    y = torch.empty_like(x)
    _apply[(1,)](x, y, x.numel(), BLOCK=8)
    assert torch.all(y[:4].abs() < 1.0)
    torch.testing.assert_close(y[:4], torch.tanh(x[:4]), rtol=2.0**-10.9, atol=0.0)
    assert torch.isnan(y[4])
