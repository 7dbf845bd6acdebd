"""A/B of the CUDA target's default tiles through the public call path (GPU): times
`kernel(*inputs)` (the torch op, as `attncc bench` does) with the host module's default
table entry as rendered and with each replacement, interleaved over rounds.

    python3 benchmarks/default_ab.py SPEC "B,H:KVH,S,D" NAME=(variant,warps,block_n,pingpong) ...

NAME is a module attribute (e.g. _WGMMA_TILES_NARROW); the module reads it on every call.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from typing import Any

import torch

import attncc
from attncc.bench import Shape, bench_inputs, sizes_for, time_rounds
from attncc.runtime.timing import median_ms

spec, shape_text = sys.argv[1], sys.argv[2]
kernel = attncc.compile(spec, target="cuda")
sizes = sizes_for(kernel.ir, Shape.parse(shape_text))
inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=4)
args = [inputs[n] for n in kernel.input_names]
module = kernel.module(interpreted=False)


def forget() -> None:
    """Drop what the module derived from its tables: its cached defines (registers) and its
    launch plans (tiles, copies)."""
    module._defines.cache_clear()
    module._PLANS.clear()


def timed(name: str | None, value: Any) -> Callable[[], float]:
    """Times the call with module attribute `name` set to `value` (None: as rendered)."""

    def time_one() -> float:
        saved = getattr(module, name) if name else None
        if name:
            setattr(module, name, value)
        forget()
        try:
            kernel(*args)  # compiles outside the timing
            torch.cuda.synchronize()
            return median_ms([lambda: kernel(*args)], graphed=False)
        finally:
            if name:
                setattr(module, name, saved)
            forget()

    return time_one


contenders = {"default": timed(None, None)}
for arg in sys.argv[3:]:
    name, value = arg.split("=", 1)
    contenders[arg] = timed(name, ast.literal_eval(value))
best = time_rounds(contenders, rounds=3, required="default")
print(f"{spec} {shape_text} on {torch.cuda.get_device_name()}")
for label, ms in best.items():
    print(f"  {ms * 1e3:8.1f} us  {label}" if ms is not None else f"  failed  {label}")
