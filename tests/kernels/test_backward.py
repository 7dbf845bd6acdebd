"""Gradients of the fused kernels (Triton interpreter on the CPU) against the float64
gradient reference, by flash-attn's rule (``attncc.tolerance.compare_grad``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.checkpoint

import attncc
from attncc.reference_grad import eager_grads, gradient_terms, reference_grads
from attncc.tolerance import compare_grad

from ._support import DEVICE, compiled, example_path

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _assert_within_rule(
    grads: dict[str, Any],
    exact: dict[str, Any],
    eager: dict[str, Any],
    terms: dict[str, int],
    given: dict[str, torch.Tensor],
    dtype: torch.dtype,
    case: str,
) -> None:
    """Every gradient in its input's dtype and within flash-attn's rule (compare_grad)."""
    for tensor, grad in grads.items():
        assert grad is not None and grad.dtype == given[tensor].dtype
        verdict = compare_grad(
            grad.double().cpu().numpy(),
            exact[tensor].cpu().numpy(),
            [e.cpu().numpy() for e in eager[tensor]],
            DTYPE_NAMES[dtype],
            terms.get(tensor, 1),
        )
        assert verdict.ok, (case, tensor, verdict)


def inputs(name: str, dtype: torch.dtype, m: int = 37, n: int = 45) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(len(name))
    b, h, kvh, d = 2, 2, 2, 16

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(DEVICE, dtype)

    if name == "gqa_causal":
        h, kvh = 4, 2
    if name == "document_mask":
        n = m
    q, k, v = randn(b, h, m, d), randn(b, kvh, n, d), randn(b, kvh, n, d)
    extra: dict[str, torch.Tensor] = {}
    if name == "alibi":
        extra["slopes"] = torch.rand(h, generator=gen).to(DEVICE) + 0.1
    if name == "bias":
        extra["bias"] = torch.randn(b, h, m, n, generator=gen).to(DEVICE)
    if name == "relative_bias":
        # 9 buckets: distances past 4 either way share the end buckets
        extra["rel"] = torch.randn(h, 9, generator=gen).to(DEVICE)
    if name == "document_mask":
        extra["doc"] = torch.sort(torch.randint(0, 3, (b, n), generator=gen)).values.to(DEVICE)
    return {"q": q, "k": k, "v": v, **extra}


def run(kernel: attncc.Kernel, given: dict[str, torch.Tensor], grad_out: torch.Tensor, **params):  # type: ignore[no-untyped-def]
    leaves = {name: t.clone().requires_grad_(t.is_floating_point()) for name, t in given.items()}
    out = kernel(**leaves, **params)
    out.backward(grad_out)
    return out, {name: t.grad for name, t in leaves.items() if t.is_floating_point()}


def run_configured(
    kernel: attncc.Kernel,
    given: dict[str, torch.Tensor],
    grad_out: torch.Tensor,
    config: dict[str, Any],
    params: dict[str, int],
) -> dict[str, torch.Tensor]:
    """The backward run directly with ``config`` (per-kernel tiles, the dkdv orientation)."""
    backward = kernel._backward
    assert not isinstance(backward, str)
    out, lse = kernel._launch(dict(given), dict(params), True)
    dlse = torch.zeros_like(lse)
    grads = backward.run(kernel._host, dict(given), dict(params), out, lse, grad_out, dlse, config)
    return dict(zip(backward.floats, grads, strict=True))


def check(
    name: str,
    dtype: torch.dtype,
    given: dict[str, torch.Tensor] | None = None,
    config: dict[str, Any] | None = None,
    **params: int,
) -> None:
    kernel = compiled(name, "fused")
    given = given or inputs(name, dtype)
    gen = torch.Generator().manual_seed(7)
    out_shape = given["q"].shape
    grad_out = torch.randn(out_shape, generator=gen).to(DEVICE, dtype)
    if config is None:
        _, grads = run(kernel, given, grad_out, **params)
    else:
        grads = run_configured(kernel, given, grad_out, config, params)  # type: ignore[assignment]
    assert_matches_reference(example_path(name), dtype, given, grad_out, grads, params)


def assert_matches_reference(
    spec: str | Path,
    dtype: torch.dtype,
    given: dict[str, torch.Tensor],
    grad_out: torch.Tensor,
    grads: dict[str, Any],
    params: dict[str, int],
) -> None:
    """``grads`` of ``spec`` (a spec's text or path) within flash-attn's rule of its float64
    gradients."""
    _, exact = reference_grads(spec, given, grad_out, params)
    eager = eager_grads(spec, given, grad_out, params, dtype=dtype)
    terms = gradient_terms(spec, given, params)
    assert set(grads) == set(exact)
    _assert_within_rule(grads, exact, eager, terms, given, dtype, str(spec)[:60])


@pytest.mark.parametrize(
    "name",
    [
        "causal",
        "gqa_causal",
        "sliding_window",
        "alibi",
        "softcap",
        "bias",
        "relative_bias",
        "document_mask",
        "prefix_lm",
    ],
)
def test_gradients_match_float64_reference(name: str) -> None:
    params = {"window": 9} if name == "sliding_window" else {}
    params = {"prefix": 5} if name == "prefix_lm" else params
    check(name, torch.float32, **params)


@pytest.mark.parametrize("name", ["softcap", "alibi", "relative_bias"])
def test_bfloat16_gradients(name: str) -> None:
    check(name, torch.bfloat16)


# several tiles a side, the last ragged: each kernel meets partial tiles before and after
# its mask-free band of whole ones (causal at 77 rows: the dkdv kernel's key tile 0 walks
# query tiles 0-31 masked, 32-63 whole, 64-76 masked again, its rows past the end)
BAND_CONFIGS = {
    "keys_major": {"dq_config": (32, 16, 4, 1), "dkdv_config": (16, 32, 4, 1)},
    "rows_major": {
        "dq_config": (16, 32, 4, 1),
        "dkdv_config": (32, 16, 4, 1),
        "dkdv_keys_major": False,
    },
}


@pytest.mark.parametrize("layout", sorted(BAND_CONFIGS))
@pytest.mark.parametrize(
    "name", ["causal", "sliding_window", "alibi", "relative_bias", "document_mask", "prefix_lm"]
)
def test_gradients_with_per_kernel_tiles_and_mask_free_bands(name: str, layout: str) -> None:
    params = {"window": 21} if name == "sliding_window" else {}
    params = {"prefix": 20} if name == "prefix_lm" else params
    given = inputs(name, torch.float32, m=77, n=77)
    check(name, torch.float32, given, BAND_CONFIGS[layout], **params)


def test_backward_tiles_must_be_powers_of_two() -> None:
    given = inputs("causal", torch.float32)
    grad_out = torch.randn(given["q"].shape).to(DEVICE)
    config = {"dq_config": (48, 16, 4, 1)}
    with pytest.raises(ValueError, match="powers of two, not 48"):
        run_configured(compiled("causal", "fused"), given, grad_out, config, {})


def test_document_mask_gradients_skip_dead_tiles_and_keep_live_ones() -> None:
    """200 tokens: 4 query and 4 key tiles of 64 in the backward, documents whose
    boundaries fall inside tiles and differ per sequence. The backward skips the pairs the
    tile index leaves out: queries 128-191 see no key of 0-63 in sequence 0, but in
    sequence 1 two of them (128, 129, document 1) do; a live pair skipped there (a tile
    classified by its start, the other sequence's index) loses their gradient."""
    given = inputs("document_mask", torch.float32, m=200)
    lengths = [[50, 30, 90, 30], [20, 110, 70]]  # boundaries at 50, 80, 170; at 20, 130
    given["doc"] = torch.stack(
        [torch.repeat_interleave(torch.arange(len(n)), torch.tensor(n)) for n in lengths]
    ).to(DEVICE, torch.int32)
    check("document_mask", torch.float32, given)


def test_fully_masked_rows_give_zero_gradients() -> None:
    kernel = compiled("sliding_window", "fused")
    given = inputs("sliding_window", torch.float32)
    grad_out = torch.randn(given["q"].shape).to(DEVICE)
    out, grads = run(kernel, given, grad_out, window=0)
    assert torch.equal(out, torch.zeros_like(out))
    for grad in grads.values():
        assert grad is not None and torch.equal(grad, torch.zeros_like(grad))


def test_gradients_are_deterministic() -> None:
    kernel = compiled("gqa_causal", "fused")
    given = inputs("gqa_causal", torch.float32)
    grad_out = torch.randn(given["q"].shape).to(DEVICE)
    _, first = run(kernel, given, grad_out)
    _, second = run(kernel, given, grad_out)
    for name in first:
        assert torch.equal(first[name], second[name])  # type: ignore[arg-type]


def noted_launches(
    monkeypatch: pytest.MonkeyPatch, kernel: attncc.Kernel, most: int | None = None
) -> list[tuple[int, ...]]:
    """The tiles of each Triton backward launch of ``kernel`` from now on, in order; with
    ``most``, tiles of more than ``most`` (block_m * block_n * stages) raise Triton's
    OutOfResources, as where a GPU's shared memory does not hold them. Asks for Triton's
    backward."""
    from triton.runtime.errors import OutOfResources

    module = kernel._backward.module(DEVICE == "cpu")  # type: ignore[union-attr]
    launch = module._backward_launch
    tried: list[tuple[int, ...]] = []

    def noted(operands: Any, params: Any, sizes: Any, dtype: Any, device: Any, *rest: Any) -> Any:
        tiles = rest[0] or module._DQ_CONFIG
        tried.append(tiles)
        if most is not None and tiles[0] * tiles[1] * tiles[3] > most:
            raise OutOfResources(262144, 232448, "shared memory")
        return launch(operands, params, sizes, dtype, device, *rest)

    monkeypatch.setattr(module, "_backward_launch", noted)
    monkeypatch.setenv("ATTNCC_BACKWARD", "triton")
    return tried


def test_a_backward_past_shared_memory_takes_smaller_tiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the Triton backward's default tiles do not fit the GPU's shared memory (float32
    at head dim 128 and up on an H200: OutOfResources at launch), it runs on the first of
    the smaller tiles that fits, and the next call of the dtype and head dims starts there."""
    kernel = attncc.compile(example_path("alibi"), target="triton", schedule="fused")
    tried = noted_launches(monkeypatch, kernel, most=32 * 32)  # 32 x 32 at one stage at most
    given = inputs("alibi", torch.float32)
    grad_out = torch.randn(given["q"].shape, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    _, grads = run(kernel, given, grad_out)
    assert tried == [(64, 64, 4, 2), (64, 64, 4, 1), (32, 32, 4, 1)]
    assert_matches_reference(example_path("alibi"), torch.float32, given, grad_out, grads, {})
    run(kernel, given, grad_out)
    longer = {**given, "q": torch.cat([given["q"], given["q"]], dim=2)}
    run(kernel, longer, torch.cat([grad_out, grad_out], dim=2))  # a new geometry
    assert tried[3:] and set(tried[3:]) == {(32, 32, 4, 1)}


@pytest.mark.parametrize(
    ("head_dim", "first"), [(64, (64, 64, 4, 2)), (96, (64, 64, 4, 1)), (200, (32, 32, 4, 1))]
)
def test_float32_backward_starts_on_tiles_that_fit(
    head_dim: int, first: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 past head dim 64 starts on the tiles Triton fits in an H100's or H200's shared
    memory (autograd.FLOAT32_FIRST_TILES), compiling none that cannot load; 64 keeps the
    default."""
    kernel = attncc.compile(example_path("causal"), target="triton", schedule="fused")
    tried = noted_launches(monkeypatch, kernel)
    gen = torch.Generator().manual_seed(head_dim)
    given = {n: torch.randn(1, 2, 20, head_dim, generator=gen).to(DEVICE) for n in "qkv"}
    grad_out = torch.randn(1, 2, 20, head_dim, generator=gen).to(DEVICE)
    _, grads = run(kernel, given, grad_out)
    assert tried == [first]
    assert_matches_reference(example_path("causal"), torch.float32, given, grad_out, grads, {})


def test_spec_without_backward_names_why() -> None:
    kernel = compiled("causal", "naive")
    q, k, v = (t.requires_grad_() for t in inputs("causal", torch.float32).values())
    with pytest.raises(NotImplementedError, match="only the fused prefill schedule"):
        kernel(q, k, v)


@pytest.mark.parametrize("slopes_grad", [True, False])
def test_compile_fullgraph_and_checkpoint_trace_the_backward(slopes_grad: bool) -> None:
    """torch.compile(fullgraph=True) and checkpoint give the eager gradients bit for bit,
    with ALiBi's slopes requiring grad or not (the backward op then returns theirs empty,
    its fake too)."""
    kernel = compiled("alibi", "fused")
    given = inputs("alibi", torch.float32, m=20, n=20)
    grad_out = torch.randn(given["q"].shape).to(DEVICE)
    _, eager = run(kernel, given, grad_out)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
        return kernel(q, k, v, slopes) * 1.0

    torch._dynamo.reset()
    compiled_fn = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for call in (
        compiled_fn,
        lambda *a: torch.utils.checkpoint.checkpoint(fn, *a, use_reentrant=False),
    ):
        leaves = [t.clone().requires_grad_(slopes_grad or n != "slopes") for n, t in given.items()]
        call(*leaves).backward(grad_out)
        for leaf, name in zip(leaves, given, strict=True):
            if leaf.requires_grad:
                torch.testing.assert_close(leaf.grad, eager[name], rtol=0, atol=0)
            else:
                assert leaf.grad is None
    torch._dynamo.reset()


FUNCTION_SPEC = """attention f
dims B, H, M, N, D
in q[B, H, M, D]
in k[B, H, N, D]
in v[B, H, N, D]
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] / sqrt(D)
s = s + {term}
mask m >= n
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""
# each function of the scores, in its domain and away from its kinks
FUNCTION_TERMS = {
    "exp": "exp(s * 0.5)",
    "log": "log(abs(s) + 0.5)",
    "sqrt": "sqrt(abs(s) + 0.5)",
    "tanh": "tanh(s)",
    "sin": "sin(s)",
    "cos": "cos(s)",
    "tan": "tan(s * 0.3)",
    "sigmoid": "sigmoid(s)",
    "erf": "erf(s)",
    "floor": "floor(s * 2.0) * 0.1",
    "ceil": "ceil(s * 2.0) * 0.1",
    "pow": "pow(abs(s) + 0.5, 1.5) * 0.1",
    "abs": "abs(s)",
    "min": "min(s, 0.3)",
    "max": "max(s, -0.3)",
    "where": "where(s > 0.0, s * 0.5, s)",
}


@pytest.mark.parametrize("function", sorted(FUNCTION_TERMS))
def test_gradients_through_every_function(function: str) -> None:
    """Every built-in's derivative rendered into the backward kernel (a device helper's too)."""
    text = FUNCTION_SPEC.format(term=FUNCTION_TERMS[function])
    kernel = attncc.compile(text, schedule="fused")
    gen = torch.Generator().manual_seed(5)
    given = {n: torch.randn(1, 2, 19, 16, generator=gen).to(DEVICE) for n in ("q", "k", "v")}
    grad_out = torch.randn(1, 2, 19, 16, generator=gen).to(DEVICE)
    _, grads = run(kernel, given, grad_out)
    _, exact = reference_grads(text, given, grad_out)
    eager = eager_grads(text, given, grad_out, dtype=torch.float32)
    for tensor, grad in grads.items():
        verdict = compare_grad(
            grad.double().cpu().numpy(),
            exact[tensor].cpu().numpy(),
            [e.cpu().numpy() for e in eager[tensor]],
            "float32",
        )
        assert verdict.ok, (function, tensor, verdict)


def test_every_function_has_a_backward_case() -> None:
    from attncc.spec.functions import FUNCTION_NAMES

    assert set(FUNCTION_TERMS) == set(FUNCTION_NAMES)


def _causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    s = (q @ k.transpose(-1, -2)) * scale
    rows, keys = s.shape[-2:]
    s = s.masked_fill(torch.ones(rows, keys, dtype=torch.bool).tril().logical_not(), -torch.inf)
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ v, lse


def test_gradients_through_the_returned_log_sum_exp() -> None:
    """d lse / d s = P: a loss on the returned log-sum-exp adds P * dlse to dS (it was
    refused, and checked with a host synchronisation in every backward)."""
    kernel = compiled("causal", "fused")
    given = inputs("causal", torch.float32, m=29, n=29)
    gen = torch.Generator().manual_seed(8)
    grad_out = torch.randn(given["q"].shape, generator=gen).to(DEVICE)
    grad_lse = torch.randn(given["q"].shape[:-1], generator=gen).to(DEVICE)
    leaves = {name: t.clone().requires_grad_() for name, t in given.items()}
    out, lse = kernel(**leaves, return_lse=True)
    ((out * grad_out).sum() + (lse * grad_lse).sum()).backward()
    scale = 1 / given["q"].shape[-1] ** 0.5

    def reference(dtype: torch.dtype) -> dict[str, torch.Tensor]:
        ref = {n: t.detach().cpu().to(dtype).requires_grad_() for n, t in given.items()}
        o, lse_ref = _causal_attention(ref["q"], ref["k"], ref["v"], scale)
        loss = (o * grad_out.cpu().to(dtype)).sum() + (lse_ref * grad_lse.cpu().to(dtype)).sum()
        loss.backward()
        return {n: t.grad.double() for n, t in ref.items()}  # type: ignore[union-attr]

    exact, eager = reference(torch.float64), reference(torch.float32)
    for name, leaf in leaves.items():
        verdict = compare_grad(
            leaf.grad.double().cpu().numpy(),  # type: ignore[union-attr]
            exact[name].numpy(),
            eager[name].numpy(),
            "float32",
        )
        assert verdict.ok, (name, verdict)


def test_reduced_gradient_is_bounded_by_both_naive_softmax_backwards() -> None:
    """`attncc check examples/alibi.attn --backward --max-len 48`, fp32 trial B=2 H=3 M=16
    N=19 D=128: the kernel's dslopes (a sum over b, m and n) is off by 1.1e-4, as a plain fp32
    flash backward is (1.2e-4); autograd's eager evaluation was off by only 1.6e-6 (its dS
    rows sum to zero within rounding), which made the bound 1.5e-5 and failed the kernel."""
    from attncc.checking import check_backward

    results = check_backward(compiled("alibi", "fused"), trials=7, max_len=48, device=DEVICE)
    trial = results[6]
    assert trial.case.describe() == "B=2 H=3 M=16 N=19 D=128" and trial.case.dtype == torch.float32
    assert trial.ok, attncc.checking.grad_table([trial])


def test_reduced_gradient_floor_grows_with_its_terms() -> None:
    """`attncc check examples/alibi.attn --backward --max-len 48`, fp32 trial B=1 H=1 M=9 N=1
    D=96: one key per row, so the exact dslopes is 0 and autograd's eager one exactly 0
    (P = 1); the kernel's P = exp2(s - lse) is 1 within rounding and its dslopes, a sum of 9
    rows' terms, was off by 3.5e-5 against a one-term floor's 3.4e-5. The floor now grows as
    sqrt(9)."""
    from attncc.checking import check_backward

    (trial,) = check_backward(compiled("alibi", "fused"), trials=1, max_len=48, device=DEVICE)
    assert trial.case.describe() == "B=1 H=1 M=9 N=1 D=96" and trial.case.dtype == torch.float32
    if DEVICE == "cpu":  # the numbers above are the interpreter's
        assert trial.grads["slopes"].error > 1e-5  # above the one-term floor: the case is live
    assert trial.ok, attncc.checking.grad_table([trial])


SIDE_SPEC = """attention side
dims B, H, M, N, D{table_dims}
in q[B, H, M, D]
in k[B, H, N, D]
in v[B, H, N, D]
in side[{shape}]
in pos[B, N]: i32
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] / sqrt(D)
s = s + {term}
{mask}
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""
B, H, M, N = 2, 3, 21, 37
# (shape of side, its dims' sizes, the modification's term, a mask): every way a float side
# input's subscripts may read the scores' indices, each reduced over those they do not carry
SIDE_PATTERNS = {
    # a relative table gathered by the exact distance: a scatter-add along diagonals
    "relative_table": ("H, R", (H, M + N - 1), "side[h, m - n + N - 1]", ""),
    # T5's clamped distance under a causal mask (masked scores' buckets get nothing)
    "clamped_relative": ("H, R", (H, 9), "side[h, min(max(m - n, 0), R - 1)]", "mask m >= n"),
    # key padding as a float bias: summed over the rows, in the dkdv kernel
    "per_key": ("B, N", (B, N), "side[b, n]", ""),
    # a temperature per query (a bias per query would cancel in the softmax): summed over
    # the keys
    "per_query": ("B, H, M", (B, H, M), "s * side[b, h, m]", "mask m + N - M >= n"),
    # one [M, N] bias for every batch and head: summed over the batch programs
    "shared_over_heads": ("M, N", (M, N), "side[m, n]", ""),
    # a repeated index: the diagonal of a [N, N] table, per key
    "diagonal": ("N, N", (N, N), "side[n, n] * 0.5", ""),
    # gathered through an integer tensor (a position id per key)
    "gathered_by_tensor": ("B, P", (B, 11), "side[b, pos[b, n]]", ""),
    # two loads of one table in one modification, read by q's and k's positions
    "two_loads": ("H, N", (H, N), "side[h, min(m, N - 1)] * side[h, n]", ""),
}


def _side_case(pattern: str, dtype: torch.dtype) -> tuple[str, dict[str, torch.Tensor]]:
    shape, sizes, term, mask = SIDE_PATTERNS[pattern]
    table_dims = "".join(f", {d}" for d in ("R", "P") if d in shape)
    text = SIDE_SPEC.format(table_dims=table_dims, shape=shape, term=term, mask=mask)
    gen = torch.Generator().manual_seed(11)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen)

    given = {
        "q": randn(B, H, M, 16).to(DEVICE, dtype),
        "k": randn(B, H, N, 16).to(DEVICE, dtype),
        "v": randn(B, H, N, 16).to(DEVICE, dtype),
        "side": randn(*sizes).to(DEVICE),  # float32 beside low-precision q, k and v
        "pos": torch.randint(0, 11, (B, N), generator=gen).to(DEVICE, torch.int32),
    }
    return text, given


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pattern", sorted(SIDE_PATTERNS))
def test_side_input_gradient_is_reduced_over_the_indices_it_does_not_carry(
    pattern: str, dtype: torch.dtype
) -> None:
    """A float side input read by any subscripts of the scores' indices gets its gradient,
    each score's partial derivative added where its subscripts point (they were refused:
    only [B, H, M, N]-like and per-head reads had gradients)."""
    text, given = _side_case(pattern, dtype)
    kernel = attncc.compile(text, schedule="fused")
    grad_out = torch.randn(B, H, M, 16, generator=torch.Generator().manual_seed(2))
    grad_out = grad_out.to(DEVICE, dtype)
    _, grads = run(kernel, given, grad_out)
    _, exact = reference_grads(text, given, grad_out)
    eager = eager_grads(text, given, grad_out, dtype=dtype)
    terms = gradient_terms(text, given)
    assert set(grads) == {"q", "k", "v", "side"}
    assert float(exact["side"].abs().max()) > 0.1  # a live gradient, not a zero one
    _assert_within_rule(grads, exact, eager, terms, given, dtype, pattern)


WITHOUT_QK_SPEC = """attention ignored
dims B, H, M, N, D
in q[B, H, M, D]
in k[B, H, N, D]
in v[B, H, N, D]
in side[B, N]
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d]
s = {term}
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""


@pytest.mark.parametrize("term", ["0.5 + side[0, 0] * 0.0", "2.0 * side[b, n]"])
def test_gradients_of_scores_that_do_not_read_qk(term: str) -> None:
    """Scores that drop Q K^T (a constant, a key's value): q and k get zero gradients, v and
    the side input theirs; the backward recomputes them as a whole tile (as a scalar its
    reductions failed)."""
    text = WITHOUT_QK_SPEC.format(term=term)
    kernel = attncc.compile(text, schedule="fused")
    gen = torch.Generator().manual_seed(3)
    given = {n: torch.randn(2, 2, 70, 16, generator=gen).to(DEVICE) for n in ("q", "k", "v")}
    given["side"] = torch.randn(2, 70, generator=gen).to(DEVICE)
    grad_out = torch.randn(2, 2, 70, 16, generator=gen).to(DEVICE)
    _, grads = run(kernel, given, grad_out)
    assert torch.all(grads["q"] == 0) and torch.all(grads["k"] == 0)
    assert_matches_reference(text, torch.float32, given, grad_out, grads, {})


def test_relative_table_gradient_is_deterministic() -> None:
    text, given = _side_case("relative_table", torch.float32)
    kernel = attncc.compile(text, schedule="fused")
    grad_out = torch.randn(B, H, M, 16).to(DEVICE)
    _, first = run(kernel, given, grad_out)
    _, second = run(kernel, given, grad_out)
    assert torch.equal(first["side"], second["side"])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["causal", "gqa_causal", "bias"])
def test_gradients_written_in_the_inputs_dtype_match_the_float32_buffers(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """q, k and v buffers the kernels write in bf16 (each its input's whole gradient) give
    the gradients the float32 buffers and their conversion give, bit for bit; GQA's k and v
    (summed over a group) stay float32."""
    from attncc.runtime import autograd, gradients

    # both runs take the full path: a replayed backward (autograd._Repeat) keeps the
    # buffers' dtypes its recorded call chose
    monkeypatch.setattr(autograd._Repeat, "__call__", lambda *_: None)
    kernel = compiled(name, "fused")
    given = inputs(name, torch.bfloat16)
    grad_out = torch.randn(given["q"].shape, generator=torch.Generator().manual_seed(5))
    grad_out = grad_out.to(DEVICE, torch.bfloat16)
    written: list[tuple[str, bool]] = []
    original = gradients.Scatter.whole

    def noting(self: Any, operand: Any, inner: Any, kernel_groups: bool = False) -> bool:
        whole: bool = original(self, operand, inner, kernel_groups)
        if not kernel_groups:  # the buffers of the Triton backward, which this runs
            written.append((operand.tensor, whole))
        return whole

    monkeypatch.setattr(gradients.Scatter, "whole", noting)
    _, direct = run(kernel, given, grad_out)
    assert dict(written) == {"q": True, "k": name != "gqa_causal", "v": name != "gqa_causal"}
    monkeypatch.setattr(gradients.Scatter, "whole", lambda *_, **__: False)
    _, converted = run(kernel, given, grad_out)
    for tensor, grad in direct.items():
        assert grad.dtype == given[tensor].dtype
        assert torch.equal(grad, converted[tensor]), tensor


@pytest.mark.parametrize("keys_major", [True, False])
def test_full_document_pairs_run_without_masks_and_match_the_masked_path(
    keys_major: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Document masks: the (query tile, key tile) pairs the tile index lists as full, every
    score inside one document and below the diagonal, run without mask arithmetic in both
    kernels; both paths' gradients are within the rule of the float64 reference. In the
    interpreter, which runs every operation as written, they are the masked path's bit for
    bit; compiled, the two paths' arithmetic is scheduled (and contracted into FMAs) apart,
    so only the rule holds there. The last query tile is ragged (rows past the end)."""
    kernel = compiled("document_mask", "fused")
    given = inputs("document_mask", torch.float32, m=150, n=150)
    grad_out = torch.randn(given["q"].shape, generator=torch.Generator().manual_seed(3))
    grad_out = grad_out.to(DEVICE)
    tiles = (16, 16, 4, 1)
    config = {"dq_config": tiles, "dkdv_config": tiles, "dkdv_keys_major": keys_major}
    config["dq_atomic"] = False  # both kernels' full pairs (one pass: the dkdv kernel's)
    module = kernel._backward.module(DEVICE == "cpu")  # type: ignore[union-attr]
    live_tiles = module._live_tiles
    seen: list[torch.Tensor] = []
    monkeypatch.setattr(module, "_live_tiles", lambda *a: seen.append(live_tiles(*a)) or seen[-1])
    direct = run_configured(kernel, given, grad_out, config, {})
    assert len(seen) == 2 and all(bool((live == 2).any() & (live == 1).any()) for live in seen)
    # every listed pair as partial: the masks applied everywhere
    monkeypatch.setattr(module, "_live_tiles", lambda *a: live_tiles(*a).clamp(max=1))
    masked = run_configured(kernel, given, grad_out, config, {})
    if DEVICE == "cpu":
        assert all(torch.equal(direct[name], masked[name]) for name in direct)
    spec = example_path("document_mask")
    _, exact = reference_grads(spec, given, grad_out)
    eager = eager_grads(spec, given, grad_out, dtype=torch.float32)
    terms = gradient_terms(spec, given)
    for grads in (direct, masked):
        _assert_within_rule(grads, exact, eager, terms, given, torch.float32, "document_mask")


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("causal", torch.float32),
        ("gqa_causal", torch.float32),
        ("document_mask", torch.float32),
        ("softcap", torch.float32),
        ("causal", torch.bfloat16),
        ("alibi", torch.float32),  # learnable slopes: a side sum per row
        ("bias", torch.float32),  # a side partial per score
        ("relative_bias", torch.float32),
    ],
)
@pytest.mark.parametrize("keys_major", [True, False])
def test_one_pass_backward_adds_dq_atomically_within_the_rule(
    name: str, dtype: torch.dtype, keys_major: bool
) -> None:
    """``dq_atomic``: a delta kernel, then the dkdv kernel adding each tile's dS K to dq
    and each side gradient's row sums with atomics, and storing per-score side partials;
    every gradient within the rule of the float64 reference, dK and dV as the two-pass
    schedule gives them, bit for bit (the same kernel, the same order)."""
    kernel = compiled(name, "fused")
    given = inputs(name, dtype)
    gen = torch.Generator().manual_seed(11)
    grad_out = torch.randn(given["q"].shape, generator=gen).to(DEVICE, dtype)
    config: dict[str, Any] = {"dkdv_keys_major": keys_major}
    one_pass = run_configured(kernel, given, grad_out, {**config, "dq_atomic": True}, {})
    two_pass = run_configured(kernel, given, grad_out, config, {})
    assert torch.equal(one_pass["k"], two_pass["k"]) and torch.equal(one_pass["v"], two_pass["v"])
    assert_matches_reference(example_path(name), dtype, given, grad_out, one_pass, {})


def test_document_masks_take_one_pass_unless_determinism_is_asked_for() -> None:
    """The default schedule: one pass (dQ by atomics) for a spec whose tile index reads
    tables, two for the others; ``torch.use_deterministic_algorithms(True)`` gives two passes
    everywhere, whose gradients are bit-identical across runs."""
    one_pass = {
        name: compiled(name, "fused")._backward.one_pass()
        for name in ("document_mask", "causal", "sliding_window")
    }  # type: ignore[union-attr]
    assert one_pass == {"document_mask": True, "causal": False, "sliding_window": False}
    kernel = compiled("document_mask", "fused")
    given = inputs("document_mask", torch.float32, m=150, n=150)
    grad_out = torch.randn(given["q"].shape, generator=torch.Generator().manual_seed(5))
    grad_out = grad_out.to(DEVICE)
    default = run_configured(kernel, given, grad_out, {}, {})
    atomic = run_configured(kernel, given, grad_out, {"dq_atomic": True}, {})
    assert all(torch.equal(default[name], atomic[name]) for name in ("k", "v"))
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not kernel._backward.one_pass()  # type: ignore[union-attr]
        first = run_configured(kernel, given, grad_out, {}, {})
        second = run_configured(kernel, given, grad_out, {}, {})
    finally:
        torch.use_deterministic_algorithms(deterministic)
    two_pass = run_configured(kernel, given, grad_out, {"dq_atomic": False}, {})
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert all(torch.equal(first[name], two_pass[name]) for name in first)


@pytest.mark.parametrize("name", ["document_mask", "alibi", "bias", "gqa_causal"])
def test_a_repeated_backward_replays_its_recorded_launches(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first backward of a call geometry records its launches (the module's
    _backward_launch); the next replays them, with the gradients of the first bit for bit:
    one pass with live-tile maps (document mask), a side sum per row (ALiBi's slopes), a
    side partial per score (bias), kv heads summing their groups (GQA). Backward.run
    directly: kernels of one spec share its torch op, and so the first one's backward."""
    kernel = attncc.compile(example_path(name), schedule="fused")
    backward = kernel._backward
    assert not isinstance(backward, str)
    given = inputs(name, torch.float32)
    grad_out = torch.randn(given["q"].shape, generator=torch.Generator().manual_seed(2))
    grad_out = grad_out.to(DEVICE)
    first = run_configured(kernel, given, grad_out, {}, {})
    assert not backward.refusals and len(backward._plans) == 1, backward.refusals
    module = backward.module(DEVICE == "cpu")

    def refuse(*args: Any) -> None:
        raise AssertionError("a repeated geometry ran the launches again")

    monkeypatch.setattr(module, "_backward_launch", refuse)
    second = run_configured(kernel, given, grad_out, {}, {})
    assert all(torch.equal(first[n], second[n]) for n in first)


def test_another_geometry_records_a_plan_of_its_own() -> None:
    kernel = attncc.compile(example_path("causal"), schedule="fused")
    backward = kernel._backward
    assert not isinstance(backward, str)
    for m in (37, 37, 20):
        given = inputs("causal", torch.float32, m=m, n=m)
        grad_out = torch.randn(given["q"].shape, generator=torch.Generator().manual_seed(m))
        grads = run_configured(kernel, given, grad_out.to(DEVICE), {}, {})
        fresh = attncc.compile(example_path("causal"), schedule="fused")  # records: full path
        alone = run_configured(fresh, given, grad_out.to(DEVICE), {}, {})
        assert all(torch.equal(grads[n], alone[n]) for n in grads)
    assert len(backward._plans) == 2
