"""Every backward tile configuration on one shape: the time of the backward kernels (both
passes and the host work around them) per (block_m, block_n, num_warps, num_stages), and
each configuration's largest gradient difference from the first's (they must agree).

    python3 benchmarks/backward_sweep.py SPEC SHAPE [bf16|fp16]
"""

from __future__ import annotations

import sys

import torch
import triton.testing

import attncc
from attncc.bench import Shape, bench_inputs, sizes_for

CONFIGS = (
    (64, 64, 4, 3),
    (64, 64, 4, 2),
    (64, 64, 8, 3),
    (128, 64, 8, 3),
    (64, 128, 8, 3),
    (128, 128, 8, 2),
    (64, 128, 4, 3),
    (128, 64, 4, 3),
    (32, 128, 4, 3),
    (128, 32, 4, 3),
)


def main(argv: list[str]) -> int:
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
    first: list[torch.Tensor] | None = None
    for block_m, block_n, warps, stages in CONFIGS:
        config = {"block_m": block_m, "block_n": block_n, "num_warps": warps,
                  "num_stages": stages}  # fmt: skip

        def run(config: dict[str, int] = config) -> list[torch.Tensor]:
            return backward.run(kernel._host, tensors, params, out, lse, dout, dlse, config)

        try:
            grads = run()
            ms = triton.testing.do_bench(run, return_mode="median")
        except Exception as err:  # a configuration that cannot compile (shared memory)
            print(f"  {config}: {type(err).__name__}: {str(err)[:120]}")
            continue
        first = first or grads
        pairs = zip(grads, first, strict=True)
        diff = max(float((g.float() - f.float()).abs().max()) for g, f in pairs)
        tiles = f"{block_m:>3} {block_n:>3} {warps} {stages}"
        print(f"  {tiles}  {ms * 1e3:8.1f} us  max diff {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
