"""How an FP8 kernel's online softmax sets its error: a CPU model of the CUDA and Triton FP8
kernels' arithmetic, tile by tile, against float64 attention of the dequantised inputs.

Each model walks 128-key tiles as the kernels do: scores from the e4m3 codes in float32 times
the descales (log2 units), a running max, weights 2^(s - max) (times 2^offset) rounded to e4m3
before P·V, the row sums from the unrounded weights, O rescaled when the max moves. Softmaxes:

- ``lazy``: the max moves only when a tile's passes it by 8 log2 units (the 16-bit kernels'
  slack), weights up to 2^8: a row's largest weight is rounded to e4m3;
- ``triton``: the max follows every tile's, weights in [0, 1] (the Triton FP8 kernel);
- ``exact``: the max follows every tile's, weights times 2^8 (the CUDA FP8 kernel), so the
  largest is exactly 2^8 and small ones stay e4m3 normals;

and with ``--value-blocks`` value descales per block of 128 keys of unequal scale, whose
ratio to O's scale the CUDA kernel folds into the weights' exponent: ``exact, fold any``
folds every ratio of [1/8, 7/4], ``exact, fold`` (the kernel's rule) only powers of two and
ratios in tiles where no row's max moves, ``exact, no fold`` none. ``--acc-bits N`` also
truncates the P·V sums to N bits after aligning each k32 step's products and O to the
largest (a model of the FP8 warp-group MMA's accumulator). Prints RMSE for K's descale
scaled by each ``--scales`` factor (peaked softmaxes).

    python3 benchmarks/fp8_softmax_model.py [--scales 1,2,4] [--value-blocks] [--acc-bits 13]
"""

from __future__ import annotations

import argparse
import math

import torch

from attncc.fp8 import quantize_torch

E4M3 = torch.float8_e4m3fn
TILE = 128


def truncated_sum(acc: torch.Tensor, terms: torch.Tensor, bits: int) -> torch.Tensor:
    """``acc + terms.sum(-1)``, every addend cut to ``bits`` bits below the largest's exponent."""
    largest = torch.cat([terms.abs(), acc.abs().unsqueeze(-1)], -1).amax(-1).clamp_min(1e-38)
    step = torch.exp2(torch.floor(torch.log2(largest)) - bits).unsqueeze(-1)
    return torch.trunc(acc / step.squeeze(-1)) * step.squeeze(-1) + (
        torch.trunc(terms / step) * step
    ).sum(-1)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    factor: torch.Tensor,
    v_descale: torch.Tensor,
    softmax: str,
    acc_bits: int | None,
) -> torch.Tensor:
    """One FP8 kernel's output: ``factor [H, S, N // TILE]`` the scores' descale product times
    the scale in log2 units, ``v_descale [H, N // TILE]``."""
    heads, rows, dim = q.shape
    o = torch.zeros(heads, rows, dim)
    m = torch.full((heads, rows), -math.inf)
    l_sum = torch.zeros(heads, rows)
    o_scale = torch.ones(heads, rows)  # the value scale O's sum is over
    lazy = softmax.startswith("lazy")
    slack = 8.0 if lazy else 0.0
    offset = 0.0 if lazy or softmax == "triton" else 8.0
    for t, n0 in enumerate(range(0, k.shape[1], TILE)):
        s = (q @ k[:, n0 : n0 + TILE].transpose(-1, -2)) * factor[..., t : t + 1]
        tile_max = s.amax(-1)
        moved = tile_max > m + slack
        m_new = torch.where(moved, tile_max, m)
        alpha = torch.where(m.isinf(), torch.zeros_like(m), torch.exp2(m - m_new))
        o, l_sum, m = o * alpha.unsqueeze(-1), l_sum * alpha, m_new
        ratio = v_descale[:, t : t + 1].expand_as(m) / o_scale
        near = (ratio >= 0.125) & (ratio <= 1.75)
        if softmax.endswith("fold any"):
            fold = near
        elif softmax.endswith("no fold") or softmax in ("lazy", "triton"):
            fold = torch.zeros_like(near)
        else:
            fold = (ratio == torch.exp2(torch.round(torch.log2(ratio)))) & near | (near & ~moved)
        bias = torch.where(fold, torch.log2(ratio), torch.zeros_like(ratio))
        o = o * torch.where(fold, torch.ones_like(ratio), 1 / ratio).unsqueeze(-1)
        o_scale = torch.where(fold, o_scale, o_scale * ratio)
        weights = torch.exp2(s - m.unsqueeze(-1) + bias.unsqueeze(-1) + offset)
        l_sum = l_sum + weights.sum(-1) * torch.exp2(-bias)
        p8 = weights.to(E4M3).float()
        if acc_bits is None:
            o = o + p8 @ v[:, n0 : n0 + TILE]
            continue
        products = p8.unsqueeze(-1) * v[:, n0 : n0 + TILE].unsqueeze(1)  # [H, M, TILE, Dv]
        for k0 in range(0, TILE, 32):
            o = truncated_sum(o, products[:, :, k0 : k0 + 32].transpose(-1, -2), acc_bits)
    return o * o_scale.unsqueeze(-1) / l_sum.unsqueeze(-1)


def dequantised(codes: torch.Tensor, descale: torch.Tensor, rows: int) -> torch.Tensor:
    return codes.double() * descale.double().repeat_interleave(rows, 1).unsqueeze(-1)


SOFTMAXES = ("lazy", "triton", "exact")
FOLDS = ("lazy, fold any", "triton", "exact, fold any", "exact, fold", "exact, no fold")


def errors(
    scale: float,
    softmaxes: tuple[str, ...],
    heads: int = 4,
    seqlen: int = 1024,
    value_blocks: bool = False,
    acc_bits: int | None = None,
) -> dict[str, float]:
    """RMSE of each softmax's output against float64, K's descales times ``scale``:
    descales per head, or with ``value_blocks`` per 128 rows and values of unequal scale."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(heads, seqlen, 128, generator=gen) for _ in range(3))
    if value_blocks:  # blocks of keys whose values differ in scale
        v = v * (torch.rand(heads, seqlen, 1, generator=gen) * 3 + 0.2)
    rows = TILE if value_blocks else seqlen  # a descale per block, or one a head
    x = quantize_torch(q, k, v, block=(rows, rows))  # attncc.fp8.quantize's numbers
    qc, kc, vc = (t.float() for t in (x.q, x.k, x.v))
    qd, kd, vd = x.q_descale, x.k_descale * scale, x.v_descale
    k_tiles, v_tiles = (d.repeat_interleave(rows // TILE, 1) for d in (kd, vd))
    q_rows = qd.repeat_interleave(rows, 1)  # [H, S]
    factor = q_rows.unsqueeze(-1) * k_tiles.unsqueeze(1) / math.sqrt(128) / math.log(2)
    qx, kx, vx = (dequantised(c, d, rows) for c, d in ((qc, qd), (kc, kd), (vc, vd)))
    exact = torch.softmax(qx @ kx.transpose(-1, -2) / math.sqrt(128), -1) @ vx
    return {
        name: float(
            (attention(qc, kc, vc, factor, v_tiles, name, acc_bits).double() - exact)
            .pow(2)
            .mean()
            .sqrt()
        )
        for name in softmaxes
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="1,2,4")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--value-blocks", action="store_true")
    parser.add_argument("--acc-bits", type=int, default=None)
    args = parser.parse_args()
    softmaxes = FOLDS if args.value_blocks else SOFTMAXES
    print("K descale x  " + "".join(f"{name:>17s}" for name in softmaxes))
    for scale in (float(x) for x in args.scales.split(",")):
        found = errors(scale, softmaxes, args.heads, args.seqlen, args.value_blocks, args.acc_bits)
        print(f"{scale:>11g}  " + "".join(f"{found[name]:17.3e}" for name in softmaxes))


if __name__ == "__main__":
    main()
