"""A/B of the CUDA target's default tiles through the public call path (GPU): times
`kernel(*inputs)` (the torch op, as `attncc bench` does) with the host module's default
table entry as rendered and with each replacement, interleaved over rounds.

    python3 benchmarks/default_ab.py SPEC "B,H:KVH,S,D" NAME=(variant,warps,block_n,pingpong) ...

NAME is a module attribute (e.g. _WGMMA_TILES_INDEXED); the module reads it on every call.
"""

from __future__ import annotations

import ast
import sys

import torch
import triton.testing

import attncc
from attncc.bench import Shape, bench_inputs, sizes_for

spec, shape_text = sys.argv[1], sys.argv[2]
kernel = attncc.compile(spec, target="cuda")
sizes = sizes_for(kernel.ir, Shape.parse(shape_text))
inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=4)
args = [inputs[n] for n in kernel.input_names]
module = kernel.module(interpreted=False)
cases = [("default", None, None)]
for arg in sys.argv[3:]:
    name, value = arg.split("=", 1)
    cases.append((arg, name, ast.literal_eval(value)))
best: dict[str, float] = {}
for _ in range(3):
    for label, name, value in cases:
        saved = getattr(module, name) if name else None
        if name:
            setattr(module, name, value)
        kernel(*args)
        torch.cuda.synchronize()
        ms = float(triton.testing.do_bench(lambda: kernel(*args), return_mode="median"))
        best[label] = min(best.get(label, ms), ms)
        if name:
            setattr(module, name, saved)
print(f"{spec} {shape_text} on {torch.cuda.get_device_name()}")
for label, ms in best.items():
    print(f"  {ms * 1e3:8.1f} us  {label}")
