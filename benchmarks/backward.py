"""Backward times of the matrix's variants beside their forward, Flex's and SDPA's backward.

Issue 28's targets: attncc's backward against its own forward, FlexAttention's backward and
SDPA's (FA2, cuDNN), over the variants of benchmarks/matrix.py.

    python3 benchmarks/backward.py [--json benchmarks/results/backward.jsonl] [--budget 240]
        [--seqs 4096,8192] [--variants fused,causal,...] [--target auto|triton]
        [--rounds 2] [--warm-share 0.45] [--dtype bf16]
    python3 benchmarks/backward.py --table FILE     # the table of a results file

Per variant and length (bf16, D=128, 16k tokens a batch; GQA 32:8 heads):
- attncc's forward alone (no grad: the call users time), and its backward alone: the forward
  runs once on inputs that require grad (every float input: ALiBi's slopes too, so dslopes
  is computed), then ``torch.autograd.grad(out, inputs, grad_out, retain_graph=True)`` is
  timed; the gradient scatter into the inputs' shapes counts, as users get it;
- the same backward for ``torch.compile(flex_attention)`` with the matrix's score_mod and
  block mask (``attncc.bench.anchor_runners``), and for SDPA's FLASH_ATTENTION and
  CUDNN_ATTENTION backends where SDPA computes the variant (full, causal, GQA causal).
Each time is ``do_bench``'s median (L2 cleared before every call), the best of ``--rounds``
rounds timed in alternating order after an untimed one (``attncc.bench.time_rounds``).

As matrix.py does, a first phase compiles everything in parallel processes (attncc's
kernels, Flex's forward and backward per shape: the Triton and Inductor disk caches), then
one process a variant times on the GPU; rows are appended to the JSON-lines file as
measured and rows already there are skipped (a call cut short is finished by the next). A
variant that fails is an error row; one that was not reached shows as such in the table.
Ratios in the table: bwd/fwd (attncc's backward over its own forward), x<anchor> = the
anchor's backward time over attncc's (above 1: attncc faster); ``missed`` names the issue's
targets a row misses.
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import matrix  # noqa: E402  (benchmarks/matrix.py: variants, shapes, the process pool)

# the variants: full ("fused"), causal, sliding window 1024, causal + ALiBi
# (learnable slopes), causal + softcap 30, document mask, GQA 32:8 causal; full and causal
# first, whose targets include SDPA's
VARIANTS = ("fused", "causal", *(v for v in matrix.VARIANTS if v not in ("fused", "causal")))
VARIANTS += ("gqa_causal",)
SEQS = (4096, 8192)
ANCHORS = ("flex", "sdpa-flash", "sdpa-cudnn")
SHORT = {"flex": "flex", "sdpa-flash": "fa2", "sdpa-cudnn": "cudnn"}
# issue 28: backward <= 3x the kernel's own forward (full attention, D=128); >= 1.3x Flex's
# backward on every variant; >= 1.3x FA2's and >= 0.85x cuDNN's on full and causal
TARGETS = {"bwd/fwd": 3.0, "flex": 1.3, "sdpa-flash": 1.3, "sdpa-cudnn": 0.85}
SDPA_TARGETED = ("fused", "causal")


@dataclass(frozen=True)
class Job:
    """One process: a variant's shapes (``matrix.run_pool`` runs it)."""

    spec: str
    dtype: str
    shapes: tuple[str, ...]
    target: str = "auto"
    rounds: int = 2

    def command(self, json_path: str, warm: bool) -> list[str]:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", self.spec]
        cmd += ["--shapes", ";".join(self.shapes), "--dtype", self.dtype]
        cmd += ["--target", self.target, "--rounds", str(self.rounds), "--json", json_path]
        return cmd + (["--warm"] if warm else [])

    @property
    def label(self) -> str:
        return self.spec


def shapes_for(spec: str, seqs: tuple[int, ...]) -> tuple[str, ...]:
    """The matrix's D=128 shapes (16k tokens a batch; GQA: 32 query, 8 kv heads) at ``seqs``."""
    pool = matrix.GQA if spec == "gqa_causal" else matrix.D128
    by_seq = {int(s.split(",")[2]): s for s in pool}
    missing = [s for s in seqs if s not in by_seq]
    if missing:
        known = ", ".join(str(s) for s in sorted(by_seq))
        raise ValueError(f"no matrix shape of length {missing[0]} (lengths: {known})")
    return tuple(by_seq[s] for s in seqs)


def jobs_for(
    variants: tuple[str, ...],
    seqs: tuple[int, ...],
    dtype: str = "bf16",
    target: str = "auto",
    rounds: int = 2,
) -> list[Job]:
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant {unknown[0]} (variants: {', '.join(VARIANTS)})")
    return [Job(v, dtype, shapes_for(v, seqs), target, rounds) for v in variants]


def warm_jobs(jobs: list[Job]) -> list[Job]:
    """One compiling process per (variant, shape): Flex compiles per static shape, and the
    longest sequences, whose compiles are no shorter, start first."""
    split = [Job(j.spec, j.dtype, (s,), j.target, j.rounds) for j in jobs for s in j.shapes]
    return sorted(split, key=lambda j: -int(j.shapes[0].split(",")[2]))


def read_rows(json_path: str) -> list[dict[str, Any]]:
    if not os.path.exists(json_path):
        return []
    with open(json_path) as f:
        return [json.loads(line) for line in f if line.strip()]


def done_keys(json_path: str) -> set[tuple[str, str, str]]:
    """(variant, shape label, dtype) of the rows measured without error."""
    return {(r["spec"], r["shape"], r["dtype"]) for r in read_rows(json_path) if not r["error"]}


def pending(jobs: list[Job], json_path: str) -> list[Job]:
    """The jobs with the shapes that have no measured row yet."""
    done = done_keys(json_path)
    left = []
    for job in jobs:
        shapes = tuple(
            s for s in job.shapes if (job.spec, matrix.shape_label(s), job.dtype) not in done
        )
        if shapes:
            left.append(Job(job.spec, job.dtype, shapes, job.target, job.rounds))
    return left


def ratios(row: dict[str, Any]) -> dict[str, float | None]:
    """bwd/fwd, and per anchor its backward time over attncc's (above 1: attncc faster)."""
    bwd, fwd = row.get("bwd_ms"), row.get("fwd_ms")
    out: dict[str, float | None] = {"bwd/fwd": bwd / fwd if bwd and fwd else None}
    for name in ANCHORS:
        anchor = (row.get("anchors") or {}).get(name)
        out[name] = anchor / bwd if anchor and bwd else None
    return out


def missed(row: dict[str, Any]) -> list[str]:
    """The issue's targets this row misses (those it has numbers for)."""
    got = ratios(row)
    misses = []
    head_dim = int(row["shape"].rsplit("D=", 1)[1])
    over = got["bwd/fwd"] is not None and got["bwd/fwd"] > TARGETS["bwd/fwd"]
    if row["spec"] == "fused" and head_dim == 128 and over:
        misses.append("bwd/fwd")
    for name in ANCHORS:
        value = got[name]
        if value is None or (name != "flex" and row["spec"] not in SDPA_TARGETED):
            continue
        if value < TARGETS[name]:
            misses.append(SHORT[name])
    return misses


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_rows(rows: list[dict[str, Any]], expected: list[Job] | None = None) -> str:
    """The results table; with ``expected``, the shapes without a row are listed as not
    measured (a process that crashed or the deadline: see the log)."""
    from attncc.text import format_table

    header = ["variant", "shape", "dtype", "backend", "fwd ms", "bwd ms", "bwd TFLOP/s"]
    header.append("bwd/fwd")
    for name in ANCHORS:
        header += [f"{SHORT[name]} ms", f"x{SHORT[name]}"]
    header.append("missed")
    table = [header]
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in rows:  # a later row of a shape (a rerun) replaces an earlier one
        latest[(row["spec"], row["shape"], row["dtype"])] = row
    for row in latest.values():
        line = [row["spec"], row["shape"], row["dtype"], row.get("backend") or "-"]
        if row["error"]:
            table.append([*line, *["-"] * (len(header) - 5), f"error: {row['error'][:80]}"])
            continue
        got = ratios(row)
        tflops = row.get("bwd_tflops")
        line += [_ms(row["fwd_ms"]), _ms(row["bwd_ms"])]
        line += ["-" if tflops is None else f"{tflops:.1f}", _ratio(got["bwd/fwd"])]
        for name in ANCHORS:
            line += [_ms(row["anchors"].get(name)), _ratio(got[name])]
        line.append(",".join(missed(row)) or "-")
        table.append(line)
    for job in expected or []:
        for shape in job.shapes:
            if (job.spec, matrix.shape_label(shape), job.dtype) not in latest:
                line = [job.spec, matrix.shape_label(shape), job.dtype, "-"]
                table.append([*line, *["-"] * (len(header) - 5), "not measured"])
    return format_table(table)


def _backward_call(forward: Callable[[], Any], leaves: list[Any], seed: int) -> Callable[[], Any]:
    """Run ``forward`` once (recording its graph) and return a call of its backward alone."""
    import torch

    out = forward()
    gen = torch.Generator(device=out.device).manual_seed(seed)
    grad_out = torch.randn(out.shape, generator=gen, device=out.device, dtype=out.dtype)
    return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True, allow_unused=True)


def measure_shape(
    kernel: Any, spec: str, shape_text: str, dtype: str, rounds: int, warm: bool
) -> dict[str, Any]:
    """One row: attncc's forward and backward times, each anchor's backward time (None:
    the anchor does not compute this variant, or failed: the row's notes say which)."""
    import torch

    from attncc import bench

    began = time.perf_counter()
    shape = bench.Shape.parse(shape_text)
    row: dict[str, Any] = {"spec": spec, "shape": str(shape), "dtype": dtype, "error": None}
    row["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    sizes = bench.sizes_for(kernel.ir, shape)
    inputs = bench.bench_inputs(kernel.ir, sizes, bench.DTYPES[dtype], 4)
    params = kernel.param_defaults(sizes)
    fraction = bench.visible_fraction(kernel.ir, sizes, params, inputs)
    heads = 1
    for axis in kernel.ir.batch_axes:
        heads *= sizes[axis.dim]
    # FA2's count: the backward's five matmuls against the forward's two
    flops = 2.5 * 4 * heads * shape.seq * shape.seq * shape.head_dim * fraction
    floats = [n for n in kernel.input_names if inputs[n].is_floating_point()]
    leaves = {n: t.detach().requires_grad_(n in floats) for n, t in inputs.items()}
    ordered = [inputs[n] for n in kernel.input_names]
    row["backend"] = kernel.backend_for(*ordered)
    row["grads"] = floats

    def forward() -> Any:
        return kernel(*ordered)

    def forward_grad() -> Any:
        return kernel(*(leaves[n] for n in kernel.input_names))

    forward()  # compiles, out of the timing
    attncc_bwd = _backward_call(forward_grad, [leaves[n] for n in floats], 0)
    attncc_bwd()  # the backward kernels compile
    notes: list[str] = []
    anchors: dict[str, Callable[[], Any]] = {}
    bench._reset_dynamo()
    runners = bench.anchor_runners(kernel.ir, leaves, sizes, params, list(ANCHORS), fraction)
    aux = [n for n in floats if kernel.ir.tensor(n).role == "aux"]
    for name in ANCHORS:
        if runners.get(name) is None:
            notes.append(f"{name}: does not compute this variant")
            continue
        try:
            anchors[name] = _backward_call(runners[name], [leaves[n] for n in floats], 0)
            anchors[name]()  # compiles (Flex) out of the timing
        except Exception as err:
            anchors.pop(name, None)
            notes.append(f"{name} failed: {type(err).__name__}: {str(err)[:200]}")
            if name != "flex" or not aux:
                continue
            # Flex without the side inputs' gradients (captured tensors requiring grad
            # are not supported everywhere): still its backward of q, k and v
            plain = {n: t.detach() if n in aux else t for n, t in leaves.items()}
            run = bench.anchor_runners(kernel.ir, plain, sizes, params, ["flex"], fraction)
            try:
                qkv = [leaves[n] for n in floats if n not in aux]
                anchors[name] = _backward_call(run["flex"], qkv, 0)  # type: ignore[arg-type]
                anchors[name]()
                notes.append(f"flex: no gradient of {', '.join(aux)}")
            except Exception as again:
                anchors.pop(name, None)
                notes.append(f"flex without {', '.join(aux)} failed: {again}"[:240])
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    row["notes"] = notes
    prepared = time.perf_counter()
    if warm:
        row["seconds"] = {"compile": prepared - began}
        return row
    contenders: dict[str, Callable[[], float]] = {
        "attncc": functools.partial(bench.median_ms, [attncc_bwd], False),
        "fwd": functools.partial(bench.median_ms, [forward], False),
    }
    for name, call in anchors.items():
        contenders[name] = functools.partial(bench.median_ms, [call], False)
    best = bench.time_rounds(contenders, rounds, required="attncc")
    row["bwd_ms"], row["fwd_ms"] = best.pop("attncc"), best.pop("fwd", None)
    row["bwd_tflops"] = flops / (row["bwd_ms"] * 1e-3) / 1e12 if row["bwd_ms"] else None
    row["anchors"] = {name: best.get(name) for name in ANCHORS}
    row["seconds"] = {"prepare": prepared - began, "measure": time.perf_counter() - prepared}
    return row


def measure_variant(args: argparse.Namespace) -> int:
    """``--one SPEC``: time (or, ``--warm``, only compile) one variant's shapes, appending a
    row a shape; a shape that fails is an error row, and the next shape still runs."""
    import torch

    import attncc

    deadline = float(os.environ.get("ATTNCC_BENCH_DEADLINE") or 0) or None
    done = set() if args.warm else done_keys(args.json)
    shapes = [s for s in args.shapes.split(";") if s]

    def record(row: dict[str, Any]) -> None:
        print(json.dumps(row), flush=True)
        if not args.warm:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")

    try:
        kernel = attncc.compile(str(ROOT / "examples" / f"{args.one}.attn"), target=args.target)
    except Exception as err:
        for shape in shapes:
            label = matrix.shape_label(shape)
            record({"spec": args.one, "shape": label, "dtype": args.dtype, "error": repr(err)})
        return 1
    failed = 0
    for shape in shapes:
        if (args.one, matrix.shape_label(shape), args.dtype) in done:
            continue
        if deadline is not None and time.time() > deadline:
            print(f"deadline reached: {args.one} {shape} and later shapes not measured")
            break
        try:
            row = measure_shape(kernel, args.one, shape, args.dtype, args.rounds, args.warm)
        except Exception as err:
            traceback.print_exc()
            failed += 1
            label = matrix.shape_label(shape)
            row = {"spec": args.one, "shape": label, "dtype": args.dtype, "backend": None}
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        record(row)
        gc.collect()  # the retained graphs and their saved tensors
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 1 if failed else 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="benchmarks/results/backward.jsonl")
    parser.add_argument("--budget", type=float, default=float(os.environ.get("BUDGET_S", 240)))
    parser.add_argument("--warm-share", type=float, default=0.45)
    parser.add_argument("--workers", type=int, default=0, help="warm processes (0: by cores)")
    parser.add_argument("--seqs", default=",".join(map(str, SEQS)), help="sequence lengths")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma separated")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--target", choices=["auto", "triton"], default="auto")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--log", default=os.environ.get("OUT", "/tmp") + "/backward_log.txt")
    parser.add_argument("--table", metavar="FILE", help="only print the table of FILE")
    parser.add_argument("--one", metavar="SPEC", help=argparse.SUPPRESS)  # a worker process
    parser.add_argument("--shapes", default="", help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    try:
        seqs = tuple(int(s) for s in args.seqs.split(",") if s)
        args.jobs = jobs_for(
            tuple(v for v in args.variants.split(",") if v), seqs, args.dtype, args.target,
            args.rounds,
        )  # fmt: skip
    except ValueError as err:
        parser.error(str(err))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.one:
        return measure_variant(args)
    if args.table:
        print(format_rows(read_rows(args.table)))
        return 0
    began = time.time()
    gpus = [str(i) for i in range(matrix.gpu_count())]
    jobs = pending(args.jobs, args.json)
    workers = args.workers or max(1, min(24, (os.cpu_count() or 4) - 2))
    # the last measuring process may run GRACE seconds past its deadline: the call ends
    # within the budget
    deadline = began + max(args.budget - matrix.GRACE, args.budget * 0.5)
    with open(args.log, "a") as log:
        slots = [g for _, g in zip(range(workers), itertools.cycle(gpus))]
        warm_deadline = began + args.budget * args.warm_share
        left = matrix.run_pool(warm_jobs(jobs), slots, args.json, True, warm_deadline, log)
        print(f"compile: {time.time() - began:.0f} s, {len(slots)} processes, {left} not started")
        left = matrix.run_pool(jobs, gpus, args.json, False, deadline, log)
        print(f"measure: {time.time() - began:.0f} s over {len(gpus)} GPU(s), {left} jobs left")
    print(format_rows(read_rows(args.json), args.jobs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
