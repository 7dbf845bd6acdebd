"""A/B of text variants of a generated Triton module (GPU), on one shape, over the tuner's
candidate configurations: what a kernel change would buy, in one device call, before the
template changes.

    python3 benchmarks/triton_variant_ab.py SPEC "B,H:KVH,S,D" VARIANTS.json

VARIANTS.json: {"name": [[old, new], ...], ...}; each old text must occur in the module.
Decode-sized calls are timed as CUDA-graph replays over rotating input copies (cold L2), as
`attncc bench` times them; every variant's output must match the unchanged module's.
"""

from __future__ import annotations

import json
import sys

import torch

import attncc
from attncc.bench import DTYPES, Shape, bench_inputs, sizes_for
from attncc.cache import cache_dir
from attncc.runtime.autotune import Tuner
from attncc.runtime.jit import load_module
from attncc.runtime.timing import cold_copies, median_ms

spec, shape_text, variants_path = sys.argv[1], sys.argv[2], sys.argv[3]
kernel = attncc.compile(spec)
source = kernel.path.read_text()
with open(variants_path) as f:
    variants: dict[str, list[list[str]]] = {"unchanged": [], **json.load(f)}
shape = Shape.parse(shape_text)
sizes = sizes_for(kernel.ir, shape)
inputs = bench_inputs(kernel.ir, sizes, DTYPES["bf16"], documents=4)
rows = sizes[kernel.ir.query_axis.dim] if kernel.ir.query_axis else 1
graphed = rows <= 16
copies = cold_copies(inputs) if graphed else [inputs]
params = kernel.param_defaults(sizes)
kv_names = (kernel.ir.key.tensor, kernel.ir.value.tensor)
kv_bytes = sum(inputs[t].numel() * inputs[t].element_size() for t in kv_names)
configs = Tuner(kernel.ir, kernel.path.stem).candidates(sizes)
print(f"{kernel.name} {shape_text} bf16 on {torch.cuda.get_device_name()}")
reference = None
for label, replacements in variants.items():
    patched = source
    for old, new in replacements:
        if old not in patched:
            raise SystemExit(f"variant {label}: {old!r} is not in the generated module")
        patched = patched.replace(old, new)
    path = cache_dir() / "modules" / f"ab{len(label)}_{abs(hash(label))}_{kernel.path.name}"
    path.write_text(patched)
    module = load_module(path, interpreted=False)
    times = []
    for config in configs:
        runs = []
        for c in copies:
            tensors, bound = module._bind([c[n] for n in kernel.input_names], {})
            full = {**params, **bound}
            runs.append(lambda m=module, t=tensors, p=full, c=config: m._forward(t, p, False, c))
        out = runs[0]()[0].float()
        reference = out if reference is None else reference
        diff = (out - reference).abs().max().item()
        if not diff <= 2e-2:
            raise SystemExit(f"variant {label} {config}: output differs by {diff:.3g}")
        times.append((median_ms(runs, graphed), config))
    times.sort(key=lambda t: t[0])
    ms, config = times[0]
    extra = f"{kv_bytes / (ms * 1e-3) / 1e12:.2f} TB/s" if graphed else ""
    print(f"  {label:28s} best {ms * 1e3:8.1f} us {extra}  {config}")
