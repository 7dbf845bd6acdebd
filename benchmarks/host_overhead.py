"""Is a call GPU-bound or host-bound? Per shape: the GPU time of one call (a CUDA-graph replay),
the wall time per call of back-to-back eager calls through the generated module
(``_forward``) and through ``attncc.compile(...)(...)`` (the registered torch op), and the
host functions that cost most (cProfile). A call whose eager time exceeds its GPU time is
limited by Python, not by the kernel.

    [TARGET=cuda] [DTYPE=fp16] [ISSUE_ONLY=1] \\
        python3 benchmarks/host_overhead.py SPEC "B,H:KVH,S,D" [...more pairs]

(TARGET: the target compiled for, triton unless set; DTYPE: bf16 unless set; ISSUE_ONLY=1:
only the CPU time a repeated call costs, ``issue_us``, the issue's host-overhead measure.)
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from calls import issue_us  # benchmarks/: the script's own folder is on sys.path

import attncc
from attncc.bench import Shape, bench_inputs, sizes_for
from attncc.runtime.timing import graphed


def wall_us(fn: Callable[[], Any], calls: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / calls * 1e6


def graph_us(fn: Callable[[], Any], calls: int = 50) -> float:
    replay = graphed(fn)
    replay()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / calls * 1e6


def cuda_pieces(module: Any, tensors: dict[str, Any], params: dict[str, Any]) -> None:
    """Host microseconds of the CUDA launch path's steps, each alone (no profiler)."""
    from attncc.runtime import nvrtc

    sizes, dtype, device = module._check(tensors, params)
    pieces: dict[str, Callable[[], Any]] = {
        "_check": lambda: module._check(tensors, params),
        "_vec_flags": lambda: module._vec_flags(tensors, sizes),
        "_allocate": lambda: module._allocate(sizes, dtype, device, False),
        "nvrtc._device": lambda: nvrtc._device(device),
        "current_stream": lambda: torch.cuda.current_stream(device).cuda_stream,
        "_key_tile_maps": lambda: module._key_tile_maps(tensors, sizes, 128),
        "_shared_limit": lambda: module._shared_limit(device),
    }
    timed = []
    for name, fn in pieces.items():
        fn()
        began = time.perf_counter()
        for _ in range(1000):
            fn()
        timed.append(f"{name} {(time.perf_counter() - began) * 1e3:.1f}")
    print("  host us a call: " + ", ".join(timed))


def report(spec: str, shape_text: str) -> None:
    # Triton unless asked for, as in every earlier run (auto picks CUDA for prefill on an H100)
    kernel = attncc.compile(spec, target=os.environ.get("TARGET", "triton"))
    sizes = sizes_for(kernel.ir, Shape.parse(shape_text))
    dtype_name = os.environ.get("DTYPE", "bf16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    inputs = bench_inputs(kernel.ir, sizes, dtype, documents=4)
    args = [inputs[name] for name in kernel.input_names]
    kernel(*args)  # compile (and choose the launch configuration)
    module = kernel.module(interpreted=False)
    tensors, params = module._bind(args, {})
    config = kernel.launch_config(*args) if kernel.target == "triton" else None
    if os.environ.get("ISSUE_ONLY"):
        print(
            f"{kernel.name} [{kernel.target}] {shape_text} {dtype_name}: CPU "
            f"{issue_us(lambda: kernel(*args)):.1f} us a call (best of 5 batches of 200 "
            f"unsynchronised calls, kernel(...)); GPU {graph_us(lambda: kernel(*args)):.1f} us "
            f"a call; config {config}"
        )
        return

    def forward() -> Any:
        return module._forward(tensors, params, False, config)

    gpu = graph_us(forward)
    eager_forward = wall_us(forward)
    eager_op = wall_us(lambda: kernel(*args))
    full = ""
    if kernel.target == "cuda":
        # config {} asks for the defaults without a launch plan: every call takes the checks
        # and choices again (the path before launch plans)
        full = f", full path {wall_us(lambda: module._forward(tensors, params, False, {})):.1f} us"
    print(
        f"{kernel.name} {shape_text}: GPU {gpu:.1f} us a call; eager back-to-back "
        f"_forward {eager_forward:.1f} us, compiled op {eager_op:.1f} us{full}; config {config}"
    )
    if kernel.target == "cuda":
        cuda_pieces(module, tensors, params)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(200):
        kernel(*args)
    torch.cuda.synchronize()
    profile.disable()
    for order in ("tottime", "cumtime"):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(22)
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:5000])


if __name__ == "__main__":
    pairs = sys.argv[1:]
    for spec, shape in zip(pairs[::2], pairs[1::2], strict=True):
        report(spec, shape)
