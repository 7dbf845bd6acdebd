"""What a ``torch.compile``d caller adds to a call's CPU time, against the same for SDPA.

Per case (spec, shape, dtype, target): the CPU microseconds to issue one call (200 calls,
unsynchronised, the best of 5 batches: ``calls.issue_us``) of attncc's kernel called eagerly
and from a function compiled by ``torch.compile`` (default mode: no CUDA graphs), and the
same two for the anchor (SDPA with PyTorch's default backend for prefill, FA2 for decode),
under ``torch.no_grad()`` as inference runs; with ``--grad`` also a compiled call in grad
mode (the inputs not requiring grad: the op's autograd kernel runs, and passes the call on).
"added" is compiled less eager: what compiling the caller costs each call. One JSON line a
case, then a table.

    python3 benchmarks/compiled_calls.py [--json FILE] [--cases "SPEC SHAPE DTYPE TARGET;..."]
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from calls import DTYPES, error_line, issue_us, parse_cases, run_cases  # benchmarks/: its folder

import attncc
from attncc.bench import Shape, anchor_runners, bench_inputs, sizes_for, visible_fraction

CASES = (
    ("examples/causal.attn", "2,8,512,64", "bf16", "auto"),
    ("examples/causal.attn", "2,8,64,64", "bf16", "triton"),
    ("examples/decode.attn", "1,32:8,8192,128", "bf16", "auto"),
)


def compiled(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` compiled by torch.compile, its first call (the compile) made."""
    run = torch.compile(fn)
    run()
    torch.cuda.synchronize()
    return run  # type: ignore[no-any-return]


def measure(spec: str, shape_text: str, dtype_name: str, target: str, grad: bool) -> dict[str, Any]:
    kernel = attncc.compile(spec, target=target)
    sizes = sizes_for(kernel.ir, Shape.parse(shape_text))
    inputs = bench_inputs(kernel.ir, sizes, DTYPES[dtype_name], documents=4)
    names = kernel.input_names
    args = [inputs[n] for n in names]

    def call() -> Any:
        return kernel(*args)

    row: dict[str, Any] = {"spec": spec, "shape": shape_text, "dtype": dtype_name,
                           "target": target, "backend": kernel.backend_for(*args)}  # fmt: skip
    anchor = "sdpa-flash" if kernel.ir.query_axis is None else "sdpa"  # decode: FA2
    params = kernel.param_defaults(sizes)
    fraction = visible_fraction(kernel.ir, sizes, params, inputs)
    runner = anchor_runners(kernel.ir, inputs, sizes, params, [anchor], fraction)[anchor]
    with torch.no_grad():
        call()
        row["eager_cpu_us"] = issue_us(call)
        row["compiled_cpu_us"] = issue_us(compiled(call))
        if runner is not None:
            row["anchor"] = anchor
            row["anchor_eager_cpu_us"] = issue_us(runner)
            row["anchor_compiled_cpu_us"] = issue_us(compiled(runner))
    if grad:
        torch._dynamo.reset()  # the grad-mode graph compiled afresh, as a training step's
        row["compiled_grad_cpu_us"] = issue_us(compiled(call))
    row["added_us"] = row["compiled_cpu_us"] - row["eager_cpu_us"]
    if runner is not None:
        row["anchor_added_us"] = row["anchor_compiled_cpu_us"] - row["anchor_eager_cpu_us"]
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| spec | shape | dtype | runs | CPU us eager / compiled (added) | anchor eager / "
        "compiled (added) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(error_line(r, 1))
            continue
        anchor = (
            f"{r['anchor']} {r['anchor_eager_cpu_us']:.1f} / {r['anchor_compiled_cpu_us']:.1f}"
            f" ({r['anchor_added_us']:+.1f})"
            if "anchor" in r
            else "-"
        )
        lines.append(
            f"| {r['spec'].rsplit('/', 1)[-1]} | {r['shape']} | {r['dtype']} | {r['backend']} | "
            f"{r['eager_cpu_us']:.1f} / {r['compiled_cpu_us']:.1f} ({r['added_us']:+.1f}) | "
            f"{anchor} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="append one JSON line a case")
    parser.add_argument("--cases", help='"SPEC SHAPE DTYPE TARGET;..." (default: three)')
    parser.add_argument("--grad", action="store_true", help="also a compiled call in grad mode")
    args = parser.parse_args(argv)
    cases = parse_cases(args.cases) if args.cases else CASES
    print(table(run_cases(functools.partial(measure, grad=args.grad), cases, args.json)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
