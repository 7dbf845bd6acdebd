"""FP8 attention's speed on the GPU: the FP8 kernel against bf16, and quantisation's cost.

Times, on one shape (``B,H,S,D``, full attention), with ``triton.testing.do_bench`` medians
(L2 cleared before each call), rounds alternating as in ``attncc.bench``:

- ``bf16``: ``examples/fused.attn`` on bf16 q, k, v;
- ``fp8``: ``examples/fp8_block.attn`` on ``attncc.fp8.quantize``'s output (block 128x128);
- ``quantize`` and ``quantize+H``: ``attncc.fp8.quantize(q, k, v, block=(128, 128))`` without
  and with the Hadamard rotation (one Triton kernel per tensor), from bf16 inputs;
- ``quantize (torch)`` and ``quantize+H (torch)``: the same through ``attncc.fp8.quantize_torch``
  (torch eager ops), for comparison;

and prints fp8's speedup over bf16 (issue target >= 1.5x) and quantisation's time as a share
of the FP8 kernel's (target <= 10% at 8k). Needs a CUDA GPU.

    python3 benchmarks/fp8_speed.py [--shape 1,16,8192,128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import triton.testing

import attncc
from attncc.fp8 import quantize, quantize_torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BLOCK = (128, 128)


def flops(b: int, h: int, s: int, d: int) -> float:
    return 4.0 * b * h * s * s * d


def time_rounds(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Best median ms of each call over ``rounds`` rounds, every other round reversed."""
    best = dict.fromkeys(calls, float("inf"))
    names = list(calls)
    for name in names:  # an untimed round: compiles, tunes, warms the clocks
        calls[name]()
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            ms = triton.testing.do_bench(calls[name], return_mode="median")
            best[name] = min(best[name], float(ms))
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--shape", default="1,16,8192,128", help="B,H,S,D")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_speed.py needs a CUDA GPU", file=sys.stderr)
        return 2
    b, h, s, d = (int(x) for x in args.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(b, h, s, d, device="cuda", generator=gen, dtype=torch.bfloat16)
        for _ in range(3)
    )
    bf16 = attncc.compile(EXAMPLES / "fused.attn", target="triton")
    fp8 = attncc.compile(EXAMPLES / "fp8_block.attn")
    x = quantize(q, k, v, block=BLOCK)
    fp8_args = (x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale)
    times = time_rounds(
        {
            "bf16": lambda: bf16(q, k, v),
            "fp8": lambda: fp8(*fp8_args, block_m=BLOCK[0], block_n=BLOCK[1]),
            "quantize": lambda: quantize(q, k, v, block=BLOCK),
            "quantize+H": lambda: quantize(q, k, v, block=BLOCK, hadamard=True),
            "quantize (torch)": lambda: quantize_torch(q, k, v, block=BLOCK),
            "quantize+H (torch)": lambda: quantize_torch(q, k, v, block=BLOCK, hadamard=True),
        },
        args.rounds,
    )
    name = torch.cuda.get_device_name()
    print(f"{name}, torch {torch.__version__}, triton {triton.__version__}, shape {args.shape}")
    for key, ms in times.items():
        rate = f"{flops(b, h, s, d) / ms / 1e9:.0f} TFLOP/s" if key in ("bf16", "fp8") else ""
        print(f"{key:<18} {ms * 1e3:9.1f} us  {rate}")
    speedup = times["bf16"] / times["fp8"]
    share = times["quantize"] / times["fp8"]
    share_h = times["quantize+H"] / times["fp8"]
    print(f"fp8 / bf16 speedup: {speedup:.2f}x (target >= 1.5x)")
    print(f"quantize: {share:.0%} of the fp8 kernel, with Hadamard {share_h:.0%} (target <= 10%)")
    torch_share = times["quantize (torch)"] / times["fp8"]
    torch_share_h = times["quantize+H (torch)"] / times["fp8"]
    print(f"quantize (torch): {torch_share:.0%}, with Hadamard {torch_share_h:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
