"""The targets side by side through the public call path (GPU): per spec and shape, the
median time of ``kernel(*inputs)`` as `attncc bench` times it (``do_bench``, L2 cleared
before each call) for target auto, cuda and triton, interleaved over rounds, and each one's
host time a call (back-to-back calls on a one-tile shape, where the GPU waits on Python).

    python3 benchmarks/target_ab.py SPEC "B,H:KVH,S,D" [...more SPEC SHAPE pairs]
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

import attncc
from attncc.bench import Shape, bench_inputs, sizes_for, time_rounds
from attncc.runtime.timing import median_ms

TARGETS = ("auto", "cuda", "triton")


def args_for(kernel: attncc.Kernel, shape: str) -> list[Any]:
    inputs = bench_inputs(kernel.ir, sizes_for(kernel.ir, Shape.parse(shape)), torch.bfloat16, 4)
    return [inputs[name] for name in kernel.input_names]


def host_us(kernel: attncc.Kernel, args: list[Any], calls: int = 300) -> float:
    for _ in range(20):
        kernel(*args)
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        kernel(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / calls * 1e6


def report(spec: str, shape: str) -> None:
    kernels = {target: attncc.compile(spec, target=target) for target in TARGETS}
    _, heads, _, head_dim = shape.split(",")
    tiny = f"1,{heads},64,{head_dim}"  # one tile a head: the GPU waits on the host
    calls = {}
    for target, kernel in kernels.items():
        args = args_for(kernel, shape)
        kernel(*args)  # compiles (and tunes) outside the timing
        calls[target] = lambda kernel=kernel, args=args: median_ms([lambda: kernel(*args)], False)
    best = time_rounds(calls, rounds=3)
    print(f"{spec} {shape} on {torch.cuda.get_device_name()}")
    for target, kernel in kernels.items():
        ms = best[target]
        host = host_us(kernel, args_for(kernel, tiny))
        shown = f"{ms * 1e3:8.1f} us" if ms is not None else "  failed"
        print(f"  {target:6s} ({kernel.target:6s}) {shown}   host {host:5.1f} us a call ({tiny})")


if __name__ == "__main__":
    pairs = sys.argv[1:]
    for spec, shape in zip(pairs[::2], pairs[1::2], strict=True):
        report(spec, shape)
