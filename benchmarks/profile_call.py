"""One kernel under a profiler: a few calls of a spec on one shape with the default
configuration (no tuning), or the launch configuration given as JSON (Triton target), for
`ncu` to pick a launch of (see `gpu_suite.sh profile`). `flex` calls the FlexAttention anchor
of the same spec instead (its kernel: `--kernel-name regex:tem`); `cuda-backward` the CUDA
target's sm_90a backward of the call (``ATTNCC_BACKWARD=cuda``; its kernel:
`--kernel-name regex:_bwd$`).

    ncu --kernel-name regex:fwd --launch-skip 3 --launch-count 1 \
        python3 benchmarks/profile_call.py SPEC "B,H:KVH,S,D" [triton|cuda|flex|cuda-backward]
                                           [CONFIG_JSON]
"""

from __future__ import annotations

import json
import os
import sys

import torch

os.environ.setdefault("ATTNCC_AUTOTUNE", "0")

import attncc
from attncc.bench import Shape, anchor_runners, bench_inputs, sizes_for

spec, shape_text = sys.argv[1], sys.argv[2]
target = sys.argv[3] if len(sys.argv) > 3 else "triton"
kernel = attncc.compile(spec, target="cuda" if target.startswith("cuda") else "triton")
sizes = sizes_for(kernel.ir, Shape.parse(shape_text))
inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=4)
args = [inputs[name] for name in kernel.input_names]
config = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
if target == "flex":
    flex = anchor_runners(kernel.ir, inputs, sizes, kernel.param_defaults(sizes), ["flex"], 1.0)
    call = flex["flex"]
    assert call is not None
elif target == "cuda-backward":
    os.environ["ATTNCC_BACKWARD"] = "cuda"
    floats = [n for n in kernel.input_names if inputs[n].is_floating_point()]
    leaves = [inputs[n].requires_grad_(True) for n in floats]
    out = kernel(*args)
    grad = torch.randn_like(out)
    call = lambda: torch.autograd.grad(out, leaves, grad, retain_graph=True)  # noqa: E731
elif config is None:
    call = lambda: kernel(*args)  # noqa: E731
else:
    module = kernel.module(interpreted=False)
    tensors, bound = module._bind(args, {})
    params = {**kernel.param_defaults(sizes), **bound}
    call = lambda: module._forward(tensors, params, False, config)  # noqa: E731
for _ in range(6):
    call()
torch.cuda.synchronize()
print(f"profiled {kernel.name} {shape_text} [{target}] {config or 'default configuration'}")
