"""Time from `attncc.compile` to the first finished call on the GPU (one process).

Run twice by gpu_suite.sh: first with empty caches (cold compile, Triton JIT included),
then warm (a new process reusing the on-disk attncc and Triton caches).

    [TARGET=auto] python3 benchmarks/startup.py SPEC LABEL [profile]
    (profile: cProfile of the timed part; triton-imported: Triton imported before the clock
    starts, as in a process that already used torch.compile; TARGET: the target compiled
    for, triton unless set)
"""

from __future__ import annotations

import os
import sys
import time

start = time.perf_counter()
import torch  # noqa: E402

import attncc  # noqa: E402

imported = time.perf_counter()
spec, label = sys.argv[1], sys.argv[2]
# the CUDA context and the inputs exist before the clock starts: a model calling attncc has
# both already, so neither is part of attncc's start-up
q = torch.randn(1, 8, 256, 128, device="cuda", dtype=torch.bfloat16)
kv = torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
triton_import = ""
if "triton-imported" in sys.argv[3:]:
    before = time.perf_counter()
    import triton  # noqa: F401

    triton_import = f"(Triton imported first: {time.perf_counter() - before:.2f} s) "
profile = None
if "profile" in sys.argv[3:]:  # where a warm start's time goes: the top entries by cumtime
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
ready = time.perf_counter()
# Triton by name unless TARGET says otherwise, as in every earlier run (auto, the default,
# picks CUDA for prefill on an H100/H200)
kernel = attncc.compile(spec, target=os.environ.get("TARGET", "triton"))
compiled = time.perf_counter()
kernel(q, kv, kv)
torch.cuda.synchronize()
done = time.perf_counter()
if profile is not None:
    import pstats

    profile.disable()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
print(
    f"{label} ({kernel.target}): import {imported - start:.2f} s, {triton_import}"
    f"CUDA context {ready - imported:.2f} s, "
    f"attncc.compile {compiled - ready:.3f} s, "
    f"first call {done - compiled:.2f} s (autotuned {kernel.tuner.tuned} time(s)), "
    f"compile + first call {done - ready:.2f} s"
)
