"""A/B of text variants of a spec's generated module on one shape (GPU): what a kernel or
default change would buy, measured in one device call before the template changes.

    python3 benchmarks/ab.py SPEC "B,H:KVH,S,D" VARIANTS.json [--target triton|cuda]
        [--dtype bf16|fp16] [--rounds 3] [--config JSON] [--documents 4 | --document-mean N]
        [--param NAME=VALUE ...]

VARIANTS.json maps a variant's name to its text replacements, ``{"name": [[old, new], ...]}``;
``"name": []`` is an identical copy (a control: how far two timings of one kernel differ).
Each ``old`` must occur in the generated source (an A/B whose variant silently equals the
baseline is worse than an error). For the CUDA target a replacement applies to the CUDA C++
the host compiles where the text is there (each variant compiles under its own cache key),
else to the host module (its tables: ``"_WGMMA_PERSISTENT = 1"`` -> ``"_WGMMA_PERSISTENT =
0"``).

Every variant runs the launch configuration a call of the shape runs with (``call_config``:
on the Triton target the heuristic table's or a tuned entry, as ``Kernel.launch_config``
says, not the generated module's own default, which differs from it at some shapes; on the
CUDA target the host's tiles; ``--config``: this one instead, e.g. ``'{"BLOCK_M": 128,
"BLOCK_N": 64, "num_warps": 8, "num_stages": 3}'``), and its output must match the unchanged
module's. The timing is `attncc bench`'s: L2 cleared
before each call (decode-sized calls: CUDA-graph replays over rotating input copies), an
untimed round, then ``--rounds`` rounds in alternating order, each variant keeping its best.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from varlen_speed import sequence_lengths  # benchmarks/: the script's own folder

from attncc.bench import source_variant

Variants = dict[str, list[list[str]]]


def load_variants(path: str) -> Variants:
    """The variants file, with the unchanged module first; a malformed entry is one clear error."""
    with open(path) as f:
        loaded = json.load(f)
    if not isinstance(loaded, dict):
        raise SystemExit(f"{path}: expected {{name: [[old, new], ...]}}")
    for name, replacements in loaded.items():
        if not isinstance(replacements, list) or not all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(t, str) for t in r)
            for r in replacements
        ):
            raise SystemExit(f"{path}: variant {name!r} is not a list of [old, new] strings")
    return {"unchanged": [], **loaded}


def split_replacements(
    host: str,
    kernel_source: str,
    name: str,
    replacements: list[list[str]],
    other_sources: str = "",
) -> tuple[str, str]:
    """(host module, kernel source) with ``replacements`` applied: each to the kernel source
    (the CUDA C++ the host compiles) where its text is there, else to the host module. The
    host embeds the kernel sources, so kernel text is often in both; the module compiles
    the patched kernel source (use_family_source), not its own copy. A text only the other
    families' sources hold (``other_sources``, embedded in the host too) is an error: it
    would change a kernel the A/B does not time."""
    for old, new in replacements:
        if kernel_source and old in kernel_source:
            kernel_source = kernel_source.replace(old, new)
        elif old in other_sources:
            raise SystemExit(f"variant {name}: {old!r} is in another family's source only")
        elif old in host:
            host = host.replace(old, new)
        else:
            kernel_source = source_variant(kernel_source, name, [[old, new]])
    return host, kernel_source


def use_family_source(module: Any, family: str, original: str, patched: str) -> None:
    """Make ``module`` compile ``patched`` for ``family`` where a replacement changed the
    family's source itself. Compared with the source before any replacement, not with the
    loaded module's: a replacement whose text the host module also holds (it embeds the
    sources) changes the module's copy, and restoring that copy would time the baseline."""
    if patched == original:
        return
    module._CUDA_SOURCES = {**module._CUDA_SOURCES, family: patched}
    module._SOURCE_KEYS = {
        **module._SOURCE_KEYS,
        family: module._nvrtc.source_key(patched, module._CUDA_HEADERS),
    }


def random_documents(inputs: dict[str, Any], kernel: Any, keys: int, mean: int) -> None:
    """Integer inputs along the key axis (document ids) replaced by ids of documents of random
    lengths (uniform on 1..2 * mean - 1, as benchmarks/varlen_speed.py draws them)."""
    import torch

    lengths = sequence_lengths(mean, keys, torch.Generator().manual_seed(0))
    for arg in kernel.tensors:
        if arg.dtype in ("i32", "i64") and arg.dims and arg.dims[-1] == kernel.key_axis.dim:
            old = inputs[arg.name]
            ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
            inputs[arg.name] = ids.to(old).expand(old.shape).contiguous()


def param_values(pairs: list[str]) -> dict[str, int | float]:
    """``--param NAME=VALUE`` pairs as the call's params (ints where the text is one)."""
    values: dict[str, int | float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--param {pair!r}: expected NAME=VALUE")
        for kind in (int, float):
            try:
                values[name] = kind(value)
                break
            except ValueError:
                continue
        else:
            raise SystemExit(f"--param {pair!r}: {value!r} is not a number")
    return values


def call_config(kernel: Any, inputs: dict[str, Any], config: dict[str, int] | None) -> Any:
    """The launch configuration the A/B runs: ``config`` where given, else what a call of
    these inputs runs with on the Triton target (None on the CUDA target: the host's tiles)."""
    if config is not None or kernel.target != "triton":
        return config
    return kernel.launch_config(*(inputs[name] for name in kernel.input_names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec")
    parser.add_argument("shape", help='"B,H:KVH,S,D"')
    parser.add_argument("variants", help="JSON: {name: [[old, new], ...]}")
    parser.add_argument("--target", choices=("triton", "cuda"), default="triton")
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", type=json.loads, default=None)
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a param's value instead of its default (soft-capping's cap=50)",
    )
    parser.add_argument("--documents", type=int, default=4, help="equal documents of doc ids")
    parser.add_argument(
        "--document-mean",
        type=int,
        default=None,
        help="doc ids of random lengths of this mean instead (uniform on 1..2 * mean - 1)",
    )
    parser.add_argument(
        "--family",
        default="hopper",
        help="the CUDA source a replacement not found in the host module applies to "
        "(hopper, mma, fma, split)",
    )
    args = parser.parse_args()

    import torch

    import attncc
    from attncc.bench import DTYPES, Shape, bench_inputs, sizes_for, time_rounds
    from attncc.cache import atomic_write, cache_dir
    from attncc.runtime.jit import load_module
    from attncc.runtime.timing import cold_copies, median_ms

    variants = load_variants(args.variants)
    kernel = attncc.compile(args.spec, target=args.target)
    host = kernel.path.read_text()
    sources = getattr(kernel.module(interpreted=False), "_CUDA_SOURCES", {})
    cuda_source = sources.get(args.family, "")
    # the other families' sources, which the host module embeds too
    others = "".join(text for family, text in sources.items() if family != args.family)
    sizes = sizes_for(kernel.ir, Shape.parse(args.shape))
    inputs = bench_inputs(kernel.ir, sizes, DTYPES[args.dtype], documents=args.documents)
    if args.document_mean is not None:
        random_documents(inputs, kernel.ir, sizes[kernel.ir.key_axis.dim], args.document_mean)
    rows = sizes[kernel.ir.query_axis.dim] if kernel.ir.query_axis else 1
    graphed = rows <= 16
    copies = cold_copies(inputs) if graphed else [inputs]
    params = {**kernel.param_defaults(sizes), **param_values(args.param)}
    kv_names = (kernel.ir.key.tensor, kernel.ir.value.tensor)
    kv_bytes = sum(inputs[t].numel() * inputs[t].element_size() for t in kv_names)
    config = call_config(kernel, inputs, args.config)
    print(
        f"{kernel.name} {args.shape} {args.dtype} {args.target} on {torch.cuda.get_device_name()}"
        + (f" (config {json.dumps(config)})" if config is not None else "")
    )

    reference = None
    contenders: dict[str, Callable[[], float]] = {}
    for name, replacements in variants.items():
        patched_host, patched_cuda = split_replacements(
            host, cuda_source, name, replacements, others
        )
        tag = hashlib.sha256(json.dumps([name, replacements]).encode()).hexdigest()[:12]
        path = Path(cache_dir()) / "modules" / f"ab_{tag}_{kernel.path.name}"
        atomic_write(path, patched_host)
        module: Any = load_module(path, interpreted=False)
        use_family_source(module, args.family, cuda_source, patched_cuda)
        runs = []
        for c in copies:
            tensors, bound = module._bind([c[n] for n in kernel.input_names], {})
            full = {**params, **bound}
            runs.append(lambda m=module, t=tensors, p=full: m._forward(t, p, False, config))
        try:
            out = runs[0]()[0].float()
        except Exception as error:  # a variant that does not compile is a result, not the end
            print(f"  {name:28s} {type(error).__name__}: {str(error)[:300]}")
            continue
        reference = out if reference is None else reference
        diff = (out - reference).abs().max().item()
        if not diff <= 2e-2:
            raise SystemExit(f"variant {name}: output differs from the unchanged one by {diff:.3g}")
        contenders[name] = lambda runs=runs: median_ms(runs, graphed)

    best = time_rounds(contenders, args.rounds)
    base = best.get("unchanged")
    for name, ms in best.items():
        if ms is None:
            print(f"  {name:28s} failed")
            continue
        extra = f"  {kv_bytes / (ms * 1e-3) / 1e12:.2f} TB/s" if graphed else ""
        change = f"  {ms / base - 1:+.1%}" if base else ""
        print(f"  {name:28s} {ms * 1e3:9.1f} us{change}{extra}")


if __name__ == "__main__":
    main()
