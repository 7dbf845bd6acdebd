"""The log-sum-exp comes back laid out as the scores' indices without the softmax's
(docs/language.md), whatever order the scores name them in. Kernels wrote it as batch axes
then the query axis and returned that layout: ``s[b, m, h, n]`` gave (B, H, M), not (B, M, H)."""

from __future__ import annotations

import pytest
import torch

import attncc

from ._support import DEVICE, evaluate, example_path

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


def reordered(text: str) -> str:
    return text.replace("s[b, h, m, n] = q", "s[b, m, h, n] = q").replace(
        "p[b, h, m, n]", "p[b, m, h, n]"
    )


@pytest.mark.parametrize("schedule", ["fused", "naive", "split_kv"])
def test_lse_follows_the_scores_index_order(schedule: str) -> None:
    text = reordered(example_path("causal").read_text())
    assert "s[b, m, h, n]" in text
    kernel = attncc.compile(text, schedule=schedule)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 5, 16, generator=gen).to(DEVICE) for _ in range(3))
    out, lse, _, returned = evaluate(kernel, {"q": q, "k": k, "v": v}, {}, torch.float32)
    assert returned.shape == (2, 5, 3)
    assert out.ok and lse.ok, (out, lse)
