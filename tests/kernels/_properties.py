"""Draws shared by the property tests (tests/kernels/test_properties.py on the CPU
interpreter, tests/gpu/test_gpu_properties.py at realistic sizes on a GPU): sizes, params and
inputs of any example, and the verdict of a call against the float64 reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from attncc.checking import DECLARED_DTYPES, derive_sizes, index_tensor_dims, operand_dtype
from attncc.checking import _draw_table_dims as draw_table_dims
from attncc.ir.nodes import AttentionKernel
from attncc.runtime.kernel import Kernel

from ._support import DEVICE, arrange, evaluate, fit_split_kv

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEAD_DIMS = (16, 40, 64, 96, 128, 160)  # 40, 96 and 160 pad to a power-of-two tile
SHORT = st.one_of(st.sampled_from([1, 2, 3, 7, 16, 17, 33, 63, 64, 65]), st.integers(1, 80))
LONG = st.integers(130, 300)


def fmt(sizes: dict[str, int], params: dict[str, Any], dtype: torch.dtype, layout: str) -> str:
    shown = " ".join(f"{k}={v}" for k, v in sizes.items())
    return f"{shown} params={params} {dtype} {layout}"


@st.composite
def sizes_for(
    draw: st.DrawFn,
    kernel: AttentionKernel,
    lengths: st.SearchStrategy[int],
    head_dims: tuple[int, ...] = HEAD_DIMS,
    most: int = 3,
    value_dims: tuple[int, ...] | None = None,
) -> dict:
    """Sizes of every dim of ``kernel``: the query and key lengths from ``lengths``, the
    head dim from ``head_dims``, a value dim of its own from ``value_dims`` (None: 1..``most``
    as the other dims), batch, heads and other dims 1..``most`` (a GQA group's kv heads 1..2,
    each with 1..3 query heads), page tables and tables to fit."""
    sizes = {dim: draw(st.integers(1, most)) for dim in kernel.dims}
    for axis in kernel.batch_axes:
        sizes[axis.dim] = draw(st.integers(1, most))
    sizes[kernel.key_axis.dim] = draw(lengths)
    if kernel.query_axis is not None and kernel.query_axis.dim != kernel.key_axis.dim:
        sizes[kernel.query_axis.dim] = draw(lengths)
    sizes[kernel.head_axis.dim] = draw(st.sampled_from(head_dims))
    if value_dims is not None and kernel.value_axis.dim != kernel.head_axis.dim:
        sizes[kernel.value_axis.dim] = draw(st.sampled_from(value_dims))
    if kernel.group is not None:
        kv_heads = draw(st.integers(1, 2))
        sizes[kernel.group.kv_dim] = kv_heads
        sizes[kernel.group.head.dim] = kv_heads * draw(st.integers(1, 3))
    for dim in index_tensor_dims(kernel).values():
        sizes[dim] = draw(st.integers(1, 40))  # the pool a page table picks from
    # a paged key axis N = NP * PAGE: any page size, pages enough for the drawn length
    page = draw(st.sampled_from([1, 2, 3, 16, 17]))
    sizes = derive_sizes(kernel, sizes, sizes[kernel.key_axis.dim], page)
    # tables read at a computed subscript (FP8 descales per block of rows) hold every entry
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    draw_table_dims(kernel, sizes, {}, rng)
    return sizes


def int_param(name: str, key_len: int) -> st.SearchStrategy[int]:
    """Windows and prefixes: tiny, around the key length and the 64-key tile, and huge."""
    around = [key_len - 1, key_len, key_len + 1, 63, 64, 65]
    return st.one_of(
        st.sampled_from([1, 2, 3, 17, *around, 10**6]),
        st.integers(1, key_len + 70),
        st.just(0) if name == "prefix" else st.integers(1, 4),
    )


@st.composite
def params_for(draw: st.DrawFn, kernel: Kernel, sizes: dict[str, int]) -> dict[str, Any]:
    """Each param either left to its default or drawn (floats scale their default)."""
    defaults = kernel.param_defaults(sizes)
    key_len = sizes[kernel.ir.key_axis.dim]
    params: dict[str, Any] = {}
    for p in kernel.ir.params:
        if draw(st.booleans()):
            continue
        if p.type == "int":
            params[p.name] = draw(int_param(p.name, key_len))
        else:
            base = float(defaults.get(p.name) or 1.0)
            params[p.name] = base * draw(st.floats(0.05, 3.0))
    return params


def make_inputs(
    kernel: AttentionKernel,
    sizes: dict[str, int],
    dtype: torch.dtype,
    layout: str,
    seed: int,
    zero_lengths: bool = False,
) -> dict[str, torch.Tensor]:
    """Fresh N(0, 1) floats in ``layout``; document ids with several documents per sequence;
    cache lengths across [0, N] (some forced to 0 with ``zero_lengths``)."""
    gen = torch.Generator().manual_seed(seed)
    key_len = sizes[kernel.key_axis.dim]
    inputs: dict[str, torch.Tensor] = {}
    indexing = index_tensor_dims(kernel)
    for arg in kernel.tensors:
        shape = [sizes[d] for d in arg.dims]
        if arg.dtype in ("i32", "i64"):
            int_dtype = torch.int32 if arg.dtype == "i32" else torch.int64
            if arg.name in indexing:  # page ids: anywhere in the pool
                values = torch.randint(0, sizes[indexing[arg.name]], shape, generator=gen)
            elif len(shape) == 1:  # per-sequence lengths
                values = torch.randint(0, key_len + 1, shape, generator=gen)
                if zero_lengths:
                    values[::2] = 0
            else:  # per-token ids: a few documents, in order
                docs = max(1, key_len // 8)
                values = torch.randint(0, docs, shape, generator=gen).sort(dim=-1).values
            inputs[arg.name] = values.to(int_dtype)
            continue
        float_dtype = DECLARED_DTYPES.get(arg.dtype, dtype)  # a side input declared `f32`
        if layout == "broadcast" and arg.role != "aux" and len(shape) > 1:
            # one batch entry shared by all: stride 0 along the batch axis
            values = torch.randn([1, *shape[1:]], generator=gen).to(float_dtype).expand(*shape)
        else:
            values = arrange(torch.randn(shape, generator=gen).to(float_dtype), layout)
        inputs[arg.name] = values
    return {k: v.to(DEVICE) for k, v in inputs.items()}


def assert_matches(
    kernel: Kernel,
    sizes: dict[str, int],
    params: dict[str, Any],
    dtype: torch.dtype,
    layout: str,
    seed: int,
    zero_lengths: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    sizes = fit_split_kv(kernel, sizes)
    dtype = operand_dtype(kernel.ir) or dtype  # q, k and v declared FP8 are drawn in it
    inputs = make_inputs(kernel.ir, sizes, dtype, layout, seed, zero_lengths)
    out_v, lse_v, out, lse = evaluate(kernel, inputs, params, dtype)
    where = fmt(sizes, params, dtype, layout)
    assert out_v.ok, f"output: {out_v} for {where}"
    assert lse_v.ok, f"lse: {lse_v} for {where}"
    assert not torch.isnan(out).any() and not torch.isnan(lse).any(), where
    return out, lse
