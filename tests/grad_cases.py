"""Gradient checks of the fused examples at any size, shared by the GPU test at training
sizes (tests/gpu/test_gpu_backward.py) and its CPU twin at tiny sizes
(tests/kernels/test_backward_tiny.py), so what the device checks runs in the CPU suite too.

The float64 reference materialises every score: at S=2048 one [B, H, S, S] float64 tensor
is 2*8*2048^2*8 bytes = 537 MB, and autograd keeps a handful of them (a few GB: fine on an
80 GB GPU).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

import attncc
from attncc.reference_grad import eager_grads, gradient_terms, reference_grads
from attncc.runtime import autograd
from attncc.tolerance import Verdict, compare_grad

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NAMES = (
    "causal",
    "gqa_causal",
    "sliding_window",
    "alibi",
    "softcap",
    "bias",
    "relative_bias",
    "document_mask",
)
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def draw(
    name: str, batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype, device: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Inputs and params for example ``name``: q, k, v ~ N(0, 1) in ``dtype`` (gqa_causal
    with a quarter as many kv heads), ALiBi's slopes in float32 in [0.1, 1.1) (a learnt
    parameter's gradient is checked too), a bias and a relative table of 33 buckets ~ N(0, 1)
    in ``dtype``, sorted document ids in 0..3, a window of a quarter of the sequence."""
    gen = torch.Generator().manual_seed(sum(map(ord, name)) + seq + head_dim)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(device, dtype)

    kv_heads = max(1, heads // 4) if name == "gqa_causal" else heads
    given = {
        "q": randn(batch, heads, seq, head_dim),
        "k": randn(batch, kv_heads, seq, head_dim),
        "v": randn(batch, kv_heads, seq, head_dim),
    }
    params: dict[str, Any] = {}
    if name == "alibi":
        given["slopes"] = (torch.rand(heads, generator=gen) + 0.1).to(device)
    if name == "bias":
        given["bias"] = randn(batch, heads, seq, seq)
    if name == "relative_bias":
        given["rel"] = randn(heads, 33)  # distances past 16 either way share the end buckets
    if name == "document_mask":
        doc = torch.randint(0, 4, (batch, seq), generator=gen).sort(dim=-1).values
        given["doc"] = doc.to(device, torch.int32)
    if name == "sliding_window":
        params["window"] = max(1, seq // 4)
    return given, params


def gradient_verdicts(
    name: str,
    given: Mapping[str, torch.Tensor],
    params: Mapping[str, Any],
    target: str = "triton",
    backend: str | None = None,
    needs: Collection[str] | None = None,
    spec: Path | None = None,
) -> dict[str, Verdict]:
    """Forward and backward of example ``name``'s fused kernel of ``target`` with a random
    ``grad_out``; every float input's gradient (slopes and bias included) against float64
    autograd, bounded by the same math done eagerly in q's dtype. ``backend``: the backward
    backend the call must have taken ("cuda": the sm_90a kernel, or "triton"); ``needs``: the
    inputs that require grad (default every float one), the only ones checked; ``spec``: a
    spec file to compile instead of the example (inputs drawn as for ``name``)."""
    spec = spec if spec is not None else EXAMPLES / f"{name}.attn"
    kernel = attncc.compile(spec, target=target, schedule="fused")
    dtype = given["q"].dtype
    floats = [n for n, t in given.items() if t.is_floating_point()]
    needs = floats if needs is None else needs
    leaves = {n: t.clone().requires_grad_(n in needs) for n, t in given.items()}
    out = kernel(**leaves, **params)
    gen = torch.Generator().manual_seed(7)
    grad_out = torch.randn(out.shape, generator=gen).to(out.device, dtype)
    out.backward(grad_out)
    del out
    if backend is not None:
        assert autograd.last_backend() == backend, autograd.last_backend()
    verdicts = {}
    _, exact = reference_grads(spec, given, grad_out, params)
    eager = eager_grads(spec, given, grad_out, params, dtype=dtype)
    terms = gradient_terms(spec, given, params)
    assert set(exact) == {n for n, t in given.items() if t.is_floating_point()}
    for tensor, reference in exact.items():
        if tensor not in needs:
            continue
        grad = leaves[tensor].grad
        assert grad is not None and grad.dtype == given[tensor].dtype, tensor
        verdicts[tensor] = compare_grad(
            grad.double().cpu().numpy(),
            reference.cpu().numpy(),
            [e.cpu().numpy() for e in eager[tensor]],
            DTYPE_NAMES[grad.dtype],
            terms.get(tensor, 1),
        )
    return verdicts


def note_replays(monkeypatch: Any) -> list[bool]:
    """Whether each recorded backward a call found replayed (True) or left the call to the
    full path (False), in order (``monkeypatch``: pytest's, patching ``_Repeat``)."""
    replayed: list[bool] = []
    replay = autograd._Repeat.__call__

    def noted(self: autograd._Repeat, *args: Any) -> Any:
        result = replay(self, *args)
        replayed.append(result is not None)
        return result

    monkeypatch.setattr(autograd._Repeat, "__call__", noted)
    return replayed
