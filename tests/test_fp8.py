"""attncc.fp8: the Hadamard rotation, block/tensor quantisation and the FP8 kernel emulation."""

from __future__ import annotations

import math

import pytest
import torch

from attncc.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    Fp8Scheme,
    dequantize,
    emulate_attention,
    hadamard_transform,
    quantize,
)


def sylvester(d: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("d", [1, 2, 4, 16, 64, 128])
def test_hadamard_is_the_normalised_sylvester_matrix(d: int) -> None:
    x = torch.randn(3, 5, d, dtype=torch.float64, generator=torch.Generator().manual_seed(d))
    want = x @ sylvester(d) / math.sqrt(d)
    torch.testing.assert_close(hadamard_transform(x), want, rtol=0, atol=1e-13)
    # orthogonal and symmetric: its own inverse
    torch.testing.assert_close(hadamard_transform(hadamard_transform(x)), x, rtol=0, atol=1e-13)


def test_hadamard_needs_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power-of-two head dim, got D=96"):
        hadamard_transform(torch.randn(2, 96))


def test_block_descales_are_block_maxima() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 300, 64, generator=g)  # 300 = 2 * 128 + 44: a short last block
    k = torch.randn(2, 1, 200, 64, generator=g)
    v = torch.randn(2, 1, 200, 32, generator=g)
    x = quantize(q, k, v, block=(128, 64))
    assert x.scheme == Fp8Scheme(128, 64, False)
    assert (x.q.dtype, x.k.dtype, x.v.dtype) == (FP8_DTYPE,) * 3
    assert x.q_descale.shape == (2, 3, 3) and x.q_descale.dtype == torch.float32
    assert x.k_descale.shape == (2, 1, 4) and x.v_descale.shape == (2, 1, 4)
    want = q.abs().amax(-1)[..., 256:].amax(-1) / FP8_MAX
    torch.testing.assert_close(x.q_descale[..., 2], want)
    want = v.abs().amax(-1)[..., 64:128].amax(-1) / FP8_MAX
    torch.testing.assert_close(x.v_descale[..., 1], want)
    # each block's largest element sits at the top of the FP8 range
    assert x.q[..., 256:, :].float().abs().amax(dim=(-1, -2)).eq(FP8_MAX).all()


@pytest.mark.parametrize("block", [None, (64, 32)])
@pytest.mark.parametrize("hadamard", [False, True])
def test_round_trip_within_half_an_fp8_step(block: tuple[int, int] | None, hadamard: bool) -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 130, 64, generator=g) for _ in range(3))
    x = quantize(q, k, v, block=block, hadamard=hadamard)
    assert x.q_descale.dim() == (0 if block is None else 3)
    qr, kr = (hadamard_transform(q), hadamard_transform(k)) if hadamard else (q, k)
    for orig, (got8, descale, rows) in (
        (qr, (x.q, x.q_descale, None if block is None else block[0])),
        (kr, (x.k, x.k_descale, None if block is None else block[1])),
        (v, (x.v, x.v_descale, None if block is None else block[1])),
    ):
        d = descale if rows is None else descale.repeat_interleave(rows, -1)[..., :130, None]
        err = (got8.float() * d - orig).abs()
        # e4m3: 3 mantissa bits (relative half step 2^-4), subnormal step 2^-9 (half: 2^-10)
        allowed = torch.maximum(orig.abs() * 2.0**-4, d * 2.0**-10) * (1 + 1e-6)
        assert (err <= allowed).all()
    qd, kd, vd = dequantize(x)
    assert (qd - q).abs().max() < 0.25 and (vd - v).abs().max() < 0.25
    if hadamard:
        qrot, krot, _ = dequantize(x, unrotate=False)
        torch.testing.assert_close(
            qrot @ krot.transpose(-1, -2), qd @ kd.transpose(-1, -2), atol=1e-4, rtol=0
        )


def test_zero_block_gets_a_finite_descale() -> None:
    q = torch.randn(1, 1, 256, 16)
    q[..., 128:, :] = 0
    x = quantize(q, q, q, block=(128, 128))
    assert x.q_descale[0, 0, 1] == 1.0
    assert x.q[..., 128:, :].float().eq(0).all()
    assert torch.isfinite(emulate_attention(x)).all()


def test_one_block_per_tensor_equals_per_tensor() -> None:
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 96, 32, generator=g) for _ in range(3))
    per_tensor = emulate_attention(quantize(q, k, v))
    one_block = emulate_attention(quantize(q, k, v, block=(96, 96)))
    torch.testing.assert_close(one_block, per_tensor, rtol=0, atol=1e-6)


def test_emulation_is_close_to_float64_attention() -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 256, 64, generator=g) for _ in range(3))
    exact = attention64(q, k, v)
    got = emulate_attention(quantize(q, k, v, block=(64, 64), hadamard=True)).double()
    rmse = (got - exact).pow(2).mean().sqrt().item()
    # e4m3's relative step is 2^-3; averaged over 256 keys the output error is far smaller
    assert 1e-4 < rmse < 2e-2
    # an input error of O(1) shows: a wrong descale for one block of v
    bad = quantize(q, k, v, block=(64, 64), hadamard=True)
    bad.v_descale[..., 1] *= 2
    assert (emulate_attention(bad).double() - exact).pow(2).mean().sqrt().item() > 5 * rmse


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"block": (0, 64)}, "block: expected"),
        ({"k": torch.randn(1, 1, 8, 32)}, "k: head dim 32 differs"),
        ({"q": torch.randn(1, 1, 8, 16).to(FP8_DTYPE)}, "q: expected a float16"),
        ({"hadamard": True, "q": torch.randn(8, 12), "k": torch.randn(8, 12)}, "power-of-two"),
        ({"v": torch.randn(1, 1, 8, 16, device="meta")}, "v: on meta, q on cpu; all three"),
    ],
)
def test_bad_inputs_are_one_clear_error(change: dict[str, object], error: str) -> None:
    args: dict[str, object] = {
        "q": torch.randn(1, 1, 8, 16),
        "k": torch.randn(1, 1, 8, 16),
        "v": torch.randn(1, 1, 8, 16),
        "block": (64, 64),
        "hadamard": False,
    } | change
    if args["q"].shape[-1] == 12:  # type: ignore[attr-defined]
        args["v"] = torch.randn(8, 12)
    with pytest.raises((ValueError, TypeError), match=error):
        quantize(**args)  # type: ignore[arg-type]
