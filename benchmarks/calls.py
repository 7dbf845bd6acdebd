"""What a user's call costs at the shapes a launch path decides: small prefill and decode.

Per case (spec, shape, dtype, target): attncc's time a call eager (back-to-back calls through
a rotation of input copies that moves 3x the L2 cache, wall clock: host time shows where it
exceeds the GPU's) and in CUDA graphs (replays of the same rotation), its CPU time to issue
a call (200 calls, unsynchronised), and the same for the anchor: SDPA with PyTorch's default
backend for prefill, FA2 (SDPA's flash backend) for decode. Ratios are anchor time / attncc
time (above 1: attncc faster). One JSON line a case.

    python3 benchmarks/calls.py [--json FILE] [--cases "SPEC SHAPE DTYPE TARGET;..."]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

import attncc
from attncc.bench import Shape, anchor_runners, bench_inputs, sizes_for, visible_fraction
from attncc.runtime.timing import cold_copies

SMALL = ("2,8,64,64", "2,8,256,64", "2,8,512,64", "2,8,2048,64")
DECODE = (
    ("examples/decode.attn", "1,32:8,8192,128", "bf16", "auto"),
    ("examples/decode.attn", "8,32:8,8192,128", "bf16", "auto"),
    ("examples/paged_decode.attn", "1,32:8,8192,128", "bf16", "auto"),
)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def default_cases() -> list[tuple[str, str, str, str]]:
    """Small prefill shapes, causal and full, each dtype, both targets where both run it
    (the CUDA target takes fp16 and bf16; fp32 falls back to Triton), then decode."""
    cases = []
    for spec in ("examples/causal.attn", "examples/fused.attn"):
        for dtype in ("fp16", "bf16", "fp32"):
            targets = ("auto", "triton") if dtype != "fp32" else ("auto",)
            for shape in SMALL:
                cases += [(spec, shape, dtype, target) for target in targets]
    return cases + list(DECODE)


def parse_cases(text: str) -> list[tuple[str, str, str, str]]:
    cases = []
    for item in text.split(";"):
        if item.strip():
            spec, shape, dtype, target = item.split()
            cases.append((spec, shape, dtype, target))
    return cases


def eager_us(fns: list[Callable[[], Any]], calls: int = 300, repeats: int = 3) -> float:
    """Wall microseconds a call of back-to-back eager calls through the rotation ``fns``, the
    best of ``repeats`` (a shared host's other work only ever adds time)."""
    for fn in fns[: min(len(fns), 20)]:
        fn()
    torch.cuda.synchronize()
    rounds = max(1, calls // len(fns))
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(rounds):
            for fn in fns:
                fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - began) / (rounds * len(fns)) * 1e6)
    return best


def graph_us(fns: list[Callable[[], Any]]) -> float:
    """Microseconds a call of CUDA-graph replays of the rotation ``fns``."""
    import triton.testing

    def rotation() -> None:
        for fn in fns:
            fn()

    return float(triton.testing.do_bench_cudagraph(rotation, rep=50)) * 1e3 / len(fns)


def issue_us(fn: Callable[[], Any], calls: int = 200, repeats: int = 5) -> float:
    """CPU microseconds to issue one call: ``calls`` repeated calls, unsynchronised, the best
    of ``repeats`` batches."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        began, cpu_began = time.perf_counter(), time.process_time()
        for _ in range(calls):
            fn()
        # the smaller: process time counts other threads too, wall time any wait for the GPU
        spent = min(time.perf_counter() - began, time.process_time() - cpu_began)
        torch.cuda.synchronize()
        best = min(best, spent / calls * 1e6)
    return best


def measure(spec: str, shape_text: str, dtype_name: str, target: str) -> dict[str, Any]:
    kernel = attncc.compile(spec, target=target)
    shape = Shape.parse(shape_text)
    sizes = sizes_for(kernel.ir, shape)
    dtype = DTYPES[dtype_name]
    inputs = bench_inputs(kernel.ir, sizes, dtype, documents=4)
    copies = cold_copies(inputs)
    names = kernel.input_names
    calls = [lambda c=c: kernel(*[c[n] for n in names]) for c in copies]
    began = time.perf_counter()
    calls[0]()
    torch.cuda.synchronize()
    row: dict[str, Any] = {
        "spec": spec, "shape": shape_text, "dtype": dtype_name, "target": target,
        "backend": kernel.backend_for(*[inputs[n] for n in names]),
        "first_call_s": round(time.perf_counter() - began, 3),
    }  # fmt: skip
    if kernel.target == "triton" or row["backend"] == "triton":
        triton_kernel = kernel if kernel.target == "triton" else kernel._fallback_kernel
        if triton_kernel is not None:
            row["launch"] = triton_kernel.launch_path(*[inputs[n] for n in names])
    row["eager_us"] = eager_us(calls)
    row["graph_us"] = graph_us(calls)
    row["cpu_us"] = issue_us(calls[0])
    anchor = "sdpa-flash" if kernel.ir.query_axis is None else "sdpa"  # decode: FA2
    params = kernel.param_defaults(sizes)
    fraction = visible_fraction(kernel.ir, sizes, params, inputs)
    runners = [
        anchor_runners(kernel.ir, c, sizes, params, [anchor], fraction)[anchor] for c in copies
    ]
    if all(r is not None for r in runners):
        fns: list[Callable[[], Any]] = runners  # type: ignore[assignment]
        row["anchor"] = anchor
        row["anchor_eager_us"] = eager_us(fns)
        row["anchor_graph_us"] = graph_us(fns)
        row["anchor_cpu_us"] = issue_us(fns[0])
        row["x_eager"] = row["anchor_eager_us"] / row["eager_us"]
        row["x_graph"] = row["anchor_graph_us"] / row["graph_us"]
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| spec | shape | dtype | runs | eager us | x anchor | graph us | x anchor | CPU us "
        "(anchor) | first call s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(error_line(r, 5))
            continue
        anchor = r.get("anchor", "-")
        lines.append(
            f"| {r['spec'].rsplit('/', 1)[-1]} | {r['shape']} | {r['dtype']} | {r['backend']} | "
            f"{r['eager_us']:.1f} | {r.get('x_eager', float('nan')):.2f} ({anchor}) | "
            f"{r['graph_us']:.1f} | {r.get('x_graph', float('nan')):.2f} | "
            f"{r['cpu_us']:.1f} ({r.get('anchor_cpu_us', float('nan')):.1f}) | "
            f"{r['first_call_s']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="append one JSON line a case")
    parser.add_argument("--cases", help='"SPEC SHAPE DTYPE TARGET;..." (default: all)')
    args = parser.parse_args(argv)
    cases = parse_cases(args.cases) if args.cases else default_cases()
    print(table(run_cases(measure, cases, args.json)))
    return 0


def run_cases(
    measure: Callable[..., dict[str, Any]],
    cases: Iterable[tuple[str, str, str, str]],
    json_path: str | None,
) -> list[dict[str, Any]]:
    """Each case's row, ``measure(spec, shape, dtype, target)``, printed as a JSON line and
    appended to ``json_path``; a case that raises gets a row with its error."""
    rows = []
    for spec, shape, dtype, target in cases:
        try:
            row = measure(spec, shape, dtype, target)
        except Exception as err:  # one case's failure is a row, not the end of the run
            row = {"spec": spec, "shape": shape, "dtype": dtype, "target": target,
                   "error": f"{type(err).__name__}: {err}"}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
        if json_path:
            with open(json_path, "a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


def error_line(row: dict[str, Any], cells: int) -> str:
    """A table line for a case that raised: its spec, shape, dtype and target, then its
    error and ``cells`` more cells left empty."""
    return (f"| {row['spec']} | {row['shape']} | {row['dtype']} | {row['target']} | "
            f"error: {row['error'][:80]} |" + " |" * cells)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
