"""K/V tiles through TMA tensor descriptors (the interpreter runs them too): the same result
as pointer loads, for layouts that allow descriptors; pointer loads for those that do not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attncc
from attncc.runtime.jit import interpreter

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}


@pytest.mark.parametrize("name", ["fused", "gqa_causal", "document_mask", "sliding_window"])
@pytest.mark.parametrize("head_dim", [40, 64])
def test_descriptor_loads_match_pointer_loads(name: str, head_dim: int) -> None:
    kernel = attncc.compile(EXAMPLES / f"{name}.attn")
    module = kernel.module(interpreted=True)
    gen = torch.Generator().manual_seed(head_dim)
    heads, kv_heads = (4, 2) if name == "gqa_causal" else (2, 2)
    q = torch.randn(1, heads, 37, head_dim, generator=gen)
    k, v = (torch.randn(1, kv_heads, 37, head_dim, generator=gen) for _ in range(2))
    docs = torch.randint(0, 3, (1, 37), generator=gen).sort(-1).values.int()
    args = [q, k, v, docs][: len(kernel.input_names)]
    assert module._descriptors_fit(k, v)
    with interpreter(True):
        tensors, params = module._bind(args, {})
        with_tma, _ = module._forward(tensors, params, False, {**CONFIG, "tma": 1})
        pointers, _ = module._forward(tensors, params, False, {**CONFIG, "tma": 0})
    torch.testing.assert_close(with_tma, pointers, rtol=0, atol=0)


def test_layouts_without_descriptors() -> None:
    k = torch.randn(1, 2, 37, 64)
    module = attncc.compile(EXAMPLES / "fused.attn").module(interpreted=True)
    assert not module._descriptors_fit(k.transpose(-1, -2).contiguous().transpose(-1, -2), k)
    assert not module._descriptors_fit(torch.randn(1, 2, 37, 66)[..., :65], k)  # odd stride
    assert not module._descriptors_fit(k.expand(3, 2, 37, 64), k)  # a zero stride
