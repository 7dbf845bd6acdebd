"""Property tests: every example, every schedule, against the float64 reference.

Hypothesis draws shapes (lengths 1, odd, M != N, a few lengths of 130-300 that cross several
key tiles and the causal diagonal; head dims that are and are not powers of two), memory
layouts, dtypes and params (windows, prefixes, scales, cache lengths including 0). The verdict
is ``attncc.tolerance``'s rule. The "fast" profile (default) keeps this to CI size on the CPU
interpreter; ``HYPOTHESIS_PROFILE=gpu`` draws many more cases.

Schedules: naive, fused and split-KV given explicitly, and "default" (fused, handing query
lengths up to 16 to split-KV at run time). An explicit split-KV kernel takes at most 128
(query head, query) rows per kv head, so its query lengths are shortened to fit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attncc
from attncc.checking import _known_dims as known_dims
from attncc.reference import reference

from ._properties import (
    DTYPES,
    HEAD_DIMS,
    LONG,
    SHORT,
    assert_matches,
    make_inputs,
    params_for,
    sizes_for,
)
from ._support import (
    ALL_SCHEDULES,
    DEVICE,
    EXAMPLES,
    LAYOUTS,
    SCHEDULES,
    compiled,
    evaluate,
    example_path,
)

# Triton 3.6's interpreter calls int() on one-element arrays (deprecated since NumPy 1.25)
# thousands of times per test; the warning is Triton's, not attncc's.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


def runs(name: str, schedule: str) -> bool:
    """Whether the example compiles for the schedule (a softmax sink runs fused only: the
    refusal is tests/kernels/test_sinks.py's)."""
    try:
        attncc.optimise(example_path(name), None if schedule == "default" else schedule)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


EXAMPLE_SCHEDULES = [(e, s) for e in EXAMPLES for s in ALL_SCHEDULES if runs(e, s)]


@pytest.mark.parametrize(("name", "schedule"), EXAMPLE_SCHEDULES)
@given(data=st.data())
def test_matches_reference(name: str, schedule: str, data: st.DataObject) -> None:
    kernel = compiled(name, schedule)
    sizes = data.draw(sizes_for(kernel.ir, SHORT), label="sizes")
    params = data.draw(params_for(kernel, sizes), label="params")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    layout = data.draw(st.sampled_from(LAYOUTS), label="layout")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    assert_matches(kernel, sizes, params, dtype, layout, seed)


@pytest.mark.parametrize(("name", "schedule"), EXAMPLE_SCHEDULES)
@settings(max_examples=max(2, settings.default.max_examples // 3))
@given(data=st.data())
def test_long_sequences_cross_tiles(name: str, schedule: str, data: st.DataObject) -> None:
    """Several 64-key tiles: the mask-free band, the diagonal, window starts and ragged ends."""
    kernel = compiled(name, schedule)
    sizes = data.draw(sizes_for(kernel.ir, LONG), label="sizes")
    tables = set(kernel.ir.dims) - known_dims(kernel.ir)  # sized to the lengths' reads
    for dim in kernel.ir.dims:  # keep the work small: one batch entry, few heads
        if dim not in (kernel.ir.key_axis.dim, kernel.ir.head_axis.dim, *tables) and (
            kernel.ir.query_axis is None or dim != kernel.ir.query_axis.dim
        ):
            sizes[dim] = min(sizes[dim], 2 if kernel.ir.group else 1)
    if kernel.ir.group is not None:
        sizes[kernel.ir.group.kv_dim] = 1
    sizes[kernel.ir.head_axis.dim] = data.draw(st.sampled_from((16, 40)), label="head dim")
    params = data.draw(params_for(kernel, sizes), label="params")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    layout = data.draw(st.sampled_from(LAYOUTS), label="layout")
    assert_matches(kernel, sizes, params, dtype, layout, seed=7)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_head_dims(head_dim: int, schedule: str) -> None:
    """Every head dim, padded or not, on a shape that crosses the diagonal of two key tiles."""
    kernel = compiled("causal", schedule)
    sizes = {"B": 1, "H": 2, "M": 70, "N": 77, "D": head_dim}
    assert_matches(kernel, sizes, {}, torch.float16, "strided", seed=head_dim)


# --------------------------------------------------------------------- params and masked rows


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("window", [1, 2, 5, 64, 65, 129, 10**6])
def test_sliding_window_sizes(window: int, schedule: str) -> None:
    kernel = compiled("sliding_window", schedule)
    sizes = {"B": 1, "H": 1, "M": 150, "N": 150, "D": 16}
    assert_matches(kernel, sizes, {"window": window}, torch.float32, "contiguous", seed=window)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("prefix", [-5, 0, 1, 40, 64, 100, 149, 150, 500])
def test_prefix_sizes(prefix: int, schedule: str) -> None:
    kernel = compiled("prefix_lm", schedule)
    sizes = {"B": 1, "H": 1, "M": 150, "N": 150, "D": 16}
    assert_matches(kernel, sizes, {"prefix": prefix}, torch.float32, "permuted", seed=prefix)


@pytest.mark.parametrize(
    ("sizes", "scale", "seed"),
    [
        ({"B": 1, "H": 2, "M": 576, "N": 228, "D": 192}, 0.1153734815160333, 375799),
        ({"B": 2, "H": 1, "M": 1298, "N": 255, "D": 192}, 0.05177776744019034, 388026541),
    ],
)
def test_float32_lse_in_the_thousands(sizes: dict[str, int], scale: float, seed: int) -> None:
    """ALiBi rows far below the keys put lse at -969 and 3218 (draws of
    tests/gpu/test_gpu_properties.py): the kernel's lse within the rule in float32, as
    PyTorch's logsumexp (the sum and change of base at the end were two float32 roundings at
    that magnitude: 1.01-1.1x the rule's bound)."""
    kernel = compiled("alibi", "fused")
    assert_matches(kernel, sizes, {"scale": scale}, torch.float32, "contiguous", seed)


@pytest.mark.parametrize("schedule", ALL_SCHEDULES)
@pytest.mark.parametrize("mask", ["not (0 == 0)", "not (0 == 1)", "not (m < n)"])
def test_negated_masks(mask: str, schedule: str, tmp_path: Path) -> None:
    """``not`` of a comparison of constants (a draw of tests/spec/test_grammar_fuzz.py) is a
    Python bool where the Triton kernel is traced: rendered as ``~``, ``not (0 == 0)`` was
    ~True = -2, which tl.where took as true, so it masked nothing."""
    path = tmp_path / "negated.attn"
    path.write_text(
        "attention negated\ndims B, H, M, N, D\nin q[B, H, M, D]\nin k[B, H, N, D]\n"
        "in v[B, H, N, D]\ns[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d]\n"
        f"mask {mask}\np = softmax(s, n)\no[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]\nout o\n"
    )
    chosen = None if schedule == "default" else schedule
    kernel = attncc.compile(path, target="triton", schedule=chosen)  # type: ignore[arg-type]
    sizes = {"B": 2, "H": 2, "M": 40, "N": 150, "D": 16}
    assert_matches(kernel, sizes, {}, torch.float16, "contiguous", seed=3)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_float32_at_large_scores(layout: str) -> None:
    """float32 at scale 7.42 and head dim 128 (a draw of ``attncc check`` of a spec with a
    scale param): the kernel misses float64 as eager PyTorch does (its products accumulate in
    float32, attncc.reference._contraction_type), within the rule."""
    kernel = compiled("fused", "fused")
    sizes = {"B": 1, "H": 6, "M": 63, "N": 79, "D": 128}
    assert_matches(kernel, sizes, {"scale": 7.42}, torch.float32, layout, seed=0)


@pytest.mark.parametrize(
    ("name", "sizes", "params"),
    [
        ("decode_window", {"B": 1, "H": 2, "KVH": 1, "N": 1, "D": 16}, {"window": 1}),
        ("softcap", {"B": 2, "H": 2, "M": 1, "N": 1, "D": 16}, {}),
    ],
)
def test_fixed_reference_rows_of_one_key(
    name: str, sizes: dict[str, int], params: dict[str, int]
) -> None:
    """Every row sees one key, so the exact output is that key's value and PyTorch's bfloat16
    softmax gets it exactly (a draw of the property tests). Under the fixed softmax reference
    (soft-capped scores) the weight is not 1: the output divides by the sum of the weights as
    P V rounds them, the lse takes the unrounded sum."""
    kernel = compiled(name, "fused")
    assert_matches(kernel, sizes, params, torch.bfloat16, "contiguous", seed=0)


# score modifications that do not read the score: the tile a constant, a row's or a key's value
SCORES_WITHOUT_QK = {
    "constant": ("", "s = 0.5"),
    "row": ("in rb[B, H, M]\n", "s = rb[b, h, m]"),
    "key": ("in kb[B, H, N]\n", "s = 2.0 * kb[b, h, n]"),
}


@pytest.mark.parametrize("schedule", ALL_SCHEDULES)
@pytest.mark.parametrize("scores", sorted(SCORES_WITHOUT_QK))
def test_scores_that_do_not_read_qk(scores: str, schedule: str, tmp_path: Path) -> None:
    """``s = 0.5`` after the product drops Q K^T (a draw of tests/spec/test_grammar_fuzz.py):
    the Triton kernels take such a score as a whole tile, not the scalar, row or key vector
    it is as an expression (their row reductions and P V failed on those)."""
    side, mod = SCORES_WITHOUT_QK[scores]
    path = tmp_path / "ignored.attn"
    path.write_text(
        "attention ignored\ndims B, H, M, N, D\nin q[B, H, M, D]\nin k[B, H, N, D]\n"
        f"in v[B, H, N, D]\n{side}s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d]\n{mod}\n"
        "p = softmax(s, n)\no[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]\nout o\n"
    )
    chosen = None if schedule == "default" else schedule
    kernel = attncc.compile(path, target="triton", schedule=chosen)  # type: ignore[arg-type]
    sizes = {"B": 2, "H": 2, "M": 70, "N": 150, "D": 16}  # a key tile past the first
    assert_matches(kernel, sizes, {}, torch.bfloat16, "contiguous", seed=len(scores))


def test_prefix_changes_the_result() -> None:
    """The default prefix (64) is really used and a given one really overrides it."""
    kernel = compiled("prefix_lm", "fused")
    sizes = {"B": 1, "H": 1, "M": 90, "N": 90, "D": 16}
    inputs = make_inputs(kernel.ir, sizes, torch.float32, "contiguous", seed=3)
    default = kernel(**inputs)
    assert torch.equal(default, kernel(**inputs, prefix=64))
    assert not torch.allclose(default, kernel(**inputs, prefix=1))


def assert_masked_rows(out: torch.Tensor, lse: torch.Tensor, masked: torch.Tensor) -> None:
    """Rows that see no key give exactly 0 and lse -inf; the others finite lse."""
    assert masked.any() and (~masked).any(), "the case must mix masked and visible rows"
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.all(out[masked] == 0)
    assert torch.all(lse[masked] == float("-inf"))
    assert torch.isfinite(lse[~masked]).all()


@pytest.mark.parametrize("schedule", ALL_SCHEDULES)
@pytest.mark.parametrize(("m", "n"), [(9, 4), (70, 3), (128, 66), (5, 1)])
def test_bottom_right_rows_before_the_keys_are_empty(m: int, n: int, schedule: str) -> None:
    """With M > N the first M - N queries see no key (split-KV: GQA-free, so M <= 128)."""
    kernel = compiled("causal_bottom_right", schedule)
    sizes = {"B": 2, "H": 1, "M": m, "N": n, "D": 40}
    out, lse = assert_matches(kernel, sizes, {}, torch.float16, "swapped", seed=m * n)
    masked = torch.zeros(m, dtype=torch.bool)
    masked[: m - n] = True
    assert_masked_rows(out.cpu(), lse.cpu(), masked[None, None, :].expand(2, 1, m))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("n", [1, 63, 130])
def test_decode_with_empty_cache(n: int, schedule: str) -> None:
    kernel = compiled("decode", schedule)
    sizes = {"B": 4, "H": 4, "KVH": 2, "N": n, "D": 64}
    inputs = make_inputs(kernel.ir, sizes, torch.bfloat16, "strided", seed=n, zero_lengths=True)
    inputs["cache_len"][1::2] = torch.tensor([n, max(1, n // 2)], dtype=torch.int32)
    out_v, lse_v, out, lse = evaluate(kernel, inputs, {}, torch.bfloat16)
    assert out_v.ok and lse_v.ok, (out_v, lse_v)
    masked = (inputs["cache_len"].cpu() == 0)[:, None].expand(4, 4)
    assert_masked_rows(out.cpu().float(), lse.cpu(), masked)


@pytest.mark.parametrize("schedule", SCHEDULES)
@given(data=st.data())
def test_decode_cache_lengths(schedule: str, data: st.DataObject) -> None:
    kernel = compiled("decode", schedule)
    sizes = data.draw(sizes_for(kernel.ir, st.one_of(SHORT, LONG)), label="sizes")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    zero = data.draw(st.booleans(), label="zero lengths")
    assert_matches(kernel, sizes, {}, dtype, "permuted", seed=5, zero_lengths=zero)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("window", [0, -3])
def test_empty_window_masks_every_row(window: int, schedule: str) -> None:
    """``m - n < window`` with window <= 0 and ``m >= n`` leaves nothing: all rows empty."""
    kernel = compiled("sliding_window", schedule)
    sizes = {"B": 1, "H": 2, "M": 70, "N": 70, "D": 16}
    out, lse = assert_matches(kernel, sizes, {"window": window}, torch.float32, "strided", seed=1)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_window_of_one_sees_only_the_diagonal(schedule: str) -> None:
    kernel = compiled("sliding_window", schedule)
    sizes = {"B": 1, "H": 1, "M": 80, "N": 80, "D": 16}
    inputs = make_inputs(kernel.ir, sizes, torch.float32, "contiguous", seed=2)
    out = kernel(**inputs, window=1)
    torch.testing.assert_close(out, inputs["v"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_documents_are_isolated(schedule: str) -> None:
    """Changing one document's keys and values leaves every other document's rows unchanged."""
    kernel = compiled("document_mask", schedule)
    sizes = {"B": 1, "H": 2, "N": 100, "D": 16}
    inputs = make_inputs(kernel.ir, sizes, torch.float32, "contiguous", seed=4)
    doc = torch.zeros(1, 100, dtype=torch.int32)
    doc[0, 30:] = 1
    doc[0, 70:] = 2
    inputs["doc"] = doc
    before = kernel(**inputs)
    changed = dict(inputs)
    changed["k"] = inputs["k"].clone()
    changed["v"] = inputs["v"].clone()
    gen = torch.Generator().manual_seed(5)
    changed["k"][..., 30:70, :] = torch.randn(1, 2, 40, 16, generator=gen)
    changed["v"][..., 30:70, :] = torch.randn(1, 2, 40, 16, generator=gen)
    after = kernel(**changed)
    outside = (doc[0] != 1).nonzero().flatten()
    assert torch.equal(before[..., outside, :], after[..., outside, :])
    assert not torch.allclose(before[..., 30:70, :], after[..., 30:70, :])


def test_every_example_is_covered() -> None:
    assert len(EXAMPLES) >= 12
    assert {"causal", "decode", "document_mask", "sliding_window"} <= set(EXAMPLES)
    assert np.unique(EXAMPLES).size == len(EXAMPLES)


def two_equal_keys(seed: int) -> dict[str, torch.Tensor]:
    """Both keys score the same, so p = [1/2, 1/2] exactly and o = (v0 + v1) / 2 is exact in
    float32: the only rounding left is the final cast to bfloat16."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 1, 64, generator=gen).bfloat16()
    k = torch.randn(1, 1, 1, 64, generator=gen).bfloat16().expand(1, 1, 2, 64).contiguous()
    v = torch.randn(1, 1, 2, 64, generator=gen).bfloat16()
    return {"q": q, "k": k, "v": v}


def nearest_bf16_mean(v: torch.Tensor) -> torch.Tensor:
    return ((v[..., 0, :].float() + v[..., 1, :].float()) / 2).bfloat16()[..., None, :]


@pytest.mark.skipif(DEVICE != "cpu", reason="the Triton interpreter only")
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_bf16_outputs_round_to_nearest(schedule: str) -> None:
    inputs = two_equal_keys(11)
    out = compiled("naive", schedule)(**inputs)
    assert torch.equal(out, nearest_bf16_mean(inputs["v"]))


# ------------------------------------------------------------- masks the examples do not use

CAUSAL_TEXT = example_path("causal").read_text()
MASK_VARIANTS = {
    "flipped": ("n <= m", ""),
    "strict": ("n < m", ""),
    "diagonal": ("n == m", ""),
    "off the diagonal": ("n != m", ""),
    "anti-causal": ("n >= m", ""),
    "band": ("m - n < w and n - m < w", "param w: i32 = 40\n"),
    "late keys or diagonal": ("n >= m or n >= w", "param w: i32 = 100\n"),
    "opposite slopes": ("n <= m or n < M - m", ""),
    "negated key": ("-n >= -m + 3", ""),
    "halved key": ("n / 2 <= m", ""),
    "per head": ("n <= h * 37 + m", ""),
    "interval or causal": ("(n < 90 and n >= 70) or m >= n", ""),
    "float comparison": ("m - n < 2.5", ""),
    "not": ("not (n > m + 5)", ""),
}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("variant", sorted(MASK_VARIANTS))
def test_other_masks(variant: str, schedule: str) -> None:
    """Bounds with slope -1, lower bounds from ``or``, per-head bounds, residual-only masks."""
    mask, params = MASK_VARIANTS[variant]
    text = CAUSAL_TEXT.replace("mask m >= n\n", f"mask {mask}\n")
    text = text.replace("param scale", f"{params}param scale")
    kernel = attncc.compile(text, schedule=schedule)
    for m, n in ((150, 150), (70, 190)):
        sizes = {"B": 1, "H": 3, "M": m, "N": n, "D": 16}
        assert_matches(kernel, sizes, {}, torch.float32, "contiguous", seed=m + n)


# ------------------------------------------------------------------------- degenerate inputs


@pytest.mark.parametrize("schedule", ALL_SCHEDULES)
@pytest.mark.parametrize("shape", [(1, 2, 0, 5), (1, 2, 5, 0), (0, 2, 5, 5), (1, 0, 5, 5)], ids=str)
def test_empty_dims(shape: tuple[int, int, int, int], schedule: str) -> None:
    """No queries, no keys (rows see nothing: 0 and -inf), no batch, no heads."""
    kernel = compiled("causal", schedule)
    b, h, m, n = shape
    sizes = {"B": b, "H": h, "M": m, "N": n, "D": 16}
    inputs = make_inputs(kernel.ir, sizes, torch.float32, "contiguous", seed=sum(shape))
    out, lse = kernel(**inputs, return_lse=True)
    exact_out, exact_lse = reference(kernel.spec)(**inputs, return_lse=True)
    assert out.shape == exact_out.shape == (b, h, m, 16) and lse.shape == (b, h, m)
    assert np.array_equal(out.cpu().numpy(), exact_out)
    assert np.array_equal(lse.cpu().numpy(), exact_lse)


@pytest.mark.parametrize("schedule", ALL_SCHEDULES)
def test_strided_integer_inputs(schedule: str) -> None:
    """Ids and lengths are read through their strides too."""
    gen = torch.Generator().manual_seed(8)
    decode = compiled("decode", schedule)
    q, k, v = (torch.randn(s, generator=gen) for s in ((4, 4, 16), (4, 30, 2, 16), (4, 30, 2, 16)))
    lengths = torch.tensor([3, 99, 0, 99, 30, 99, 7, 99], dtype=torch.int32)[::2]
    out_v, lse_v, _, _ = evaluate(
        decode, {"q": q, "k": k, "v": v, "cache_len": lengths}, {}, q.dtype
    )
    assert out_v.ok and lse_v.ok, (out_v, lse_v)
    documents = compiled("document_mask", schedule)
    x = torch.randn(2, 2, 30, 16, generator=gen)
    ids = torch.randint(0, 4, (2, 60), generator=gen, dtype=torch.int32).sort(-1).values[:, ::2]
    assert not ids.is_contiguous()
    out_v, lse_v, _, _ = evaluate(
        documents, {"q": x, "k": x, "v": x.flip(-1), "doc": ids}, {}, x.dtype
    )
    assert out_v.ok and lse_v.ok, (out_v, lse_v)


@pytest.mark.parametrize("schedule", ALL_SCHEDULES)
def test_cache_lengths_outside_the_cache(schedule: str) -> None:
    """Negative lengths see nothing; lengths past N see the whole cache."""
    kernel = compiled("decode", schedule)
    sizes = {"B": 4, "H": 4, "KVH": 2, "N": 30, "D": 16}
    inputs = make_inputs(kernel.ir, sizes, torch.float16, "contiguous", seed=9)
    inputs["cache_len"] = torch.tensor([-3, 31, 1000, 29], dtype=torch.int32)
    out_v, lse_v, out, lse = evaluate(kernel, inputs, {}, torch.float16)
    assert out_v.ok and lse_v.ok, (out_v, lse_v)
    assert torch.all(lse[0] == float("-inf")) and torch.all(out[0] == 0)
