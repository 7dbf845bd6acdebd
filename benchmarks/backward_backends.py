"""attncc's two backward backends side by side with Flex's and SDPA's backward, in one process.

    python3 benchmarks/backward_backends.py SPEC "B,H:KVH,S,D" [SHAPE ...] [--dtype bf16]
                                            [--rounds 3] [--anchors flex,sdpa-flash,sdpa-cudnn]
                                            [--frozen slopes] [--documents 4] [--graphs]

Per shape: attncc's forward (no grad) and its backward through ``torch.autograd.grad`` with
the CUDA target's sm_90a kernel (``ATTNCC_BACKWARD=cuda``, where the spec and call allow it:
the line above the times says which backend ran) and with the Triton backward (as
``torch.use_deterministic_algorithms(True)`` runs it: two passes, no atomics), Flex's
backward (``torch.compile(flex_attention)``) and SDPA's FA2 and cuDNN backward where SDPA
computes the spec. Times are ``do_bench`` medians (L2 cleared
before every call), the best of ``--rounds`` rounds in alternating order
(``attncc.bench.time_rounds``). Ratios: the anchor's time over the sm_90a backward's (above
1: it is faster); bwd/fwd: that backward over attncc's own forward. Its gradients are
checked against the Triton backward's first (max |diff| over max |grad|). ``--graphs``: also
forward and backward as one step (sm_90a backward), eager and replayed from a CUDA graph.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton.testing

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
import attncc  # noqa: E402
from attncc.bench import Shape, anchor_runners, bench_inputs, sizes_for, time_rounds  # noqa: E402
from attncc.runtime import autograd  # noqa: E402
from attncc.runtime.timing import graphed  # noqa: E402

ANCHORS = {"flex": "flex", "sdpa-flash": "fa2", "sdpa-cudnn": "cudnn"}


def anchor_backwards(
    runners: dict[str, Callable[[], torch.Tensor] | None],
    leaves: list[torch.Tensor],
    grad: torch.Tensor,
) -> dict[str, Callable[[], object]]:
    """Each anchor's backward of q, k and v over a forward graph kept for it, by ANCHORS'
    label, for the anchors ``runners`` (attncc.bench.anchor_runners) can run."""
    calls: dict[str, Callable[[], object]] = {}
    for anchor, label in ANCHORS.items():
        runner = runners.get(anchor)
        if runner is None:
            continue
        with torch.enable_grad():
            out = runner()
        calls[label] = lambda o=out: torch.autograd.grad(o, leaves[:3], grad, retain_graph=True)
    return calls


def timed(step: Callable[[], object]) -> Callable[[], float]:
    return lambda: float(triton.testing.do_bench(step, warmup=25, rep=100))


def one_shape(
    spec: str,
    shape: str,
    dtype: torch.dtype,
    rounds: int,
    anchors: list[str],
    frozen: list[str],
    documents: int,
    graphs: bool,
) -> None:
    kernel = attncc.compile(spec)
    sizes = sizes_for(kernel.ir, Shape.parse(shape))
    inputs = bench_inputs(kernel.ir, sizes, dtype, documents=documents)
    floats = [n for n in kernel.input_names if inputs[n].is_floating_point() and n not in frozen]
    for name in floats:
        inputs[name].requires_grad_(True)
    leaves = [inputs[n] for n in floats]
    args = [inputs[name] for name in kernel.input_names]
    with torch.no_grad():  # no autograd graph (see below)
        grad = torch.randn_like(kernel(*args))
    steps: dict[str, Callable[[], float]] = {}
    if graphs:
        # forward and backward as one training step, eager and replayed from a CUDA graph
        # (the backward's host work gone): what reduce-overhead compiles users pay. Captured
        # before any eager forward: with an eager call's graph alive on the default stream,
        # torch's autograd makes the default stream wait on the capture (an error; SDPA's
        # backward the same)
        def train_step() -> tuple[torch.Tensor, ...]:
            os.environ["ATTNCC_BACKWARD"] = "cuda"
            try:
                return torch.autograd.grad(kernel(*args), leaves, grad)
            finally:
                os.environ.pop("ATTNCC_BACKWARD")

        steps = {"step": timed(train_step), "step-graph": timed(graphed(train_step))}
    out = kernel(*args)

    def backward(deterministic: bool) -> tuple[torch.Tensor, ...]:
        # the sm_90a kernel where it can run, or Triton's two passes (deterministic)
        torch.use_deterministic_algorithms(deterministic)
        os.environ["ATTNCC_BACKWARD"] = "triton" if deterministic else "cuda"
        try:
            return torch.autograd.grad(out, leaves, grad, retain_graph=True)
        finally:
            torch.use_deterministic_algorithms(False)
            os.environ.pop("ATTNCC_BACKWARD")

    default = backward(False)
    ran = autograd.last_backend()
    triton_grads = backward(True)
    for name, a, b in zip(floats, default, triton_grads, strict=True):
        diff = float((a - b).abs().max()) / (float(b.abs().max()) or 1.0)
        print(f"  {name}: backward ({ran}) against Triton's: {diff:.2e}")

    def forward() -> None:
        with torch.no_grad():
            kernel(*args)

    contenders: dict[str, Callable[[], float]] = {
        "fwd": timed(forward),
        "bwd": timed(lambda: backward(False)),
        "triton": timed(lambda: backward(True)),
        **steps,
    }
    params = kernel.param_defaults(sizes)
    runners = anchor_runners(kernel.ir, inputs, sizes, params, anchors, 0.5) if anchors else {}
    for label, call in anchor_backwards(runners, leaves, grad).items():
        contenders[label] = timed(call)
    best = time_rounds(contenders, rounds, required="bwd")
    bwd = best["bwd"]
    assert bwd is not None
    cells = [f"{label} {ms * 1000:.1f} us" for label, ms in best.items() if ms is not None]
    ratios = [f"bwd/fwd {bwd / best['fwd']:.2f}"] if best.get("fwd") else []
    ratios += [
        f"x{label} {ms / bwd:.2f}"
        for label, ms in best.items()
        if label not in ("fwd", "bwd", "step", "step-graph") and ms
    ]
    if best.get("step") and best.get("step-graph"):
        ratios.append(f"step graph/eager {best['step-graph'] / best['step']:.3f}")
    print(f"{spec} {shape} {dtype}: " + ", ".join(cells))
    print("  " + ", ".join(ratios))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("shapes", nargs="+")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--anchors", default=",".join(ANCHORS), help="comma separated, or none")
    parser.add_argument("--documents", type=int, default=4, help="equal documents a sequence")
    parser.add_argument(
        "--graphs", action="store_true", help="also forward + backward, eager and CUDA-graphed"
    )
    parser.add_argument(
        "--frozen", default="", help="float inputs without a gradient (comma separated: slopes)"
    )
    args = parser.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    for shape in args.shapes:
        anchors = [a for a in args.anchors.split(",") if a in ANCHORS]
        frozen = [n for n in args.frozen.split(",") if n]
        one_shape(
            args.spec, shape, dtype, args.rounds, anchors, frozen, args.documents, args.graphs
        )
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
