"""Time from `attncc.compile` to the first finished call on the GPU (one process).

Run twice by gpu_suite.sh: first with empty caches (cold compile, Triton JIT included),
then warm (a new process reusing the on-disk attncc and Triton caches).

    [TARGET=auto] python3 benchmarks/startup.py SPEC LABEL [profile] [phases]
        [triton-imported] [backward] [shape=B,H:KVH,S,D] [dtype=bf16|fp16|fp32]
    (profile: cProfile of the timed part; phases: when each phase of it started and how
    long it took, on the clock of the timed part, the start-up thread's too (``name@thread
    [start+seconds]``: code generation, module loads, attncc.runtime.triton_warm's thread
    and the first call's wait for it, Triton's compile and its stages); triton-imported:
    Triton imported before the clock starts, as in a process that already used
    torch.compile; backward: the inputs require grad and the first backward is timed too
    (ATTNCC_BACKWARD picks its backend); TARGET: the target compiled for, triton unless
    set; shape and dtype: the call's, default 1,8:2,256,128 bf16)

The line printed says where the call's launch configuration came from: "table" (the
heuristic table, attncc.runtime.heuristics), "tuned" (an `attncc tune` entry) and how many
tunings ran inline (ATTNCC_AUTOTUNE=1 only).
"""

from __future__ import annotations

import os
import sys
import time

start = time.perf_counter()
import torch  # noqa: E402

import attncc  # noqa: E402
from attncc.bench import Shape, bench_inputs, sizes_for  # noqa: E402

imported = time.perf_counter()
spec, label = sys.argv[1], sys.argv[2]
options = dict(arg.split("=", 1) for arg in sys.argv[3:] if "=" in arg)
flags = [arg for arg in sys.argv[3:] if "=" not in arg]
shape = Shape.parse(options.get("shape", "1,8:2,256,128"))
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
    options.get("dtype", "bf16")
]
# the CUDA context and the inputs exist before the clock starts: a model calling attncc has
# both already, so neither is part of attncc's start-up (the inputs' shapes come from the
# spec's IR: parsing and passes, no code generation; attncc.compile does both again, timed)
inputs_ir = attncc.optimise(spec)[1]
inputs = bench_inputs(inputs_ir, sizes_for(inputs_ir, shape), dtype, documents=4)
backward = "backward" in flags
leaves = [t.requires_grad_(True) for t in inputs.values() if backward and t.is_floating_point()]
torch_autograd = ""
if backward:
    # torch's own first torch.autograd.grad given a gradient (it imports sympy for the shape
    # check: 2.1 s on the H200 machine) is no part of attncc's first backward
    before = time.perf_counter()
    x = torch.ones(4, device="cuda", requires_grad=True)
    torch.autograd.grad(x * 2, x, torch.ones_like(x))
    torch_autograd = f"(torch's first autograd.grad first: {time.perf_counter() - before:.2f} s) "
torch.cuda.synchronize()
triton_import = ""
if "triton-imported" in flags:
    before = time.perf_counter()
    import triton  # noqa: F401

    triton_import = f"(Triton imported first: {time.perf_counter() - before:.2f} s) "
phases: list[tuple[str, float, float, str]] = []
if "phases" in flags:
    from phase_timing import watch_phases

    watch_phases(phases)
profile = None
if "profile" in flags:  # where a warm start's time goes: the top entries by cumtime
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
ready = time.perf_counter()
# Triton by name unless TARGET says otherwise, as in every earlier run (auto, the default,
# picks CUDA for prefill on an H100/H200)
kernel = attncc.compile(spec, target=os.environ.get("TARGET", "triton"))
compiled = time.perf_counter()
out = kernel(*(inputs[name] for name in kernel.input_names))
torch.cuda.synchronize()
done = time.perf_counter()
backward_line = ""
if backward:
    from attncc.runtime import autograd

    torch.autograd.grad(out, leaves, torch.ones_like(out))
    torch.cuda.synchronize()
    backward_time = time.perf_counter() - done
    backward_line = f", first backward {backward_time:.2f} s ({autograd.last_backend()})"
if profile is not None:
    import pstats

    profile.disable()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(45)
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)
if phases:
    spans = [
        f"{name}{'' if thread == 'MainThread' else '@' + thread} "
        f"[{begin - ready:.2f}+{end - begin:.2f}]"
        for name, begin, end, thread in sorted(phases, key=lambda phase: phase[1])
        if end - begin >= 0.01
    ]
    print(" | ".join(spans))
sources = ", ".join(f"{k} {v}" for k, v in kernel.tuner.sources.items() if v) or "module defaults"
print(
    f"{label} ({kernel.target}, {shape}, {options.get('dtype', 'bf16')}): "
    f"import {imported - start:.2f} s, {triton_import}{torch_autograd}"
    f"CUDA context and inputs {ready - imported:.2f} s, "
    f"attncc.compile {compiled - ready:.3f} s, "
    f"first call {done - compiled:.2f} s (config: {sources}; tuned inline "
    f"{kernel.tuner.tuned} time(s)), compile + first call {done - ready:.2f} s{backward_line}"
)
