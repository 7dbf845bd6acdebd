"""Passes: the verifier after every pass, the verifier's teeth, mask analysis and GQA mapping.

Mask analysis is also checked for exactness: the key interval plus the residual masks must
select exactly the keys the spec's masks select, evaluated numerically on a grid.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import attncc
from attncc.ir import IRError, expr_str, lower, verify
from attncc.ir import nodes as ir
from attncc.passes import PASS_NAMES, default_passes, run_passes
from attncc.passes.gqa import GqaMapping
from attncc.passes.mask_analysis import MaskAnalysis
from attncc.passes.schedule import SPLIT_MAX_QUERIES
from attncc.spec import load

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))
CAUSAL = (ROOT / "examples" / "causal.attn").read_text()


def example(name: str) -> ir.AttentionKernel:
    return attncc.optimise(ROOT / "examples" / f"{name}.attn")[1]


def with_mask(mask: str, params: str = "") -> str:
    """The causal spec with another mask line (and extra param lines)."""
    text = CAUSAL.replace("mask m >= n\n", f"mask {mask}\n" if mask else "")
    return text.replace("param scale", f"{params}param scale") if params else text


# ----------------------------------------------------------------------------- pipeline


@pytest.mark.parametrize("schedule", [None, "naive", "fused", "split_kv"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_verifier_runs_after_every_pass(path: Path, schedule: str | None) -> None:
    lowered = verify(lower(load(path)))
    if lowered.sink is not None and schedule in ("naive", "split_kv"):
        with pytest.raises(ValueError, match="a softmax sink runs fused only"):
            run_passes(lowered, default_passes(schedule))  # type: ignore[arg-type]
        return
    if lowered.fp8 and schedule in ("naive", "split_kv"):
        with pytest.raises(ValueError, match="FP8 inputs run fused only"):
            run_passes(lowered, default_passes(schedule))  # type: ignore[arg-type]
        return
    seen: list[str] = []

    def after_each(p: Any, kernel: ir.AttentionKernel) -> None:
        verify(kernel)
        seen.append(p.name)

    final = run_passes(lowered, default_passes(schedule), after_each=after_each, check=True)
    assert seen == list(PASS_NAMES)
    assert final.schedule == (schedule or final.schedule)
    assert final.schedule in ("naive", "fused", "split_kv")
    assert final.tiling is not None and final.mask_plan is not None
    # the API runs the same pipeline
    assert final == attncc.optimise(path, schedule)[1]  # type: ignore[arg-type]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_passes_are_pure(path: Path) -> None:
    lowered = lower(load(path))
    again = lower(load(path))
    once = run_passes(lowered)
    assert lowered == again  # the input was not modified
    assert run_passes(lowered) == once  # the same input gives the same output


def test_every_pass_is_named_and_documented() -> None:
    passes = default_passes()
    assert [p.name for p in passes] == list(PASS_NAMES)
    assert len(set(PASS_NAMES)) == len(PASS_NAMES)
    for p in passes:
        doc = type(p).__doc__ or ""
        assert "Before" in doc and "After" in doc, f"{p.name}: docstring must state before/after"


def test_schedule_override_and_spec_line() -> None:
    assert example("naive").schedule == "naive"  # from the spec's `schedule` line
    assert example("naive").split_max_queries == 0
    fused = attncc.optimise(ROOT / "examples" / "naive.attn", "fused")[1]
    assert fused.schedule == "fused"  # the caller's override wins
    assert fused.split_max_queries == 0  # an explicit schedule is kept at run time too


def test_default_schedule() -> None:
    """Fused, handing short query lengths to split-KV; single-query specs split-KV outright."""
    causal = example("causal")
    assert causal.schedule == "fused" and causal.split_max_queries == SPLIT_MAX_QUERIES > 0
    assert example("gqa_causal").split_max_queries == SPLIT_MAX_QUERIES
    assert example("decode").schedule == "split_kv"


def test_split_kv_refuses_a_head_dependent_key_range() -> None:
    gqa = (ROOT / "examples" / "gqa_causal.attn").read_text()
    per_head = gqa.replace("mask m >= n", "mask m >= n and n <= h + m")
    with pytest.raises(ValueError, match="cannot run split_kv: the visible key range depends"):
        attncc.optimise(per_head, "split_kv")
    default = attncc.optimise(per_head)[1]
    assert default.schedule == "fused" and default.split_max_queries == 0


def test_tiling_rules() -> None:
    """Rules by head dim; the last covers any head dim; single-query kernels get their own."""
    for name in ("causal", "decode"):
        rules = example(name).tiling.rules  # type: ignore[union-attr]
        assert rules and rules[-1][0] == 0
        bounds = [bound for bound, _ in rules[:-1]]
        assert bounds == sorted(bounds) and all(b > 0 for b in bounds)
    assert example("causal").tiling != example("decode").tiling
    pinned = attncc.optimise(ROOT / "examples" / "causal.attn", block_n=32)[1]
    assert {c.block_n for _, c in pinned.tiling.rules} == {32}  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="unknown option block_k"):
        attncc.optimise(ROOT / "examples" / "causal.attn", block_k=32)


def test_default_tiles_take_tma_copies_except_through_a_tile_index() -> None:
    """Head dims 65-128 default to 64x64 tiles with TMA K/V copies (the Hopper sweeps'
    pick), but kernels walking a tile index's lists keep pointer loads (faster there)."""

    def rule_for_128(name: str) -> ir.TileConfig:
        rules = example(name).tiling.rules  # type: ignore[union-attr]
        return next(c for bound, c in rules if bound == 0 or bound >= 128)

    causal, documents = rule_for_128("causal"), rule_for_128("document_mask")
    assert example("document_mask").tile_index is not None
    assert (causal.block_m, causal.block_n, causal.num_warps, causal.tma) == (64, 64, 4, True)
    assert dataclasses.replace(documents, tma=True) == causal and not documents.tma


# ----------------------------------------------------------------------------- verifier

CAUSAL_IR = example("causal")


def tiled(kernel: ir.AttentionKernel, config: ir.TileConfig) -> ir.AttentionKernel:
    return dataclasses.replace(kernel, tiling=ir.Tiling(((0, config),)))


def upper_bound(kernel: ir.AttentionKernel, bound: ir.KeyBound) -> ir.AttentionKernel:
    plan = dataclasses.replace(kernel.mask_plan, upper=(bound,))  # type: ignore[type-var]
    return dataclasses.replace(kernel, mask_plan=plan)


DOC_IR = example("document_mask")
BROKEN = {
    "float mask": lambda k: dataclasses.replace(k, masks=(ir.Const(1.0, "float"),)),
    "int mask": lambda k: dataclasses.replace(k, masks=(ir.Index("m"),)),
    "mask reads an unknown tensor": lambda k: dataclasses.replace(
        k, masks=(ir.Load("nope", (ir.Index("b"),), "bool"),)
    ),
    "mask reads the query": lambda k: dataclasses.replace(
        k, masks=(ir.Load("q", tuple(ir.Index(i) for i in "bhmd"), "bool"),)
    ),
    "mask uses the head index": lambda k: dataclasses.replace(
        k, masks=(ir.BinOp(">=", ir.Index("d"), ir.Index("n"), "bool"),)
    ),
    "mask reads the score": lambda k: dataclasses.replace(
        k, masks=(ir.BinOp(">", ir.Score(), ir.Const(0.0, "float"), "bool"),)
    ),
    "unknown dim": lambda k: dataclasses.replace(
        k, masks=(ir.BinOp("<", ir.Index("n"), ir.Dim("Q"), "bool"),)
    ),
    "unknown param": lambda k: dataclasses.replace(k, score_scale=ir.Param("temperature", "float")),
    "bool scale": lambda k: dataclasses.replace(k, score_scale=ir.Const(True, "bool")),
    "scale uses an index": lambda k: dataclasses.replace(k, score_scale=ir.Index("m")),
    "int score modification": lambda k: dataclasses.replace(k, score_mods=(ir.Index("m"),)),
    "unknown operand tensor": lambda k: dataclasses.replace(
        k, key=dataclasses.replace(k.key, tensor="kv")
    ),
    "operand subscripts": lambda k: dataclasses.replace(
        k, value=dataclasses.replace(k.value, indices=k.value.indices[:3])
    ),
    "output indices": lambda k: dataclasses.replace(
        k, output=dataclasses.replace(k.output, indices=("b", "h", "m"))
    ),
    "block size not a power of two": lambda k: tiled(k, ir.TileConfig(48, 64, 4, 2)),
    "block size below 16": lambda k: tiled(k, ir.TileConfig(64, 8, 4, 2)),
    "warps": lambda k: tiled(k, ir.TileConfig(64, 64, 3, 2)),
    "no rule for any head dim": lambda k: dataclasses.replace(
        k, tiling=ir.Tiling(((64, ir.TileConfig(64, 64, 4, 2)),))
    ),
    "bound slope": lambda k: upper_bound(k, ir.KeyBound(ir.Index("m"), 2)),
    "bound uses the key index": lambda k: upper_bound(k, ir.KeyBound(ir.Index("n"), 0)),
    "float bound": lambda k: upper_bound(k, ir.KeyBound(ir.Const(1.5, "float"), 0)),
    "group on a non-batch axis": lambda k: dataclasses.replace(
        k, group=ir.GroupMapping(ir.Axis("m", "M"), "H")
    ),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN))
def test_verifier_rejects_a_broken_kernel(breakage: str) -> None:
    assert verify(CAUSAL_IR) is CAUSAL_IR
    with pytest.raises(IRError):
        verify(BROKEN[breakage](CAUSAL_IR))


def with_index(kernel: ir.AttentionKernel, **changes: Any) -> ir.AttentionKernel:
    assert kernel.tile_index is not None
    return dataclasses.replace(kernel, tile_index=dataclasses.replace(kernel.tile_index, **changes))


def untested_residual(kernel: ir.AttentionKernel) -> ir.AttentionKernel:
    """A residual mask that is not separable, while the index still claims full tiles."""
    odd = ir.BinOp(
        "!=", ir.BinOp("%", ir.Index("m"), ir.Const(2, "int"), "int"), ir.Const(0, "int"), "bool"
    )
    plan = kernel.mask_plan
    assert plan is not None
    plan = dataclasses.replace(plan, residual=(*plan.residual, odd))
    return dataclasses.replace(kernel, masks=(*kernel.masks, odd), mask_plan=plan)


B_AXIS, H_AXIS = DOC_IR.batch_axes
(DOC_SEPARABLE,) = DOC_IR.mask_plan.separable  # type: ignore[union-attr]
BROKEN_INDEX = {
    "index shared across the sequences": lambda k: with_index(k, axes=()),
    "index axes out of batch order": lambda k: with_index(k, axes=(H_AXIS, B_AXIS)),
    "index over a non-batch axis": lambda k: with_index(k, axes=(B_AXIS, ir.Axis("m", "N"))),
    "index tests no mask": lambda k: with_index(k, masks=()),
    "index tests a mask the plan lacks": lambda k: with_index(
        k, masks=(dataclasses.replace(DOC_SEPARABLE, op="<"),)
    ),
    "full tiles with a mask left untested": untested_residual,
    "index of a naive kernel": lambda k: dataclasses.replace(k, schedule="naive"),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN_INDEX))
def test_verifier_rejects_a_broken_tile_index(breakage: str) -> None:
    assert verify(DOC_IR) is DOC_IR
    with pytest.raises(IRError):
        verify(BROKEN_INDEX[breakage](DOC_IR))


def test_tile_index_pass() -> None:
    """Fused kernels with separable masks get an index over the batch axes their ids read;
    one that also has a mask that is not separable lists no full tiles."""
    assert DOC_IR.tile_index == ir.TileIndex((B_AXIS,), (DOC_SEPARABLE,), True)
    doc = (ROOT / "examples" / "document_mask.attn").read_text()
    odd = attncc.optimise(doc.replace("and m >= n", "and m >= n and m % 2 != 0"))[1]
    assert odd.tile_index == ir.TileIndex((B_AXIS,), (DOC_SEPARABLE,), False)
    assert verify(untested_residual(with_index(DOC_IR, full=False)))
    for schedule in ("naive", "split_kv"):
        assert attncc.optimise(doc, schedule)[1].tile_index is None  # type: ignore[arg-type]
    assert all(example(p.stem).tile_index is None for p in EXAMPLES if p.stem != "document_mask")


def test_verifier_rejects_a_load_with_the_wrong_rank() -> None:
    (residual,) = DOC_IR.mask_plan.residual  # type: ignore[union-attr]
    load_doc = residual.left  # type: ignore[union-attr]
    short = dataclasses.replace(load_doc, indices=load_doc.indices[:1])
    with pytest.raises(IRError, match="doc indexed with 1 subscripts"):
        verify(dataclasses.replace(DOC_IR, masks=(ir.BinOp("==", short, short, "bool"),)))


def test_a_broken_pass_is_caught_by_run_passes() -> None:
    class Breaks:
        name = "breaks"

        def run(self, kernel: ir.AttentionKernel) -> ir.AttentionKernel:
            return dataclasses.replace(kernel, masks=(ir.Const(0, "int"),))

    with pytest.raises(IRError, match="a mask must be boolean"):
        run_passes(lower(load(ROOT / "examples" / "causal.attn")), [Breaks()])
    # and not without checking
    run_passes(lower(load(ROOT / "examples" / "causal.attn")), [Breaks()], check=False)


# ----------------------------------------------------------------------------- mask analysis


def bounds(bs: tuple[ir.KeyBound, ...]) -> list[tuple[str, int]]:
    return [(expr_str(b.expr), b.slope) for b in bs]


MASK_PLANS = {
    # example: (lower bounds, upper bounds, residual masks)
    "causal": ([], [("m + 1", 1)], []),
    "gqa_causal": ([], [("m + 1", 1)], []),
    "alibi": ([], [("m + 1", 1)], []),
    "softcap": ([], [("m + 1", 1)], []),
    "mla_causal": ([], [("m + 1", 1)], []),
    "causal_bottom_right": ([], [("m + N - M + 1", 1)], []),
    "sliding_window": ([("m - window + 1", 1)], [("m + 1", 1)], []),
    "prefix_lm": ([], [("max(prefix, m + 1)", 1)], []),
    "document_mask": ([], [("m + 1", 1)], ["doc[b, m] == doc[b, n]"]),
    "decode": ([], [("cache_len[b]", 0)], []),
    "paged_decode": ([], [("cache_len[b]", 0)], []),
    "decode_window": ([("cache_len[b] - window", 0)], [("cache_len[b]", 0)], []),
    "speculative_decode": ([], [("m + (cache_len[b] - M) + 1", 1)], []),
    "naive": ([], [], []),
    "fused": ([], [], []),
    "bias": ([], [], []),
    "fp8_block": ([], [], []),
    "fp8_causal": ([], [("m + 1", 1)], []),
    "relative_bias": ([], [], []),
    "sinks": ([("m + N - M - window + 1", 1)], [("m + N - M + 1", 1)], []),
}


def test_every_example_has_an_expected_mask_plan() -> None:
    assert set(MASK_PLANS) == {p.stem for p in EXAMPLES}


@pytest.mark.parametrize("name", sorted(MASK_PLANS))
def test_mask_plan_of_the_examples(name: str) -> None:
    plan = example(name).mask_plan
    assert plan is not None
    lower_bounds, upper_bounds, residual = MASK_PLANS[name]
    assert bounds(plan.lower) == lower_bounds
    assert bounds(plan.upper) == upper_bounds
    assert [expr_str(r) for r in plan.residual] == residual


def test_mask_analysis_before_and_after() -> None:
    lowered = lower(load(ROOT / "examples" / "sliding_window.attn"))
    assert lowered.mask_plan is None
    analysed = MaskAnalysis().run(lowered)
    assert analysed.masks == lowered.masks  # the masks stay for partial tiles
    assert analysed.mask_plan is not None


@pytest.mark.parametrize(
    ("name", "group"),
    [("gqa_causal", ("h", "H", "KVH")), ("decode", ("h", "H", "KVH")), ("causal", None)],
)
def test_gqa_mapping(name: str, group: tuple[str, str, str] | None) -> None:
    kernel = example(name)
    if group is None:
        assert kernel.group is None
    else:
        assert kernel.group == ir.GroupMapping(ir.Axis(group[0], group[1]), group[2])


def test_gqa_mapping_needs_the_exact_pattern() -> None:
    """h / (H / KVH) over a key dim other than KVH is not a group mapping."""
    gqa = (ROOT / "examples" / "gqa_causal.attn").read_text()
    lowered = lower(load(gqa))
    assert GqaMapping().run(lowered).group is not None
    other = gqa.replace("let g = h / (H / KVH)", "let g = h / (KVH / KVH)")
    assert GqaMapping().run(lower(load(other))).group is None


# --------------------------------------------------------------- mask analysis is exact


def evaluate(expr: ir.Expr, env: dict[str, Any]) -> Any:
    """Numpy value of an IR expression; ints divide truncating toward zero (C semantics)."""
    match expr:
        case ir.Const(value=value):
            return value
        case ir.Index(name=name) | ir.Dim(name=name) | ir.Param(name=name):
            return env[name]
        case ir.Load(tensor=tensor, indices=indices):
            return env[tensor][tuple(evaluate(i, env) for i in indices)]
        case ir.Unary(op="neg", operand=x):
            return -evaluate(x, env)
        case ir.Unary(op="not", operand=x):
            return ~evaluate(x, env)
        case ir.BinOp(op=op, left=a, right=b):
            x, y = evaluate(a, env), evaluate(b, env)
            if op == "/" and expr.type == "int":
                return np.trunc(np.divide(x, y)).astype(np.int64)
            if op == "%" and expr.type == "int":
                return np.fmod(x, y)
            ops = {
                "+": np.add,
                "-": np.subtract,
                "*": np.multiply,
                "/": np.divide,
                "==": np.equal,
                "!=": np.not_equal,
                "<": np.less,
                "<=": np.less_equal,
                ">": np.greater,
                ">=": np.greater_equal,
                "and": np.logical_and,
                "or": np.logical_or,
            }
            return ops[op](x, y)
        case ir.Call(func=func, args=args):
            values = [evaluate(a, env) for a in args]
            return {"min": np.minimum, "max": np.maximum, "abs": np.abs}[func](*values)
    raise AssertionError(expr)


def visible(kernel: ir.AttentionKernel, env: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Visible (b, m, n) keys by the masks, and by the mask plan."""
    plan = kernel.mask_plan
    assert plan is not None
    by_masks = np.ones(env["shape"], dtype=bool)
    for mask in kernel.masks:
        by_masks &= evaluate(mask, env)
    key_count = env[kernel.key_axis.dim]
    low = np.zeros((*env["shape"][:2], 1), dtype=np.int64)
    high = np.full_like(low, key_count)
    for b in plan.lower:
        low = np.maximum(low, evaluate(b.expr, env))
    for b in plan.upper:
        high = np.minimum(high, evaluate(b.expr, env))
    by_plan = (env["n"] >= low) & (env["n"] < high)
    for mask in plan.residual:
        by_plan &= evaluate(mask, env)
    return np.broadcast_to(by_masks, env["shape"]), by_plan


# (name, spec text, i32 params): the examples and masks written other ways
ANALYSED = {
    **{p.stem: (p.read_text(), ()) for p in EXAMPLES},
    "flipped": (with_mask("n <= m"), ()),
    "strict": (with_mask("n < m"), ()),
    "diagonal": (with_mask("n == m"), ()),
    "not the diagonal": (with_mask("n != m"), ()),
    "window from below": (with_mask("n > m - w and n <= m", "param w: i32 = 4\n"), ("w",)),
    "band": (with_mask("m - n < w and n - m < w", "param w: i32 = 4\n"), ("w",)),
    "scaled key": (with_mask("2 * n <= m"), ()),
    "anti-causal": (with_mask("n >= m"), ()),
    "either prefix or window": (
        with_mask("n < pre or m - n < w", "param pre: i32 = 3\nparam w: i32 = 4\n"),
        ("pre", "w"),
    ),
    "either late or diagonal": (with_mask("n >= m or n >= w", "param w: i32 = 4\n"), ("w",)),
    "opposite slopes": (with_mask("n <= m or n < M - m"), ()),
    "negated key": (with_mask("-n >= -m"), ()),
    "halved key": (with_mask("n / 2 <= m"), ()),
    "per head": (with_mask("n <= h + m"), ()),
    "interval or causal": (with_mask("(n < 5 and n >= 2) or m >= n"), ()),
    "float comparison": (with_mask("m - n < 2.5"), ()),
    "shifted": (with_mask("m + 3 >= n + 1"), ()),
    "negated": (with_mask("not (n > m)"), ()),
}


@pytest.mark.parametrize("name", sorted(ANALYSED))
@given(
    b=st.integers(1, 2),
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    values=st.lists(st.integers(-5, 45), min_size=2, max_size=2),
    seed=st.integers(0, 2**16),
)
def test_mask_plan_selects_exactly_the_masked_keys(
    name: str, b: int, m: int, n: int, values: list[int], seed: int
) -> None:
    text, int_params = ANALYSED[name]
    kernel = attncc.optimise(text)[1]
    if kernel.query_axis is not None and kernel.query_axis.dim == kernel.key_axis.dim:
        m = n
    rng = np.random.default_rng(seed)
    rows = m if kernel.query_axis is not None else 1
    env: dict[str, Any] = {
        "shape": (b, rows, n),
        "b": np.arange(b)[:, None, None],
        "n": np.arange(n)[None, None, :],
        kernel.key_axis.dim: n,
    }
    for axis in kernel.batch_axes[1:]:  # other batch indices: one program's scalar value
        env[axis.index], env[axis.dim] = seed % 3, 3
    if kernel.query_axis is not None:
        env[kernel.query_axis.index] = np.arange(m)[None, :, None]
        env[kernel.query_axis.dim] = m
    for name_, value in zip(int_params, values, strict=False):
        env[name_] = value
    for p in kernel.params:
        if p.name not in env and p.type == "int":
            env[p.name] = values[0]
    if "doc" in {t.name for t in kernel.tensors}:
        env["doc"] = np.sort(rng.integers(0, 4, size=(b, n)), axis=-1)
    if "cache_len" in {t.name for t in kernel.tensors}:
        env["cache_len"] = rng.integers(0, n + 1, size=(b,))
    by_masks, by_plan = visible(kernel, env)
    assert np.array_equal(by_masks, by_plan), f"{name}: {np.argwhere(by_masks != by_plan)[:5]}"


# ------------------------------------------- mask analysis under a row == key equality mask

# packed sequences: doc ids per token, a start per document in two tables (st, st2) and a
# length per document (ln), as attncc.varlen's derived specs read them
PACKED = (
    CAUSAL.replace("dims  B, H, M, N, D", "dims  B, H, N, D, S")
    .replace("q[B, H, M, D]", "q[B, H, N, D]")
    .replace("in    v[B, H, N, D]\n", "in    v[B, H, N, D]\nin    doc[B, N]: i32\n")
    .replace(
        "param scale", "in    st[B, S]: i32\nin    st2[B, S]: i32\nparam w: i32 = 4\nparam scale"
    )
)
ROW_DOC, KEY_DOC = "doc[b, m]", "doc[b, n]"
LOCAL_M, LOCAL_N = f"(m - st[b, {ROW_DOC}])", f"(n - st[b, {KEY_DOC}])"
SAME_DOC = f"{ROW_DOC} == {KEY_DOC}"
ROW_LEN = f"(st[b, {ROW_DOC} + 1] - st[b, {ROW_DOC}])"

# name: (mask lines, the expected bounds (lower, upper) or None for "stays residual")
EQUALITY_MASKS: dict[str, tuple[str, tuple[list[str], list[str]] | None]] = {
    "local causal": (f"{SAME_DOC}\nmask {LOCAL_M} >= {LOCAL_N}", ([], ["m + 1"])),
    "local causal, one line": (f"{SAME_DOC} and {LOCAL_M} >= {LOCAL_N}", ([], ["m + 1"])),
    "equality written key first": (
        f"{KEY_DOC} == {ROW_DOC}\nmask {LOCAL_N} <= {LOCAL_M}",
        ([], ["m + 1"]),
    ),
    "local bottom right": (
        f"{SAME_DOC}\nmask {LOCAL_M} + {ROW_LEN} - {ROW_LEN} >= {LOCAL_N}",
        ([], ["m + 1"]),
    ),
    "local window": (
        f"{SAME_DOC}\nmask {LOCAL_M} >= {LOCAL_N} and {LOCAL_M} - {LOCAL_N} < w",
        (["m - w + 1"], ["m + 1"]),
    ),
    "local key twice": (f"{SAME_DOC}\nmask 2 * {LOCAL_M} >= {LOCAL_N} + {LOCAL_N}", None),
    # not cancelled: the starts come from different tables, no equality mask, the equality
    # only on one side of an or, a start that does not cancel (local n alone)
    "two tables": (f"{SAME_DOC}\nmask {LOCAL_M} >= (n - st2[b, {KEY_DOC}])", None),
    "no equality": (f"{LOCAL_M} >= {LOCAL_N}", None),
    "equality in an or": (f"{SAME_DOC} or {LOCAL_M} >= {LOCAL_N}", None),
    "local key alone": (f"{SAME_DOC}\nmask {LOCAL_N} < 4", None),
    "unequal ids": (f"{ROW_DOC} != {KEY_DOC}\nmask {LOCAL_M} >= {LOCAL_N}", None),
}


@pytest.mark.parametrize("name", sorted(EQUALITY_MASKS))
def test_mask_analysis_cancels_starts_equal_under_an_equality_mask(name: str) -> None:
    masks, expected = EQUALITY_MASKS[name]
    kernel = attncc.optimise(PACKED.replace("mask m >= n\n", f"mask {masks}\n"))[1]
    plan = kernel.mask_plan
    assert plan is not None
    if expected is None:
        assert not plan.lower and not plan.upper
        assert len(plan.residual) == len(kernel.masks)
        return
    assert ([expr_str(b.expr) for b in plan.lower], [expr_str(b.expr) for b in plan.upper]) == (
        expected
    )
    assert [b.slope for b in (*plan.lower, *plan.upper)] == [1] * len(plan.lower + plan.upper)
    # the equality stays, a residual mask the tile index tests; the local mask became the
    # interval's comparisons (no loads left for partial tiles)
    assert [expr_str(r) for r in plan.residual] in (
        [f"{ROW_DOC} == {KEY_DOC}"],
        [f"{KEY_DOC} == {ROW_DOC}"],
    )
    assert kernel.tile_index is not None and kernel.tile_index.full
    assert sum("st[" in expr_str(mask) for mask in kernel.masks) == 0


def test_a_mask_whose_table_terms_cancel_is_tested_as_its_interval() -> None:
    # local positions read through the row's sequence alone (attncc.varlen's one-packing
    # form): the starts cancel with no equality, and partial tiles compare indices, not
    # gathers of the starts
    kernel = attncc.optimise(
        PACKED.replace("mask m >= n\n", f"mask {LOCAL_M} >= (n - st[b, {ROW_DOC}])\n")
    )[1]
    plan = kernel.mask_plan
    assert plan is not None and [expr_str(b.expr) for b in plan.upper] == ["m + 1"]
    assert [expr_str(mask) for mask in kernel.masks] == ["n < m + 1"]


@pytest.mark.parametrize("name", sorted(EQUALITY_MASKS))
@given(
    m=st.integers(1, 30),
    docs=st.integers(1, 5),
    w=st.integers(-2, 8),
    seed=st.integers(0, 2**16),
)
def test_mask_plan_under_an_equality_selects_exactly_the_masked_keys(
    name: str, m: int, docs: int, w: int, seed: int
) -> None:
    """The interval and residual masks select exactly what the spec's masks select (as
    lowered, before any rewrite), for any ids and any start tables; so do the masks the
    analysis leaves."""
    masks, _ = EQUALITY_MASKS[name]
    text = PACKED.replace("mask m >= n\n", f"mask {masks}\n")
    lowered = lower(load(text))
    kernel = attncc.optimise(text)[1]
    rng = np.random.default_rng(seed)
    b = 2
    env: dict[str, Any] = {
        "shape": (b, m, m),
        "b": np.arange(b)[:, None, None],
        "h": 0,
        "m": np.arange(m)[None, :, None],
        "n": np.arange(m)[None, None, :],
        "N": m,
        "S": docs + 1,
        "w": w,
        # sorted as packing makes them, or not: the rule needs neither
        "doc": rng.integers(0, docs, size=(b, m)),
        "st": rng.integers(-m, m, size=(b, docs + 1)),
        "st2": rng.integers(-m, m, size=(b, docs + 1)),
    }
    if seed % 2:
        env["doc"] = np.sort(env["doc"], axis=-1)
    want = np.ones(env["shape"], dtype=bool)
    for mask in lowered.masks:
        want &= evaluate(mask, env)
    by_masks, by_plan = visible(kernel, env)
    assert np.array_equal(want, by_plan), f"{name}: {np.argwhere(want != by_plan)[:5]}"
    assert np.array_equal(want, by_masks), f"{name}: {np.argwhere(want != by_masks)[:5]}"


def test_a_comparison_mixing_row_and_key_terms_is_rearranged_into_a_separable_mask() -> None:
    """Local causality with the key's start read through the row's document (varlen's two
    packings): no interval, but its terms move into a row side and the key index, which the
    tile index bounds per tile (full tiles allowed: the residual mask is that comparison as
    written). A term reading both indices leaves a mask inseparable."""
    written = f"{LOCAL_M} >= (n - st2[b, {ROW_DOC}])"
    text = PACKED.replace("mask m >= n\n", f"mask {SAME_DOC}\nmask {written}\n")
    kernel = attncc.optimise(text)[1]
    plan = kernel.mask_plan
    assert plan is not None and not plan.lower and not plan.upper
    rearranged = plan.separable[-1]
    row = f"m - st[b, {ROW_DOC}] + st2[b, {ROW_DOC}]"
    assert (expr_str(rearranged.row), rearranged.op, expr_str(rearranged.key)) == (row, ">=", "n")
    assert rearranged.written == plan.residual[-1] and rearranged.is_form_of(plan.residual[-1])
    assert kernel.tile_index is not None and kernel.tile_index.full
    both = attncc.optimise(text.replace(f"mask {written}\n", "mask (m + n) % 2 == 0\n"))[1]
    assert both.tile_index is not None and not both.tile_index.full
    # the indices alone, no table: nothing to skip, so no index (and no builder launch)
    plain = attncc.optimise(CAUSAL.replace("mask m >= n", "mask m >= n and m - n != 3"))[1]
    assert plain.tile_index is None and plain.mask_plan.separable == ()  # type: ignore[union-attr]
