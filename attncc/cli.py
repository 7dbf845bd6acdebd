"""``attncc compile | check | bench | demo | tune``.

``--target`` defaults to ``auto`` (``attncc.target``: CUDA for fused prefill on an sm_90 GPU
with cuda-python, Triton otherwise); output names the target that ran.

Errors a user can fix print one line, ``attncc: error: ...`` (a bad spec: its position, line,
caret and hint) and exit 2; ``check`` exits 1 when a trial fails. Anything else is a bug in
attncc: one line and exit 3, with the traceback under ``--debug`` or ``ATTNCC_DEBUG=1``."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from attncc.spec import SpecError

# attncc.target.TARGETS, spelled out: importing it would import torch before --help
TARGET_CHOICES = ("auto", "triton", "cuda")
TARGET_HELP = "auto (default): cuda for fused prefill on an sm_90 GPU, triton otherwise"
# attncc.checking.DTYPES's names, for the same reason
DTYPE_CHOICES = ("fp32", "fp16", "bf16")
SCHEDULES = ("naive", "fused", "split_kv")
DEBUG_ENV = "ATTNCC_DEBUG"
EXIT_FAILED, EXIT_USAGE, EXIT_BUG = 1, 2, 3


class UsageError(Exception):
    """A mistake in the command line or its files: reported in one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse's usage block plus "prog: error:" becomes the one line every error gets
        raise UsageError(f"{message} (see '{self.prog} --help')")


# ----------------------------------------------------------------------------- flag values


def _at_least(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def _dtype_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in DTYPE_CHOICES]
    if unknown or not names:
        what = f"unknown dtype {unknown[0]!r}" if unknown else "no dtype given"
        raise argparse.ArgumentTypeError(f"{what}; choose from {', '.join(DTYPE_CHOICES)}")
    return names


def _assignments(text: str, what: str) -> list[tuple[str, str]]:
    pairs = []
    for item in text.split(","):
        name, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not name.isidentifier() or not value:
            raise argparse.ArgumentTypeError(f"expected NAME={what}[,NAME={what}...], got {item!r}")
        pairs.append((name, value))
    return pairs


def _dim_sizes(text: str) -> list[tuple[str, int]]:
    sizes = []
    for name, value in _assignments(text, "SIZE"):
        try:
            size = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name}: expected an integer, got {value!r}"
            ) from None
        if size < 1:
            raise argparse.ArgumentTypeError(f"{name}: must be at least 1, got {size}")
        sizes.append((name, size))
    return sizes


def _number(text: str) -> int | float | None:
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        return value if math.isfinite(value) else None
    return None


def _param_values(text: str) -> list[tuple[str, int | float]]:
    values: list[tuple[str, int | float]] = []
    for name, value in _assignments(text, "VALUE"):
        number = _number(value)
        if number is None:
            raise argparse.ArgumentTypeError(f"{name}: expected a finite number, got {value!r}")
        values.append((name, number))
    return values


def _merged(groups: list[list[tuple[str, Any]]] | None, flag: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for name, value in (pair for group in groups or [] for pair in group):
        if name in merged and merged[name] != value:
            raise UsageError(f"{flag}: {name} given twice ({merged[name]} and {value})")
        merged[name] = value
    return merged


def _spec_path(text: str) -> Path:
    """The spec file, readable as UTF-8 text (a clean error otherwise)."""
    path = Path(text)
    try:
        path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"{text}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{text}: is a directory, not a spec file") from None
    except UnicodeDecodeError as err:
        byte = err.object[err.start]
        raise UsageError(
            f"{text}: not a UTF-8 text file (byte {byte:#04x} at offset {err.start})"
        ) from None
    except OSError as err:
        raise UsageError(f"{text}: cannot read: {err.strerror or err}") from None
    return path


def _load(text: str) -> Any:
    from attncc.spec import load

    return load(_spec_path(text))


def _refuse_naive_on_cuda(args: argparse.Namespace, checked: Any, target: str) -> None:
    schedule = args.schedule or checked.schedule
    if target == "cuda" and schedule == "naive":
        raise UsageError(f"{args.spec}: the cuda target has no naive schedule; use --target triton")


def _named_target(target: str) -> str:
    """``target``, or for auto the target ``$ATTNCC_TARGET`` names (auto if unset)."""
    return target if target != "auto" else os.environ.get("ATTNCC_TARGET") or "auto"


# ----------------------------------------------------------------------------- commands


def _output_files(built: Any, output: Path) -> dict[Path, str]:
    """What ``compile -o`` writes: the source; for CUDA, into a file, the default kernel
    family's source with the shipped headers inlined (nvcc compiles it alone), into an
    existing directory every family's source (<spec>.<family>.cu) and the headers."""
    if built.target != "cuda":
        return {output: built.source}
    from attncc.codegen import cuda as cuda_backend

    rendered = cuda_backend.render(built.ir, built.spec.spec)
    if not output.is_dir():
        return {output: rendered.standalone()}
    files = {output / f"{built.ir.name}.{family}.cu": text for family, text in rendered.sources}
    files.update({output / name: text for name, text in rendered.headers})
    return files


def _compile_cmd(args: argparse.Namespace) -> int:
    from attncc.api import build, optimise
    from attncc.ir import kernel_str, lower
    from attncc.passes import PASS_NAMES, default_passes, run_passes

    if args.print_ir_after and args.print_ir_after not in PASS_NAMES:
        raise UsageError(f"unknown pass '{args.print_ir_after}'; passes: {', '.join(PASS_NAMES)}")
    checked = _load(args.spec)
    _refuse_naive_on_cuda(args, checked, _named_target(args.target))
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
            files = _output_files(built, Path(args.output))
            try:
                for path, text in files.items():
                    path.write_text(text)
            except OSError as err:
                raise UsageError(f"cannot write {args.output}: {err.strerror or err}") from None
            # auto may pick either backend, and the file's language follows it
            print(f"wrote {', '.join(map(str, files))} (target {built.target})", file=sys.stderr)
        else:
            sys.stdout.write(built.source)
    return 0


def _check_cmd(args: argparse.Namespace) -> int:
    dims = _merged(args.dims, "--dims")
    params = _merged(args.param, "--param")
    checked = _load(args.spec)
    import torch

    import attncc
    from attncc.checking import (
        DTYPES,
        NO_BACKWARD,
        backward_refusal,
        check,
        check_backward,
        check_dims,
        check_params,
        grad_table,
        table,
    )

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but no CUDA device is available")
    if args.device == "cpu":
        from attncc.runtime.jit import interpreter_problem

        problem = interpreter_problem()
        if problem is not None:
            raise UsageError(problem)
    if args.target == "cuda" and args.device != "cuda":
        raise UsageError("--target cuda runs on CUDA tensors; add --device cuda")
    # auto asks this machine's GPU; CPU tensors run only on Triton (its interpreter)
    target = "triton" if args.target == "auto" and args.device == "cpu" else args.target
    _refuse_naive_on_cuda(args, checked, _named_target(target))
    kernel = attncc.compile(checked, target=target, schedule=args.schedule)
    try:
        check_dims(kernel.ir, dims)
        check_params(kernel.ir, params)
    except ValueError as err:
        raise UsageError(f"{args.spec}: {err}") from None
    options: dict[str, Any] = dict(
        trials=args.trials,
        seed=args.seed,
        device=args.device,
        dtypes=[DTYPES[d] for d in args.dtypes],
        max_len=args.max_len,
        dims=dims,
        params=params,
        raise_errors=args.debug,
    )
    shown = "" if kernel.target == "triton" else f", target {kernel.target}"
    results: Sequence[Any]
    if args.backward:
        why = backward_refusal(kernel.ir)
        if why is not None:
            raise UsageError(f"{args.spec}: {NO_BACKWARD}{why}")
        results = check_backward(kernel, **options)
        print(f"{kernel.name} ({kernel.ir.schedule}, {args.device}{shown}, backward):")
        print(grad_table(results))
    else:
        results = check(kernel, **options)
        print(f"{kernel.name} ({kernel.ir.schedule}, {args.device}{shown}):")
        print(table(results))
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return EXIT_FAILED if failed else 0


def _demo_cmd(args: argparse.Namespace) -> int:
    checked = _load(args.spec)
    import torch

    import attncc
    from attncc.checking import check, draw_params, draw_sizes, make_inputs, table
    from attncc.ir import kernel_str
    from attncc.reference import reference

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"== 1. parse and check {args.spec}")
    print(f"attention '{checked.name}': inputs {', '.join(checked.inputs)}; out {checked.output}")
    print("\n== 2. the IR after every pass")
    _, kernel_ir = attncc.optimise(checked)
    print(kernel_str(kernel_ir))
    print("== 3. the float64 reference on random inputs")
    rng = np.random.default_rng(0)
    sizes = draw_sizes(kernel_ir, rng, max_len=48, head_dims=(32,))
    inputs = make_inputs(kernel_ir, sizes, torch.float32, "cpu", rng)
    required = [p.name for p in kernel_ir.params if p.default is None]
    params = draw_params(kernel_ir, sizes, {}, rng, required) if required else {}
    out = reference(checked)(**inputs, **params, return_lse=False)
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
    shown += "".join(f", {k}={v:.3g}" for k, v in params.items())
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
    results = check(
        kernel, trials=args.trials, seed=0, device=device, max_len=64, raise_errors=args.debug
    )
    print(table(results))
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return EXIT_FAILED if failed else 0


def _bench_cmd(args: argparse.Namespace) -> int:
    _load(args.spec)  # a bad file or spec is reported before the GPU is asked for
    from attncc.bench import main as bench_main

    return int(bench_main(args))


def _tune_cmd(args: argparse.Namespace) -> int:
    checked = _load(args.spec)  # a bad file or spec is reported before the GPU is asked for
    if args.target == "cuda":
        raise UsageError("the cuda target picks its tiles per shape itself: nothing to tune")
    from attncc.bench import Shape

    try:
        shapes = [Shape.parse(text) for text in args.shapes.split(";") if text.strip()]
    except ValueError:
        raise UsageError(
            f"--shapes: expected B,H,S,D[;...] (H may be H:KVH), got {args.shapes!r}"
        ) from None
    if not shapes:
        raise UsageError("--shapes: no shape given")
    import torch

    if not torch.cuda.is_available():
        raise UsageError("attncc tune times kernels on a CUDA GPU, and none is visible here")
    import attncc
    from attncc.checking import DTYPES
    from attncc.runtime.autotune import describe, tune_shapes

    # auto sends the calls it does not run on the CUDA target to this same Triton kernel
    kernel = attncc.compile(checked, target="triton")
    for shape, _key, best in tune_shapes(kernel, shapes, DTYPES[args.dtype], stream=sys.stderr):
        print(f"{kernel.name} {shape} {args.dtype}: {describe(best)}")
    print(f"tuning cache: {kernel.tuner.path}")
    return 0


# ----------------------------------------------------------------------------- parser


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="attncc", description=__doc__)
    top.add_argument("--debug", action="store_true", help=f"show tracebacks (also {DEBUG_ENV}=1)")
    sub = top.add_subparsers(dest="command", required=True)
    common = _Parser(add_help=False)
    # SUPPRESS: a subcommand's default must not undo "attncc --debug check ..."
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)

    compile_p = sub.add_parser(
        "compile", parents=[common], help="compile a spec; print IR or write a module"
    )
    compile_p.add_argument("spec")
    compile_p.add_argument(
        "-o",
        "--output",
        help="write the generated source here (Python module or CUDA C++); for CUDA, a "
        "directory gets every kernel family's source and the headers they include",
    )
    compile_p.add_argument("--target", default="auto", choices=TARGET_CHOICES, help=TARGET_HELP)
    compile_p.add_argument("--schedule", choices=SCHEDULES)
    compile_p.add_argument("--print-ir", action="store_true", help="print the final IR")
    compile_p.add_argument("--print-ir-after", metavar="PASS", help="print the IR after PASS")
    compile_p.add_argument("--print-ir-after-all", action="store_true")
    compile_p.set_defaults(func=_compile_cmd)

    check_p = sub.add_parser(
        "check", parents=[common], help="compare a compiled spec with its float64 reference"
    )
    check_p.add_argument("spec")
    check_p.add_argument("--trials", type=_at_least(1), default=8)
    check_p.add_argument("--seed", type=_at_least(0), default=0)
    check_p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="auto (default): cuda where a CUDA device is available, else cpu (Triton's "
        "interpreter)",
    )
    check_p.add_argument(
        "--dtypes",
        type=_dtype_list,
        default=list(DTYPE_CHOICES),
        help="dtypes of q, k and v, in turn: fp32,fp16,bf16 (default: all three)",
    )
    check_p.add_argument(
        "--max-len", type=_at_least(1), default=96, help="largest sequence length drawn"
    )
    check_p.add_argument(
        "--dims",
        type=_dim_sizes,
        action="append",
        metavar="NAME=SIZE,...",
        help="fix dims in every trial, e.g. N=4096,T=300 (repeatable)",
    )
    check_p.add_argument(
        "--param",
        type=_param_values,
        action="append",
        metavar="NAME=VALUE,...",
        help="fix params in every trial, e.g. window=256 (repeatable); "
        "params without a default are drawn unless given",
    )
    check_p.add_argument("--target", default="auto", choices=TARGET_CHOICES, help=TARGET_HELP)
    check_p.add_argument("--schedule", choices=SCHEDULES)
    check_p.add_argument(
        "--backward",
        action="store_true",
        help="check gradients instead: every float input's against float64 autograd "
        "(fused prefill kernels)",
    )
    check_p.set_defaults(func=_check_cmd)

    demo_p = sub.add_parser(
        "demo", parents=[common], help="parse, show IR, evaluate, compile and check a spec"
    )
    demo_p.add_argument("spec")
    demo_p.add_argument("--trials", type=_at_least(1), default=3)
    demo_p.set_defaults(func=_demo_cmd)

    bench_p = sub.add_parser(
        "bench", parents=[common], help="time a spec against SDPA and FlexAttention (GPU)"
    )
    bench_p.add_argument("spec")
    bench_p.add_argument(
        "--shapes",
        default="",
        help="B,H,S,D;... (H may be H:KVH, D may be D:DV; defaults: a 16k-token set)",
    )
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

    tune_p = sub.add_parser(
        "tune",
        parents=[common],
        help="time every launch configuration at these shapes and cache the best (GPU)",
    )
    tune_p.add_argument("spec")
    tune_p.add_argument("--shapes", required=True, help="B,H,S,D;... (H may be H:KVH)")
    tune_p.add_argument("--dtype", default="bf16", choices=DTYPE_CHOICES)
    tune_p.add_argument(
        "--target",
        default="auto",
        choices=TARGET_CHOICES,
        help="auto or triton: tunes the Triton kernel (auto runs it where CUDA has none)",
    )
    tune_p.set_defaults(func=_tune_cmd)
    return top


def _one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status: 0 ok, 1 a check failed, 2 a user error, 3 a bug."""
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        args = parser().parse_args(argv)
        args.debug = debug = debug or args.debug
        return int(args.func(args))
    except UsageError as err:
        print(f"attncc: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except SpecError as err:
        if debug:
            traceback.print_exc()
        print(err.render(), file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, TypeError) as err:
        # what attncc.compile and the kernels raise for a spec or a call they cannot take
        if debug:
            raise
        print(f"attncc: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("attncc: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if debug:
            raise
        print(
            f"attncc: internal error: {type(err).__name__}: {_one_line(err)} "
            f"(a bug in attncc; rerun with --debug or {DEBUG_ENV}=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
