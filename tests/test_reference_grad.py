"""The float64 gradient reference: against finite differences, SDPA's backward, and the
NumPy forward reference; fully masked rows give zero gradients."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from attncc import reference_grad
from attncc.ir import lower
from attncc.reference import reference
from attncc.reference_grad import gradient_terms
from attncc.spec import load
from attncc.tolerance import compare_grad, floor

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
F64 = torch.float64


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def inputs_for(name: str) -> dict[str, torch.Tensor]:
    b, h, m, n, d = 1, 2, 5, 6, 3
    q, k, v = randn(b, h, m, d, seed=1), randn(b, h, n, d, seed=2), randn(b, h, n, d, seed=3)
    extra: dict[str, torch.Tensor] = {}
    if name == "gqa_causal":
        q = randn(b, 4, m, d, seed=1)
    if name == "alibi":
        extra["slopes"] = randn(h, seed=4).abs()
    if name == "bias":
        extra["bias"] = randn(b, h, m, n, seed=5)
    if name == "sinks":
        extra["sinks"] = randn(h, seed=6)
    if name == "document_mask":
        k, v = randn(b, h, m, d, seed=2), randn(b, h, m, d, seed=3)
        extra["doc"] = torch.tensor([[0, 0, 1, 1, 1]])
    return {"q": q, "k": k, "v": v, **extra}


def output_of(name: str, tensors: dict[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    checked = load(EXAMPLES / f"{name}.attn")
    kernel = lower(checked)
    sizes = reference_grad._sizes(checked, tensors)
    params = reference_grad._params(kernel, sizes, {})
    floats = reference_grad.float_inputs(kernel)

    def fn(*values: torch.Tensor) -> torch.Tensor:
        given = {**tensors, **dict(zip(floats, values, strict=True))}
        return reference_grad.attention(kernel, given, sizes, params)

    return fn


@pytest.mark.parametrize(
    "name",
    ["causal", "gqa_causal", "alibi", "softcap", "bias", "document_mask", "prefix_lm", "sinks"],
)
def test_gradients_match_finite_differences(name: str) -> None:
    tensors = inputs_for(name)
    fn = output_of(name, tensors)
    floats = reference_grad.float_inputs(lower(load(EXAMPLES / f"{name}.attn")))
    values = tuple(tensors[n].clone().requires_grad_(True) for n in floats)
    assert torch.autograd.gradcheck(fn, values, eps=1e-6, atol=1e-6)


def test_forward_matches_numpy_reference_and_grads_cover_every_float_input() -> None:
    tensors = inputs_for("alibi")
    grad_out = randn(1, 2, 5, 3, seed=9)
    out, grads = reference_grad.reference_grads(EXAMPLES / "alibi.attn", tensors, grad_out)
    exact = reference(EXAMPLES / "alibi.attn")(**tensors)
    torch.testing.assert_close(out, torch.from_numpy(exact), rtol=0, atol=1e-14)
    assert set(grads) == {"q", "k", "v", "slopes"}
    assert grads["slopes"].shape == (2,) and grads["slopes"].abs().sum() > 0


def test_causal_gradients_match_sdpa_backward() -> None:
    q, k, v = randn(2, 3, 17, 8, seed=1), randn(2, 3, 17, 8, seed=2), randn(2, 3, 17, 8, seed=3)
    grad_out = randn(2, 3, 17, 8, seed=4)
    out, grads = reference_grad.reference_grads(
        EXAMPLES / "causal.attn", {"q": q, "k": k, "v": v}, grad_out
    )
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    sdpa = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
    sdpa.backward(grad_out)
    torch.testing.assert_close(out, sdpa.detach(), rtol=0, atol=1e-13)
    for name, leaf in zip("qkv", leaves, strict=True):
        assert leaf.grad is not None
        torch.testing.assert_close(grads[name], leaf.grad, rtol=0, atol=1e-12)


def test_fully_masked_rows_give_zero_gradients() -> None:
    # window 0: no query sees any key
    tensors = inputs_for("sliding_window")
    grad_out = randn(1, 2, 5, 3, seed=9)
    out, grads = reference_grad.reference_grads(
        EXAMPLES / "sliding_window.attn", tensors, grad_out, {"window": 0}
    )
    assert torch.equal(out, torch.zeros_like(out))
    for g in grads.values():
        assert torch.equal(g, torch.zeros_like(g))


def test_low_precision_evaluation_differs_from_float64() -> None:
    tensors = inputs_for("softcap")
    grad_out = randn(1, 2, 5, 3, seed=9)
    _, exact = reference_grad.reference_grads(EXAMPLES / "softcap.attn", tensors, grad_out)
    _, rough = reference_grad.reference_grads(
        EXAMPLES / "softcap.attn", tensors, grad_out, dtype=torch.bfloat16
    )
    error = (rough["q"] - exact["q"]).abs().max().item()
    assert 0 < error < 0.1


def test_flash_softmax_backward_is_autograds_in_float64() -> None:
    """The eager evaluation's flash-style softmax backward (delta from the output, a sink
    column in the normaliser only) has autograd's gradient, checked in float64."""
    logits = randn(2, 5, 7, seed=1)
    logits[0, 1, 2:] = float("-inf")  # masked keys; the last column is a sink
    v = randn(2, 6, 3, seed=2).requires_grad_(True)
    leaf = logits.clone().requires_grad_(True)

    def flash(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return reference_grad._FlashSoftmaxValue.apply(x, values, F64)  # type: ignore[no-any-return]

    grad_out = randn(2, 5, 3, seed=3)
    got = torch.autograd.grad(flash(leaf, v), (leaf, v), grad_out)
    want = torch.autograd.grad(torch.softmax(leaf, -1)[..., :6] @ v, (leaf, v), grad_out)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-13)


def test_gradient_terms_count_the_visible_scores_each_side_element_sums() -> None:
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen)

    qkv = {"q": randn(2, 3, 5, 8), "k": randn(2, 3, 5, 8), "v": randn(2, 3, 5, 8)}
    # causal: a head's slope sums B * (1 + 2 + ... + 5) scores
    alibi = gradient_terms(EXAMPLES / "alibi.attn", {**qkv, "slopes": randn(3)})
    assert alibi == {"slopes": 2 * 15}
    bias = gradient_terms(EXAMPLES / "bias.attn", {**qkv, "bias": randn(2, 3, 5, 5)})
    assert bias == {"bias": 1}
    # a sink: one term per row of a head, every row (GQA's query heads each have their own)
    sinks = {"q": randn(2, 4, 5, 8), "k": randn(2, 2, 6, 8), "v": randn(2, 2, 6, 8)}
    assert gradient_terms(EXAMPLES / "sinks.attn", {**sinks, "sinks": randn(4)}) == {"sinks": 10}


def test_gradient_floor_scales_with_the_square_root_of_the_terms() -> None:
    exact = np.zeros(3)
    actual = np.full(3, 2.5 * floor("float32"))
    assert not compare_grad(actual, exact, exact, "float32").ok
    assert not compare_grad(actual, exact, exact, "float32", terms=4).ok
    verdict = compare_grad(actual, exact, exact, "float32", terms=9)
    assert verdict.ok and verdict.bound == pytest.approx(3 * floor("float32"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_evaluation_of_a_score_term_from_indices(
    dtype: torch.dtype, tmp_path: Path
) -> None:
    """A score modification of index arithmetic alone (a float32 term) promotes the scores
    past the inputs' 16-bit dtype: the weights still meet V in V's dtype, and both naive
    evaluations (autograd's softmax backward and the flash one) give the gradients."""
    spec = tmp_path / "distance.attn"
    spec.write_text(
        (EXAMPLES / "fused.attn")
        .read_text()
        .replace("p = softmax", "s = s - abs(m - n) * 0.01\np = softmax")
    )
    tensors = inputs_for("fused")
    grad_out = randn(1, 2, 5, 3, seed=9)
    _, exact = reference_grad.reference_grads(spec, tensors, grad_out)
    rough = reference_grad.eager_grads(spec, tensors, grad_out, dtype=dtype)
    for name in ("q", "k", "v"):
        for grads in rough[name]:
            error = (grads.to(F64) - exact[name]).abs().max().item()
            assert 0 < error < 0.05
