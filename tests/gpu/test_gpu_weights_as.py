"""The fixed softmax reference's row sums take each weight as P V does, rounded to bfloat16
(the Triton module's ``_weights_as``: one ``cvt.rn.bf16x2.f32`` a pair on the GPU, its
halves moved apart): bit for bit what a cast to bfloat16 and back gives, at every rounding
tie and over the weights' whole range.

Run on the device by benchmarks/gpu_suite.sh; without a GPU every test here is skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

import attncc

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).parents[2] / "examples"

# the generated module's helper, bound before the kernel below first compiles
_WEIGHTS_AS: Any = None


@triton.jit
def _apply(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, _WEIGHTS_AS(x, tl.bfloat16), mask=offs < n)


def test_weights_as_rounds_as_a_cast_to_bfloat16() -> None:
    global _WEIGHTS_AS
    _WEIGHTS_AS = (
        attncc.compile(EXAMPLES / "softcap.attn", target="triton").module(False)._weights_as
    )
    gen = torch.Generator().manual_seed(0)
    n = 4096
    # exponents over the fixed reference's range (2^-100 .. 2^64), mantissas random, and a
    # quarter of them exact ties (low 16 bits 0x8000) with even and odd bfloat16 neighbours
    exponents = torch.randint(127 - 100, 127 + 65, (n,), generator=gen, dtype=torch.int32)
    mantissas = torch.randint(0, 1 << 23, (n,), generator=gen, dtype=torch.int32)
    ties = torch.arange(n) % 4 == 0
    mantissas[ties] = (mantissas[ties] & ~0xFFFF) | 0x8000
    bits = (exponents << 23) | mantissas
    x = bits.view(torch.float32).cuda()
    y = torch.empty_like(x)
    _apply[(1,)](x, y, n, BLOCK=n)
    want = x.to(torch.bfloat16).to(torch.float32)
    assert torch.equal(y.view(torch.int32), want.view(torch.int32))
