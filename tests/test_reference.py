"""The float64 reference against torch SDPA and against plain NumPy written out by hand.

Everything here runs on the CPU in float64, so agreement is to rounding (``TOL``).
"""

from __future__ import annotations

import tracemalloc
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attncc.reference import Reference, reference
from attncc.spec import load

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TOL = {"rtol": 1e-10, "atol": 1e-12}
PROPERTY = settings(max_examples=50, deadline=None)

lengths = st.sampled_from([1, 2, 3, 5, 7, 9, 16])  # 1, odd and even sequence lengths
head_dims = st.sampled_from([1, 8, 40, 96])


@cache
def example(name: str) -> Reference:
    return reference(EXAMPLES / f"{name}.attn")


def randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


def qkv(rng: np.random.Generator, b: int, h: int, m: int, n: int, d: int, kvh: int | None = None):
    kvh = h if kvh is None else kvh
    return randn(rng, b, h, m, d), randn(rng, b, kvh, n, d), randn(rng, b, kvh, n, d)


def sdpa(q, k, v, **kwargs) -> np.ndarray:
    tensors = [torch.from_numpy(x) for x in (q, k, v)]
    if isinstance(kwargs.get("attn_mask"), np.ndarray):
        kwargs["attn_mask"] = torch.from_numpy(kwargs["attn_mask"])
    return F.scaled_dot_product_attention(*tensors, **kwargs).numpy()


def masked_attention(scores: np.ndarray, visible: np.ndarray, v: np.ndarray):
    """Softmax over the last axis of the visible scores, then times v; plain NumPy.

    A row with no visible key gives output 0 and lse -inf.
    """
    visible = np.broadcast_to(visible, scores.shape)
    has_key = visible.any(axis=-1, keepdims=True)
    peak = np.where(visible, scores, -np.inf).max(axis=-1, keepdims=True)
    peak = np.where(has_key, peak, 0.0)
    weights = np.where(visible, np.exp(scores - peak), 0.0)
    total = weights.sum(axis=-1, keepdims=True)
    probs = weights / np.where(has_key, total, 1.0)
    lse = np.where(has_key, np.log(np.where(has_key, total, 1.0)) + peak, -np.inf)[..., 0]
    return probs @ v, lse


def plain_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    return q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])


def causal(m: int, n: int, offset: int = 0) -> np.ndarray:
    """Query i sees keys j <= i + offset."""
    return np.arange(m)[:, None] + offset >= np.arange(n)[None, :]


# ----------------------------------------------------------------------------- against SDPA


@pytest.mark.parametrize("name", ["fused", "naive"])
@pytest.mark.parametrize(("m", "n"), [(6, 6), (5, 9), (9, 3), (1, 7)])
def test_full_attention_matches_sdpa(name, m, n):
    q, k, v = qkv(np.random.default_rng(0), 2, 3, m, n, 16)
    np.testing.assert_allclose(example(name)(q, k, v), sdpa(q, k, v), **TOL)


def test_scale_param_overrides_default():
    q, k, v = qkv(np.random.default_rng(1), 1, 2, 4, 6, 8)
    got = example("fused")(q, k, v, scale=0.3)
    np.testing.assert_allclose(got, sdpa(q, k, v, scale=0.3), **TOL)


@pytest.mark.parametrize(("m", "n"), [(7, 7), (5, 9), (9, 5), (1, 4)])
def test_causal_top_left_matches_sdpa(m, n):
    q, k, v = qkv(np.random.default_rng(2), 2, 3, m, n, 16)
    got = example("causal")(q, k, v)
    np.testing.assert_allclose(got, sdpa(q, k, v, attn_mask=causal(m, n)), **TOL)
    if m == n:
        np.testing.assert_allclose(got, sdpa(q, k, v, is_causal=True), **TOL)


@pytest.mark.parametrize(("m", "n"), [(5, 9), (1, 8), (4, 4)])
def test_causal_bottom_right_matches_sdpa(m, n):
    q, k, v = qkv(np.random.default_rng(3), 2, 2, m, n, 24)
    got = example("causal_bottom_right")(q, k, v)
    np.testing.assert_allclose(got, sdpa(q, k, v, attn_mask=causal(m, n, n - m)), **TOL)


def test_causal_bottom_right_more_queries_than_keys():
    # The first m - n queries see no key: SDPA gives NaN there, the reference 0.
    m, n = 9, 4
    q, k, v = qkv(np.random.default_rng(4), 1, 2, m, n, 8)
    got, lse = example("causal_bottom_right")(q, k, v, return_lse=True)
    live = slice(m - n, None)
    want = sdpa(q, k, v, attn_mask=causal(m, n, n - m))
    np.testing.assert_allclose(got[:, :, live], want[:, :, live], **TOL)
    assert np.all(got[:, :, : m - n] == 0)
    assert np.all(lse[:, :, : m - n] == -np.inf)
    assert np.all(np.isfinite(lse[:, :, live]))


@pytest.mark.parametrize(("h", "kvh"), [(6, 2), (6, 3), (4, 4), (4, 1)])
@pytest.mark.parametrize(("m", "n"), [(5, 5), (3, 8)])
def test_gqa_matches_sdpa(h, kvh, m, n):
    q, k, v = qkv(np.random.default_rng(5), 2, h, m, n, 16, kvh=kvh)
    got = example("gqa_causal")(q, k, v)
    mask = causal(m, n)
    np.testing.assert_allclose(got, sdpa(q, k, v, attn_mask=mask, enable_gqa=True), **TOL)
    group = h // kvh
    k_rep, v_rep = (np.repeat(x, group, axis=1) for x in (k, v))
    np.testing.assert_allclose(got, sdpa(q, k_rep, v_rep, attn_mask=mask), **TOL)


@pytest.mark.parametrize(("m", "n"), [(6, 6), (3, 10)])
def test_additive_bias_matches_sdpa(m, n):
    rng = np.random.default_rng(6)
    q, k, v = qkv(rng, 2, 3, m, n, 16)
    bias = 2 * randn(rng, 2, 3, m, n)
    got = example("bias")(q, k, v, bias)
    np.testing.assert_allclose(got, sdpa(q, k, v, attn_mask=bias), **TOL)


# ----------------------------------------------------------------------------- against plain NumPy


@pytest.mark.parametrize("window", [1, 3, 1024])
def test_sliding_window(window):
    m = n = 11
    q, k, v = qkv(np.random.default_rng(7), 2, 2, m, n, 8)
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    visible = (i >= j) & (i - j < window)
    want, want_lse = masked_attention(plain_scores(q, k), visible, v)
    kwargs = {} if window == 1024 else {"window": window}  # 1024 is the spec's default
    got, lse = example("sliding_window")(q, k, v, return_lse=True, **kwargs)
    np.testing.assert_allclose(got, want, **TOL)
    np.testing.assert_allclose(lse, want_lse, **TOL)


def test_alibi():
    b, h, m, n, d = 2, 4, 7, 7, 16
    rng = np.random.default_rng(8)
    q, k, v = qkv(rng, b, h, m, n, d)
    slopes = 2.0 ** -np.arange(1, h + 1)
    distance = np.arange(m)[:, None] - np.arange(n)[None, :]
    scores = plain_scores(q, k) - slopes[:, None, None] * distance
    want, want_lse = masked_attention(scores, causal(m, n), v)
    got, lse = example("alibi")(q, k, v, slopes, return_lse=True)
    np.testing.assert_allclose(got, want, **TOL)
    np.testing.assert_allclose(lse, want_lse, **TOL)


@pytest.mark.parametrize("cap", [None, 0.5, 2.0])
def test_softcap(cap):
    m, n = 6, 9
    q, k, v = qkv(np.random.default_rng(9), 2, 2, m, n, 8)
    q *= 4  # large scores, so that the cap bites
    effective = 30.0 if cap is None else cap
    scores = effective * np.tanh(plain_scores(q, k) / effective)
    want, _ = masked_attention(scores, causal(m, n), v)
    kwargs = {} if cap is None else {"cap": cap}
    np.testing.assert_allclose(example("softcap")(q, k, v, **kwargs), want, **TOL)


def test_document_mask():
    b, h, n, d = 2, 2, 12, 8
    rng = np.random.default_rng(10)
    q, k, v = qkv(rng, b, h, n, n, d)
    doc = np.sort(rng.integers(0, 4, size=(b, n)), axis=1).astype(np.int32)
    same_doc = doc[:, None, :, None] == doc[:, None, None, :]
    want, want_lse = masked_attention(plain_scores(q, k), same_doc & causal(n, n), v)
    got, lse = example("document_mask")(q, k, v, doc, return_lse=True)
    np.testing.assert_allclose(got, want, **TOL)
    np.testing.assert_allclose(lse, want_lse, **TOL)


@pytest.mark.parametrize("prefix", [0, 3, 64])
def test_prefix_lm(prefix):
    m, n = 8, 8
    q, k, v = qkv(np.random.default_rng(11), 1, 3, m, n, 8)
    visible = (np.arange(n)[None, :] < prefix) | causal(m, n)
    want, _ = masked_attention(plain_scores(q, k), visible, v)
    kwargs = {} if prefix == 64 else {"prefix": prefix}  # 64 is the spec's default
    np.testing.assert_allclose(example("prefix_lm")(q, k, v, **kwargs), want, **TOL)
    if prefix >= n:
        np.testing.assert_allclose(want, sdpa(q, k, v), **TOL)


def plain_decode(q, k, v, cache_len):
    """One query per sequence, token-major cache [B, N, KVH, D]; loops, as plainly as possible."""
    b_size, h_size, d = q.shape
    kvh = k.shape[2]
    out = np.zeros_like(q)
    lse = np.full((b_size, h_size), -np.inf)
    for b in range(b_size):
        for h in range(h_size):
            g = h // (h_size // kvh)
            length = cache_len[b]
            if length == 0:
                continue
            scores = k[b, :length, g, :] @ q[b, h] / np.sqrt(d)
            weights = np.exp(scores - scores.max())
            out[b, h] = weights @ v[b, :length, g, :] / weights.sum()
            lse[b, h] = np.log(weights.sum()) + scores.max()
    return out, lse


@pytest.mark.parametrize(("h", "kvh"), [(8, 2), (4, 4), (3, 1)])
def test_decode_with_cache_lengths(h, kvh):
    b, n, d = 4, 10, 16
    rng = np.random.default_rng(12)
    q = randn(rng, b, h, d)
    k, v = randn(rng, b, n, kvh, d), randn(rng, b, n, kvh, d)
    cache_len = np.array([0, 1, 7, n], dtype=np.int32)
    got, lse = example("decode")(q, k, v, cache_len, return_lse=True)
    want, want_lse = plain_decode(q, k, v, cache_len)
    np.testing.assert_allclose(got, want, **TOL)
    np.testing.assert_allclose(lse, want_lse, **TOL)
    assert lse.shape == (b, h)
    assert np.all(got[0] == 0) and np.all(lse[0] == -np.inf)


# ----------------------------------------------------------------------------- masking and lse


def test_fully_masked_rows_give_zero_and_minus_inf():
    spec = """
attention nothing_visible
dims B, H, M, N, D
in q[B, H, M, D]
in k[B, H, N, D]
in v[B, H, N, D]
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d]
mask n < 0
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""
    q, k, v = qkv(np.random.default_rng(13), 2, 2, 3, 5, 4)
    out, lse = reference(spec)(q, k, v, return_lse=True)
    assert out.shape == (2, 2, 3, 4) and lse.shape == (2, 2, 3)
    assert np.all(out == 0) and not np.isnan(out).any()
    assert np.all(lse == -np.inf)


@pytest.mark.parametrize(
    ("name", "m", "n", "extra"),
    [
        ("causal", 6, 6, {}),
        ("causal_bottom_right", 7, 4, {}),  # 3 fully masked rows
        ("sliding_window", 9, 9, {"window": 2}),
        ("fused", 3, 8, {}),
    ],
)
def test_lse_matches_torch_logsumexp(name, m, n, extra):
    q, k, v = qkv(np.random.default_rng(14), 2, 3, m, n, 8)
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    visible = {
        "causal": i >= j,
        "causal_bottom_right": i + n - m >= j,
        "sliding_window": (i >= j) & (i - j < extra.get("window", 0)),
        "fused": np.ones((m, n), dtype=bool),
    }[name]
    tq, tk = torch.from_numpy(q), torch.from_numpy(k)
    scores = tq @ tk.transpose(-1, -2) / np.sqrt(q.shape[-1])
    scores = scores.masked_fill(~torch.from_numpy(visible), -torch.inf)
    _, lse = example(name)(q, k, v, return_lse=True, **extra)
    np.testing.assert_allclose(lse, torch.logsumexp(scores, dim=-1).numpy(), **TOL)


# ----------------------------------------------------------------------------- properties


@PROPERTY
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 3),
    m=lengths,
    n=lengths,
    d=head_dims,
    seed=st.integers(0, 2**32 - 1),
)
def test_property_bottom_right_causal_matches_sdpa(b, h, m, n, d, seed):
    q, k, v = qkv(np.random.default_rng(seed), b, h, m, n, d)
    got, lse = example("causal_bottom_right")(q, k, v, return_lse=True)
    assert got.shape == (b, h, m, d) and lse.shape == (b, h, m)
    assert not np.isnan(got).any() and not np.isnan(lse).any()
    live = np.arange(m) + n - m >= 0  # queries that see at least key 0
    want = sdpa(q, k, v, attn_mask=causal(m, n, n - m))
    np.testing.assert_allclose(got[:, :, live], want[:, :, live], **TOL)
    assert np.all(got[:, :, ~live] == 0) and np.all(lse[:, :, ~live] == -np.inf)


@PROPERTY
@given(
    kvh=st.integers(1, 3),
    group=st.integers(1, 3),
    m=lengths,
    n=lengths,
    d=head_dims,
    seed=st.integers(0, 2**32 - 1),
)
def test_property_gqa_matches_sdpa(kvh, group, m, n, d, seed):
    q, k, v = qkv(np.random.default_rng(seed), 1, kvh * group, m, n, d, kvh=kvh)
    got = example("gqa_causal")(q, k, v)
    want = sdpa(q, k, v, attn_mask=causal(m, n), enable_gqa=True)
    np.testing.assert_allclose(got, want, **TOL)


@PROPERTY
@given(
    m=lengths,
    n=lengths,
    d=head_dims,
    window=st.integers(1, 20),
    prefix=st.integers(0, 20),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_masks_match_plain_numpy(m, n, d, window, prefix, seed):
    q, k, v = qkv(np.random.default_rng(seed), 1, 2, m, n, d)
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    for name, visible, extra in [
        ("sliding_window", (i >= j) & (i - j < window), {"window": window}),
        ("prefix_lm", (j < prefix) | (i >= j), {"prefix": prefix}),
    ]:
        want, want_lse = masked_attention(plain_scores(q, k), visible, v)
        got, lse = example(name)(q, k, v, return_lse=True, **extra)
        np.testing.assert_allclose(got, want, **TOL)
        np.testing.assert_allclose(lse, want_lse, **TOL)


@PROPERTY
@given(
    b=st.integers(1, 3),
    kvh=st.integers(1, 2),
    group=st.integers(1, 4),
    n=lengths,
    d=head_dims,
    data=st.data(),
)
def test_property_decode_matches_plain_loops(b, kvh, group, n, d, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    h = kvh * group
    q, k, v = randn(rng, b, h, d), randn(rng, b, n, kvh, d), randn(rng, b, n, kvh, d)
    cache_len = np.array(data.draw(st.lists(st.integers(0, n), min_size=b, max_size=b)))
    got, lse = example("decode")(q, k, v, cache_len, return_lse=True)
    want, want_lse = plain_decode(q, k, v, cache_len)
    np.testing.assert_allclose(got, want, **TOL)
    np.testing.assert_allclose(lse, want_lse, **TOL)


# ----------------------------------------------------------------------------- semantics


INT_ARITHMETIC = """
attention int_arithmetic
dims N
in x[N]
o[n] = x[n] + 100 * ((n - 3) / 2) + (n - 3) % 2 + (n - 3) / 2.0
out o
"""


def test_integer_division_truncates_and_remainder_follows_dividend():
    x = randn(np.random.default_rng(15), 7)
    j = np.arange(7) - 3
    trunc_div = np.array([int(a / 2) for a in j])  # C: -3 / 2 == -1, not -2
    c_mod = np.array([int(np.fmod(a, 2)) for a in j])  # C: -3 % 2 == -1, not 1
    want = x + 100 * trunc_div + c_mod + j / 2.0
    np.testing.assert_allclose(reference(INT_ARITHMETIC)(x), want, **TOL)


def test_output_follows_left_hand_index_order():
    spec = (EXAMPLES / "fused.attn").read_text().replace("o[b, h, m, d] = p", "o[b, m, h, d] = p")
    q, k, v = qkv(np.random.default_rng(16), 2, 3, 4, 5, 8)
    got = reference(spec)(q, k, v)
    assert got.shape == (2, 4, 3, 8)
    np.testing.assert_allclose(got, example("fused")(q, k, v).transpose(0, 2, 1, 3), **TOL)


def test_products_are_contracted_without_materialising_every_index():
    # B*H*M*N*D float64 would be 64 MiB here; the scores and probabilities are 0.5 MiB each.
    q, k, v = qkv(np.random.default_rng(22), 1, 1, 256, 256, 128)
    f = example("causal")
    f(q, k, v)  # warm up lazily built state (parser, einsum paths)
    tracemalloc.start()
    try:
        f(q, k, v)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_accepts_text_path_checked_spec_and_torch_tensors():
    path = EXAMPLES / "gqa_causal.attn"
    q, k, v = qkv(np.random.default_rng(17), 1, 4, 5, 5, 8, kvh=2)
    want = example("gqa_causal")(q, k, v)
    for spec in (path, str(path), path.read_text(), load(path)):
        np.testing.assert_allclose(reference(spec)(q, k, v), want, **TOL)
    as_f32 = [torch.from_numpy(x).float() for x in (q, k, v)]
    np.testing.assert_allclose(
        example("gqa_causal")(*as_f32),
        example("gqa_causal")(*(t.double().numpy() for t in as_f32)),
        **TOL,
    )
    np.testing.assert_allclose(example("gqa_causal")(v=v, k=k, q=q), want, **TOL)
    np.testing.assert_allclose(example("gqa_causal")(q, k, v=v), want, **TOL)


# ----------------------------------------------------------------------------- input errors


def test_wrong_rank_names_the_input():
    q, k, v = qkv(np.random.default_rng(18), 1, 2, 3, 3, 4)
    with pytest.raises(ValueError, match=r"input 'k' has 3 dims.*k\[B, H, N, D\]"):
        example("causal")(q, k[0], v)


def test_disagreeing_sizes_name_the_input_and_expected_shape():
    q, k, v = qkv(np.random.default_rng(19), 1, 2, 3, 4, 8)
    with pytest.raises(ValueError, match=r"input 'k' .*\(1, 2, 4, 8\).*D is 8"):
        example("causal")(q, k[..., :5], v)
    with pytest.raises(ValueError, match=r"input 'v' .*N is 4"):
        example("causal")(q, k, v[:, :, :3])
    with pytest.raises(ValueError, match=r"input 'cache_len'"):
        example("decode")(q[:, :, 0], k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), [1, 2])


def test_heads_not_a_multiple_of_kv_heads_is_an_out_of_range_read_of_k():
    q, k, v = qkv(np.random.default_rng(20), 1, 4, 3, 3, 8, kvh=3)
    with pytest.raises(ValueError, match=r"'k' .*outside 0\.\.2"):
        example("gqa_causal")(q, k, v)


def test_bad_arguments():
    q, k, v = qkv(np.random.default_rng(21), 1, 2, 3, 3, 4)
    f = example("prefix_lm")
    with pytest.raises(TypeError, match="takes 3 inputs"):
        f(q, k, v, v)
    with pytest.raises(TypeError, match="missing input v"):
        f(q, k)
    with pytest.raises(TypeError, match="unknown argument 'window'"):
        f(q, k, v, window=3)
    with pytest.raises(TypeError, match="'k' given both"):
        f(q, k, v, k=k)
    with pytest.raises(TypeError, match="param 'prefix' is i32"):
        f(q, k, v, prefix=2.5)
    with pytest.raises(TypeError, match="param 'scale' is f32"):
        f(q, k, v, scale="0.5x")
    with pytest.raises(TypeError, match="input 'cache_len' is declared i32"):
        example("decode")(q[:, :, 0], k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), [1.0])
    with pytest.raises(ValueError, match="exactly one softmax"):
        reference(INT_ARITHMETIC)(q[0, 0, 0], return_lse=True)


def test_paged_view_reads_like_the_contiguous_cache() -> None:
    """``view kc[...] = k_pages[page_table[b, n / PAGE], n % PAGE, j, d]`` gathers pages."""
    rng = np.random.default_rng(7)
    batch, heads, kv_heads, pool, page, pages, dim = 2, 4, 2, 9, 3, 4, 8
    q = rng.standard_normal((batch, heads, dim))
    k_pages = rng.standard_normal((pool, page, kv_heads, dim))
    v_pages = rng.standard_normal((pool, page, kv_heads, dim))
    table = rng.integers(0, pool, (batch, pages)).astype(np.int32)
    lengths = np.array([5, 12], dtype=np.int32)
    paged = reference(EXAMPLES / "paged_decode.attn")(q, k_pages, v_pages, table, lengths)
    k = np.stack([np.concatenate([k_pages[p] for p in row]) for row in table])
    v = np.stack([np.concatenate([v_pages[p] for p in row]) for row in table])
    contiguous = reference(EXAMPLES / "decode.attn")(q, k, v, lengths)
    np.testing.assert_allclose(paged, contiguous, rtol=0, atol=1e-12)


def test_a_page_id_outside_the_pool_is_an_error() -> None:
    q = np.ones((1, 2, 4))
    pages = np.ones((2, 3, 1, 4))
    table = np.array([[0, 5]], dtype=np.int32)  # page 5 of a pool of 2
    with pytest.raises(ValueError, match="k_pages"):
        reference(EXAMPLES / "paged_decode.attn")(q, pages, pages, table, np.array([6], np.int32))


# ----------------------------------------------------------------------------- the naive model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_eager_float32_attention_is_within_the_rule(seed: int) -> None:
    """The rule's naive float32 model is eager PyTorch's math: its products accumulate in
    float32 as a float32 matmul does, so eager attention itself passes. (Contracted in float64
    and rounded once, the model missed float64 by 0.8-1.6e-5 where eager PyTorch, at scale
    7.42 and head dim 128, misses by 4-10e-5: past the rule's four times that.)"""
    from attncc.tolerance import compare

    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 6, n, 128, generator=gen) for n in (63, 79, 79))
    scale = 7.42
    spec = EXAMPLES / "fused.attn"
    exact = reference(spec)(q=q, k=k, v=v, scale=scale)
    naive = reference(spec, rounding="float32")(q=q, k=k, v=v, scale=scale)
    eager = torch.softmax((q @ k.transpose(-1, -2)) * scale, -1) @ v
    verdict = compare(eager.double().numpy(), exact, naive, "float32")
    assert verdict.ok, verdict
