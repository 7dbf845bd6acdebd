"""A/B of which int arguments the Triton kernels let Triton specialize (GPU), on one shape:
the generated module is rewritten with other `do_not_specialize` lists and each variant's
launch configurations are timed with `do_bench`.

    python3 benchmarks/specialization_ab.py SPEC "B,H,S,D"
"""

from __future__ import annotations

import re
import sys

import torch
import triton.testing

import attncc
from attncc.bench import DTYPES, Shape, bench_inputs, sizes_for
from attncc.cache import cache_dir
from attncc.runtime.autotune import PREFILL_CANDIDATES, _as_launch
from attncc.runtime.jit import load_module

spec, shape_text = sys.argv[1], sys.argv[2]
kernel = attncc.compile(spec, target="triton")
source = kernel.path.read_text()
fwd = re.search(r"@triton\.jit\(do_not_specialize=\[(.*?)\]\)\ndef (\w+_fwd)\(", source)
assert fwd is not None, "no fused kernel with a do_not_specialize list"
names = [n.strip().strip('"') for n in fwd.group(1).split(",")]
dims = [n for n in names if n.startswith("d_")]
variants = {
    "all (current)": names,
    "none (Triton's default)": [],
    "batch and heads only": [n for n in names if n in ("d_B", "d_H", "d_KVH")],
    "all but lengths": [n for n in names if n not in ("d_M", "d_N")],
    "all but head dims": [n for n in names if n != "d_D"],
    "all but lse strides": [n for n in names if not n.startswith("lse")],
}
shape = Shape.parse(shape_text)
sizes = sizes_for(kernel.ir, shape)
inputs = bench_inputs(kernel.ir, sizes, DTYPES["bf16"], documents=4)
params = kernel.param_defaults(sizes)
for label, keep in variants.items():
    listed = ", ".join(f'"{n}"' for n in keep)
    patched = source.replace(fwd.group(0), fwd.group(0).replace(fwd.group(1), listed))
    path = cache_dir() / "modules" / f"ab_{abs(hash(label))}_{kernel.path.name}"
    path.write_text(patched)
    module = load_module(path, interpreted=False)
    tensors, bound = module._bind([inputs[n] for n in kernel.input_names], {})
    full = {**params, **bound}
    times = []
    for tile in PREFILL_CANDIDATES:
        launch = _as_launch(tile, tma=int(tile.tma))
        try:
            module._forward(tensors, full, False, launch)
            ms = triton.testing.do_bench(
                lambda m=module, t=tensors, f=full, c=launch: m._forward(t, f, False, c)
            )
        except Exception as err:  # a configuration this GPU cannot run
            print(f"  {label} {launch}: {type(err).__name__}")
            continue
        times.append((float(ms), tile))
    torch.cuda.synchronize()
    best = sorted(times)[:3]
    print(
        f"{label:26s} best {best[0][0] * 1e3:7.1f} us  "
        + "  ".join(
            f"{ms * 1e3:.1f} ({t.block_m}x{t.block_n}x{t.num_warps}x{t.num_stages})"
            for ms, t in best
        )
    )
