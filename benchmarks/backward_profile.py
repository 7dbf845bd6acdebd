"""Where a backward's GPU time goes: attncc's backward of a spec on one shape, and Flex's
backward of the same spec, under torch.profiler, one table of CUDA kernels each (time per
call, calls, share), so a kernel or a copy that should not be there shows at once.

    python3 benchmarks/backward_profile.py SPEC "B,H:KVH,S,D" [bf16|fp16] [--documents N]
                                           [--deterministic] [--host] [--no-flex]

``--documents``: equal documents a sequence (4); ``--deterministic``: attncc's backward under
``torch.use_deterministic_algorithms(True)`` (two passes, no atomics, for every spec);
``--host``: also the CPU time to issue one backward (benchmarks/calls.py's issue_us: 200
calls unsynchronised) and where it goes (cProfile, the top entries by own time);
``--no-flex``: attncc's table alone (Flex's backward not compiled).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from collections.abc import Callable

import torch
from calls import issue_us  # benchmarks/: the script's own folder is on sys.path
from torch.profiler import ProfilerActivity, profile

import attncc
from attncc.bench import Shape, bench_inputs, sizes_for
from attncc.runtime import autograd

REPS = 5


def kernel_table(label: str, step: Callable[[], None]) -> None:
    for _ in range(2):  # compile and warm outside the profile
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.device_time_total for e in events) or 1.0
    print(f"{label}: {total / REPS:.1f} us of GPU time a backward")
    for e in sorted(events, key=lambda e: -e.device_time_total)[:12]:
        share = 100 * e.device_time_total / total
        per = e.device_time_total / REPS
        print(f"  {per:9.1f} us  {e.count // REPS:3d} calls  {share:5.1f}%  {e.key[:90]}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("shape")
    parser.add_argument("dtype", nargs="?", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--documents", type=int, default=4)
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--host", action="store_true")
    parser.add_argument("--no-flex", action="store_true")
    args = parser.parse_args(argv)
    spec, dtype = args.spec, {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    kernel = attncc.compile(spec)
    sizes = sizes_for(kernel.ir, Shape.parse(args.shape))
    inputs = bench_inputs(kernel.ir, sizes, dtype, documents=args.documents)
    floats = [n for n in kernel.input_names if inputs[n].is_floating_point()]
    for name in floats:
        inputs[name].requires_grad_(True)
    out = kernel(*[inputs[name] for name in kernel.input_names])
    grad = torch.randn_like(out)
    leaves = [inputs[n] for n in floats]
    torch.use_deterministic_algorithms(args.deterministic)

    def step() -> None:
        torch.autograd.grad(out, leaves, grad, retain_graph=True)

    kernel_table(f"attncc {spec}", step)
    print(f"  backend: {autograd.last_backend()}")
    if args.host:
        print(f"  CPU to issue one backward: {issue_us(step):.1f} us")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(50):
            step()
        profiler.disable()
        torch.cuda.synchronize()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    torch.use_deterministic_algorithms(False)
    if args.no_flex:
        return
    from attncc.bench import anchor_runners

    params = kernel.param_defaults(sizes)
    runners = anchor_runners(kernel.ir, inputs, sizes, params, ["flex"], 0.5)
    flex = runners.get("flex")
    if flex is None:
        print("flex: no anchor for this spec")
        return
    with torch.enable_grad():
        flex_out = flex()
    kernel_table("flex", lambda: torch.autograd.grad(flex_out, leaves[:3], grad, retain_graph=True))


if __name__ == "__main__":
    main(sys.argv[1:])
