"""Where a repeated call's CPU time goes: each step of the replay path timed alone.

Per case (spec, shape, dtype, target): CPU microseconds to issue one call (as `calls.py`
measures it: 200 unsynchronised calls, best of 5), then each piece of that call issued on its
own the same way: binding the arguments, the eager-mode test, the launch-plan key, the
stream and context lookups, the output allocations, the plan's launch, and SDPA's whole call
beside them. The pieces do not add up exactly (each runs warm in its own loop), but they
show which ones a faster launcher must remove.

    python3 benchmarks/call_parts.py [--cases "SPEC SHAPE DTYPE TARGET;..."]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch
from calls import DTYPES, issue_us, parse_cases  # benchmarks/: the script's own folder

import attncc
from attncc.bench import Shape, anchor_runners, bench_inputs, sizes_for, visible_fraction
from attncc.runtime import driver, native, nvrtc
from attncc.runtime import kernel as kernel_module
from attncc.runtime.launch_plan import Plans

CASES = (
    ("examples/causal.attn", "2,8,512,64", "fp16", "cuda"),
    ("examples/causal.attn", "2,8,512,64", "fp16", "triton"),
    ("examples/causal.attn", "2,8,64,64", "fp16", "auto"),
    ("examples/decode.attn", "1,32:8,8192,128", "bf16", "auto"),
    ("examples/paged_decode.attn", "1,32:8,8192,128", "bf16", "auto"),
)


def parts(spec: str, shape_text: str, dtype_name: str, target: str) -> dict[str, float]:
    kernel = attncc.compile(spec, target=target)
    sizes = sizes_for(kernel.ir, Shape.parse(shape_text))
    inputs = bench_inputs(kernel.ir, sizes, DTYPES[dtype_name], documents=4)
    args = [inputs[n] for n in kernel.input_names]
    kernel(*args)
    torch.cuda.synchronize()
    host = kernel._host
    tensors, params = host._bind(tuple(args), {})
    out, lse = kernel._launch(tensors, params, False)
    launcher = native.launcher()
    assert launcher is not None, native.unavailable()
    table, stream_of = kernel._replays.table, kernel_module._RAW_STREAM

    def c_replay() -> Any:
        return launcher.replay(table, (False, False), tensors, params, torch.Tensor, stream_of)

    assert c_replay() is not None, "the first call left no C replay"
    row: dict[str, Callable[[], Any]] = {
        "call": lambda: kernel(*args),
        "bind": lambda: host._bind(tuple(args), {}),
        "eager": lambda: kernel_module._eager(tensors.values()),
        # the C launcher's replay of the call's plan: key, stream, lookup, allocations and
        # launches in one C call (Kernel._replays)
        "C replay (no bind)": c_replay,
        "launch (no bind)": lambda: kernel._launch(tensors, params, False),
        "key, stream-free": lambda: Plans.key(tensors, params, False, False, stream=False),
        "key with stream": lambda: Plans.key(tensors, params, False, True),
        "current_stream": lambda: nvrtc.current_stream(0),
        "current_context": driver.current_context,
        "empty out + lse": lambda: (torch.empty_like(out), torch.empty_like(lse)),
    }
    backend = kernel.backend_for(*args)
    ab: dict[str, float] = {}
    if backend == "cuda":
        key = Plans.key(tensors, params, False, kernel.fallback is not None)
        plan = host._PLANS.get(key)
        if plan is not None and callable(plan):
            row["plan(tensors)"] = lambda: plan(tensors)
            if hasattr(plan, "attend"):
                pointers = plan.pointers(tensors, out, lse)
                maps = [tensors[n] for n, _ in plan.maps]
                from attncc.runtime import tensor_map

                # a plan whose maps move (their address fields found) takes pointers
                encoded = [
                    t.data_ptr() if plan.fields else tensor_map.encode(t.data_ptr(), *layout)
                    for t, (_, layout) in zip(maps, plan.maps, strict=True)
                ]
                if plan.first is None and not plan.buffers:
                    row["attend launch"] = lambda: plan.attend(*pointers, *encoded)
                ab = _c_and_python_launches(plan.attend, lambda: kernel(*args))
                if plan.maps:
                    layout = plan.maps[0][1]
                    ptr = maps[0].data_ptr()
                    row["encode map (uncached)"] = lambda: tensor_map.encode_map(ptr, *layout)
    else:
        triton_kernel = kernel if kernel.target == "triton" else kernel._fallback_kernel
        assert triton_kernel is not None
        geometry = triton_kernel._geometry(Plans.key(tensors, params, False, False, stream=False))
        if geometry is not None and geometry.plan is not None:
            plan = geometry.plan
            row["plan(tensors)"] = lambda: plan(tensors)
            row.update(_triton_launch_parts(plan, tensors))
    params_default = kernel.param_defaults(sizes)
    fraction = visible_fraction(kernel.ir, sizes, params_default, inputs)
    anchor = "sdpa-flash" if kernel.ir.query_axis is None else "sdpa"
    runner = anchor_runners(kernel.ir, inputs, sizes, params_default, [anchor], fraction)[anchor]
    if runner is not None:
        row[f"{anchor} call"] = runner
    row["torch.empty x1"] = lambda: torch.empty_like(out)
    timed = {name: issue_us(fn) for name, fn in row.items()} | ab
    return timed | {"backend": backend}  # type: ignore[dict-item]


def _triton_launch_parts(plan: Any, tensors: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """A Triton plan's replay split in two: its Python work with every launch stubbed out,
    and the launches alone (attncc's launcher, or Triton's compiled launcher where the plan
    keeps it) on the arguments one replay passed them."""
    captured: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def capturing(launch: Callable[..., Any]) -> Callable[..., int]:
        def capture(*args: Any) -> int:
            captured.append((launch, args))
            return 0

        return capture

    if plan.issues is not None:
        attribute, real = "issues", plan.issues
        plan.issues = tuple(capturing(issue) for issue in real)
        stubs: tuple[Any, ...] = tuple(lambda *args: 0 for _ in real)
    elif plan.launches:
        attribute, real = "launches", plan.launches
        plan.launches = tuple((capturing(entry[0]), *entry[1:]) for entry in real)
        stubs = tuple((lambda *args: 0, *entry[1:]) for entry in real)
    else:
        return {}
    plan(tensors)  # one replay, captured
    setattr(plan, attribute, real)

    def python_only() -> None:
        setattr(plan, attribute, stubs)
        try:
            plan(tensors)
        finally:
            setattr(plan, attribute, real)

    calls = list(captured)

    def launches_alone() -> None:
        for launch, args in calls:
            launch(*args)

    return {"plan, launches stubbed": python_only, "launches alone": launches_alone}


def _alternating(
    call: Callable[[], Any], target: Any, attribute: str, variants: dict[str, Any], rounds: int = 7
) -> dict[str, float]:
    """A whole call with ``target.attribute`` set to each of ``variants`` in turn, timed in
    alternating rounds, best of each (the GPU machine's CPU times drift between runs, not
    between neighbouring rounds); the attribute is left as found."""
    original = getattr(target, attribute)
    best: dict[str, float] = {}
    try:
        for _ in range(rounds):
            for name, value in variants.items():
                setattr(target, attribute, value)
                us = issue_us(call, repeats=1)
                best[name] = min(best.get(name, us), us)
    finally:
        setattr(target, attribute, original)
    return best


def _c_and_python_launches(launch: driver.Launch, call: Callable[[], Any]) -> dict[str, float]:
    """The call with its prepared launch issued by the C launcher and by its ctypes twin
    (driver.PythonLaunch, the same packed parameters and slots)."""
    python = driver.PythonLaunch(driver.entry_address(), *launch._config, launch.slots)
    variants = {"call, C launch": launch._issue, "call, ctypes launch": python}
    return _alternating(call, launch, "_issue", variants)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="")
    options = parser.parse_args(argv)
    cases = parse_cases(options.cases) if options.cases else list(CASES)
    for spec, shape, dtype, target in cases:
        result = parts(spec, shape, dtype, target)
        print(f"{spec} {shape} {dtype} {target} (backend {result.pop('backend')})")
        for name, us in result.items():
            print(f"  {name:<24} {us:7.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
