"""A/B of text variants of a generated Triton module (GPU), on one shape, over the tuner's
candidate configurations: what a kernel change would buy, in one device call, before the
template changes.

    python3 benchmarks/triton_variant_ab.py SPEC "B,H:KVH,S,D" VARIANTS.json

VARIANTS.json: {"name": [[old, new], ...], ...}; each old text must occur in the module.
`AB_WARM=1` only launches every (variant, configuration) once, untimed, to fill Triton's disk
cache: several warm processes can compile in parallel before one timed run. The timed run
interleaves the variants (`AB_ROUNDS` rounds, 3 by default) so drift touches all alike.
Decode-sized calls are timed as CUDA-graph replays over rotating input copies (cold L2), as
`attncc bench` times them; every variant's output must match the unchanged module's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

import attncc
from attncc.bench import DTYPES, Shape, bench_inputs, sizes_for, source_variant, time_rounds
from attncc.cache import atomic_write, cache_dir
from attncc.runtime.autotune import Tuner
from attncc.runtime.jit import load_module
from attncc.runtime.timing import cold_copies, median_ms

spec, shape_text, variants_path = sys.argv[1], sys.argv[2], sys.argv[3]
kernel = attncc.compile(spec, target="triton")
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
# variant -> configuration index -> its timed calls
calls: dict[str, dict[int, list[Callable[..., Any]]]] = {}
for label, replacements in variants.items():
    patched = source_variant(source, label, replacements)
    tag = hashlib.sha256(label.encode()).hexdigest()[:12]  # stable: warm and timed runs share files
    path = cache_dir() / "modules" / f"ab_{tag}_{kernel.path.name}"
    atomic_write(path, patched)  # warm processes of other shapes may write it at once
    module = load_module(path, interpreted=False)
    calls[label] = {}
    for i, config in enumerate(configs):
        runs = []
        for c in copies:
            tensors, bound = module._bind([c[n] for n in kernel.input_names], {})
            full = {**params, **bound}
            runs.append(lambda m=module, t=tensors, p=full, c=config: m._forward(t, p, False, c))
        try:
            out = runs[0]()[0].float()
        except Exception as error:  # a variant that does not compile is a result, not the end
            print(f"  {label:28s} {config}: {type(error).__name__}: {str(error)[:300]}")
            continue
        reference = out if reference is None else reference
        diff = (out - reference).abs().max().item()
        if not diff <= 2e-2:
            raise SystemExit(f"variant {label} {config}: output differs by {diff:.3g}")
        calls[label][i] = runs
if os.environ.get("AB_WARM") == "1":
    print(f"  compiled {sum(len(c) for c in calls.values())} (variant, configuration) pairs")
    raise SystemExit(0)

# Rounds over every configuration, each timing all variants back to back: clock and
# temperature drift over the run then touches every variant alike. A variant keeps its
# best time per configuration.
contenders = {
    (label, i): functools.partial(median_ms, calls[label][i], graphed)
    for i in range(len(configs))
    for label in calls
    if i in calls[label]
}
times = time_rounds(contenders, int(os.environ.get("AB_ROUNDS", "3")))
for label in calls:
    ranked = sorted((ms, i) for (name, i), ms in times.items() if name == label and ms is not None)
    if not ranked:
        continue
    ms, i = ranked[0]
    extra = f"{kv_bytes / (ms * 1e-3) / 1e12:.2f} TB/s" if graphed else ""
    print(f"  {label:28s} best {ms * 1e3:8.1f} us {extra}  {configs[i]}")
    for ms, i in ranked[1:3]:
        print(f"  {'':28s} then {ms * 1e3:8.1f} us  {configs[i]}")
