"""attncc.flash_attn_func against a float64 torch reference written from flash-attn's
definitions (bottom-right causal and window alignment, softcap, then ALiBi)."""

from __future__ import annotations

import math

import pytest
import torch

import attncc
from attncc.flash_attn import flash_attn_func, flash_attn_spec


def _reference(q, k, v, causal, window, softcap, slopes, scale):
    q, k, v = (t.double() for t in (q, k, v))
    b, m, h, d = q.shape
    n, kvh = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // kvh, dim=2)
    v = v.repeat_interleave(h // kvh, dim=2)
    s = torch.einsum("bmhd,bnhd->bhmn", q, k) * (scale or 1 / math.sqrt(d))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    diag = torch.arange(m)[:, None] + n - m  # the query's own key position
    keys = torch.arange(n)[None, :]
    if slopes is not None:
        per = slopes.double().reshape(
            -1 if slopes.dim() == 1 else b, *(() if slopes.dim() == 1 else (h,))
        )
        per = per[None, :, None, None] if slopes.dim() == 1 else per[:, :, None, None]
        s = s - per * (diag - keys).abs()
    left, right = window
    visible = torch.ones(m, n, dtype=torch.bool)
    if causal:
        visible &= keys <= diag
    if right >= 0:
        visible &= keys <= diag + right
    if left >= 0:
        visible &= keys >= diag - left
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("bhmn,bnhd->bmhd", p, v)


CASES = [
    # causal, window, softcap, alibi, heads (q, kv), (M, N)
    (False, (-1, -1), 0.0, None, (2, 2), (9, 9)),
    (True, (-1, -1), 0.0, None, (4, 2), (5, 13)),  # bottom-right causal, M < N, GQA
    (True, (-1, -1), 0.0, None, (2, 1), (13, 5)),  # M > N: the first rows see nothing
    (False, (3, 2), 0.0, None, (2, 2), (7, 11)),
    (True, (4, -1), 0.0, None, (2, 2), (17, 17)),
    (False, (-1, -1), 5.0, None, (2, 2), (6, 10)),
    (False, (-1, -1), 0.0, "H", (4, 2), (8, 8)),
    (True, (-1, -1), 0.0, "BH", (2, 2), (6, 9)),
    (True, (2, -1), 20.0, "H", (4, 1), (10, 12)),
]


@pytest.mark.parametrize(("causal", "window", "softcap", "alibi", "heads", "lengths"), CASES)
def test_flash_attn_func_matches_its_definition(causal, window, softcap, alibi, heads, lengths):
    torch.manual_seed(1)
    (h, kvh), (m, n), b, d = heads, lengths, 2, 16
    q = torch.randn(b, m, h, d)
    k = torch.randn(b, n, kvh, d)
    v = torch.randn(b, n, kvh, d)
    slopes = None
    if alibi == "H":
        slopes = torch.rand(h)
    elif alibi == "BH":
        slopes = torch.rand(b, h)
    out = flash_attn_func(
        q, k, v, causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes
    )
    want = _reference(q, k, v, causal, window, softcap, slopes, None)
    assert out.shape == q.shape
    assert torch.allclose(out.double(), want, atol=2e-5, rtol=2e-5)


def test_softmax_scale_and_lse() -> None:
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 4, 2, 16), torch.randn(1, 6, 2, 16), torch.randn(1, 6, 2, 16)
    out, lse = flash_attn_func(q, k, v, softmax_scale=0.3, causal=True, return_attn_probs=True)
    want = _reference(q, k, v, True, (-1, -1), 0.0, None, 0.3)
    assert torch.allclose(out.double(), want, atol=2e-5, rtol=2e-5)
    assert lse.shape == (1, 2, 4)


def test_every_option_combination_is_a_valid_spec() -> None:
    for causal in (False, True):
        for window in ((False, False), (True, False), (False, True), (True, True)):
            for softcap in (False, True):
                for alibi in (None, "H", "BH"):
                    attncc.optimise(flash_attn_spec(causal, window, softcap, alibi))


def test_dropout_is_refused() -> None:
    q = torch.randn(1, 2, 1, 16)
    with pytest.raises(ValueError, match="dropout is not supported"):
        flash_attn_func(q, q, q, dropout_p=0.1)
