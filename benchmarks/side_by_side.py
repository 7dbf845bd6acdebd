"""Kernels of several specs and targets on one shape, timed side by side in one process: how
a variant's kernel compares with another spec's (soft-capping against causal attention, the
issue's "0.8x causal's TFLOP/s") or one target with another, in ratios that hold.

    python3 benchmarks/side_by_side.py "B,H:KVH,S,D" SPEC@TARGET [SPEC@TARGET ...]
        [--dtype bf16|fp16] [--rounds 3]

SPEC is an example's name (examples/NAME.attn) or a path; TARGET auto, triton or cuda. Each
kernel runs on its own inputs of the shape (``attncc.bench.bench_inputs``). Times are
``do_bench`` medians, L2 cleared before every call, the best of ``--rounds`` rounds in
alternating order after an untimed one (``attncc.bench.time_rounds``); each line gives the
time, TFLOP/s (halved where a causal mask hides half the scores: ``visible_fraction``) and
the time of the first entry over this one (above 1: this one is faster).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

import attncc
from attncc.bench import (
    DTYPES,
    Shape,
    bench_inputs,
    sizes_for,
    time_rounds,
    visible_fraction,
)
from attncc.runtime.timing import median_ms

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def spec_path(name: str) -> Path:
    path = Path(name)
    return path if path.suffix == ".attn" else EXAMPLES / f"{name}.attn"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", help='"B,H:KVH,S,D"')
    parser.add_argument("entries", nargs="+", help="SPEC@TARGET (target: auto, triton, cuda)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    shape = Shape.parse(args.shape)
    print(f"{args.shape} {args.dtype} on {torch.cuda.get_device_name()}")
    contenders: dict[str, Callable[[], float]] = {}
    flops: dict[str, float] = {}
    for entry in args.entries:
        name, _, target = entry.partition("@")
        kernel = attncc.compile(spec_path(name), target=target or "auto")
        sizes = sizes_for(kernel.ir, shape)
        inputs = bench_inputs(kernel.ir, sizes, DTYPES[args.dtype], documents=4)
        call_args = [inputs[n] for n in kernel.input_names]
        kernel(*call_args)  # compiles outside the timing
        fraction = visible_fraction(kernel.ir, sizes, kernel.param_defaults(sizes), inputs)
        flops[entry] = 4.0 * shape.batch * shape.heads * shape.seq**2 * shape.head_dim * fraction
        contenders[entry] = lambda k=kernel, a=call_args: median_ms([lambda: k(*a)], False)
    best = time_rounds(contenders, args.rounds)
    first = best.get(args.entries[0])
    for entry in args.entries:  # as given (time_rounds' order alternates)
        ms = best.get(entry)
        if ms is None:
            print(f"  {entry:32s} failed")
            continue
        ratio = f"  x{first / ms:.3f}" if first else ""
        tflops = flops[entry] / (ms * 1e-3) / 1e12
        print(f"  {entry:32s} {ms * 1e3:9.1f} us  {tflops:6.1f} TFLOP/s{ratio}")


if __name__ == "__main__":
    main()
