"""Paged KV caches: a view over a page pool gives what the contiguous cache gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attncc
from attncc.checking import check, table

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def paged_copy(
    cache: torch.Tensor, page: int, pool: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scatter a contiguous cache [B, N, KVH, D] into a shuffled pool of pages. The slots of
    the last page past N hold NaN, as unwritten cache memory may: no kernel may let them
    through (a zero probability times NaN is NaN)."""
    batch, length, kv_heads, dim = cache.shape
    pages = -(-length // page)
    order = torch.randperm(pool, generator=gen)[: batch * pages].reshape(batch, pages)
    pool_tensor = torch.randn(pool, page, kv_heads, dim, generator=gen).to(cache.dtype)
    padded = torch.full((batch, pages * page, kv_heads, dim), float("nan"), dtype=cache.dtype)
    padded[:, :length] = cache
    for b in range(batch):
        for p in range(pages):
            pool_tensor[order[b, p]] = padded[b, p * page : (p + 1) * page]
    return pool_tensor, order.to(torch.int32)


@pytest.mark.parametrize("schedule", [None, "fused", "naive"])
@pytest.mark.parametrize("page", [1, 3, 16])
def test_paged_cache_matches_contiguous_cache(schedule: str | None, page: int) -> None:
    gen = torch.Generator().manual_seed(page)
    batch, heads, kv_heads, length, dim = 3, 8, 2, 70, 64
    q = torch.randn(batch, heads, dim, generator=gen)
    k = torch.randn(batch, length, kv_heads, dim, generator=gen)
    v = torch.randn(batch, length, kv_heads, dim, generator=gen)
    lengths = torch.tensor([70, 0, 33], dtype=torch.int32)
    contiguous = attncc.compile(EXAMPLES / "decode.attn", schedule=schedule)
    paged = attncc.compile(EXAMPLES / "paged_decode.attn", schedule=schedule)
    pool = batch * (-(-length // page)) + 5
    k_pages, table_k = paged_copy(k, page, pool, gen)
    v_pages = torch.full_like(k_pages, float("nan"))  # unwritten slots: see paged_copy
    for b in range(batch):  # the values share the keys' page table
        for p in range(table_k.shape[1]):
            chunk = v[b, p * page : (p + 1) * page]
            v_pages[table_k[b, p], : chunk.shape[0]] = chunk
    # the contiguous spec reads N = the cache's length; the paged one NP * PAGE >= that
    expected, expected_lse = contiguous(q, k, v, lengths, return_lse=True)
    out, lse = paged(q, k_pages, v_pages, table_k, lengths, return_lse=True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, expected_lse, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # an empty cache gives 0


@pytest.mark.parametrize("schedule", [None, "fused", "naive"])
def test_cache_memory_past_the_lengths_never_reaches_the_output(schedule: str | None) -> None:
    """A preallocated cache holds garbage (here NaN) past each sequence's length: the fused
    kernel (TMA copies on the interpreter), split-KV (the default for one query) and naive
    give what the same cache with zeros there gives."""
    gen = torch.Generator().manual_seed(3)
    kernel = attncc.compile(EXAMPLES / "decode.attn", schedule=schedule)
    q = torch.randn(3, 8, 64, generator=gen)
    k, v = (torch.randn(3, 90, 2, 64, generator=gen) for _ in range(2))
    lengths = torch.tensor([90, 17, 64], dtype=torch.int32)
    past = torch.arange(90)[None, :] >= lengths[:, None]  # [B, N]: unwritten slots
    clean = [t.masked_fill(past[:, :, None, None], 0.0) for t in (k, v)]
    dirty = [t.masked_fill(past[:, :, None, None], float("nan")) for t in (k, v)]
    expected, expected_lse = kernel(q, *clean, lengths, return_lse=True)
    out, lse = kernel(q, *dirty, lengths, return_lse=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, expected_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("schedule", [None, "fused", "naive"])
def test_paged_decode_passes_check(schedule: str | None) -> None:
    kernel = attncc.compile(EXAMPLES / "paged_decode.attn", schedule=schedule)
    results = check(kernel, trials=6, seed=21, max_len=200)
    assert all(r.ok for r in results), table(results)


PAGED_WINDOW = (
    (EXAMPLES / "paged_decode.attn")
    .read_text()
    .replace("attention paged_decode", "attention paged_window")
    .replace("param scale", "param window: i32 = 37\nparam scale")
    .replace("mask n < cache_len[b]", "mask n < cache_len[b] and n >= cache_len[b] - window")
)


@pytest.mark.parametrize("schedule", [None, "fused"])
def test_paged_window_carries_page_entries_across_its_loops(schedule: str | None) -> None:
    """A window bounds the keys from below, so the kernels walk three loops (partial tiles,
    the mask-free band, partial tiles) and each starts with the page-table entries the one
    before prefetched: with windows and lengths off the tile grid, every loop's first tile
    reads the right pages."""
    assert "n >= cache_len[b] - window" in PAGED_WINDOW
    kernel = attncc.compile(PAGED_WINDOW, schedule=schedule)
    assert "the loop before loaded for its next" in kernel.source
    for window in (37, 1, 100):
        results = check(kernel, trials=4, seed=window, max_len=300, params={"window": window})
        assert all(r.ok for r in results), table(results)


def test_page_table_read_once_per_key_tile() -> None:
    # K and V of a tile share the page-table entries: one gathered load, named gather_0
    source = attncc.compile(EXAMPLES / "paged_decode.attn").source
    loop_bodies = source.split("for start_n in range(")[1:]
    assert loop_bodies
    for body in loop_bodies:
        body = body.split("m_i = m_new")[0]
        assert body.count("t_page_table +") == 1, body
        assert "gather_0" in body.split("k = tl.load(")[1].split("\n")[0]


def test_split_merge_leaves_arrival_counters_zero() -> None:
    # the last chunk to arrive merges and resets its counter: a second call must see zeros
    gen = torch.Generator().manual_seed(7)
    kernel = attncc.compile(EXAMPLES / "decode.attn")
    for length in (70, 33):
        q = torch.randn(2, 4, 32, generator=gen)
        k = torch.randn(2, length, 2, 32, generator=gen)
        v = torch.randn(2, length, 2, 32, generator=gen)
        lengths = torch.tensor([length, length - 5], dtype=torch.int32)
        out = kernel(q, k, v, lengths)
        scores = torch.einsum("bhd,bnhd->bhn", q, k.repeat_interleave(2, dim=2)) / 32**0.5
        keep = torch.arange(length)[None, None, :] < lengths[:, None, None]
        probs = scores.masked_fill(~keep, float("-inf")).softmax(-1)
        expected = torch.einsum("bhn,bnhd->bhd", probs, v.repeat_interleave(2, dim=2))
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        for buffers in kernel.module(interpreted=True)._ARRIVALS.values():
            assert all(int(b.abs().sum()) == 0 for b in buffers)


PAGED_DOCUMENTS = """\
# Prefill over a paged cache with document ids: the tile index's list loops read pages too.
attention paged_docs

dims  B, H, P, PAGE, NP, M, D
dims  N = NP * PAGE
in    q[B, H, M, D]
in    k_pages[P, PAGE, H, D]
in    v_pages[P, PAGE, H, D]
in    page_table[B, NP]: i32
in    qdoc[B, M]: i32
in    kdoc[B, N]: i32
param scale: f32 = 1 / sqrt(D)

view kc[b: B, n: N, h: H, d: D] = k_pages[page_table[b, n / PAGE], n % PAGE, h, d]
view vc[b: B, n: N, h: H, d: D] = v_pages[page_table[b, n / PAGE], n % PAGE, h, d]

s[b, h, m, n] = q[b, h, m, d] * kc[b, n, h, d] * scale
mask qdoc[b, m] == kdoc[b, n]
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * vc[b, n, h, d]
out o
"""


def test_paged_cache_with_a_tile_index() -> None:
    # the tile index's list loops visit key tiles out of order: they load page-table entries
    # per tile instead of prefetching the next consecutive tile's
    kernel = attncc.compile(PAGED_DOCUMENTS)
    assert kernel.ir.tile_index is not None
    results = check(kernel, trials=6, seed=3, max_len=120)
    assert all(r.ok for r in results), table(results)


@pytest.mark.parametrize("merge_floats", [64, 128, 8192])
def test_split_merge_takes_rows_in_steps(merge_floats: int) -> None:
    # 5 query heads on one kv head, 2 chunks of 32 value dims: the merge takes 1, 2 or all
    # rows a step (the last step partly past the rows)
    gen = torch.Generator().manual_seed(merge_floats)
    kernel = attncc.compile(EXAMPLES / "decode.attn")
    module = kernel.module(interpreted=True)
    q = torch.randn(1, 5, 32, generator=gen)
    k = torch.randn(1, 150, 1, 32, generator=gen)
    v = torch.randn(1, 150, 1, 32, generator=gen)
    lengths = torch.tensor([140], dtype=torch.int32)
    saved = module._MERGE_FLOATS
    module._MERGE_FLOATS = merge_floats
    try:
        out, lse = kernel(q, k, v, lengths, return_lse=True)
    finally:
        module._MERGE_FLOATS = saved
    scores = torch.einsum("bhd,bnd->bhn", q, k[:, :140, 0]) / 32**0.5
    expected = torch.einsum("bhn,bnd->bhd", scores.softmax(-1), v[:, :140, 0])
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lse, scores.logsumexp(-1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("page", "length", "loaded"), [(16, 300, True), (3, 200, True), (1, 1200, False)]
)
def test_split_chunks_read_their_page_entries(
    page: int, length: int, loaded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Split-KV programs take a tile's page-table entries from their chunk's, loaded once
    (PAGE_TABLE; chunks of 128 keys start inside pages of 3), or, for a chunk of more pages
    than _PAGE_TABLE_LIMIT (640 pages of one key), a tile ahead: both give the contiguous
    cache's results."""
    gen = torch.Generator().manual_seed(length)
    q = torch.randn(1, 2, 16, generator=gen)
    k, v = (torch.randn(1, length, 1, 16, generator=gen) for _ in "kv")
    lengths = torch.tensor([length - 7], dtype=torch.int32)
    pool = -(-length // page) + 3
    k_pages, table_k = paged_copy(k, page, pool, gen)
    v_pages = torch.zeros_like(k_pages)
    for p in range(table_k.shape[1]):
        chunk = v[0, p * page : (p + 1) * page]
        v_pages[table_k[0, p], : chunk.shape[0]] = chunk
    paged = attncc.compile(EXAMPLES / "paged_decode.attn")
    module = paged.module(interpreted=True)
    counted = []
    count = module._page_table_entries
    monkeypatch.setattr(
        module, "_page_table_entries", lambda *a: counted.append(count(*a)) or counted[-1]
    )
    out = paged(q, k_pages, v_pages, table_k, lengths)
    assert len(counted) == 1 and (counted[0] > 0) == loaded, counted
    expected = attncc.compile(EXAMPLES / "decode.attn")(q, k, v, lengths)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_page_table_entries_cover_a_chunk() -> None:
    module = attncc.compile(EXAMPLES / "paged_decode.attn").module(interpreted=True)
    entries = module._page_table_entries
    assert "tl.gather(table_0" in attncc.compile(EXAMPLES / "paged_decode.attn").source
    # a chunk of 320 keys in pages of 3 (106.7 of them) spans at most 108: 128 entries
    assert entries(320, (3,)) == 128
    assert entries(64, (16,)) == 16  # at least 16: fewer counts to compile for
    assert entries(3968, (16,)) == module._PAGE_TABLE_LIMIT == 256  # B=1 128k: 33 chunks
    assert entries(320, (1,)) == 0  # 322 entries: loaded a tile ahead instead
    assert entries(320, (1, 16)) == 0  # two tables: the one of more entries decides
