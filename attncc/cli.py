"""``attncc compile | check | bench | demo``.

``--target`` defaults to ``auto`` (``attncc.target``: CUDA for fused prefill on an sm_90 GPU
with cuda-python, Triton otherwise); output names the target that ran."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attncc.spec import SpecError

# attncc.target.TARGETS, spelled out: importing it would import torch before --help
TARGET_CHOICES = ("auto", "triton", "cuda")
TARGET_HELP = "auto (default): cuda for fused prefill on an sm_90 GPU, triton otherwise"


def _compile_cmd(args: argparse.Namespace) -> int:
    from attncc.api import build, optimise
    from attncc.ir import kernel_str, lower
    from attncc.passes import PASS_NAMES, default_passes, run_passes
    from attncc.spec import load

    if args.print_ir_after and args.print_ir_after not in PASS_NAMES:
        print(
            f"attncc: unknown pass '{args.print_ir_after}'; passes: {', '.join(PASS_NAMES)}",
            file=sys.stderr,
        )
        return 2
    checked = load(args.spec)
    printing = args.print_ir or args.print_ir_after or args.print_ir_after_all
    if args.print_ir_after or args.print_ir_after_all:
        lowered = lower(checked)
        print(f"// IR after lower\n{kernel_str(lowered)}")

        def show(p: object, kernel: object) -> None:
            name = getattr(p, "name", "?")
            if args.print_ir_after_all or name == args.print_ir_after:
                print(f"// IR after {name}\n{kernel_str(kernel)}")  # type: ignore[arg-type]

        run_passes(lowered, default_passes(args.schedule), after_each=show)
    elif args.print_ir:
        _, kernel = optimise(checked, args.schedule)
        print(kernel_str(kernel))
    if args.output or not printing:
        built = build(checked, target=args.target, schedule=args.schedule)
        if args.output:
            Path(args.output).write_text(built.source)
            # auto may pick either backend, and the file's language follows it
            print(f"wrote {args.output} (target {built.target})", file=sys.stderr)
        else:
            sys.stdout.write(built.source)
    return 0


def _check_cmd(args: argparse.Namespace) -> int:
    import torch

    import attncc
    from attncc.checking import DTYPES, check, table

    if args.device == "cuda" and not torch.cuda.is_available():
        print("attncc: --device cuda, but no CUDA device is available", file=sys.stderr)
        return 2
    if args.target == "cuda" and args.device != "cuda":
        print("attncc: --target cuda runs on CUDA tensors; add --device cuda", file=sys.stderr)
        return 2
    dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    # auto asks this machine's GPU; CPU tensors run only on Triton (its interpreter)
    target = "triton" if args.target == "auto" and args.device == "cpu" else args.target
    kernel = attncc.compile(args.spec, target=target, schedule=args.schedule)
    results = check(
        kernel,
        trials=args.trials,
        seed=args.seed,
        device=args.device,
        dtypes=dtypes,
        max_len=args.max_len,
    )
    shown = "" if kernel.target == "triton" else f", target {kernel.target}"
    print(f"{kernel.name} ({kernel.ir.schedule}, {args.device}{shown}):")
    print(table(results))
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _demo_cmd(args: argparse.Namespace) -> int:
    import torch

    import attncc
    from attncc.checking import check, draw_sizes, make_inputs, table
    from attncc.ir import kernel_str
    from attncc.reference import reference

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"== 1. parse and check {args.spec}")
    checked = attncc.load(args.spec)
    print(f"attention '{checked.name}': inputs {', '.join(checked.inputs)}; out {checked.output}")
    print("\n== 2. the IR after every pass")
    _, kernel_ir = attncc.optimise(checked)
    print(kernel_str(kernel_ir))
    print("== 3. the float64 reference on random inputs")
    rng = np.random.default_rng(0)
    sizes = draw_sizes(kernel_ir, rng, max_len=48, head_dims=(32,))
    inputs = make_inputs(kernel_ir, sizes, torch.float32, "cpu", rng)
    out = reference(checked)(**inputs, return_lse=False)
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
    print(
        f"sizes {shown}: output {checked.output}{list(out.shape)}, mean |o| = {abs(out).mean():.4f}"
    )
    print("\n== 4. compile (target auto)")
    start = time.perf_counter()
    kernel = attncc.compile(checked)  # auto: CUDA only for fused prefill on an sm_90 GPU
    print(
        f"target {kernel.target}: generated {len(kernel.source.splitlines())} lines "
        f"in {time.perf_counter() - start:.2f} s"
    )
    print(f"module: {kernel.path}")
    print(f"\n== 5. check the kernel against the reference on {device}")
    results = check(kernel, trials=args.trials, seed=0, device=device, max_len=64)
    print(table(results))
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _bench_cmd(args: argparse.Namespace) -> int:
    from attncc.bench import main as bench_main

    return int(bench_main(args))


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="attncc", description=__doc__)
    sub = top.add_subparsers(dest="command", required=True)

    compile_p = sub.add_parser("compile", help="compile a spec; print IR or write a module")
    compile_p.add_argument("spec")
    compile_p.add_argument(
        "-o", "--output", help="write the generated source here (Python module or CUDA C++)"
    )
    compile_p.add_argument("--target", default="auto", choices=TARGET_CHOICES, help=TARGET_HELP)
    compile_p.add_argument("--schedule", choices=["naive", "fused", "split_kv"])
    compile_p.add_argument("--print-ir", action="store_true", help="print the final IR")
    compile_p.add_argument("--print-ir-after", metavar="PASS", help="print the IR after PASS")
    compile_p.add_argument("--print-ir-after-all", action="store_true")
    compile_p.set_defaults(func=_compile_cmd)

    check_p = sub.add_parser("check", help="compare a compiled spec with its float64 reference")
    check_p.add_argument("spec")
    check_p.add_argument("--trials", type=int, default=8)
    check_p.add_argument("--seed", type=int, default=0)
    check_p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    check_p.add_argument("--dtypes", default="fp32,fp16,bf16")
    check_p.add_argument("--max-len", type=int, default=96, help="largest sequence length drawn")
    check_p.add_argument("--target", default="auto", choices=TARGET_CHOICES, help=TARGET_HELP)
    check_p.add_argument("--schedule", choices=["naive", "fused", "split_kv"])
    check_p.set_defaults(func=_check_cmd)

    demo_p = sub.add_parser("demo", help="parse, show IR, evaluate, compile and check a spec")
    demo_p.add_argument("spec")
    demo_p.add_argument("--trials", type=int, default=3)
    demo_p.set_defaults(func=_demo_cmd)

    bench_p = sub.add_parser("bench", help="time a spec against SDPA and FlexAttention (GPU)")
    bench_p.add_argument("spec")
    bench_p.add_argument("--shapes", default="", help="B,H,S,D;... (defaults: a 16k-token set)")
    bench_p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    bench_p.add_argument(
        "--against",
        default="sdpa-flash,sdpa-cudnn,flex,copy",
        help="anchors timed in the same run (copy: cache-bound rows only)",
    )
    bench_p.add_argument("--json", help="append one JSON line per measured shape to this file")
    bench_p.add_argument(
        "--page", type=int, default=16, help="tokens a page of a paged cache (default 16)"
    )
    bench_p.add_argument("--target", default="auto", choices=TARGET_CHOICES, help=TARGET_HELP)
    bench_p.add_argument(
        "--resume", action="store_true", help="skip shapes already in the --json file"
    )
    bench_p.add_argument(
        "--deadline",
        type=float,
        help="start no shape after this time (seconds since the epoch; "
        "default $ATTNCC_BENCH_DEADLINE)",
    )
    bench_p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="time attncc and the anchors in turn this many times, after an untimed round "
        "and in reverse order every other round, each keeping its best (default 2)",
    )
    bench_p.add_argument(
        "--warm",
        action="store_true",
        help="time nothing: compile every tuning candidate and anchor into the disk caches",
    )
    bench_p.set_defaults(func=_bench_cmd)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SpecError as err:
        print(err.render(), file=sys.stderr)
        return 1
    except FileNotFoundError as err:
        print(f"attncc: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
