"""FP8 attention's speed on the GPU: the FP8 kernel against bf16, and quantisation's cost.

Times, on one shape (``B,H,S,D``), full attention and causal, with ``triton.testing.do_bench``
medians (L2 cleared before each call), rounds alternating as in ``attncc.bench``:

- ``bf16``: ``examples/fused.attn`` (``causal.attn``) on bf16 q, k, v, the default target
  (the CUDA kernels on an H100/H200), and ``bf16 triton`` the Triton target's;
- ``fp8``: ``examples/fp8_block.attn`` (``fp8_causal.attn`` for causal) on
  ``attncc.fp8.quantize``'s output (block 128x128: v key-major, P·V in FP8), the default
  target (Triton), and ``fp8 cuda`` the CUDA target's sm_90a kernel;
- ``quantize`` and ``quantize+H``: ``attncc.fp8.quantize(q, k, v, block=(128, 128))`` without
  and with the Hadamard rotation (one Triton kernel per tensor), from bf16 inputs;
- ``quantize (torch)`` and ``quantize+H (torch)``: the same through ``attncc.fp8.quantize_torch``
  (torch eager ops), for comparison;
- ``quantize graphed`` and ``quantize+H graphed``: ``quantize`` replayed from a CUDA graph (its
  GPU time, no host time);
- ``quantize, fp8`` and ``quantize+H, fp8``: quantisation then the FP8 kernel, eager, as a
  user calls them (quantize's host time overlaps the kernel before it);

and prints fp8's speedup over bf16 (issue target >= 1.5x), quantisation's time as a share
of the FP8 kernel's (target <= 10% at 8k): alone, graphed, and what it adds to the eager
pair, and the CPU time to issue one ``quantize`` call (50 calls, unsynchronised).
``--configs`` also times the FP8 kernels at each launch configuration given (the heuristic
table's sweep). Needs a CUDA GPU.

    python3 benchmarks/fp8_speed.py [--shape 1,16,8192,128] [--rounds 3]
        [--configs "BLOCK_M,BLOCK_N,num_warps,num_stages;..."]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import triton.testing
from calls import issue_us  # benchmarks/: the script's own folder is on sys.path

import attncc
from attncc.fp8 import Fp8Inputs, quantize, quantize_torch
from attncc.runtime.timing import graphed

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
    parser.add_argument("--configs", help='"BLOCK_M,BLOCK_N,num_warps,num_stages;..." (FP8 only)')
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
    kernels = {
        "bf16": attncc.compile(EXAMPLES / "fused.attn"),
        "bf16 triton": attncc.compile(EXAMPLES / "fused.attn", target="triton"),
        "fp8": attncc.compile(EXAMPLES / "fp8_block.attn"),
        "fp8 cuda": attncc.compile(EXAMPLES / "fp8_block.attn", target="cuda"),
        "bf16 causal": attncc.compile(EXAMPLES / "causal.attn"),
        "bf16 triton causal": attncc.compile(EXAMPLES / "causal.attn", target="triton"),
        "fp8 causal": attncc.compile(EXAMPLES / "fp8_causal.attn"),
        "fp8 cuda causal": attncc.compile(EXAMPLES / "fp8_causal.attn", target="cuda"),
    }
    x = quantize(q, k, v, block=BLOCK)
    fp8_args = unpacked(x)
    blocks = {"block_m": BLOCK[0], "block_n": BLOCK[1]}
    calls: dict[str, Callable[[], object]] = {}
    for key, kernel in kernels.items():
        if key.startswith("fp8"):
            calls[key] = lambda f=kernel: f(*fp8_args, **blocks)
        else:
            calls[key] = lambda f=kernel: f(q, k, v)
    for text in filter(None, (args.configs or "").split(";")):
        bm, bn, warps, stages = (int(t) for t in text.split(","))
        config = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "tma": 1}
        for key in ("fp8", "fp8 causal"):
            calls[f"{key} {bm}x{bn} w{warps} s{stages}"] = pinned(
                kernels[key], fp8_args, blocks, config
            )
    quantizers = {
        "quantize": lambda: quantize(q, k, v, block=BLOCK),
        "quantize+H": lambda: quantize(q, k, v, block=BLOCK, hadamard=True),
    }
    calls |= quantizers | {
        "quantize (torch)": lambda: quantize_torch(q, k, v, block=BLOCK),
        "quantize+H (torch)": lambda: quantize_torch(q, k, v, block=BLOCK, hadamard=True),
    }
    fp8 = kernels["fp8"]
    for key, quantizer in quantizers.items():
        calls[f"{key} graphed"] = graphed(quantizer)
        calls[f"{key}, fp8"] = lambda f=quantizer: fp8(*unpacked(f()), **blocks)
    times = time_rounds(calls, args.rounds)
    name = torch.cuda.get_device_name()
    print(f"{name}, torch {torch.__version__}, triton {triton.__version__}, shape {args.shape}")
    for key, launch in (("fp8", kernels["fp8"]), ("fp8 causal", kernels["fp8 causal"])):
        print(f"{key} launch configuration: {launch.launch_config(*fp8_args, **blocks)}")
    for key, ms in times.items():
        work = flops(b, h, s, d) / (2 if "causal" in key else 1)
        rate = f"{work / ms / 1e9:.0f} TFLOP/s" if not key.startswith("quantize") else ""
        print(f"{key:<28} {ms * 1e3:9.1f} us  {rate}")
    for mask in ("", " causal"):
        for fp8_key in (f"fp8{mask}", f"fp8 cuda{mask}"):
            fp8_ms = times[fp8_key]
            print(
                f"{fp8_key} / bf16{mask}: {times[f'bf16{mask}'] / fp8_ms:.2f}x (target >= 1.5x), "
                f"/ bf16 triton{mask}: {times[f'bf16 triton{mask}'] / fp8_ms:.2f}x"
            )
    for how, suffix in (("alone", ""), ("graphed", " graphed")):
        share = times[f"quantize{suffix}"] / times["fp8"]
        share_h = times[f"quantize+H{suffix}"] / times["fp8"]
        print(
            f"quantize {how}: {share:.0%} of the fp8 kernel, with Hadamard {share_h:.0%} "
            "(target <= 10%)"
        )
    added = times["quantize, fp8"] / times["fp8"] - 1
    added_h = times["quantize+H, fp8"] / times["fp8"] - 1
    print(f"quantize, fp8 (eager): +{added:.0%} on the fp8 kernel, with Hadamard +{added_h:.0%}")
    for key, quantizer in quantizers.items():
        print(f"{key}: {issue_us(quantizer, calls=50):.1f} us of CPU time a call")
    torch_share = times["quantize (torch)"] / times["fp8"]
    torch_share_h = times["quantize+H (torch)"] / times["fp8"]
    print(f"quantize (torch): {torch_share:.0%}, with Hadamard {torch_share_h:.0%}")
    return 0


def unpacked(x: Fp8Inputs) -> tuple[torch.Tensor, ...]:
    return (x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale)


def pinned(
    kernel: attncc.Kernel,
    args: tuple[torch.Tensor, ...],
    params: dict[str, int],
    config: dict[str, int],
) -> Callable[[], object]:
    """A call of ``kernel``'s module at the launch configuration ``config``."""
    module = kernel.module(interpreted=False)
    tensors, bound = module._bind(list(args), params)
    sizes = module._check(tensors, bound)[0]
    full = {**kernel.param_defaults(sizes), **bound}
    return lambda: module._forward(tensors, full, False, config)


if __name__ == "__main__":
    sys.exit(main())
