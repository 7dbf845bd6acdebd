"""The Triton key loop's per-score work: score mods that only multiply the score fold into one
multiply (factors of the rows before the loop, of key blocks once a tile), and P meets V in
FP8 behind the host's FP8_PV switch."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

import attncc

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def source(text: str) -> str:
    return attncc.compile(text, target="triton").source


def loop_lines(src: str) -> list[str]:
    """The generated fused kernel's lines between its first key loop and the output store."""
    kernel = src[src.index("def _attncc_") :]
    body = kernel[kernel.index("    for start_n in") : kernel.index("tl.store(")]
    return body.splitlines()


def test_descales_fold_into_one_multiply_per_score() -> None:
    src = source((EXAMPLES / "fp8_block.attn").read_text())
    # the query block's descale: once a program, beside the scale and log2(e)
    assert re.search(r"qk_scale = \(\(p_scale\) \* \(tl\.load\(t_q_descale", src)
    lines = loop_lines(src)
    scores = [line.strip() for line in lines if line.strip().startswith("s2 = qk")]
    assert scores and all(
        s.startswith("s2 = qk * (qk_scale * (tl.load(t_k_descale") for s in scores
    )
    assert not any("t_q_descale" in line for line in lines)
    # the key block's index: one a tile where blocks are multiples of the key tile
    assert (
        "key_block_0 = (start_n // p_block_n) if KEY_BLOCKS_ALIGNED else (i_n // p_block_n)" in src
    )
    assert "acc = tl.dot(p.to(tl.float8e4nv), v, acc" in src and "FP8_PV=fp8_pv" in src


def test_a_mod_after_a_non_product_keeps_its_place() -> None:
    """Only the leading product mods fold: a factor after tanh would change the result."""
    text = (EXAMPLES / "softcap.attn").read_text()
    src = source(text)
    assert "s = qk * qk_scale" in src  # softcap's tanh(s / cap) * cap is not a product of s
    plain = source((EXAMPLES / "causal.attn").read_text())
    assert "s2 = qk * qk_scale" in plain and "KEY_BLOCKS_ALIGNED" not in plain


@pytest.mark.parametrize("schedule", ["fused", "naive", "split_kv"])
def test_folded_factors_match_the_reference(schedule: str) -> None:
    """Factors of the rows (hoisted before the key loop in fused kernels), of key blocks and
    constants, after the scale: each applied once, in every schedule."""
    text = (
        (EXAMPLES / "fused.attn")
        .read_text()
        .replace("schedule fused\n", "")
        .replace(
            "in    v[B, H, N, D]\n", "in    v[B, H, N, D]\nin    w[H, M]: f32\nin    u[NB]: f32\n"
        )
        .replace("dims  B, H, M, N, D", "dims  B, H, M, N, D, NB")
    )
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("s[b, h, m, n]"))
    lines.insert(at + 1, "s = s * w[h, m] * 0.5 * u[n / 64]")
    kernel = attncc.compile("\n".join(lines) + "\n", schedule=schedule)
    gen = torch.Generator().manual_seed(3)
    m = 4 if schedule == "split_kv" else 40
    q = torch.randn(1, 2, m, 32, generator=gen)
    k, v = (torch.randn(1, 2, 150, 32, generator=gen) for _ in range(2))
    w, u = torch.rand(2, m, generator=gen) + 0.5, torch.rand(3, generator=gen) + 0.5
    out = kernel(q, k, v, w, u)
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(32)
    scores = scores * w.double()[None, :, :, None] * 0.5
    scores = scores * u.double().repeat_interleave(64)[:150]
    exact = torch.softmax(scores, -1) @ v.double()
    assert (out.double() - exact).abs().max().item() < 1e-4


# ------------------------------------------------- uniform factors around a score modification


def _mods(text: str) -> tuple[object, tuple[object, ...]]:
    kernel = attncc.compile(text, target="triton").ir
    return kernel.score_scale, kernel.score_mods


def _with_mod(mod: str) -> str:
    return (EXAMPLES / "softcap.attn").read_text().replace("s = cap * tanh(s / cap)", mod)


def test_a_uniform_divisor_of_the_score_joins_the_scale() -> None:
    from attncc.codegen.plan import outer_factors, scaled_score_mods
    from attncc.ir import nodes as ir

    scale, mods = _mods(_with_mod("s = cap * tanh(s / cap)"))
    folded, rest = scaled_score_mods(scale, mods)
    cap = ir.Param("cap", "float")
    assert folded == ir.BinOp("/", scale, cap, "float")
    assert rest == (ir.BinOp("*", cap, ir.Call("tanh", (ir.Score(),), "float"), "float"),)
    assert outer_factors(rest[0]) == ([cap], [ir.Call("tanh", (ir.Score(),), "float")])
    # a product alone folds away whole
    assert scaled_score_mods(*_mods(_with_mod("s = s * cap")))[1] == ()
    # left alone: the score read twice, a divisor read per row, an integer one
    for mod in ("s = cap * tanh(s / cap) + s", "s = cap * tanh(s / (cap + m))", "s = tanh(s / D)"):
        scale, mods = _mods(_with_mod(mod))
        assert scaled_score_mods(scale, mods) == (scale, mods), mod


def test_soft_capping_multiplies_each_score_without_a_division() -> None:
    triton_src = source((EXAMPLES / "softcap.attn").read_text())
    assert "qk_scale = (p_scale / p_cap)" in triton_src
    assert "score_out = (p_cap) * 1.4426950408889634" in triton_src
    assert all("/ p_cap" not in line for line in loop_lines(triton_src))
    cuda_src = attncc.compile(EXAMPLES / "softcap.attn", target="cuda").source
    assert "float s = qk * (attncc_div(p_scale, p_cap));" in cuda_src
    assert "float s2 = ((p_cap) * ATTNCC_LOG2E) * (attncc_tanh_as<elem_t>(s));" in cuda_src
    assert "attncc_div(s, p_cap)" not in cuda_src


@pytest.mark.parametrize("cap", [30.0, -4.0, 0.3])
@pytest.mark.parametrize("schedule", ["fused", "naive", "split_kv"])
def test_folded_soft_capping_matches_the_reference(cap: float, schedule: str) -> None:
    """The cap folded into the scale and log2(e), a negative or small cap (most scores
    saturate) included, in every schedule."""
    kernel = attncc.compile(EXAMPLES / "softcap.attn", schedule=schedule)
    gen = torch.Generator().manual_seed(int(cap * 10))
    m = 4 if schedule == "split_kv" else 40
    q = torch.randn(1, 2, m, 32, generator=gen) * 3
    k, v = (torch.randn(1, 2, 90, 32, generator=gen) for _ in range(2))
    out, lse = kernel(q, k, v, cap=cap, return_lse=True)
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(32)
    scores = cap * torch.tanh(scores / cap)
    visible = torch.arange(m)[:, None] >= torch.arange(90)[None, :]
    scores = scores.masked_fill(~visible, float("-inf"))
    exact = torch.softmax(scores, -1) @ v.double()
    assert (out.double() - exact).abs().max().item() < 1e-4
    assert (lse.double() - scores.logsumexp(-1)).abs().max().item() < 1e-4
