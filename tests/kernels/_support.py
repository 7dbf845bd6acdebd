"""Helpers shared by the kernel tests: example paths, cached compiles, evaluation on given inputs.

Everything runs on the CPU through the Triton interpreter unless a CUDA device is present.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

import attncc
from attncc.checking import DTYPE_NAMES
from attncc.reference import reference
from attncc.runtime.kernel import Kernel
from attncc.tolerance import Verdict, compare

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = ROOT / "examples"
EXAMPLES = tuple(sorted(p.stem for p in EXAMPLES_DIR.glob("*.attn")))
SCHEDULES = ("naive", "fused", "split_kv")
# "default": no schedule given; fused kernels then hand short query lengths to split-KV
ALL_SCHEDULES = ("default", *SCHEDULES)
# split-KV runs every (query head, query) row of a kv head in one program
SPLIT_KV_MAX_ROWS = 128
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def example_path(name: str) -> Path:
    return EXAMPLES_DIR / f"{name}.attn"


@cache
def compiled(name: str, schedule: str) -> Kernel:
    """One compile per (example, schedule) per test session."""
    chosen = None if schedule == "default" else schedule
    kernel = attncc.compile(example_path(name), schedule=chosen)  # type: ignore[arg-type]
    assert kernel.ir.schedule == (chosen or kernel.ir.schedule)
    return kernel


def fit_split_kv(kernel: Kernel, sizes: dict[str, int]) -> dict[str, int]:
    """Shorten the query length so an explicit split-KV kernel takes the shape."""
    ir = kernel.ir
    if ir.schedule != "split_kv" or ir.query_axis is None:
        return sizes
    group = 1
    if ir.group is not None:
        group = sizes[ir.group.head.dim] // sizes[ir.group.kv_dim]
    sizes = dict(sizes)
    sizes[ir.query_axis.dim] = min(sizes[ir.query_axis.dim], SPLIT_KV_MAX_ROWS // group)
    return sizes


def numpy64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def evaluate(
    kernel: Kernel,
    inputs: dict[str, torch.Tensor],
    params: dict[str, Any],
    dtype: torch.dtype,
    spec: Any = None,
) -> tuple[Verdict, Verdict, torch.Tensor, torch.Tensor]:
    """Run ``kernel`` on ``inputs`` with outputs poisoned; judge it against the float64
    reference of ``spec`` (the kernel's own spec by default) with the tolerance rule."""
    spec = kernel.spec if spec is None else spec
    kernel.poison_outputs(True)
    try:
        out, lse = kernel(**inputs, **params, return_lse=True)
    finally:
        kernel.poison_outputs(False)
    host = {k: v.cpu() for k, v in inputs.items()}
    exact_out, exact_lse = reference(spec)(**host, **params, return_lse=True)
    naive_out, naive_lse = reference(spec, rounding=DTYPE_NAMES[dtype])(
        **host, **params, return_lse=True
    )
    return (
        compare(numpy64(out), exact_out, naive_out, DTYPE_NAMES[dtype]),
        compare(numpy64(lse), exact_lse, naive_lse, "float32"),
        out,
        lse,
    )


def arrange(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``t`` in another memory layout (never a copy of the values' order)."""
    if layout == "contiguous" or t.dim() < 2:
        return t.contiguous()
    if layout == "strided":  # rows padded: a view into a wider buffer full of noise
        wide = torch.randn((*t.shape[:-1], t.shape[-1] + 3), dtype=torch.float32).to(t.dtype)
        wide[..., : t.shape[-1]] = t
        return wide[..., : t.shape[-1]]
    if layout == "permuted":  # every axis reversed in memory
        order = list(range(t.dim()))[::-1]
        return t.permute(order).contiguous().permute(order)
    if layout == "swapped":  # [B, M, H, D] in memory read as [B, H, M, D], as most models store it
        first = 1 if t.dim() > 2 else 0  # a 2-d table ([H, R]): stored transposed
        return t.transpose(first, first + 1).contiguous().transpose(first, first + 1)
    if layout == "broadcast":  # stride 0 along the first axis when it is 1 wide
        if t.shape[0] == 1:
            return t.expand(*t.shape).as_strided(t.shape, (0, *t.stride()[1:]))
        return t
    raise ValueError(layout)


LAYOUTS = ("contiguous", "strided", "permuted", "swapped", "broadcast")
