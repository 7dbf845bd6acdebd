"""The tile index of fused kernels with separable masks (document ids), and its kernels.

The builder's lists are compared with a NumPy mirror of the same classification (value ranges
of each query tile and key tile, the key interval of the query tile), and checked for
soundness against the masks evaluated on every (row, key) pair: every tile holding a visible
pair is listed, and no full tile holds a masked pair or a key past the end. Ids are drawn
sorted, unsorted, as one document, one document per token, and beyond float32's exact
integers. Mutated builders (a wrong full or live test, an off-by-one slot) are caught both
here and by the reference check of the kernel's output; so is an index shared across batch
entries that the verifier would have refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attncc
from attncc.ir import nodes as ir
from attncc.runtime.jit import interpreter
from attncc.runtime.kernel import Kernel
from attncc.torch_eval import evaluate as torch_evaluate

from ._support import DEVICE, compiled, evaluate, example_path

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)

DOC = example_path("document_mask").read_text()
DOC_MASK = "mask doc[b, m] == doc[b, n] and m >= n\n"
assert DOC_MASK in DOC


def variant(mask: str, extra: str = "", doc: str = "in    doc[B, N]: i32\n") -> str:
    text = DOC.replace(DOC_MASK, f"mask {mask}\n").replace("in    doc[B, N]: i32\n", doc)
    return text.replace("param scale", f"{extra}param scale") if extra else text


# name: (spec, whether the index may list full tiles, the batch axes it varies over)
SPECS = {
    "document": (DOC, True, ("b",)),
    "document, both ways": (variant("doc[b, m] == doc[b, n]"), True, ("b",)),
    "other documents": (variant("doc[b, m] != doc[b, n] and m >= n"), True, ("b",)),
    "earlier documents": (variant("doc[b, n] < doc[b, m]"), True, ("b",)),
    "not later documents": (variant("doc[b, n] <= doc[b, m] and m >= n"), True, ("b",)),
    "later documents": (variant("doc[b, m] < doc[b, n]"), True, ("b",)),
    "window": (
        variant("doc[b, m] == doc[b, n] and m >= n and m - n < w", "param w: i32 = 40\n"),
        True,
        ("b",),
    ),
    "ids per head": (
        variant("doc[b, h, m] == doc[b, h, n] and m >= n", doc="in    doc[B, H, N]: i32\n"),
        True,
        ("b", "h"),
    ),
    "i64 ids": (DOC.replace("doc[B, N]: i32", "doc[B, N]: i64"), True, ("b",)),
    "float levels": (
        variant("doc[b, m] >= doc[b, n]", doc="in    doc[B, N]: f32\n"),
        True,
        ("b",),
    ),
    "queries and keys apart": (
        DOC.replace("dims  B, H, N, D", "dims  B, H, M, N, D")
        .replace("q[B, H, N, D]", "q[B, H, M, D]")
        .replace("in    doc[B, N]: i32", "in    qdoc[B, M]: i32\nin    doc[B, N]: i32")
        .replace(DOC_MASK, "mask qdoc[b, m] == doc[b, n] and m + N - M >= n\n"),
        True,
        ("b",),
    ),
    # row and key terms on both sides, moved apart (mask-analysis: varlen's two packings)
    "terms rearranged": (
        variant("doc[b, m] == doc[b, n] and m - doc[b, m] >= n - 2 * doc[b, m]"),
        True,
        ("b",),
    ),
    "and a mask that is not separable": (
        variant("doc[b, m] == doc[b, n] and m >= n and (m + n) % 3 != 1"),
        False,
        ("b",),
    ),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_pass_plans_an_index(name: str) -> None:
    text, full, axes = SPECS[name]
    kernel = attncc.optimise(text)[1]
    index = kernel.tile_index
    assert index is not None
    assert index.full == full
    assert tuple(a.index for a in index.axes) == axes
    # naive and split-KV kernels walk no index
    for schedule in ("naive", "split_kv"):
        assert attncc.optimise(text, schedule)[1].tile_index is None  # type: ignore[arg-type]


def test_no_index_without_separable_masks() -> None:
    for name in ("causal", "sliding_window", "prefix_lm", "gqa_causal", "bias"):
        assert attncc.optimise(example_path(name))[1].tile_index is None


# ------------------------------------------------------------------- the index against NumPy


def doc_ids(pattern: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    n = shape[-1]
    if pattern == "sorted":
        return torch.randint(0, max(1, n // 20), shape, generator=gen).sort(dim=-1).values
    if pattern == "unsorted":
        return torch.randint(0, 4, shape, generator=gen)
    if pattern == "one document":
        return torch.full(shape, 7)
    if pattern == "every token its own":
        return torch.arange(n).expand(*shape).clone()
    if pattern == "beyond float32":
        # 2**24 + 1 rounds to 2**24 in float32: two documents there would merge
        return 2**24 + torch.randint(0, 2, shape, generator=gen).sort(dim=-1).values
    raise ValueError(pattern)


PATTERNS = ("sorted", "unsorted", "one document", "every token its own", "beyond float32")


def make_inputs(kernel: Kernel, sizes: dict[str, int], pattern: str, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    inputs: dict[str, torch.Tensor] = {}
    for arg in kernel.ir.tensors:
        shape = tuple(sizes[d] for d in arg.dims)
        if arg.role != "aux":
            inputs[arg.name] = torch.randn(shape, generator=gen)
        elif arg.dtype == "f32":
            ids = doc_ids(pattern, shape, gen).float()
            ids[ids == 1] = float("nan")  # a NaN level passes no comparison
            inputs[arg.name] = ids
        else:
            ids = doc_ids(pattern, shape, gen)
            inputs[arg.name] = ids.to(torch.int64 if arg.dtype == "i64" else torch.int32)
    return {k: v.to(DEVICE) for k, v in inputs.items()}


@dataclasses.dataclass
class Index:
    """Per (index program, query tile): the listed key tiles (by start), and the counts."""

    partial: dict[tuple[int, int], list[int]]
    full: dict[tuple[int, int], list[int]]


def build_index(
    kernel: Kernel,
    inputs: dict[str, torch.Tensor],
    params: dict[str, Any],
    bm: int,
    bn: int,
    map_too: bool = True,
) -> Index:
    """Run the generated builder alone, as ``_launch`` does before the attention kernel; its
    map mode (the backward's) must mark exactly the listed tiles, 2 full and 1 partial
    (``map_too``; a mutant of the lists' code alone differs from its map)."""
    on_cpu = DEVICE == "cpu"
    module = kernel.module(interpreted=on_cpu)
    sizes, dtype, device = module._check(inputs, params)
    params = module._param_defaults(sizes, dict(params))
    out, lse = module._allocate(sizes, dtype, device, False)
    query_tiles = -(-sizes[kernel.ir.query_axis.dim] // bm)  # type: ignore[union-attr]
    with interpreter(on_cpu):
        lists, counts, key_tiles = module._tile_index(
            inputs, params, sizes, out, lse, query_tiles, bm, bn
        )
    lists, counts = lists.cpu().numpy(), counts.cpu().numpy()
    assert lists.shape[-1] == key_tiles == -(-sizes["N"] // bn)
    found: list[dict[tuple[int, int], list[int]]] = [{}, {}]
    for kind in (0, 1):
        for program in range(counts.shape[1]):
            for tile in range(query_tiles):
                count = int(counts[kind, program, tile])
                assert 0 <= count <= key_tiles
                found[kind][program, tile] = [int(s) for s in lists[kind, program, tile, :count]]
    if not map_too:
        return Index(found[0], found[1])
    with interpreter(on_cpu):
        live = module._tile_map(inputs, params, sizes, out, lse, query_tiles, bm, bn)
    expected = np.zeros((counts.shape[1], query_tiles, key_tiles), dtype=np.int8)
    for kind in (0, 1):
        for (program, tile), starts in found[kind].items():
            expected[program, tile, [s // bn for s in starts]] = kind + 1
    np.testing.assert_array_equal(live.cpu().numpy(), expected)
    return Index(found[0], found[1])


def value_of(expr: ir.Expr, env: dict[str, Any], inputs: dict[str, torch.Tensor]) -> np.ndarray:
    sizes = env["sizes"]
    value = torch_evaluate(expr, env, sizes, env["params"], inputs)
    return np.asarray(torch.as_tensor(value).to(torch.float64).numpy())


def expected_index(
    kernel: Kernel, inputs: dict[str, torch.Tensor], params: dict[str, Any], bm: int, bn: int
) -> tuple[Index, np.ndarray]:
    """A NumPy mirror of the builder (exact value ranges, the kernel's key interval per query
    tile), and the masks on every (program, row, key) pair."""
    k = kernel.ir
    plan, index = k.mask_plan, k.tile_index
    assert plan is not None and index is not None
    host = {name: t.cpu() for name, t in inputs.items()}
    module = kernel.module(False)
    sizes, _, _ = module._check(host, params)
    params = module._param_defaults(sizes, dict(params))
    n_keys = sizes[k.key_axis.dim]
    assert k.query_axis is not None
    n_rows = sizes[k.query_axis.dim]
    axes = index.axes
    programs = list(np.ndindex(*(sizes[a.dim] for a in axes)))
    rows_all, keys_all = torch.arange(n_rows)[:, None], torch.arange(n_keys)[None, :]
    partial: dict[tuple[int, int], list[int]] = {}
    full: dict[tuple[int, int], list[int]] = {}
    visible = np.ones((len(programs), n_rows, n_keys), dtype=bool)
    for p, values in enumerate(programs):
        env: dict[str, Any] = {a.index: v for a, v in zip(axes, values, strict=True)}
        env.update(sizes=sizes, params=params)
        # other batch indices (heads) do not matter: the verifier checks nothing reads them
        for a in k.batch_axes:
            env.setdefault(a.index, 0)
        pair_env = {**env, "m": rows_all, "n": keys_all}
        for mask in k.masks:
            visible[p] &= np.broadcast_to(
                value_of(mask, pair_env, host).astype(bool), visible[p].shape
            )
        row_env = {**env, "m": torch.arange(n_rows)}
        key_env = {**env, "n": torch.arange(n_keys)}
        row_vals = [value_of(s.row, row_env, host) for s in index.masks]
        key_vals = [value_of(s.key, key_env, host) for s in index.masks]
        lower = [value_of(b.expr, row_env, host) * np.ones(n_rows) for b in plan.lower]
        upper = [value_of(b.expr, row_env, host) * np.ones(n_rows) for b in plan.upper]
        for qt in range(-(-n_rows // bm)):
            rows = slice(qt * bm, min(qt * bm + bm, n_rows))
            lo = max([0] + [b[rows].min() for b in lower])
            hi = min([n_keys] + [b[rows].max() for b in upper])
            full_lo = max([0] + [b[rows].max() for b in lower])
            full_hi = min([n_keys] + [b[rows].min() for b in upper])
            ranges = [range_of(v[rows]) for v in row_vals]
            partial[p, qt], full[p, qt] = [], []
            for start in range(0, n_keys, bn):
                keys = slice(start, min(start + bn, n_keys))
                live = start < hi and start + bn > lo
                is_full = index.full and start >= full_lo and start + bn <= full_hi
                for sep, (row_lo, row_hi), v in zip(index.masks, ranges, key_vals, strict=True):
                    key_lo, key_hi = range_of(v[keys])
                    live = live and can_meet(sep.op, row_lo, row_hi, key_lo, key_hi)
                    is_full = is_full and always(sep.op, row_lo, row_hi, key_lo, key_hi)
                if live:
                    (full if is_full else partial)[p, qt].append(start)
    return Index(partial, full), visible


def range_of(values: np.ndarray) -> tuple[float, float]:
    if np.isnan(values).any():  # NaN widens the range to everything
        return -np.inf, np.inf
    return float(values.min()), float(values.max())


def can_meet(op: str, row_lo: float, row_hi: float, key_lo: float, key_hi: float) -> bool:
    return {
        "==": key_hi >= row_lo and key_lo <= row_hi,
        "!=": not (row_lo == row_hi == key_lo == key_hi),
        "<": row_lo < key_hi,
        "<=": row_lo <= key_hi,
        ">": row_hi > key_lo,
        ">=": row_hi >= key_lo,
    }[op]


def always(op: str, row_lo: float, row_hi: float, key_lo: float, key_hi: float) -> bool:
    return {
        "==": row_lo == row_hi == key_lo == key_hi,
        "!=": row_hi < key_lo or key_hi < row_lo,
        "<": row_hi < key_lo,
        "<=": row_hi <= key_lo,
        ">": row_lo > key_hi,
        ">=": row_lo >= key_hi,
    }[op]


def assert_sound(index: Index, visible: np.ndarray, bm: int, bn: int) -> None:
    """Every tile with a visible pair is listed once; every full tile is all visible."""
    n_rows, n_keys = visible.shape[1:]
    for (p, qt), partial in index.partial.items():
        full = index.full[p, qt]
        listed = partial + full
        assert partial == sorted(partial) and full == sorted(full), (p, qt, partial, full)
        assert len(set(listed)) == len(listed), f"a key tile listed twice: {(p, qt, listed)}"
        rows = slice(qt * bm, min(qt * bm + bm, n_rows))
        for start in range(0, n_keys, bn):
            pairs = visible[p, rows, start : start + bn]
            if pairs.any():
                assert start in listed, f"key tile {start} of query tile {qt} has visible pairs"
            if start in full:
                assert start + bn <= n_keys, f"full key tile {start} runs past the keys"
                assert pairs.all(), f"full key tile {start} of query tile {qt} has masked pairs"


BLOCKS = st.sampled_from([(16, 16), (32, 16), (16, 32), (64, 16), (128, 64)])


@pytest.mark.parametrize("name", sorted(SPECS))
@settings(max_examples=8)
@given(
    n=st.one_of(st.sampled_from([1, 16, 17, 63, 64, 65, 130]), st.integers(1, 200)),
    rows=st.integers(1, 150),
    batch=st.integers(1, 2),
    blocks=BLOCKS,
    pattern=st.sampled_from(PATTERNS),
    seed=st.integers(0, 2**16),
)
def test_index_matches_numpy(
    name: str, n: int, rows: int, batch: int, blocks: tuple[int, int], pattern: str, seed: int
) -> None:
    """``rows`` is the query length of the spec with queries apart from keys (M)."""
    kernel = compiled_spec(name)
    bm, bn = blocks
    sizes = {"B": batch, "H": 2, "M": rows, "N": n, "D": 16}
    inputs = make_inputs(kernel, sizes, pattern, seed)
    built = build_index(kernel, inputs, {}, bm, bn)
    expected, visible = expected_index(kernel, inputs, {}, bm, bn)
    assert built == expected, f"{pattern}: {built} != {expected}"
    assert_sound(built, visible, bm, bn)


def test_full_tiles_are_exactly_the_all_visible_ones() -> None:
    """Sorted ids, causal: the ranges lose nothing, so full tiles are exactly the complete key
    tiles whose pairs are all visible."""
    kernel = compiled("document_mask", "fused")
    n, bm, bn = 200, 32, 16
    doc = torch.zeros(1, n, dtype=torch.int32)
    doc[0, 40:] = 1
    doc[0, 72:] = 2
    doc[0, 150:] = 3
    inputs = make_inputs(kernel, {"B": 1, "H": 1, "N": n, "D": 16}, "sorted", 0)
    inputs["doc"] = doc.to(DEVICE)
    built = build_index(kernel, inputs, {}, bm, bn)
    _, visible = expected_index(kernel, inputs, {}, bm, bn)
    for qt in range(-(-n // bm)):
        rows = slice(qt * bm, min(qt * bm + bm, n))
        all_visible = [s for s in range(0, n - bn + 1, bn) if visible[0, rows, s : s + bn].all()]
        assert built.full[0, qt] == all_visible
    # rows 192..199: keys 144..159 hold two documents, 192..199 are the diagonal
    assert built.full[0, 6] == [160, 176] and built.partial[0, 6] == [144, 192]


def compiled_spec(name: str) -> Kernel:
    return _compiled_specs.setdefault(name, attncc.compile(SPECS[name][0]))


_compiled_specs: dict[str, Kernel] = {}


# -------------------------------------------------------------- kernels walking the index


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("pattern", PATTERNS)
def test_kernel_matches_reference(name: str, pattern: str) -> None:
    """Every spec variant and id pattern, across several tiles, against float64."""
    kernel = compiled_spec(name)
    sizes = {"B": 2, "H": 2, "M": 90, "N": 150, "D": 16}
    inputs = make_inputs(kernel, sizes, pattern, seed=len(name) + len(pattern))
    out_v, lse_v, out, _ = evaluate(kernel, inputs, {}, torch.float32)
    assert out_v.ok and lse_v.ok, (out_v, lse_v)
    assert not torch.isnan(out).any()


# ---------------------------------------------------------------------------------- mutants


# A document boundary inside query tile 1 (rows 128..199 of the default 128 x 64 tiles, which
# the CPU uses at head dim 16): key tiles 0 and 1 are all document 0 and before every row.
def boundary_inputs(kernel: Kernel) -> dict[str, torch.Tensor]:
    inputs = make_inputs(kernel, {"B": 2, "H": 1, "N": 200, "D": 16}, "sorted", 3)
    doc = torch.zeros(2, 200, dtype=torch.int32)
    doc[:, 150:] = 1
    doc[1, 20:] += 1  # the second sequence differs from the first
    inputs["doc"] = doc.to(DEVICE)
    return inputs


def mutant(kernel: Kernel, old: str, new: str) -> Kernel:
    assert kernel.source.count(old) == 1, old
    source = kernel.source.replace(old, new)
    return Kernel(kernel.name, kernel.spec, kernel.ir, source, kernel.entry)


BUILDER_MUTANTS = {
    # full by the key range alone: rows of two documents take a one-document key tile whole
    "full ignores the row range": ("(row_lo_0 == row_hi_0) & (key_lo_0", "(key_lo_0"),
    # a key tile whose last document is the rows' first is dropped
    "live misses a shared boundary id": ("(key_hi_0 >= row_lo_0)", "(key_hi_0 > row_lo_0)"),
    # the causal diagonal counted as inside every row's keys
    "full interval off by a tile": ("(start_n + BLOCK_N <= full_hi)", "(start_n < full_hi)"),
    # the last partial tile (the causal diagonal) left out of the count
    "partial count one short": (
        "tl.store(tile_counts + index_row, partial_count)",
        "tl.store(tile_counts + index_row, partial_count - 1)",
    ),
}


@pytest.mark.parametrize("name", sorted(BUILDER_MUTANTS))
def test_a_wrong_classification_is_caught(name: str) -> None:
    right = compiled("document_mask", "fused")
    wrong = mutant(right, *BUILDER_MUTANTS[name])
    inputs = boundary_inputs(right)
    bm, bn = 128, 64
    expected, visible = expected_index(right, inputs, {}, bm, bn)
    assert build_index(right, inputs, {}, bm, bn) == expected
    built = build_index(wrong, inputs, {}, bm, bn, map_too=False)
    assert built != expected, f"{name}: the index test missed it"
    with pytest.raises(AssertionError):
        assert_sound(built, visible, bm, bn)
    # and the kernel's output is wrong against the reference
    right_out, right_lse, _, _ = evaluate(right, inputs, {}, torch.float32)
    assert right_out.ok and right_lse.ok
    out_v, lse_v, _, _ = evaluate(wrong, inputs, {}, torch.float32)
    assert not (out_v.ok and lse_v.ok), f"{name}: the reference check missed it"


def test_an_index_shared_across_sequences_is_caught() -> None:
    """Every sequence reading sequence 0's lists (what an index over no batch axis would do,
    which the verifier refuses: tests/ir) gives sequence 1 the wrong key tiles."""
    right = compiled("document_mask", "fused")
    wrong = mutant(
        right, "index_row = (i_b) * tl.num_programs(0)", "index_row = 0 * tl.num_programs(0)"
    )
    inputs = boundary_inputs(right)
    doc = torch.zeros(2, 200, dtype=torch.int32)
    doc[1, 100:] = 1  # sequence 0 is one document: its query tile 1 sees key tiles 0, 1 whole
    inputs["doc"] = doc.to(DEVICE)
    right_out, right_lse, _, _ = evaluate(right, inputs, {}, torch.float32)
    assert right_out.ok and right_lse.ok
    out_v, lse_v, _, _ = evaluate(wrong, inputs, {}, torch.float32)
    assert not (out_v.ok and lse_v.ok)


def test_a_wrong_live_map_is_caught() -> None:
    """The backward's map mode of the builder (2 full, 1 partial): partial tiles marked full
    (which the backward would run without their masks) differ from the lists."""
    right = compiled("document_mask", "fused")
    wrong = mutant(right, "tl.where(live, 1, 0)", "tl.where(live, 2, 0)")
    inputs = boundary_inputs(right)
    build_index(right, inputs, {}, 128, 64)
    with pytest.raises(AssertionError, match="Arrays are not equal"):
        build_index(wrong, inputs, {}, 128, 64)
