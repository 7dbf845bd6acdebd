"""Issue 4's whole benchmark matrix in one device call, over every visible GPU.

Two phases, both bounded by a wall-clock budget:
1. warm: many processes (spread over the GPUs, several per GPU) compile, without timing,
   every launch configuration the tuner will try and every anchor (FlexAttention compiles per
   shape), filling the Triton and Inductor disk caches. Compiling is CPU work, and most of a
   matrix's time when done serially.
2. measure: one process at a time per GPU runs `attncc bench` (tuning, then timing beside the
   anchors, each in the same process and on the same GPU), appending rows to one JSON-lines
   file. Rows already there are skipped, so a call cut short is finished by the next one.

    python3 benchmarks/matrix.py [--json benchmarks/results/matrix.jsonl] [--budget 560]
                                 [--warm-share 0.35] [--workers N] [--only bf16]
                                 [--target triton|auto]

``--target auto`` times the default target (CUDA for fused prefill on an H100/H200, Triton
elsewhere: rows are labelled by the backend that ran) instead of Triton, without the separate
CUDA column.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
D128 = ["16,16,1024,128", "8,16,2048,128", "4,16,4096,128", "2,16,8192,128", "1,16,16384,128"]
D64 = ["16,32,1024,64", "8,32,2048,64", "4,32,4096,64", "2,32,8192,64", "1,32,16384,64"]
ODD = ["4,16,4096,96", "4,16,4096,256"]  # non-power-of-two and large head dims work
GQA = ["16,32:8,1024,128", "8,32:8,2048,128", "4,32:8,4096,128", "2,32:8,8192,128"]
GQA += ["1,32:8,16384,128"]
DECODE = ["1,32:8,8192,128", "8,32:8,8192,128", "1,32:8,32768,128", "8,32:8,32768,128"]
GRACE = 30.0  # seconds a measuring process may run past the deadline to finish its shape
VARIANTS = ("causal", "fused", "sliding_window", "alibi", "softcap", "document_mask")
# FP8 inputs (Triton, D=128): the FP8 column, beside the bf16 rows of fused and causal
FP8_VARIANTS = ("fp8_block", "fp8_causal")


# the CUDA target's column: bf16 at 4k (D=128) for every variant, and decode
CUDA_SHAPES = {"gqa_causal": ("4,32:8,4096,128",), "decode": tuple(DECODE[:2])}
CUDA_SHAPES["paged_decode"] = CUDA_SHAPES["decode"]
CUDA_SHAPES["document_mask"] = ("4,16,4096,128", "1,16,16384,128")


@dataclass(frozen=True)
class Job:
    spec: str
    dtype: str
    shapes: tuple[str, ...]
    target: str = "triton"

    def command(self, json_path: str, warm: bool) -> list[str]:
        cmd = [sys.executable, "-m", "attncc", "bench", f"examples/{self.spec}.attn"]
        cmd += ["--shapes", ";".join(self.shapes), "--dtype", self.dtype]
        cmd += ["--json", json_path, "--resume", "--target", self.target]
        return cmd + (["--warm"] if warm else [])

    @property
    def label(self) -> str:
        """The spec as `attncc bench` labels its rows (auto: either backend's label)."""
        return self.spec if self.target == "triton" else f"{self.spec} [{self.target}]"

    @property
    def labels(self) -> tuple[str, ...]:
        """Every label a row of this job may have: auto's rows name the backend that ran."""
        if self.target == "auto":
            return (self.spec, f"{self.spec} [cuda]")
        return (self.label,)


def matrix(dtypes: list[str], target: str = "triton") -> list[Job]:
    """Measure jobs: one process per (spec, dtype, target), the bf16 half first (the
    targets, then the FP8 column), then (Triton's matrix) the CUDA target's column, the fp16
    half and decode."""
    jobs = []
    for dtype in dtypes:
        jobs += [Job(spec, dtype, tuple(D128 + D64 + ODD), target) for spec in VARIANTS]
        jobs.append(Job("gqa_causal", dtype, tuple(GQA), target))
        if dtype == "bf16":  # the FP8 column: e4m3 inputs whatever the dtype (auto: Triton)
            jobs += [Job(spec, dtype, tuple(D128), target) for spec in FP8_VARIANTS]
        if dtype == "bf16" and target == "triton":  # the CUDA column, before the fp16 half
            for spec in (*VARIANTS, "gqa_causal", "decode", "paged_decode"):
                jobs.append(Job(spec, "bf16", CUDA_SHAPES.get(spec, ("4,16,4096,128",)), "cuda"))
    jobs += [Job(spec, "bf16", tuple(DECODE), target) for spec in ("decode", "paged_decode")]
    return jobs


def cuda_column() -> list[Job]:
    """The CUDA column alone, with the Triton target on the same shapes (a short call after
    a change to the CUDA kernels: `--column cuda`)."""
    jobs = []
    for spec in (*VARIANTS, "gqa_causal", "decode", "paged_decode"):
        shapes = CUDA_SHAPES.get(spec, ("4,16,4096,128",))
        jobs += [Job(spec, "bf16", shapes, "cuda"), Job(spec, "bf16", shapes)]
    return jobs


def warm_jobs(jobs: list[Job]) -> list[Job]:
    """One process per (spec, dtype, head dim): it compiles the tuning candidates once and
    then each shape's anchors; the groups with the most shapes start first."""
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for job in jobs:
        for shape in job.shapes:
            key = (job.spec, job.dtype, shape.rsplit(",", 1)[1], job.target)
            groups.setdefault(key, []).append(shape)
    ordered = sorted(groups.items(), key=lambda item: -len(item[1]))
    return [Job(spec, dtype, tuple(shapes), target) for (spec, dtype, _, target), shapes in ordered]


def pending(jobs: list[Job], json_path: str) -> list[Job]:
    """The jobs with their shapes not yet in the JSON-lines file (a process per job costs
    seconds of start-up even when `--resume` then skips every shape)."""
    done = set()
    if os.path.exists(json_path):
        with open(json_path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        done = {(r["spec"], r["shape"], r["dtype"]) for r in rows}
    left = []
    for job in jobs:
        shapes = tuple(
            s
            for s in job.shapes
            if not any((label, shape_label(s), job.dtype) in done for label in job.labels)
        )
        if shapes:
            left.append(Job(job.spec, job.dtype, shapes, job.target))
    return left


def shape_label(shape: str) -> str:
    """ "4,32:8,4096,128" as `attncc bench` writes it: "B=4 H=32:8 S=4096 D=128"."""
    b, h, s, d = shape.split(",")
    return f"B={b} H={h} S={s} D={d}"


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return max(1, sum(line.startswith("GPU ") for line in out.stdout.splitlines()))


def run_pool(
    jobs: list[Job], slots: list[str], json_path: str, warm: bool, deadline: float, log
) -> int:
    """Run ``jobs`` on ``slots`` (a CUDA_VISIBLE_DEVICES value per concurrent process); no
    job or shape starts after ``deadline``. A warm-up still running then is stopped; a
    measurement gets ``GRACE`` seconds to finish its shape (finished rows are in the file).
    Returns how many jobs never started."""
    grace = 0.0 if warm else GRACE
    todo: queue.Queue[Job] = queue.Queue()
    for job in jobs:
        todo.put(job)
    lock = threading.Lock()

    def worker(device: str) -> None:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": device}
        env["ATTNCC_BENCH_DEADLINE"] = str(deadline)
        if warm:  # many processes already: no pool of Inductor compile workers under each
            env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        while time.time() < deadline:
            try:
                job = todo.get_nowait()
            except queue.Empty:
                return
            began = time.time()
            cmd = job.command(json_path, warm)
            try:
                done = subprocess.run(
                    cmd,
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=max(1.0, deadline + grace - time.time()),
                )
                output, status = done.stdout + done.stderr, str(done.returncode)
            except subprocess.TimeoutExpired as err:
                output, status = str(err.stdout or "") + str(err.stderr or ""), "deadline"
            with lock:
                log.write(
                    f"== gpu {device} {'warm' if warm else 'bench'} {job.label} "
                    f"{job.dtype} {';'.join(job.shapes)}: {status}, "
                    f"{time.time() - began:.1f} s\n{output}\n"
                )
                log.flush()

    threads = [threading.Thread(target=worker, args=(s,)) for s in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return todo.qsize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="benchmarks/results/matrix.jsonl")
    parser.add_argument("--budget", type=float, default=560.0, help="seconds for both phases")
    parser.add_argument("--warm-share", type=float, default=0.35)
    parser.add_argument("--workers", type=int, default=0, help="warm processes (0: by cores)")
    parser.add_argument("--only", default="bf16,fp16", help="dtypes, comma separated")
    parser.add_argument("--column", choices=["cuda"], help="only the CUDA column (both targets)")
    parser.add_argument("--target", choices=["triton", "auto"], default="triton")
    parser.add_argument("--log", default=os.environ.get("OUT", "/tmp") + "/matrix.log")
    args = parser.parse_args()
    began = time.time()
    gpus = [str(i) for i in range(gpu_count())]
    wanted = cuda_column() if args.column else matrix(args.only.split(","), args.target)
    jobs = pending(wanted, args.json)
    workers = args.workers or max(1, min(24, (os.cpu_count() or 4) - 2))
    with open(args.log, "a") as log:
        warm_deadline = began + args.budget * args.warm_share
        slots = [g for _, g in zip(range(workers), itertools.cycle(gpus))]
        left = run_pool(warm_jobs(jobs), slots, args.json, True, warm_deadline, log)
        print(f"warm: {time.time() - began:.0f} s, {workers} processes, {left} jobs not started")
        left = run_pool(jobs, gpus, args.json, False, began + args.budget, log)
        print(f"measure: {time.time() - began:.0f} s over {len(gpus)} GPU(s), {left} jobs left")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
