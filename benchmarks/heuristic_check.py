"""Issue 27's check: is the heuristic table's launch configuration within 10% of the best
tuning candidate on the benchmark matrix's Triton cases (GPU)?

    python3 benchmarks/heuristic_check.py [--cases "SPEC[ SHAPE];..."] [--quick]
                                          [--dtype bf16] [--rounds 2] [--json FILE]
                                          [--extra "64x32/w4/s3;..."] [--graphed]

Per case (a spec of examples/ on one shape, the Triton target): the configuration the call
runs with when nothing was tuned (``ATTNCC_AUTOTUNE=0``: the checked-in table of
attncc.runtime.heuristics) and every configuration tuning tries (``Tuner.candidates``) each
run once with the configuration forced, their outputs checked against the table's (a
mismatch is an error row: a fast wrong configuration is a bug, not a candidate), then timed
as benchmarks/sweep.py times them (``attncc.bench.prepare_config``: decode as CUDA-graph
replays over cold input copies, prefill with do_bench), in ``--rounds`` alternating rounds
after an untimed one, each keeping its best (``attncc.bench.time_rounds``). A candidate that
cannot run on this GPU is skipped, as tuning skips it. The line per case gives the table's
configuration and time, the best candidate's, table / best, and MISS above 1.10; the last
line the worst ratio and the number of misses. ``--extra`` times more configurations beside
the candidates (a table row to be, before tuning tries it); ``--graphed`` times prefill as
CUDA-graph replays too: a forced configuration takes the full path, whose host work hides
the kernel's time at small shapes. ``--json`` appends a line per case as it
finishes (a run cut short keeps what it measured).

Default cases: the matrix's bf16 Triton prefill variants at S=4096, D=128 (its FP8 column's
too) and its decode cases (benchmarks/matrix.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import matrix  # noqa: E402  (benchmarks/matrix.py: the matrix's jobs and shapes)

import attncc  # noqa: E402
from attncc.bench import (  # noqa: E402
    Shape,
    bench_inputs,
    config_mismatch,
    prepare_config,
    sizes_for,
    time_rounds,
)
from attncc.runtime import heuristics  # noqa: E402
from attncc.runtime.autotune import describe  # noqa: E402
from attncc.runtime.timing import cold_copies  # noqa: E402

EXAMPLES = ROOT / "examples"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MISS_RATIO = 1.10  # issue 27: the table's configuration within 10% of the tuned one
QUICK = (
    ("causal", "4,16,4096,128"),
    ("fused", "4,16,4096,128"),
    ("gqa_causal", "4,32:8,4096,128"),
    ("decode", "1,32:8,8192,128"),
    ("decode", "8,32:8,32768,128"),
    ("paged_decode", "8,32:8,8192,128"),
)
# where inputs live; the CPU test sets "cpu" (the Triton interpreter, its timing faked)
DEVICE = "cuda"


def default_cases() -> list[tuple[str, str]]:
    """The matrix's bf16 Triton jobs at S=4096, D=128 (prefill) and every decode shape."""
    cases = []
    for job in matrix.matrix(["bf16"], "triton"):
        if job.target != "triton" or job.dtype != "bf16":
            continue
        decode = job.spec in ("decode", "paged_decode")
        for shape in job.shapes:
            s = Shape.parse(shape)
            if decode or (s.seq == 4096 and s.head_dim == 128):
                cases.append((job.spec, shape))
    return cases


def select(text: str | None, quick: bool) -> list[tuple[str, str]]:
    """``--cases``: "SPEC SHAPE" (any shape) or "SPEC" (its default cases), ;-separated."""
    base = list(QUICK) if quick else default_cases()
    if not text:
        return base
    chosen = []
    for item in (part.split() for part in text.split(";") if part.strip()):
        if len(item) == 2:
            Shape.parse(item[1])  # a bad shape fails here, before any GPU work
            chosen.append((item[0], item[1]))
        elif len(item) == 1 and any(spec == item[0] for spec, _ in base):
            chosen += [case for case in base if case[0] == item[0]]
        else:
            raise SystemExit(f"--cases: expected 'SPEC SHAPE' or a default case's SPEC, got {item}")
    return chosen


def parse_config(text: str) -> dict[str, int]:
    """A configuration from its one word (``describe``'s ``64x32/w4/s3[/tma][/x2]``)."""
    found = re.fullmatch(r"(\d+)x(\d+)/w(\d+)/s(\d+)(/tma)?(?:/x(\d+))?", text.strip())
    if not found:
        raise SystemExit(f"--extra: expected a configuration like 64x32/w4/s3[/tma], got {text!r}")
    m, n, warps, stages, tma, waves = found.groups()
    config = {"BLOCK_M": int(m), "BLOCK_N": int(n), "num_warps": int(warps)}
    config |= {"num_stages": int(stages), "tma": int(bool(tma))}
    return config | ({"waves": int(waves)} if waves else {})


def check_case(
    spec: str,
    shape_text: str,
    dtype_name: str,
    rounds: int,
    extra: Sequence[dict[str, int]] = (),
    graphed: bool = False,
) -> dict[str, Any]:
    """One case's row (see the module's docstring); raises on an error of the case itself.
    ``extra`` configurations are timed beside the tuning candidates and may be the best;
    ``graphed`` times prefill as decode is timed (GPU time alone)."""
    dtype = DTYPES[dtype_name]
    kernel = attncc.compile(EXAMPLES / f"{spec}.attn", target="triton")
    sizes = sizes_for(kernel.ir, Shape.parse(shape_text))
    inputs = bench_inputs(kernel.ir, sizes, dtype, documents=4, device=DEVICE)
    params = kernel.param_defaults(sizes)
    table = kernel.launch_config(*(inputs[name] for name in kernel.input_names))
    candidates = [*kernel.tuner.candidates(sizes, dtype), *extra]
    # split-KV calls are timed as the tuner times them: graphed, over cold copies
    graphed = graphed or bool(heuristics.splits(kernel.ir, sizes))
    copies = cold_copies(inputs) if graphed and DEVICE == "cuda" else [inputs]
    module = kernel.module(interpreted=DEVICE != "cuda")

    configs = {describe(table): table}
    for config in candidates:
        configs.setdefault(describe(config), config)
    table_key = describe(table)
    reference, table_timer = prepare_config(kernel, module, copies, params, table, graphed)
    timers: dict[str, Callable[[], float]] = {table_key: table_timer}
    failed: dict[str, str] = {}
    mismatched: dict[str, float] = {}
    for key, config in configs.items():
        if key == table_key:
            continue
        try:
            out, timers[key] = prepare_config(kernel, module, copies, params, config, graphed)
        except Exception as err:  # past this GPU's shared memory: tuning skips it too
            failed[key] = f"{type(err).__name__}: {str(err)[:160]}"
            continue
        diff = config_mismatch(out, reference)
        if diff is not None:
            mismatched[key] = diff
    row: dict[str, Any] = {"spec": spec, "shape": shape_text, "dtype": dtype_name}
    row["table"] = table
    if mismatched:
        worst = ", ".join(f"{k} {d:.3g}" for k, d in mismatched.items())
        row["error"] = f"output differs from the table config's (max |diff|): {worst}"
        row["mismatch"] = mismatched
        return row
    timed = time_rounds(timers, rounds, required=table_key)
    for key, ms in timed.items():
        if ms is None:
            failed[key] = "failed while timed"
    ran = {describe(c): timed.get(describe(c)) for c in candidates}
    times = {k: ms for k, ms in ran.items() if ms is not None}
    if not times:
        row["error"] = "no tuning candidate ran"
        row["failed"] = failed
        return row
    best_key = min(times, key=lambda k: times[k])
    table_ms = timed[table_key]
    assert table_ms is not None  # required: its failure raised
    ratio = table_ms / times[best_key]
    row.update(
        table_config=table_key,
        table_ms=table_ms,
        best=configs[best_key],
        best_config=best_key,
        best_ms=times[best_key],
        ratio=ratio,
        miss=ratio > MISS_RATIO,
        table_is_candidate=table_key in ran,
        times=times,
        failed=failed,
    )
    return row


def line(row: dict[str, Any]) -> str:
    head = f"{row['spec']} {row['shape']} {row['dtype']}:"
    if "error" in row:
        return f"{head} ERROR {row['error']}"
    text = (
        f"{head} table {row['table_config']} {row['table_ms'] * 1e3:.1f} us"
        f" | best {row['best_config']} {row['best_ms'] * 1e3:.1f} us"
        f" | table/best {row['ratio']:.3f}"
    )
    return text + (" MISS" if row["miss"] else "")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help='"SPEC SHAPE;..." or default cases\' "SPEC;..."')
    parser.add_argument("--quick", action="store_true", help="a handful of the default cases")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (after one untimed)")
    parser.add_argument("--json", help="append one JSON line per case")
    parser.add_argument(
        "--graphed",
        action="store_true",
        help="time prefill in CUDA-graph replays: kernel time without the forced config's "
        "host work (its full path: small shapes are host-bound)",
    )
    parser.add_argument(
        "--extra", help='configurations to time beside the candidates: "64x32/w4/s3;..."'
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.rounds < 1:
        print(f"error: --rounds must be at least 1, got {args.rounds}", file=sys.stderr)
        return 2
    cases = select(args.cases, args.quick)
    extra = [parse_config(t) for t in (args.extra or "").split(";") if t.strip()]
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("error: heuristic_check.py needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ["ATTNCC_AUTOTUNE"] = "0"  # the table's configuration, never a tuned entry
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    print(f"device: {device}  torch {torch.__version__}  {len(cases)} cases", flush=True)
    rows = []
    for spec, shape in cases:
        try:
            row = check_case(spec, shape, args.dtype, args.rounds, extra, args.graphed)
        except Exception as err:
            traceback.print_exc(limit=3)
            row = {"spec": spec, "shape": shape, "dtype": args.dtype}
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        row["device"] = device
        rows.append(row)
        print(line(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    measured = [r for r in rows if "error" not in r]
    misses = sum(r["miss"] for r in measured)
    errors = len(rows) - len(measured)
    if measured:
        worst = max(measured, key=lambda r: r["ratio"])
        summary = f"worst table/best {worst['ratio']:.3f} ({worst['spec']} {worst['shape']})"
    else:
        summary = "nothing measured"
    counts = f"{misses} MISS of {len(measured)} cases (> {MISS_RATIO:.2f}); {errors} errors"
    print(f"{summary}; {counts}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
