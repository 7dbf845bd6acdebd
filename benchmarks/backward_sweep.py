"""Backward tile configurations on one shape, each kernel's apart: the time of the backward
(both kernels and the host work around them) per configuration, and each one's largest
gradient difference from the baseline's (they must agree).

    python3 benchmarks/backward_sweep.py SPEC SHAPE [bf16|fp16] [--one-pass]

The two kernels run one after the other, so each is swept with the other at its default:
the dkdv kernel's (block_m, block_n, num_warps, num_stages) in both orientations (keys-major
[keys, rows] score tiles, the default; rows-major, P and dS transposed in registers), then
the dq kernel's. The baseline is the former schedule (rows-major dkdv, both kernels at
64x64, 4 warps, 2 stages); the last line times the best dkdv and dq configurations together.
Last, the one-pass schedule (``dq_atomic``: a delta kernel, then the dkdv kernel adding dQ
with atomics) at each dkdv configuration; ``--one-pass`` times the default two passes and
that section alone.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import triton.testing

import attncc
from attncc.bench import Shape, bench_inputs, sizes_for

Config = tuple[int, int, int, int]
DEFAULT: Config = (64, 64, 4, 2)
# (block_m, block_n, num_warps, num_stages); FlexAttention's sm90 D=128 backward takes
# 64x128 for its dK/dV part and 128x64 for its dQ part, 8 warps, 3 stages
CONFIGS: tuple[Config, ...] = (
    (64, 64, 4, 2),
    (64, 64, 4, 3),
    (64, 64, 8, 3),
    (128, 64, 8, 3),
    (64, 128, 8, 3),
    (64, 128, 8, 2),
    (128, 128, 8, 2),
    (64, 128, 4, 3),
    (128, 64, 4, 3),
    (32, 128, 4, 3),
    (128, 32, 4, 3),
)


def main(argv: list[str]) -> int:
    one_pass_only = "--one-pass" in argv
    argv = [a for a in argv if a != "--one-pass"]
    spec, shape_text = argv[0], argv[1]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[argv[2] if len(argv) > 2 else "bf16"]
    kernel = attncc.compile(spec)
    backward = kernel._backward
    if isinstance(backward, str):
        raise SystemExit(f"{spec}: {backward}")
    sizes = sizes_for(kernel.ir, Shape.parse(shape_text))
    tensors = bench_inputs(kernel.ir, sizes, dtype, documents=4)
    params: dict[str, object] = {}
    fallback = kernel if kernel.target == "triton" else kernel.fallback()  # type: ignore[misc]
    out, lse = fallback._launch(tensors, params, True)
    dout, dlse = torch.randn_like(out), torch.zeros_like(lse)
    print(f"{kernel.name} {shape_text} {dtype} on {torch.cuda.get_device_name()}")
    baseline: list[torch.Tensor] | None = None

    def time(label: str, config: dict[str, Any]) -> float | None:
        nonlocal baseline

        # two passes unless the row asks for one (a document mask's default is one pass)
        schedule = {"dq_atomic": False, **config}

        def run() -> list[torch.Tensor]:
            return backward.run(kernel._host, tensors, params, out, lse, dout, dlse, schedule)

        try:
            grads = run()
            ms = triton.testing.do_bench(run, return_mode="median")
        except Exception as err:  # a configuration that cannot compile (shared memory)
            print(f"  {label}: {type(err).__name__}: {str(err)[:120]}")
            return None
        baseline = baseline or grads
        pairs = zip(grads, baseline, strict=True)
        diff = max(float((g.float() - f.float()).abs().max()) for g, f in pairs)
        print(f"  {label:<44} {ms * 1e3:8.1f} us  max diff {diff:.2e}")
        return float(ms)

    def tiles(c: Config) -> str:
        return f"{c[0]:>3}x{c[1]:<3} w{c[2]} s{c[3]}"

    if one_pass_only:
        time(f"two passes  {tiles(DEFAULT)}", {})  # the default tiles
        _one_pass(time, tiles)
        return 0
    print("baseline: rows-major dkdv, both kernels at the former default")
    time(f"dkdv rows  {tiles(DEFAULT)}  dq {tiles(DEFAULT)}",
         {"dq_config": DEFAULT, "dkdv_config": DEFAULT, "dkdv_keys_major": False})  # fmt: skip
    best: dict[str, tuple[float, Any]] = {}
    print("dkdv kernel (dq at the default):")
    for keys_major in (True, False):
        for c in CONFIGS:
            config = {"dq_config": DEFAULT, "dkdv_config": c, "dkdv_keys_major": keys_major}
            layout = "keys" if keys_major else "rows"
            ms = time(f"dkdv {layout}  {tiles(c)}", config)
            if ms is not None and ms < best.get("dkdv", (float("inf"), None))[0]:
                best["dkdv"] = (ms, (c, keys_major))
    print("dq kernel (dkdv keys-major at the default):")
    for c in CONFIGS:
        ms = time(f"dq {tiles(c)}", {"dq_config": c, "dkdv_config": DEFAULT})
        if ms is not None and ms < best.get("dq", (float("inf"), None))[0]:
            best["dq"] = (ms, c)
    if "dkdv" in best and "dq" in best:
        (dkdv, keys_major), dq = best["dkdv"][1], best["dq"][1]
        layout = "keys" if keys_major else "rows"
        print("best of each, together:")
        config = {"dq_config": dq, "dkdv_config": dkdv, "dkdv_keys_major": keys_major}
        time(f"dkdv {layout}  {tiles(dkdv)}  dq {tiles(dq)}", config)
    _one_pass(time, tiles)
    return 0


def _one_pass(time: Any, tiles: Any) -> None:
    print("one pass (dQ added atomically by the keys-major dkdv kernel):")
    for c in CONFIGS:
        time(f"one pass {tiles(c)}", {"dq_config": DEFAULT, "dkdv_config": c, "dq_atomic": True})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
