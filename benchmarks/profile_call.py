"""One kernel under a profiler: a few calls of a spec on one shape with the default
configuration (no tuning), for `ncu` to pick a launch of (see `gpu_suite.sh profile`).

    ncu --kernel-name regex:fwd --launch-skip 3 --launch-count 1 \
        python3 benchmarks/profile_call.py SPEC "B,H:KVH,S,D" [triton|cuda]
"""

from __future__ import annotations

import os
import sys

import torch

os.environ.setdefault("ATTNCC_AUTOTUNE", "0")

import attncc
from attncc.bench import Shape, bench_inputs, sizes_for

spec, shape_text = sys.argv[1], sys.argv[2]
target = sys.argv[3] if len(sys.argv) > 3 else "triton"
kernel = attncc.compile(spec, target=target)
sizes = sizes_for(kernel.ir, Shape.parse(shape_text))
inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=4)
args = [inputs[name] for name in kernel.input_names]
for _ in range(6):
    kernel(*args)
torch.cuda.synchronize()
print(f"profiled {kernel.name} {shape_text} [{target}]")
