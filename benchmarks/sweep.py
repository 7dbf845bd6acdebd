"""Time every launch configuration of a spec on one shape (GPU): what the autotuner chooses
from, and whether the candidate list or the defaults should change.

    python3 benchmarks/sweep.py SPEC "B,H:KVH,S,D" [bf16|fp16] [cuda] [quick] [wgmma2]
        [paired] [graphs]

(`cuda`: the CUDA target; `quick`: Triton prefill sweeps only the four tiles that have won
before; `wgmma2`: the CUDA target's sm_90a configurations only, and one mma.sync tile;
`paired`: Triton prefill tiles with and without query tiles taken in pairs; `graphs`: prefill
timed in CUDA-graph replays as decode is.)

Decode-sized calls (<= 16 queries) sweep tile x `waves` (split count) and are timed as
CUDA-graph replays over rotating input copies (cold L2), as `attncc bench` times them;
prefill calls sweep tiles, with and without TMA descriptors, with `do_bench`. The CUDA
target sweeps its fused kernel's tiles (BLOCK_M: 16 or 32 rows a warp) and its sm_90a
configurations. Every configuration's output must match the first's. A/B of source changes:
benchmarks/ab.py.
"""

from __future__ import annotations

import itertools
import sys

import torch

import attncc
from attncc.bench import DTYPES, Shape, bench_inputs, config_mismatch, prepare_config, sizes_for
from attncc.runtime.timing import cold_copies

spec, shape_text = sys.argv[1], sys.argv[2]
dtype = DTYPES[sys.argv[3] if len(sys.argv) > 3 else "bf16"]
target = "cuda" if "cuda" in sys.argv[4:] else "triton"
kernel = attncc.compile(spec, target=target)
shape = Shape.parse(shape_text)
sizes = sizes_for(kernel.ir, shape)
inputs = bench_inputs(kernel.ir, sizes, dtype, documents=4)
rows = sizes[kernel.ir.query_axis.dim] if kernel.ir.query_axis else 1
# `graphs`: prefill timed as decode is (below 2k tokens do_bench times the host's launch path)
graphed = rows <= 16 or "graphs" in sys.argv[4:]
copies = cold_copies(inputs) if graphed else [inputs]
module = kernel.module(interpreted=False)
params = kernel.param_defaults(sizes)
kv_names = (kernel.ir.key.tensor, kernel.ir.value.tensor)
kv_bytes = sum(inputs[t].numel() * inputs[t].element_size() for t in kv_names)

if target == "cuda":
    # (BLOCK_M, BLOCK_N, num_warps); the split-KV kernels of decode calls take no config
    cuda_tiles = ((128, 64, 4), (128, 32, 4), (64, 64, 4), (64, 32, 4), (128, 64, 8))
    cuda_tiles += ((128, 128, 8), (256, 64, 8), (256, 32, 8))
    configs = [{"wgmma": 0, "BLOCK_M": m, "BLOCK_N": n, "num_warps": w} for m, n, w in cuda_tiles]
    # the sm_90a kernel (hopper.cu.jinja): 64 rows a warp group
    configs += [
        {"wgmma": 1, "BLOCK_N": n, "num_warps": w}
        for n, w in ((128, 8), (64, 8), (128, 4), (64, 4))
    ]
    # variant 2: ping-pong, tensor copies (TMA) or cp.async, two or three stages
    configs += [
        {"wgmma": 2, "BLOCK_N": n, "num_warps": 8, "pingpong": pp, "tma": tma, "stages": st}
        for n, pp, tma, st in itertools.product((128, 64), (0, 1), (1, 0), (2, 3))
    ]
    # variant 2 with one MMA group: two blocks a multiprocessor
    configs += [
        {"wgmma": 2, "BLOCK_N": n, "num_warps": 4, "pingpong": 0, "tma": 1, "stages": 2}
        for n in (64, 128)
    ]
    if "wgmma2" in sys.argv[4:]:  # the sm_90a variants only, beside one mma.sync tile
        configs = [configs[0], *[c for c in configs if c["wgmma"]]]
elif rows <= 16:
    configs = [
        {"BLOCK_M": 16, "BLOCK_N": n, "num_warps": w, "num_stages": s, "waves": waves}
        for n, w, s, waves in itertools.product((32, 64, 128), (4, 8), (2, 3, 4), (1, 2, 4, 8))
        if not (n == 32 and w == 8)
    ]
else:
    tiles = ((64, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 4), (128, 64, 8, 3))
    if "quick" not in sys.argv[4:]:
        tiles += ((128, 128, 8, 2), (128, 64, 4, 3), (128, 32, 4, 4), (64, 128, 4, 3))
    # `paired`: causal kernels' programs also take their query tiles in pairs
    pairings = (0, 1) if "paired" in sys.argv[4:] else (0,)
    configs = [
        {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": s, "tma": tma, "paired": paired}
        for (m, n, w, s), tma, paired in itertools.product(tiles, (True, False), pairings)
    ]

results = []
first_out = None
for config in configs:
    try:
        out, timer = prepare_config(kernel, module, copies, params, config, graphed)
        ms = timer()
    except Exception as err:  # shared memory or register limits: report and go on
        print(f"{config}: {type(err).__name__}: {str(err)[:120]}")
        continue
    # every configuration must give the first one's output (a fast wrong one is no candidate)
    first_out = out if first_out is None else first_out
    diff = config_mismatch(out, first_out)
    if diff is not None:
        print(f"{config}: MISMATCH, max |out - first config's out| = {diff:.3g}")
        continue
    results.append((ms, config))

results.sort(key=lambda r: r[0])
print(f"{kernel.name} {shape_text} {dtype} on {torch.cuda.get_device_name()}")
for ms, config in results[:24]:
    extra = f"{kv_bytes / (ms * 1e-3) / 1e12:.2f} TB/s" if rows <= 16 else ""
    print(f"  {ms * 1e3:8.1f} us  {extra}  {config}")
print(f"  (worst {results[-1][0] * 1e3:.1f} us of {len(results)})")
