"""Check a compiled kernel against the float64 reference on random shapes, layouts and dtypes.

Used by ``attncc check`` and the test suites. Inputs are drawn fresh for every trial (never
zeros), outputs are poisoned with NaN before the run so unwritten elements show, and the
verdict follows ``attncc.tolerance``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attncc.ir import nodes as ir
from attncc.ir.nodes import AttentionKernel
from attncc.ir.verify import subexprs
from attncc.reference import Rounding, reference
from attncc.runtime.kernel import Kernel
from attncc.text import format_table
from attncc.tolerance import Verdict, compare
from attncc.torch_eval import evaluate

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES: dict[torch.dtype, Rounding] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}
LAYOUTS = ("contiguous", "strided", "permuted")
HEAD_DIMS = (16, 32, 40, 64, 80, 96, 128)


@dataclass(frozen=True)
class Case:
    sizes: dict[str, int]
    dtype: torch.dtype
    layout: str
    params: dict[str, int | float] = field(default_factory=dict)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.sizes.items())


@dataclass(frozen=True)
class Result:
    case: Case
    output: Verdict
    lse: Verdict

    @property
    def ok(self) -> bool:
        return self.output.ok and self.lse.ok


def draw_sizes(
    kernel: AttentionKernel,
    rng: np.random.Generator,
    max_len: int = 96,
    head_dims: Sequence[int] = HEAD_DIMS,
) -> dict[str, int]:
    """Sizes for every dim: lengths 1..max_len (M != N allowed), head dims from ``head_dims``."""
    sizes = {dim: int(rng.integers(1, 4)) for dim in kernel.dims}
    for axis in kernel.batch_axes:
        sizes[axis.dim] = int(rng.integers(1, 4))
    sizes[kernel.key_axis.dim] = int(rng.integers(1, max_len + 1))
    if kernel.query_axis is not None and kernel.query_axis.dim != kernel.key_axis.dim:
        sizes[kernel.query_axis.dim] = int(rng.integers(1, max_len + 1))
    sizes[kernel.head_axis.dim] = int(rng.choice(list(head_dims)))
    if kernel.value_axis.dim != kernel.head_axis.dim:
        sizes[kernel.value_axis.dim] = int(rng.choice(list(head_dims)))
    if kernel.group is not None:
        kv = int(rng.integers(1, 3))
        sizes[kernel.group.kv_dim] = kv
        sizes[kernel.group.head.dim] = kv * int(rng.integers(1, 4))
    for dim in index_tensor_dims(kernel).values():
        sizes[dim] = int(rng.integers(1, 64))  # a pool to pick from (pages)
    derive_sizes(kernel, sizes, int(rng.integers(1, max_len + 1)), int(rng.integers(1, 18)))
    if kernel.schedule == "split_kv" and kernel.query_axis is not None:
        # split-KV holds every (query head of a group, query) row in one tile: at most 128
        group = sizes[kernel.group.head.dim] // sizes[kernel.group.kv_dim] if kernel.group else 1
        query = kernel.query_axis.dim
        sizes[query] = min(sizes[query], 128 // group)
        if kernel.key_axis.dim == query:
            sizes[kernel.key_axis.dim] = sizes[query]
    return sizes


def derive_sizes(
    kernel: AttentionKernel, sizes: dict[str, int], key_length: int, page: int
) -> dict[str, int]:
    """Compute the derived dims into ``sizes``. A paged key axis ``N = NP * PAGE`` first gets
    pages of ``page`` tokens, and pages enough for ``key_length`` keys."""
    for dim, value in kernel.derived_dims:
        if (
            dim == kernel.key_axis.dim
            and isinstance(value, ir.BinOp)
            and value.op == "*"
            and isinstance(value.left, ir.Dim)
            and isinstance(value.right, ir.Dim)
        ):
            sizes[value.right.name] = page
            sizes[value.left.name] = -(-key_length // page)
        sizes[dim] = int(evaluate(value, {}, sizes, {}, {}))
    return sizes


def index_tensor_dims(kernel: AttentionKernel) -> dict[str, str]:
    """Integer inputs read as a whole subscript of another tensor (a page table), mapped to
    the dim they index: their values must lie in [0, size of that dim)."""
    found: dict[str, str] = {}
    exprs = [*kernel.query.indices, *kernel.key.indices, *kernel.value.indices]
    exprs += [*kernel.score_mods, *kernel.masks]
    for expr in exprs:
        for e in subexprs(expr):
            if isinstance(e, ir.Load):
                dims = kernel.tensor(e.tensor).dims
                for sub, dim in zip(e.indices, dims, strict=True):
                    if isinstance(sub, ir.Load):
                        found[sub.tensor] = dim
    for operand in (kernel.query, kernel.key, kernel.value):
        dims = kernel.tensor(operand.tensor).dims
        for sub, dim in zip(operand.indices, dims, strict=True):
            if isinstance(sub, ir.Load):
                found[sub.tensor] = dim
    return found


def _layout(t: torch.Tensor, layout: str, rng: np.random.Generator) -> torch.Tensor:
    """The same values in a non-contiguous arrangement."""
    if layout == "strided" and t.dim() > 0:
        pad = int(rng.integers(1, 5))
        wide = torch.empty((*t.shape[:-1], t.shape[-1] + pad), dtype=t.dtype, device=t.device)
        wide.normal_()
        wide[..., : t.shape[-1]] = t
        return wide[..., : t.shape[-1]]
    if layout == "permuted" and t.dim() > 1:
        order = list(range(t.dim()))[::-1]
        return t.permute(order).contiguous().permute(order)
    return t


def make_inputs(
    kernel: AttentionKernel,
    sizes: dict[str, int],
    dtype: torch.dtype,
    device: str,
    rng: np.random.Generator,
    layout: str = "contiguous",
) -> dict[str, torch.Tensor]:
    """Random inputs: floats ~ N(0, 1); integers that index another tensor (page tables)
    uniform over that dim; other integers sorted in [0, key length] along the last axis
    (document ids, cache lengths); booleans fair coins."""
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    key_size = sizes[kernel.key_axis.dim]
    indexing = index_tensor_dims(kernel)
    inputs = {}
    for arg in kernel.tensors:
        shape = tuple(sizes[d] for d in arg.dims)
        if arg.name in indexing:  # e.g. page ids: anywhere in the pool, in any order
            values = torch.randint(0, max(sizes[indexing[arg.name]], 1), shape, generator=gen)
            tensor = values.to(torch.int32 if arg.dtype == "i32" else torch.int64)
        elif arg.dtype in ("i32", "i64"):
            values = torch.randint(0, key_size + 1, shape, generator=gen)
            values = values.sort(dim=-1).values if values.dim() else values
            tensor = values.to(torch.int32 if arg.dtype == "i32" else torch.int64)
        elif arg.dtype == "bool":
            tensor = torch.rand(shape, generator=gen) < 0.5
        else:
            tensor = torch.randn(shape, generator=gen).to(dtype)
            tensor = _layout(tensor, layout, rng)
        inputs[arg.name] = tensor.to(device)
    return inputs


def draw_params(
    kernel: AttentionKernel,
    sizes: dict[str, int],
    defaults: dict[str, Any],
    rng: np.random.Generator,
) -> dict[str, int | float]:
    """Integer params across the key range (windows, prefixes); floats around their default."""
    key_size = sizes[kernel.key_axis.dim]
    params: dict[str, int | float] = {}
    for p in kernel.params:
        if p.type == "int":
            params[p.name] = int(rng.integers(1, key_size + 2))
        else:
            base = float(defaults.get(p.name) or 1.0)
            params[p.name] = base * float(rng.uniform(0.05, 2.0))
    return params


def _numpy(t: torch.Tensor) -> np.ndarray[Any, Any]:
    return t.detach().to("cpu", torch.float64).numpy()


def run_case(kernel: Kernel, case: Case, device: str, rng: np.random.Generator) -> Result:
    inputs = make_inputs(kernel.ir, case.sizes, case.dtype, device, rng, case.layout)
    out, lse = kernel(**inputs, **case.params, return_lse=True)
    exact_fn = reference(kernel.spec)
    naive_fn = reference(kernel.spec, rounding=DTYPE_NAMES[case.dtype])
    host = {k: v.cpu() for k, v in inputs.items()}
    exact_out, exact_lse = exact_fn(**host, **case.params, return_lse=True)
    naive_out, naive_lse = naive_fn(**host, **case.params, return_lse=True)
    dtype = DTYPE_NAMES[case.dtype]
    return Result(
        case,
        compare(_numpy(out), exact_out, naive_out, dtype),
        compare(_numpy(lse), exact_lse, naive_lse, "float32"),
    )


def cases(
    kernel: AttentionKernel,
    trials: int,
    seed: int,
    dtypes: Sequence[torch.dtype],
    defaults_of: Any,
    max_len: int = 96,
) -> Iterator[Case]:
    """``trials`` random cases; the first keeps param defaults, the rest draw params."""
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        sizes = draw_sizes(kernel, rng, max_len)
        params = {} if trial == 0 else draw_params(kernel, sizes, defaults_of(sizes), rng)
        dtype = dtypes[trial % len(dtypes)]
        layout = LAYOUTS[trial % len(LAYOUTS)]
        yield Case(sizes, dtype, layout, params)


def check(
    kernel: Kernel,
    trials: int = 8,
    seed: int = 0,
    device: str = "cpu",
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float16, torch.bfloat16),
    max_len: int = 96,
) -> list[Result]:
    """Run ``trials`` random cases on ``device``; every result carries its verdicts."""
    kernel.poison_outputs(True)
    try:
        rng = np.random.default_rng(seed + 1)
        return [
            run_case(kernel, case, device, rng)
            for case in cases(kernel.ir, trials, seed, dtypes, kernel.param_defaults, max_len)
        ]
    finally:
        kernel.poison_outputs(False)


def table(results: Sequence[Result]) -> str:
    rows = [("shape", "dtype", "layout", "params", "error", "bound", "lse error", "verdict")]
    for r in results:
        params = ",".join(f"{k}={v:.3g}" for k, v in r.case.params.items()) or "defaults"
        rows.append(
            (
                r.case.describe(),
                DTYPE_NAMES[r.case.dtype],
                r.case.layout,
                params,
                f"{r.output.error:.2e}",
                f"{r.output.bound:.2e}",
                f"{r.lse.error:.2e}",
                "ok" if r.ok else f"FAIL ({r.output.reason or r.lse.reason})",
            )
        )
    return format_table(rows)
