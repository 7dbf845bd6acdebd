"""What a backward costs the host: CPU microseconds to issue one backward of a spec
(``torch.autograd.grad`` over a kept forward graph, 200 calls unsynchronised, best of 5
batches) through attncc's two backends and the anchors' backward, then the host functions
that cost attncc's training step (forward and backward; PROFILE_STEP=attncc-cuda: its
backward) most (cProfile).

    python3 benchmarks/backward_host.py SPEC "B,H:KVH,S,D" [SHAPE ...] [--dtype bf16]
                                        [--anchors flex,sdpa-flash] [--no-profile]

Beside them, each backward's time in a CUDA-graph replay (GPU time, no host work) and in
eager back-to-back calls (``wall``): where wall exceeds the GPU time the call is host-bound.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from backward_backends import anchor_backwards  # noqa: E402
from calls import issue_us  # noqa: E402
from host_overhead import graph_us, wall_us  # noqa: E402

import attncc  # noqa: E402
from attncc.bench import Shape, anchor_runners, bench_inputs, sizes_for  # noqa: E402
from attncc.runtime import autograd  # noqa: E402

ANCHORS = {"flex": "flex", "sdpa-flash": "fa2"}


def with_backend(backend: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        os.environ["ATTNCC_BACKWARD"] = backend
        try:
            return fn()
        finally:
            os.environ.pop("ATTNCC_BACKWARD")

    return call


def one_shape(spec: str, shape: str, dtype: torch.dtype, anchors: list[str], profile: bool) -> None:
    kernel = attncc.compile(spec)
    sizes = sizes_for(kernel.ir, Shape.parse(shape))
    inputs = bench_inputs(kernel.ir, sizes, dtype, documents=4)
    floats = [n for n in kernel.input_names if inputs[n].is_floating_point()]
    args = [inputs[name] for name in kernel.input_names]
    with torch.no_grad():
        grad = torch.randn_like(kernel(*args))
    steps: dict[str, Callable[[], Any]] = {}
    # graph replays first: a live eager graph of the same leaves breaks capture (torch's
    # autograd makes the default stream wait on it)
    for name in floats:
        inputs[name].requires_grad_(True)
    leaves = [inputs[n] for n in floats]
    graphs: dict[str, float] = {}
    for backend in ("cuda", "triton"):
        step = with_backend(backend, lambda: torch.autograd.grad(kernel(*args), leaves, grad))
        graphs[backend] = graph_us(step)
    out = kernel(*args)
    for backend in ("cuda", "triton"):
        steps[f"attncc-{backend}"] = with_backend(
            backend, lambda: torch.autograd.grad(out, leaves, grad, retain_graph=True)
        )
    steps["attncc-cuda"]()
    ran = autograd.last_backend()
    params = kernel.param_defaults(sizes)
    runners = anchor_runners(kernel.ir, inputs, sizes, params, anchors, 0.5) if anchors else {}
    steps.update(anchor_backwards(runners, leaves, grad))
    for anchor, label in ANCHORS.items():
        runner = runners.get(anchor)
        if runner is None:
            continue
        steps[f"{label} step"] = lambda r=runner: torch.autograd.grad(r(), leaves[:3], grad)
        steps[f"{label} forward"] = runner
    steps["attncc step"] = lambda: torch.autograd.grad(kernel(*args), leaves, grad)
    steps["attncc forward"] = lambda: kernel(*args)
    print(f"{spec} {shape} {dtype} (the cuda backend ran: {ran})")
    print(
        "  step in a CUDA graph (forward + backward, GPU time): "
        + ", ".join(f"{b} {us:.1f} us" for b, us in graphs.items())
    )
    for label, fn in steps.items():
        print(f"  {label}: CPU {issue_us(fn):.1f} us a backward, eager wall {wall_us(fn):.1f} us")
    layers(kernel, args, grad, [n for n in kernel.input_names if n in floats])
    if not profile:
        return
    profiler = cProfile.Profile()
    step = steps[os.environ.get("PROFILE_STEP", "attncc step")]
    profiler.enable()
    for _ in range(200):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    for order in ("tottime", "cumtime"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(28)
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


class _Nothing(torch.autograd.Function):
    """Two outputs shaped as attncc's (out, lse), a backward that launches nothing: what
    torch's engine and a Python autograd.Function cost a backward without any kernel."""

    @staticmethod
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor) -> Any:
        ctx.saved_tensors  # noqa: B018 - unpacked as attncc's backward does
        return grad_out, grad_out, grad_out


def layers(kernel: Any, args: list[torch.Tensor], grad: torch.Tensor, floats: list[str]) -> None:
    """CPU microseconds of each layer of attncc's backward (sm_90a where it runs), each
    called directly: the backward op (torch's dispatcher), the Kernel's method behind it,
    ``Backward.run``, the host module's ``_backward_hopper``."""
    inputs = [a.detach() for a in args]
    with torch.no_grad():
        out, lse = kernel._op(*inputs, *[None] * len(kernel.param_names), return_lse=True)
    grad_lse = torch.zeros_like(lse)
    needs = [True] * len(floats)
    name = kernel._op._schema.name.split("::")[-1]
    bwd = getattr(torch.ops.attncc, f"{name}_bwd").default
    params = [None] * len(kernel.param_names)
    tensors = dict(zip(kernel.input_names, inputs, strict=True))
    host = kernel._host
    timed = {
        "bwd op": lambda: bwd(*inputs, *params, out, lse, grad, grad_lse, needs),
        "Kernel._backward_run": lambda: kernel._backward_run(
            *inputs, *params, out, lse, grad, grad_lse, needs
        ),
        "Backward.run": lambda: kernel._backward.run(
            host, tensors, {}, out, lse, grad, grad_lse, needs=needs
        ),
    }
    sizes, dtype, device = host._check(tensors, {})
    defaults = host._param_defaults(sizes, {})
    hopper_args = (tensors, defaults, out, lse, grad, grad_lse.reshape(-1, lse.shape[-1]))
    hopper_args += (sizes, dtype, device, False, False)
    if hasattr(host, "_backward_hopper_plan"):
        timed["_backward_hopper"] = lambda: host._backward_hopper(*hopper_args)
        plan = host._backward_hopper_plan(*hopper_args)
        timed["its BackwardPlan"] = lambda: plan(tensors, out, lse, grad, hopper_args[5])
        timed["the plan's allocate"] = plan.allocate
    leaves = [a.detach().requires_grad_(True) for a in args[:3]]
    nothing = _Nothing.apply(*leaves)[0]  # type: ignore[no-untyped-call]
    timed["a Function launching nothing, through torch.autograd.grad"] = lambda: (
        torch.autograd.grad(nothing, leaves, grad, retain_graph=True)
    )
    cells = []
    for label, fn in timed.items():
        os.environ["ATTNCC_BACKWARD"] = "cuda"
        try:
            cells.append(f"{label} {issue_us(fn):.1f}")
        finally:
            os.environ.pop("ATTNCC_BACKWARD")
    print("  CPU us a call, by layer: " + ", ".join(cells))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("shapes", nargs="+")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--anchors", default=",".join(ANCHORS), help="comma separated, or none")
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    anchors = [a for a in args.anchors.split(",") if a in ANCHORS]
    for shape in args.shapes:
        one_shape(args.spec, shape, dtype, anchors, not args.no_profile)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
