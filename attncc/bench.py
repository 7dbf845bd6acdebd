"""``attncc bench``: time a compiled spec beside what users would pick instead (GPU only).

Anchors measured in the same run: SDPA with the FLASH_ATTENTION backend (FA2) and with
CUDNN_ATTENTION (full and causal specs only), and ``torch.compile(flex_attention)`` with the
score_mod / mask_mod built from the same IR (every spec with two batch axes).
Throughput is 4·B·H·M·N·D times the fraction of (query, key) pairs the masks leave visible
(so causal with M == N counts about half, a sliding window its band); decode specs also
report the bytes of K and V actually read per second.

Decode-sized calls (one query, or up to 16) take a few microseconds of GPU time, less than
the Python launch path; they are timed as CUDA-graph replays (``do_bench_cudagraph``), the
way serving stacks run them, for attncc and the anchors alike.

Bench inputs: floats ~ N(0, 1) in ``--dtype`` (inputs declared ``f32`` in float32; FP8
ones rounded to e4m3, an FP8 value tensor stored key-major as ``attncc.fp8.quantize`` writes
it); an integer input over the key axis holds segment ids of ``--documents`` equal
documents; a page table holds a shuffled pool of pages (``--page`` tokens each, 16 by
default; rows with another size are labelled with it); any other integer input (cache
lengths) holds the key length; a table read by subscripts (FP8 descales per block of rows)
holds every entry the spec reads at its params' defaults. FP8 specs' anchors run on the
same values in bfloat16.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch

import attncc
from attncc.checking import (
    derive_sizes,
    index_tensor_dims,
    param_defaults,
    size_table_dims,
    table_dims,
)
from attncc.flex_tanh import approx_tanh
from attncc.ir import nodes as ir
from attncc.ir.verify import indices_of
from attncc.runtime.timing import cold_copies, median_ms
from attncc.text import format_table
from attncc.torch_eval import evaluate

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# "copy": for cache-bound rows (no query axis), a copy-like kernel moving as many bytes (read
# plus written) as the kernel reads, timed the same way: the memory roofline at that
# size, launch and ramp-up included (a 34 MB cache cannot reach the large-copy bandwidth)
ANCHORS = ("sdpa-flash", "sdpa-cudnn", "flex", "copy")


Key = TypeVar("Key")  # what time_rounds names its contenders by


@dataclass(frozen=True)
class Shape:
    """``B,H,S,D``, ``B,H:KVH,S,D`` (query heads : kv heads) or ``...,D:DV`` (a value head
    dim of its own, as MLA's 192:128)."""

    batch: int
    heads: int
    kv_heads: int | None
    seq: int
    head_dim: int
    value_dim: int | None = None

    @staticmethod
    def parse(text: str) -> Shape:
        b, h, s, d = text.split(",")
        heads, _, kv = h.partition(":")
        head, _, value = d.partition(":")
        kv_heads = int(kv) if kv else None
        return Shape(int(b), int(heads), kv_heads, int(s), int(head), int(value) if value else None)

    @property
    def value_head_dim(self) -> int:
        """The value head dim: the head dim unless the shape names one."""
        return self.value_dim or self.head_dim

    def __str__(self) -> str:
        kv = f":{self.kv_heads}" if self.kv_heads else ""
        dv = f" DV={self.value_dim}" if self.value_dim else ""
        return f"B={self.batch} H={self.heads}{kv} S={self.seq} D={self.head_dim}{dv}"


def source_variant(source: str, label: str, replacements: list[list[str]]) -> str:
    """``source`` with each [old, new] text replacement of an A/B variant applied (the
    benchmark scripts' ``variants=FILE``); an ``old`` that is not there is an error, not a
    variant that silently equals the baseline."""
    for old, new in replacements:
        if old not in source:
            raise SystemExit(f"variant {label}: {old!r} is not in the generated source")
        source = source.replace(old, new)
    return source


def default_shapes(kernel: ir.AttentionKernel, head_dim: int = 128) -> list[Shape]:
    """16k tokens per batch at sequence lengths 1k..16k (GQA specs: 32 query / 8 kv heads)."""
    heads, kv = (32, 8) if kernel.group else (16, None)
    return [Shape(16384 // s, heads, kv, s, head_dim) for s in (1024, 2048, 4096, 8192, 16384)]


@dataclass
class Row:
    spec: str  # "<spec> [cuda]" for the CUDA target
    shape: str
    dtype: str
    ms: float
    tflops: float
    tbps: float | None
    anchors: dict[str, float | None] = field(default_factory=dict)  # anchor -> TFLOP/s
    # wall seconds of each step (first call: compile and tuning; anchors: their compiles
    # included): where a matrix run's device time goes
    seconds: dict[str, float] = field(default_factory=dict)
    # the launch configuration the Triton target ran (tuned, or the heuristic table's)
    config: dict[str, int] | None = None


def sizes_for(kernel: ir.AttentionKernel, shape: Shape, page: int = 16) -> dict[str, int]:
    """Every dim of ``kernel`` for ``shape``; a paged cache gets pages of ``page`` tokens."""
    sizes = {dim: 1 for dim in kernel.dims}
    axes = kernel.batch_axes
    if axes:
        sizes[axes[0].dim] = shape.batch
    if len(axes) > 1:
        sizes[axes[-1].dim] = shape.heads
    if kernel.group is not None:
        sizes[kernel.group.kv_dim] = shape.kv_heads or shape.heads
    sizes[kernel.key_axis.dim] = shape.seq
    if kernel.query_axis is not None:
        sizes[kernel.query_axis.dim] = shape.seq
    sizes[kernel.head_axis.dim] = shape.head_dim
    if kernel.value_axis.dim != kernel.head_axis.dim:
        sizes[kernel.value_axis.dim] = shape.value_head_dim
    elif shape.value_head_dim != shape.head_dim:
        raise ValueError(
            f"shape {shape}: the spec's values have head dim {kernel.head_axis.dim} too, "
            "so they take no value dim of their own"
        )
    derive_sizes(kernel, sizes, shape.seq, page=page)
    tables = table_dims(kernel)
    if tables:
        # tables read by subscripts hold every entry the spec reads at its int params'
        # defaults (FP8 descales: ceil(M / block_m) of them); one where the reads cannot be
        # bounded (a bucket table sized by its own dim)
        defaults = param_defaults(kernel, sizes, {})
        at_defaults = {
            p.name: (int(defaults[p.name]),) * 2
            for p in kernel.params
            if p.type == "int" and p.name in defaults
        }
        size_table_dims(kernel, sizes, tables, at_defaults, lambda need: max(need or 1, 1))
        derive_sizes(kernel, sizes, shape.seq, page=page)
    # a page pool with a page for every slot of the page table
    for tensor, dim in index_tensor_dims(kernel).items():
        sizes[dim] = math.prod(sizes[d] for d in kernel.tensor(tensor).dims)
    return sizes


def bench_inputs(
    kernel: ir.AttentionKernel,
    sizes: dict[str, int],
    dtype: torch.dtype,
    documents: int,
    device: str = "cuda",
) -> dict[str, torch.Tensor]:
    """Every input of ``kernel`` at ``sizes`` (the module's docstring says what they hold);
    ``device``: "cpu" only where the scripts' CPU tests run them in the interpreter."""
    key_dim, key_size = kernel.key_axis.dim, sizes[kernel.key_axis.dim]
    indexing = index_tensor_dims(kernel)
    inputs = {}
    for arg in kernel.tensors:
        shape = [sizes[d] for d in arg.dims]
        declared = torch.float32 if arg.dtype == "f32" else dtype  # float inputs' dtype
        if arg.name in indexing:  # page ids: every page used once, in a shuffled order
            ids = torch.randperm(sizes[indexing[arg.name]], device=device)[: math.prod(shape)]
            tensor = ids.reshape(shape).to(torch.int32 if arg.dtype == "i32" else torch.int64)
        elif arg.dtype in ("i32", "i64"):
            int_dtype = torch.int32 if arg.dtype == "i32" else torch.int64
            if arg.dims and arg.dims[-1] == key_dim:
                ids = torch.arange(key_size, device=device) * documents // max(key_size, 1)
                tensor = ids.expand(shape).to(int_dtype).contiguous()
            else:
                tensor = torch.full(shape, key_size, dtype=int_dtype, device=device)
        elif arg.role == "aux":
            tensor = torch.rand(shape, device=device).to(declared) * 0.1
        elif arg.dtype == "f8e4m3":
            values = torch.randn(shape, device=device).to(torch.float8_e4m3fn)
            key_major = arg.name == kernel.value.tensor
            tensor = _keys_innermost(kernel, values) if key_major else values
        else:
            tensor = torch.randn(shape, device=device, dtype=declared)
        inputs[arg.name] = tensor
    return inputs


def _keys_innermost(kernel: ir.AttentionKernel, value: torch.Tensor) -> torch.Tensor:
    """``value`` (the value operand's tensor) copied to storage with its key axis innermost,
    as ``attncc.fp8.quantize`` writes an FP8 v: FP8 tensor cores take P·V's second operand
    that way, and the FP8 kernels multiply P·V in FP8 only then."""
    indices = kernel.value.indices
    key = next(
        i
        for i, s in enumerate(indices)
        if isinstance(s, ir.Index) and s.name == kernel.key_axis.index
    )
    order = [i for i in range(value.dim()) if i != key] + [key]
    storage = torch.empty([value.shape[i] for i in order], dtype=value.dtype, device=value.device)
    view = storage.permute(*sorted(range(value.dim()), key=order.__getitem__))
    return view.copy_(value)


def _indices(kernel: ir.AttentionKernel, b: Any, h: Any, m: Any, n: Any) -> dict[str, Any]:
    axes = kernel.batch_axes
    env = {axes[0].index: b, axes[-1].index: h} if len(axes) == 2 else {}
    if len(axes) == 1:
        env[axes[0].index] = b
    if kernel.query_axis is not None:
        env[kernel.query_axis.index] = m
    env[kernel.key_axis.index] = n
    return env


def visible_fraction(
    kernel: ir.AttentionKernel,
    sizes: dict[str, int],
    params: dict[str, Any],
    tensors: dict[str, torch.Tensor],
) -> float:
    """Fraction of (query, key) pairs the masks keep, for batch index 0."""
    if not kernel.masks:
        return 1.0
    rows = sizes[kernel.query_axis.dim] if kernel.query_axis else 1
    m = torch.arange(rows, device="cuda")[:, None]
    n = torch.arange(sizes[kernel.key_axis.dim], device="cuda")[None, :]
    env = _indices(kernel, 0, 0, m, n)
    keep = torch.ones(rows, n.shape[1], dtype=torch.bool, device="cuda")
    for mask in kernel.masks:
        keep &= torch.as_tensor(evaluate(mask, env, sizes, params, tensors), device="cuda")
    return float(keep.float().mean())


def _bhsd(operand: ir.Operand, row: str | None, col: str, t: torch.Tensor) -> torch.Tensor:
    """A [batch, heads, rows, cols] view of an operand (a singleton row axis for decode)."""
    batch_axes = [
        i
        for i, s in enumerate(operand.indices)
        if not (isinstance(s, ir.Index) and s.name in (row, col))
    ]
    row_axes = [
        i for i, s in enumerate(operand.indices) if isinstance(s, ir.Index) and s.name == row
    ]
    col_axes = [
        i for i, s in enumerate(operand.indices) if isinstance(s, ir.Index) and s.name == col
    ]
    view = t.permute(*batch_axes, *row_axes, *col_axes)
    return view if row_axes else view.unsqueeze(-2)


def anchor_runners(
    kernel: ir.AttentionKernel,
    inputs: dict[str, torch.Tensor],
    sizes: dict[str, int],
    params: dict[str, Any],
    against: list[str],
    fraction: float,
) -> dict[str, Callable[[], Any] | None]:
    """SDPA runs specs equivalent to full attention on these inputs (every key visible, e.g.
    decode with full caches) or to causal attention; FlexAttention runs every spec."""
    if len(kernel.batch_axes) != 2:
        return dict.fromkeys(against)
    query = kernel.query_axis.index if kernel.query_axis else None
    q = _bhsd(kernel.query, query, kernel.head_axis.index, inputs[kernel.query.tensor])
    k = _bhsd(kernel.key, kernel.key_axis.index, kernel.head_axis.index, inputs[kernel.key.tensor])
    v = _bhsd(
        kernel.value, kernel.key_axis.index, kernel.value_axis.index, inputs[kernel.value.tensor]
    )
    if q.dtype == torch.float8_e4m3fn:
        # FP8 specs: the anchors run the same spec on the values in bfloat16 (SDPA has no
        # FP8 path in torch 2.11; Flex reads the descales as captured tensors)
        q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    if k.dim() != 4 or v.dim() != 4:
        # K/V read through a view (a paged cache): no anchor reads that layout; compare with
        # the same spec over a contiguous cache instead (examples/decode.attn)
        return dict.fromkeys(against)
    scale = float(evaluate(kernel.score_scale, {}, sizes, params, inputs))
    gqa = kernel.group is not None
    runners: dict[str, Callable[[], Any] | None] = {}
    causal_mask = ir.BinOp(">=", ir.Index(query or ""), ir.Index(kernel.key_axis.index), "bool")
    causal = kernel.masks == (causal_mask,) and q.shape[2] == k.shape[2] and fraction < 1.0
    sdpa_ok = not kernel.score_mods and (fraction == 1.0 or causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    for name, backend in (
        ("sdpa", None),  # PyTorch's own choice of backend, what a plain call gets
        ("sdpa-flash", SDPBackend.FLASH_ATTENTION),
        ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
    ):
        if name not in against:
            continue

        def run_sdpa(backend: Any = backend) -> Any:
            if backend is None:
                return sdpa(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)

        runners[name] = run_sdpa if sdpa_ok else None
    if "flex" in against:
        runners["flex"] = _flex_runner(kernel, q, k, v, sizes, params, inputs, scale, gqa)
    return runners


def copy_runner(traffic_bytes: int, device: torch.device) -> Callable[[], Any]:
    """An elementwise kernel reading ``traffic_bytes / 2`` bytes and writing as many: as much
    memory traffic as a kernel reading ``traffic_bytes``, moved by the multiprocessors (a
    ``copy_`` may go to a copy engine, which runs slower on large buffers)."""
    src = torch.zeros(max(1, traffic_bytes // 8), dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return lambda: torch.neg(src, out=dst)


def _flex_runner(
    kernel: ir.AttentionKernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sizes: dict[str, int],
    params: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    scale: float,
    gqa: bool,
) -> Callable[[], Any]:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        env = _indices(kernel, b, h, q_idx, kv_idx)
        keep = evaluate(kernel.masks[0], env, sizes, params, tensors)
        for mask in kernel.masks[1:]:
            keep = keep & evaluate(mask, env, sizes, params, tensors)
        return keep

    # tanh as FlexAttention users who cap scores compute it (attncc.flex_tanh)
    tanh = approx_tanh() if q.is_cuda else None
    funcs = {"tanh": tanh} if tanh is not None else None

    def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        env = _indices(kernel, b, h, q_idx, kv_idx)
        for mod in kernel.score_mods:
            score = evaluate(mod, env, sizes, params, tensors, score, funcs=funcs)
        return score

    block_mask = None
    if kernel.masks:
        used = set().union(*(indices_of(m) for m in kernel.masks))
        batch = [a.index for a in kernel.batch_axes]
        block_mask = create_block_mask(
            mask_mod,
            q.shape[0] if batch[0] in used else None,
            q.shape[1] if batch[1] in used else None,
            q.shape[2],
            k.shape[2],
            device="cuda",
        )
    # static shapes, as users of a fixed-shape model get; bench_spec resets Dynamo before
    # each shape, so a long matrix never hits the recompile limit and falls back to eager
    compiled = torch.compile(flex_attention, dynamic=False)
    mod = score_mod if kernel.score_mods else None
    return lambda: compiled(
        q, k, v, score_mod=mod, block_mask=block_mask, scale=scale, enable_gqa=gqa
    )


def _reset_dynamo() -> None:
    """Forget earlier shapes' Dynamo compiles (the disk caches of Inductor and Triton stay):
    one process benching many shapes would otherwise hit the recompile limit."""
    torch._dynamo.reset()


def warm_anchors(runners: dict[str, Callable[[], Any] | None]) -> None:
    """Call each anchor once (its compiles land in the disk caches); one that cannot run is
    reported by the timed run later."""
    _reset_dynamo()
    for run in runners.values():
        if run is None:
            continue
        try:
            run()
        except Exception as err:  # the timed run reports it
            print(f"  warm-up of an anchor failed: {type(err).__name__}: {str(err)[:120]}")
    torch.cuda.synchronize()


@dataclass
class Startup:
    """Seconds from spec to module (``attncc.compile``), and the first call of each shape:
    Triton's JIT (or its disk cache) plus autotuning unless the tuning cache has the shape."""

    compile_s: float
    first_calls: list[tuple[str, float, int]] = field(default_factory=list)  # shape, s, tunings
    target: str = ""  # the backend compiled for ("auto" resolved)

    def __str__(self) -> str:
        calls = ", ".join(
            f"{shape}: {s:.2f} s" + (" (autotuned)" if tuned else "")
            for shape, s, tuned in self.first_calls
        )
        return f"attncc.compile {self.compile_s:.3f} s; first calls: {calls}"


def bench_spec(
    spec: str,
    shapes: list[Shape] | None,
    dtype: str,
    against: list[str],
    documents: int = 4,
    startup: Startup | None = None,
    target: str = "auto",
    plan: RunPlan | None = None,
    warm_only: bool = False,
    page: int = 16,
    rounds: int = 1,
) -> list[Row]:
    """Time ``spec`` on each shape; ``plan`` skips shapes already measured, stops starting
    new ones past a deadline and appends each row to a JSON-lines file as it is measured.
    ``warm_only`` times nothing: it compiles every launch configuration the tuner would try
    and every anchor, filling the disk caches (run in parallel processes before a matrix).
    ``rounds`` times attncc and the anchors in turn that many times, each keeping its best,
    after an untimed round (``time_rounds``)."""
    plan = plan or RunPlan()
    began = time.perf_counter()
    # the naive schedule has no CUDA kernels: its spec runs fused there
    schedule = (
        "fused" if target == "cuda" and attncc.optimise(spec)[1].schedule == "naive" else None
    )
    kernel = attncc.compile(spec, target=target, schedule=schedule)  # type: ignore[arg-type]
    # "auto" resolved: labels say which kernel ran, as with an explicit --target, so rows
    # stay comparable with earlier result files ("causal [cuda]" is the CUDA kernel)
    target = kernel.target
    if startup is not None:
        startup.compile_s = time.perf_counter() - began
        startup.target = target
    rows: list[Row] = []
    paged = f" [page {page}]" if page != 16 and index_tensor_dims(kernel.ir) else ""

    def labelled(backend: str) -> str:
        return (kernel.name if backend == "triton" else f"{kernel.name} [{backend}]") + paged

    # an auto kernel's rows may name either backend (``backend_for``): done is done
    labels = {labelled(target)} | ({labelled("triton")} if kernel.fallback else set())
    for shape in shapes or default_shapes(kernel.ir):
        if any((label, str(shape), dtype) in plan.done for label in labels):
            continue
        if plan.deadline is not None and time.time() > plan.deadline:
            print(f"  deadline reached: {kernel.name} {shape} and later shapes not measured")
            break
        sizes = sizes_for(kernel.ir, shape, page)
        inputs = bench_inputs(kernel.ir, sizes, DTYPES[dtype], documents)
        params = kernel.param_defaults(sizes)
        fraction = visible_fraction(kernel.ir, sizes, params, inputs)
        rows_m = sizes[kernel.ir.query_axis.dim] if kernel.ir.query_axis else 1
        heads = math.prod(sizes[a.dim] for a in kernel.ir.batch_axes)
        dims = shape.head_dim + shape.value_head_dim  # S = Q K^T and O = P V
        flops = 2 * heads * rows_m * sizes[kernel.ir.key_axis.dim] * dims * fraction

        if warm_only:
            kernel.warm(*(inputs[name] for name in kernel.input_names))
            warm_anchors(anchor_runners(kernel.ir, inputs, sizes, params, against, fraction))
            continue
        graphed = rows_m <= 16
        copies = cold_copies(inputs) if graphed else [inputs]

        def runner(inputs: dict[str, torch.Tensor]) -> Callable[[], Any]:
            ordered = [inputs[name] for name in kernel.input_names]
            return lambda: kernel(*ordered)

        runs = [runner(c) for c in copies]
        # an auto CUDA kernel runs some calls on Triton (fp32, head dims past 256): the row
        # names the backend that ran
        ran = kernel.backend_for(*(inputs[name] for name in kernel.input_names))
        tuned, began = kernel.tuner.tuned, time.perf_counter()
        runs[0]()  # the first call may compile and autotune: keep it out of the timing
        torch.cuda.synchronize()
        first = time.perf_counter() - began
        if startup is not None:
            startup.first_calls.append((str(shape), first, kernel.tuner.tuned - tuned))
        first_inputs = {name: inputs[name] for name in kernel.input_names}
        config = kernel.tuner.chosen(first_inputs, False) if target == "triton" else None
        kv_bytes = sum(
            inputs[t].numel() * inputs[t].element_size()
            for t in (kernel.ir.key.tensor, kernel.ir.value.tensor)
        )
        cache_bound = kernel.ir.query_axis is None
        _reset_dynamo()
        per_copy = [anchor_runners(kernel.ir, c, sizes, params, against, fraction) for c in copies]
        if "copy" in against:
            # one buffer pair per input copy, so the copies rotate through memory as the
            # kernel's inputs do
            device = next(iter(inputs.values())).device
            for runners in per_copy:
                runners["copy"] = (
                    copy_runner(int(kv_bytes * fraction), device) if cache_bound else None
                )
        anchors: dict[str, Callable[[], float]] = {}
        for name, first_copy in per_copy[0].items():
            if first_copy is None:
                continue
            try:
                first_copy()  # compiles (FlexAttention) out of the timing
            except Exception as err:  # an anchor that cannot run this shape is reported, not fatal
                print(f"  {name} failed on {shape}: {type(err).__name__}: {str(err)[:200]}")
                continue
            calls = [r[name] for r in per_copy]  # set on every copy, as on the first
            anchors[name] = functools.partial(median_ms, calls, graphed)  # type: ignore[arg-type]
        prepared = time.perf_counter()
        ours = functools.partial(median_ms, runs, graphed)
        best = time_rounds({"attncc": ours, **anchors}, rounds, required="attncc")
        ms = best.pop("attncc")
        assert ms is not None  # required: its failure raised
        tbps = kv_bytes * fraction / (ms * 1e-3) / 1e12 if cache_bound else None
        row = Row(
            labelled(ran), str(shape), dtype, ms, flops / (ms * 1e-3) / 1e12, tbps, config=config
        )
        row.anchors = {name: None for name in against}
        for name, anchor_ms in best.items():
            row.anchors[name] = None if anchor_ms is None else flops / (anchor_ms * 1e-3) / 1e12
        row.seconds = {
            "first_call": first,
            "anchors": prepared - began - first,  # building and warming them
            "measure": time.perf_counter() - prepared,
        }
        rows.append(row)
        plan.record(row)
    return rows


# Every launch configuration of one call must give the same output to this (max |difference|
# of the float32 outputs; 16-bit inputs): a fast configuration with a wrong answer is no
# candidate (benchmarks/sweep.py, benchmarks/heuristic_check.py).
CONFIG_ATOL = 2e-2


def prepare_config(
    kernel: Any,
    module: Any,
    copies: list[dict[str, torch.Tensor]],
    params: dict[str, Any],
    config: dict[str, int],
    graphed: bool,
) -> tuple[torch.Tensor, Callable[[], float]]:
    """Run the generated ``module`` of ``kernel`` (an ``attncc.Kernel``) once with launch
    ``config`` forced (compiling it) and return its output as float32 and a timer of it:
    median milliseconds of one call, ``graphed`` as CUDA-graph replays over the input
    ``copies`` (decode: cold L2), else ``do_bench`` of the first copy (``median_ms``).
    Raises what the launch raises (a configuration past this GPU's shared memory)."""
    runs: list[Callable[[], Any]] = []
    for inputs in copies:
        tensors, bound = module._bind([inputs[n] for n in kernel.input_names], {})
        runs.append(functools.partial(module._forward, tensors, {**params, **bound}, False, config))
    out = runs[0]()[0].float()
    if out.is_cuda:
        torch.cuda.synchronize()
    return out, functools.partial(median_ms, runs, graphed)


def config_mismatch(out: torch.Tensor, reference: torch.Tensor) -> float | None:
    """The largest |out - reference| where it exceeds ``CONFIG_ATOL`` (NaN included), else None."""
    diff = (out - reference).abs().max().item()
    return None if diff <= CONFIG_ATOL else float(diff)


def time_rounds(
    contenders: Mapping[Key, Callable[[], float]], rounds: int, required: Key | None = None
) -> dict[Key, float | None]:
    """Each contender's best time over ``rounds`` rounds, timing every contender once per
    round in turn: the GPU's clocks and temperature drift over a long run, and timed back to
    back, whichever ran first would meet a cooler GPU. For the same reason a first round
    goes untimed (a GPU idle before it boosts its clocks for the first ~0.1 s of work: the
    first contender's best was up to 5% faster than the same kernel's timed after it), and
    every other round runs in reverse order. A contender that raises is reported and gets
    None (an anchor that cannot run a shape is a result, not the end), except the
    ``required`` one, whose error propagates."""
    best: dict[Key, float | None] = {}
    failed: set[Key] = set()
    names = list(contenders)
    for round_index in range(max(1, rounds) + 1):
        for name in names if round_index % 2 == 0 else names[::-1]:
            if name in failed:
                continue
            try:
                ms = float(contenders[name]())
            except Exception as err:
                if name == required:
                    raise
                print(f"  {name} failed while timed: {type(err).__name__}: {str(err)[:200]}")
                failed.add(name)
                best[name] = None
                continue
            if round_index == 0:
                continue  # the untimed round
            previous = best.get(name)
            best[name] = ms if previous is None else min(previous, ms)
    return best


@dataclass
class RunPlan:
    """What a device call with a time limit needs to finish a large matrix over several
    calls: the rows already in the JSON-lines file are skipped (``resume``), no shape starts
    after ``deadline`` (seconds since the epoch), and each row is appended once measured,
    so a call stopped at its limit keeps what it measured."""

    json_path: str | None = None
    resume: bool = False
    deadline: float | None = None
    done: set[tuple[str, str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.resume and self.json_path and os.path.exists(self.json_path):
            with open(self.json_path) as f:
                for line in f:
                    if line.strip():
                        row = json.loads(line)
                        self.done.add((row["spec"], row["shape"], row["dtype"]))

    def record(self, row: Row) -> None:
        if self.json_path:
            with open(self.json_path, "a") as f:
                f.write(json.dumps(asdict(row)) + "\n")


def format_rows(rows: list[Row], against: list[str]) -> str:
    header = ["spec", "shape", "dtype", "ms", "TFLOP/s", "TB/s"]  # TB/s: K and V bytes read
    for name in against:
        header += [name, f"x{name}"]
    header.append("config")
    table = [header]
    for r in rows:
        line = [r.spec, r.shape, r.dtype, f"{r.ms:.3f}", f"{r.tflops:.1f}"]
        line.append(f"{r.tbps:.2f}" if r.tbps is not None else "-")
        for name in against:
            value = r.anchors.get(name)
            line += ["-", "-"] if value is None else [f"{value:.1f}", f"{r.tflops / value:.2f}"]
        line.append(config_text(r.config))
        table.append(line)
    return format_table(table)


def config_text(config: dict[str, int] | None) -> str:
    """A launch configuration in a table cell: ``64x64/w4/s3/tma`` (``default``: untuned)."""
    if config is None:
        return "default"
    text = f"{config['BLOCK_M']}x{config['BLOCK_N']}/w{config['num_warps']}/s{config['num_stages']}"
    extras = [f"waves{config['waves']}"] if "waves" in config else []
    extras += ["tma"] if config.get("tma") else []
    return "/".join([text, *extras])


def main(args: argparse.Namespace) -> int:
    against = [a for a in args.against.split(",") if a]
    unknown = [a for a in against if a not in ANCHORS]
    if unknown:
        print(
            f"attncc: error: --against: unknown anchor {', '.join(unknown)}; "
            f"choose from {', '.join(ANCHORS)}",
            file=sys.stderr,
        )
        return 2
    if getattr(args, "page", 16) < 1:
        print(f"attncc: error: --page must be at least 1 token, got {args.page}", file=sys.stderr)
        return 2
    if getattr(args, "rounds", 2) < 1:
        print(f"attncc: error: --rounds must be at least 1, got {args.rounds}", file=sys.stderr)
        return 2
    try:
        shapes = [Shape.parse(s) for s in args.shapes.split(";") if s] or None
    except ValueError:
        print(
            "attncc: error: --shapes: expected B,H,S,D, B,H:KVH,S,D or B,H,S,D:DV;..., "
            f"got {args.shapes!r}",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print("attncc: error: bench needs a CUDA GPU", file=sys.stderr)
        return 2
    startup = Startup(0.0)
    target = getattr(args, "target", "auto")
    deadline = getattr(args, "deadline", None) or os.environ.get("ATTNCC_BENCH_DEADLINE")
    plan = RunPlan(
        getattr(args, "json", None),
        resume=getattr(args, "resume", False),
        deadline=float(deadline) if deadline else None,
    )
    warm_only = getattr(args, "warm", False)
    rows = bench_spec(
        args.spec,
        shapes,
        args.dtype,
        against,
        startup=startup,
        target=target,
        plan=plan,
        warm_only=warm_only,
        page=getattr(args, "page", 16),
        rounds=getattr(args, "rounds", 2),
    )
    if warm_only:
        print(f"warmed {args.spec} ({args.dtype}): {args.shapes}")
        return 0
    target = startup.target or target
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  target {target}")
    print(startup)
    print(format_rows(rows, against))
    return 0
