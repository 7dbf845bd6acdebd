"""One call of the CUDA target's fused kernel with an explicit launch configuration (GPU):
prints its time and, where the float64 reference is cheap (small shapes), its error. A call still
running after PROBE_TIMEOUT_S seconds (60) prints every thread's Python stack and exits: with
CUDA_LAUNCH_BLOCKING=1 the stack names the launch that hangs.

    python3 benchmarks/config_probe.py SPEC "B,H:KVH,S,D" '{"wgmma": 2, "num_warps": 4}'
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

import torch

import attncc
from attncc.bench import Shape, bench_inputs, sizes_for
from attncc.reference import reference

faulthandler.dump_traceback_later(float(os.environ.get("PROBE_TIMEOUT_S", "60")), exit=True)
spec, shape_text, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
kernel = attncc.compile(spec, target="cuda")
module = kernel.module(interpreted=False)
sizes = sizes_for(kernel.ir, Shape.parse(shape_text))
inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=4)
args = [inputs[n] for n in kernel.input_names]
tensors, bound = module._bind(args, {})
params = {**kernel.param_defaults(sizes), **bound}
out, _ = module._forward(tensors, params, False, config)  # compiles
torch.cuda.synchronize()
start = time.perf_counter()
out, _ = module._forward(tensors, params, False, config)
torch.cuda.synchronize()
line = f"{spec} {shape_text} {config}: {1e6 * (time.perf_counter() - start):.0f} us"
if out.numel() <= 1 << 22:
    expected = torch.from_numpy(reference(kernel.spec)(*(a.cpu() for a in args)))
    line += f", max error {(out.double().cpu() - expected).abs().max().item():.3g}"
print(line, flush=True)
