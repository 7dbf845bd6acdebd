"""Decode (one query per sequence) with and without grouped-query heads, with and without the
log-sum-exp, against the float64 reference.

Every decode example groups its heads (KVH kv heads); a spec whose q and k share the head
axis once failed to compile its split-KV merge with ``return_lse=True``: without a group or
query index the log-sum-exp's offset was a scalar, and Triton refuses a block stored through
a scalar pointer (the interpreter raises the same error as the GPU compiler).
"""

from __future__ import annotations

from functools import cache

import pytest
import torch

import attncc
from attncc.runtime.kernel import Kernel

from ._support import DEVICE, compiled, evaluate

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)

# one kv head per query head: no group, no query axis
MHA_DECODE = """attention decode_mha

dims  B, H, N, D
in    q[B, H, D]
in    k[B, H, N, D]
in    v[B, H, N, D]
param scale: f32 = 1 / sqrt(D)

s[b, h, n] = q[b, h, d] * k[b, h, n, d] * scale
p = softmax(s, n)
o[b, h, d] = p[b, h, n] * v[b, h, n, d]
out o
"""


@cache
def mha_decode(schedule: str) -> Kernel:
    return attncc.compile(MHA_DECODE, schedule=None if schedule == "default" else schedule)  # type: ignore[arg-type]


def inputs(kind: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(DEVICE, dtype)

    batch, length, dim = 2, 37, 16
    if kind == "mha":
        return {
            "q": randn(batch, 3, dim),
            "k": randn(batch, 3, length, dim),
            "v": randn(batch, 3, length, dim),
        }
    heads, kv_heads = (4, 2) if kind == "gqa" else (2, 2)  # "gqa, group 1": H == KVH at run time
    return {
        "q": randn(batch, heads, dim),
        "k": randn(batch, length, kv_heads, dim),
        "v": randn(batch, length, kv_heads, dim),
        "cache_len": torch.tensor([length, 20], dtype=torch.int32, device=DEVICE),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("schedule", ["default", "split_kv", "fused"])
@pytest.mark.parametrize("kind", ["mha", "gqa", "gqa, group 1"])
def test_decode_matches_the_reference(kind: str, schedule: str, dtype: torch.dtype) -> None:
    kernel = mha_decode(schedule) if kind == "mha" else compiled("decode", schedule)
    if schedule != "fused":
        assert kernel.ir.schedule == "split_kv"
    given = inputs(kind, dtype)
    out_verdict, lse_verdict, out, lse = evaluate(kernel, given, {}, dtype)
    assert out_verdict.ok, out_verdict
    assert lse_verdict.ok, lse_verdict
    assert out.shape == given["q"].shape and lse.shape == given["q"].shape[:2]
    # without the log-sum-exp: the same output
    assert torch.equal(kernel(**given), out)
