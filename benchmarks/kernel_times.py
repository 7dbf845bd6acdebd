"""Where a call's time goes (GPU): each kernel's time per call of a spec on one shape under
torch.profiler, beside the call's own median time (the difference is launch gaps and host
work), for the default target or the one named, with host-module constants replaced
(NAME=VALUE: the CUDA target's tables, e.g. _WGMMA_PERSISTENT=0).

    python3 benchmarks/kernel_times.py SPEC "B,H:KVH,S,D" [auto|triton|cuda] [NAME=VALUE ...]
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import attncc
from attncc.bench import Shape, bench_inputs, sizes_for
from attncc.runtime.timing import median_ms

CALLS = 20

spec, shape_text = sys.argv[1], sys.argv[2]
target = sys.argv[3] if len(sys.argv) > 3 else "auto"
kernel = attncc.compile(spec, target=target)
sizes = sizes_for(kernel.ir, Shape.parse(shape_text))
inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=4)
args = [inputs[n] for n in kernel.input_names]
module = kernel.module(interpreted=False)
for replacement in sys.argv[4:]:
    name, value = replacement.split("=", 1)
    setattr(module, name, ast.literal_eval(value))
    if hasattr(module, "_defines"):
        module._defines.cache_clear()  # the CUDA target's: it reads the tables and is cached

for _ in range(5):  # compiles, tunes and warms up outside the profile
    kernel(*args)
torch.cuda.synchronize()
# timed before the profile: once a profiler ran, launches carried its overhead (calls of
# 200 us of kernels timed at 390)
wall = median_ms([lambda: kernel(*args)], graphed=False) * 1e3
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(CALLS):
        kernel(*args)
    torch.cuda.synchronize()
per_kernel: dict[str, float] = defaultdict(float)
for event in prof.key_averages():
    if event.device_time_total > 0:
        per_kernel[event.key] += event.device_time_total / CALLS
print(f"{spec} {shape_text} [{kernel.target}] {' '.join(sys.argv[4:])}")
for name, us in sorted(per_kernel.items(), key=lambda item: -item[1]):
    print(f"  {us:8.1f} us  {name[:90]}")
print(f"  {sum(per_kernel.values()):8.1f} us  kernels in all; {wall:.1f} us a call (median)")
