"""attncc.varlen: flash-attn's packed layout, checked per sequence against the kernel on
each sequence alone and against the float64 reference of the batched spec."""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attncc
from attncc.ir import expr_str
from attncc.ir import nodes as ir
from attncc.reference import reference
from attncc.varlen import VarlenKernel, sequence_ids, varlen, varlen_source
from tests.kernels._support import example_path

# unequal lengths, a length-1 sequence, lengths that are no multiple of a tile
Q_LENS = (5, 1, 37, 16)
K_LENS = (9, 3, 37, 20)


@cache
def compiled_varlen(name: str) -> VarlenKernel:
    return varlen(example_path(name))


def _cu(lens: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)


def _case(
    name: str, q_lens: tuple[int, ...], k_lens: tuple[int, ...], seed: int = 0
) -> dict[str, Any]:
    torch.manual_seed(seed)
    heads, kv_heads, dim = (4, 2, 32) if "gqa" in name or name == "sinks" else (2, 2, 32)
    q = torch.randn(sum(q_lens), heads, dim)
    k = torch.randn(sum(k_lens), kv_heads, dim)
    v = torch.randn(sum(k_lens), kv_heads, dim)
    extra = {"slopes": torch.rand(heads)} if name == "alibi" else {}
    return {"q": q, "k": k, "v": v, "extra": extra}


def _per_sequence_reference(name: str, case: dict[str, Any], q_lens, k_lens, params):
    """The batched spec's float64 reference on each sequence alone ([1, H, len, D])."""
    spec = attncc.load(example_path(name))
    outs, lses = [], []
    cq, ck = _cu(q_lens), _cu(k_lens)
    for i in range(len(q_lens)):
        q = case["q"][cq[i] : cq[i + 1]].transpose(0, 1)[None].double().numpy()
        k = case["k"][ck[i] : ck[i + 1]].transpose(0, 1)[None].double().numpy()
        v = case["v"][ck[i] : ck[i + 1]].transpose(0, 1)[None].double().numpy()
        extra = {n: t.double().numpy() for n, t in case["extra"].items()}
        out, lse = reference(spec)(q, k, v, **extra, **params, return_lse=True)
        outs.append(torch.from_numpy(out[0]).transpose(0, 1))
        lses.append(torch.from_numpy(lse[0]).transpose(0, 1))
    return torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize(
    "name", ["causal", "causal_bottom_right", "gqa_causal", "alibi", "softcap", "fused"]
)
def test_varlen_matches_each_sequence_alone(name: str) -> None:
    kernel = compiled_varlen(name)
    case = _case(name, Q_LENS, K_LENS)
    out, lse = kernel(
        case["q"],
        case["k"],
        case["v"],
        _cu(Q_LENS),
        _cu(K_LENS),
        max(Q_LENS),
        max(K_LENS),
        **case["extra"],
        return_lse=True,
    )
    assert out.shape == (*case["q"].shape[:2], case["v"].shape[2])
    want_out, want_lse = _per_sequence_reference(name, case, Q_LENS, K_LENS, {})
    assert torch.allclose(out.double(), want_out, atol=2e-5, rtol=2e-5)
    # [H, total_q], as flash-attn's varlen calls return it
    lse = lse.transpose(0, 1)
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert torch.allclose(lse.double()[finite], want_lse[finite], atol=2e-5, rtol=2e-5)
    # and the batched kernel run on one sequence alone agrees (the same generated maths)
    batched = attncc.compile(example_path(name))
    cq, ck = _cu(Q_LENS), _cu(K_LENS)
    i = 2
    alone = batched(
        case["q"][cq[i] : cq[i + 1]].transpose(0, 1)[None],
        case["k"][ck[i] : ck[i + 1]].transpose(0, 1)[None],
        case["v"][ck[i] : ck[i + 1]].transpose(0, 1)[None],
        **case["extra"],
    )
    assert torch.allclose(out[cq[i] : cq[i + 1]], alone[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tables", ["one", "two"])
def test_varlen_gradients_match_each_sequence_alone(tables: str) -> None:
    # the backward reads the same sequence bounds and tile index as the forward
    kernel, batched = compiled_varlen("causal"), attncc.compile(example_path("causal"))
    lens = (5, 1, 37, 16)
    case = _case("causal", lens, lens, seed=5)
    cu = _cu(lens)
    cu_k = cu if tables == "one" else cu.clone()
    q, k, v = (case[t].clone().requires_grad_() for t in ("q", "k", "v"))
    out = kernel(q, k, v, cu, cu_k, max(lens), max(lens))
    grad = torch.randn_like(out)
    out.backward(grad)
    for i in range(len(lens)):
        rows = slice(cu[i], cu[i + 1])
        alone = [case[t][rows].transpose(0, 1)[None].clone().requires_grad_() for t in "qkv"]
        batched(*alone).backward(grad[rows].transpose(0, 1)[None])
        for got, want in zip((q, k, v), alone, strict=True):
            assert got.grad is not None and want.grad is not None
            assert torch.allclose(
                got.grad[rows], want.grad[0].transpose(0, 1), atol=1e-5, rtol=1e-5
            )


def test_sliding_window_is_local_to_each_sequence() -> None:
    kernel = compiled_varlen("sliding_window")
    lens = (7, 1, 19)
    case = _case("sliding_window", lens, lens, seed=3)
    out = kernel(case["q"], case["k"], case["v"], _cu(lens), _cu(lens), 19, 19, window=4)
    want, _ = _per_sequence_reference("sliding_window", case, lens, lens, {"window": 4})
    assert torch.allclose(out.double(), want, atol=2e-5, rtol=2e-5)


def test_cross_sequence_tiles_are_skipped_by_the_tile_index() -> None:
    # each query's keys are its sequence's slots: masks of the key index itself against
    # the row's sequence start and end, which the index builder scans by (no key's id read)
    _, kernel = attncc.optimise(varlen_source(example_path("causal")))
    assert kernel.tile_index is not None and kernel.tile_index.full
    start, end = kernel.tile_index.masks[:2]
    assert (expr_str(start.row), start.op, start.key) == (
        "cu_seqlens_k[seq_q[m]]",
        "<=",
        ir.Index("n"),
    )
    assert (expr_str(end.row), end.op, end.key) == (
        "cu_seqlens_k[seq_q[m] + 1]",
        ">",
        ir.Index("n"),
    )
    assert "seq_k" not in varlen_source(example_path("causal"))


def test_the_index_builders_scan_only_a_query_tiles_own_sequences() -> None:
    # both builders start at the rows' least sequence start and end at their greatest end
    source = varlen_source(example_path("causal"))
    built = attncc.compile(source, target="triton").source
    assert "lo = tl.minimum(tl.maximum(lo, row_lo_0), d_TOTAL_K).to(tl.int32)" in built
    assert "hi = tl.maximum(tl.minimum(hi, row_hi_1), 0).to(tl.int32)" in built
    built = attncc.compile(source, target="cuda").source
    tile = "(long long)t * BN"
    assert f"(block_lo_0 <= ({tile} + BN - 1)) && (block_hi_1 > {tile})" in built


def test_bad_offsets_are_one_clear_error() -> None:
    kernel = compiled_varlen("causal")
    case = _case("causal", (4, 4), (4, 4))
    with pytest.raises(ValueError, match="cu_seqlens_q must rise from 0 to the packed length 8"):
        kernel(case["q"], case["k"], case["v"], _cu((4, 3)), _cu((4, 4)), 4, 4)
    with pytest.raises(TypeError, match="1-D int32"):
        kernel(case["q"], case["k"], case["v"], _cu((4, 4)).long(), _cu((4, 4)), 4, 4)


# ------------------------------------------------- the sequence-id kernel (GPU tables)


@settings(max_examples=12, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=9),
    st.lists(st.integers(0, 40), min_size=1, max_size=9),
    st.booleans(),
)
def test_sequence_id_kernel_matches_searchsorted(
    q_lens: list[int], k_lens: list[int], with_used: bool
) -> None:
    # the kernel a GPU call runs, here in the interpreter: empty sequences included
    k_lens = (k_lens * len(q_lens))[: len(q_lens)]
    cu_q, cu_k = _cu(tuple(q_lens)), _cu(tuple(k_lens))
    used = torch.tensor([n // 2 for n in k_lens], dtype=torch.int32) if with_used else None
    keys = (cu_k, sum(k_lens))
    seq_q = sequence_ids(cu_q, sum(q_lens), keys, used, on_device=True)
    want_q = sequence_ids(cu_q, sum(q_lens), keys)
    assert seq_q.dtype == torch.int32 and torch.equal(seq_q, want_q)
    assert seq_q.tolist() == [b for b, n in enumerate(q_lens) for _ in range(n)]


@pytest.mark.parametrize(
    ("q_lens", "total", "used", "message"),
    [
        ((4, 4), 9, None, "cu_seqlens must end at the packed length"),
        ((4, 4), 7, None, "cu_seqlens must end at the packed length"),
        ((5, -1), 4, None, "cu_seqlens must not fall"),
        ((4, 4), 8, (3, 9), "seqused_k must lie within each sequence's key slots"),
        ((4, 4), 8, (-1, 2), "seqused_k must lie within each sequence's key slots"),
    ],
)
def test_sequence_id_kernel_stops_on_a_broken_table(
    q_lens: tuple[int, ...],
    total: int,
    used: tuple[int, ...] | None,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # on the GPU these stop the launch with a device-side assertion (the kernel is compiled
    # in debug mode; tests/gpu runs one); the interpreter checks device_assert only when its
    # builder's options ask for debug, whatever the kernel's flag
    from triton.runtime.errors import InterpreterError
    from triton.runtime.interpreter import interpreter_builder

    debug = dataclasses.replace(interpreter_builder.options, debug=True)
    monkeypatch.setattr(interpreter_builder, "options", debug)
    cu = _cu(q_lens)
    seqused = torch.tensor(used, dtype=torch.int32) if used is not None else None
    with pytest.raises(InterpreterError, match=message):
        sequence_ids(cu, total, (cu, total), seqused, on_device=True)


@pytest.mark.parametrize(
    ("q_lens", "total", "used"),
    [((4, 4), 9, None), ((5, -1), 4, None), ((4, 4), 8, (3, 9)), ((4, 4), 8, (-1, 2))],
)
def test_traced_calls_check_the_tables_with_pytorchs_assertions(
    q_lens: tuple[int, ...], total: int, used: tuple[int, ...] | None
) -> None:
    # what a GPU call under torch.compile runs in place of the sequence-id kernel's checks
    from attncc.varlen import _assert_tables

    cu = _cu(q_lens)
    seqused = torch.tensor(used, dtype=torch.int32) if used is not None else None
    with pytest.raises(RuntimeError):
        _assert_tables(cu, total, (cu, total), seqused)
    _assert_tables(_cu((4, 4)), 8, (_cu((4, 4)), 8), torch.tensor([4, 0], dtype=torch.int32))


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("decode", "no query axis"),
        ("paged_decode", "no query axis"),
        ("bias", "has a query or key length axis"),
    ],
)
def test_specs_without_a_packed_form_are_refused(name: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        varlen_source(example_path(name))


# decode and chunked decode against a cache: each sequence owns SLOTS key slots, of which the
# first USED are written (a length-0 cache, a full one, one within a single key tile)
SLOTS = (40, 40, 64, 8)
USED = (17, 0, 64, 1)


def _cache_case(name: str, q_lens: tuple[int, ...], seed: int) -> dict[str, Any]:
    case = _case(name, q_lens, SLOTS, seed)
    if name == "sinks":
        case["extra"] = {"sinks": 2 * torch.randn(case["q"].shape[1])}
    # the unused slots hold large values: a kernel reading one is far off
    unused = torch.cat(
        [
            torch.arange(used, slots) + start
            for used, slots, start in zip(USED, SLOTS, _cu(SLOTS)[:-1], strict=True)
        ]
    )
    for name_ in ("k", "v"):
        case[name_][unused] = 100 * torch.randn_like(case[name_][unused])
    return case


@pytest.mark.parametrize(
    ("name", "q_lens", "params"),
    [
        ("causal_bottom_right", (1, 1, 1, 1), {}),  # decode: a query per sequence
        ("causal_bottom_right", (3, 1, 5, 1), {}),  # chunked prefill / speculative decode
        ("sinks", (1, 1, 1, 1), {"window": 24}),  # gpt-oss decode: GQA, window and sinks
        ("sinks", (2, 1, 3, 1), {"window": 24}),
        # no mask at all: only the used length keeps the unused slots out
        ("fused", (1, 1, 1, 1), {}),
        ("fused", (3, 1, 5, 1), {}),
    ],
)
def test_seqused_k_reads_only_the_used_keys(name: str, q_lens: tuple[int, ...], params) -> None:
    """flash-attn's seqused_k: sequence b's keys are its first USED[b] slots, its last query
    sits on its last used key (bottom-right), and the float64 reference of the batched spec
    on exactly those keys agrees; a sequence with no used key gives 0 (its lse: -inf, or
    the sink)."""
    kernel = compiled_varlen(name)
    case = _cache_case(name, q_lens, seed=5)
    used = torch.tensor(USED, dtype=torch.int32)
    cq, ck = _cu(q_lens), _cu(SLOTS)
    out, lse = kernel(
        case["q"], case["k"], case["v"], cq, ck, max(q_lens), max(SLOTS),
        seqused_k=used, **case["extra"], **params, return_lse=True,
    )  # fmt: skip
    spec = attncc.load(example_path(name))
    for i, length in enumerate(USED):
        got, got_lse = out[cq[i] : cq[i + 1]], lse[:, cq[i] : cq[i + 1]]
        if length == 0:
            assert torch.equal(got, torch.zeros_like(got))
            if name == "sinks":
                sinks = case["extra"]["sinks"][:, None].expand_as(got_lse)
                assert torch.allclose(got_lse, sinks, atol=1e-6, rtol=1e-6)
            else:
                assert torch.equal(got_lse, torch.full_like(got_lse, float("-inf")))
            continue
        q = case["q"][cq[i] : cq[i + 1]].transpose(0, 1)[None].double().numpy()
        k, v = (
            case[t][ck[i] : ck[i] + length].transpose(0, 1)[None].double().numpy() for t in "kv"
        )
        extra = {n: t.double().numpy() for n, t in case["extra"].items()}
        want, want_lse = reference(spec)(q, k, v, **extra, **params, return_lse=True)
        want_out = torch.from_numpy(want[0]).transpose(0, 1)
        assert torch.allclose(got.double(), want_out, atol=2e-5, rtol=2e-5)
        assert torch.allclose(got_lse.double(), torch.from_numpy(want_lse[0]), atol=2e-5, rtol=2e-5)


def test_seqused_k_tiles_past_the_used_keys_are_skipped() -> None:
    """The used length is a row-against-key bound in the tile index, as the sequence mask."""
    _, kernel = attncc.optimise(varlen_source(example_path("causal"), seqused_k=True))
    assert kernel.tile_index is not None
    bounds = [m for m in kernel.tile_index.masks if "seqused_k" in repr(m.row)]
    assert [(m.op, m.key) for m in bounds] == [(">", ir.Index("n", "int"))]


def test_bad_seqused_k_is_one_clear_error() -> None:
    kernel = compiled_varlen("causal_bottom_right")
    case = _case("causal_bottom_right", (1, 1), (8, 8))
    cu_q, cu_k = _cu((1, 1)), _cu((8, 8))
    args = (case["q"], case["k"], case["v"], cu_q, cu_k, 1, 8)
    with pytest.raises(
        TypeError, match=r"seqused_k must be a 1-D int32 tensor of 2 lengths, got int64 \[2\]"
    ):
        kernel(*args, seqused_k=torch.tensor([3, 4]))
    with pytest.raises(TypeError, match="of 2 lengths, got int32 \\[3\\]"):
        kernel(*args, seqused_k=torch.tensor([3, 4, 5], dtype=torch.int32))
    with pytest.raises(
        ValueError, match=r"within each sequence's key slots \[8, 8\], got \[3, 9\]"
    ):
        kernel(*args, seqused_k=torch.tensor([3, 9], dtype=torch.int32))


# ---------------------------------------- one offset table for queries and keys (prefill)

# a mask on the local query position alone, beside the examples' local masks
PREFIX = example_path("causal").read_text().replace("mask m >= n", "mask m < 4 or n < 4")
ONE_TABLE_SPECS = {
    "causal": (example_path("causal"), {}),
    "causal_bottom_right": (example_path("causal_bottom_right"), {}),
    "sliding_window": (example_path("sliding_window"), {"window": 5}),
    "alibi": (example_path("alibi"), {}),
    "prefix": (PREFIX, {}),
}


@cache
def compiled_spec(name: str) -> tuple[VarlenKernel, Any]:
    spec, _ = ONE_TABLE_SPECS[name]
    return varlen(spec), attncc.compile(spec)


@pytest.mark.parametrize("packing", ["one tensor", "a copy", "apart"])
@pytest.mark.parametrize("name", sorted(ONE_TABLE_SPECS))
@settings(max_examples=3, deadline=None)
@given(
    lens=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    extra_keys=st.lists(st.integers(0, 9), min_size=4, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_varlen_matches_a_loop_over_the_sequences(
    name: str, packing: str, lens: list[int], extra_keys: list[int], seed: int
) -> None:
    """Every packing against the batched kernel run on each sequence alone: one cu_seqlens
    tensor for queries and keys (the one-packing spec, its local masks folded into key
    intervals), an equal copy and other key lengths (the two-table spec)."""
    kernel, batched = compiled_spec(name)
    params = ONE_TABLE_SPECS[name][1]
    q_lens = tuple(lens)
    k_lens = (
        tuple(n + e for n, e in zip(lens, extra_keys, strict=False))
        if packing == "apart"
        else q_lens
    )
    case = _case(name, q_lens, k_lens, seed)
    cu_q = _cu(q_lens)
    cu_k = cu_q if packing == "one tensor" else _cu(k_lens)
    out, lse = kernel(
        case["q"], case["k"], case["v"], cu_q, cu_k, max(q_lens), max(k_lens),
        **case["extra"], **params, return_lse=True,
    )  # fmt: skip
    ck = _cu(k_lens)
    for i in range(len(q_lens)):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(ck[i], ck[i + 1])
        alone, alone_lse = batched(
            *(case[t][s].transpose(0, 1)[None] for t, s in (("q", rows), ("k", keys), ("v", keys))),
            **case["extra"], **params, return_lse=True,
        )  # fmt: skip
        assert torch.allclose(out[rows], alone[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
        assert torch.allclose(lse[:, rows], alone_lse[0], atol=1e-5, rtol=1e-5, equal_nan=True)


def test_one_cu_seqlens_tensor_runs_the_one_packing_spec() -> None:
    """The same tensor, or a view of the same memory, picks the one-packing spec, whose
    causal mask is the key interval n < m + 1 (no loads); equal values in another tensor
    do not (comparing them would synchronise with the device)."""
    kernel = compiled_varlen("causal")
    source = kernel.same_packing_source
    assert source is not None and "seq_k" not in source and "cu_seqlens_k" not in source
    same = kernel.same_packing_kernel
    plan = same.ir.mask_plan
    assert [expr_str(b.expr) for b in plan.upper] == ["m + 1"] and not plan.lower
    assert [expr_str(m) for m in same.ir.masks] == [
        "n >= cu_seqlens_q[seq_q[m]]",
        "n < cu_seqlens_q[seq_q[m] + 1]",
        "n < m + 1",
    ]
    assert same.ir.tile_index is not None and same.ir.tile_index.full

    cu = _cu((5, 9))
    assert kernel.kernel_for(14, 14, cu, cu) is same
    assert kernel.kernel_for(14, 14, cu, cu[:]) is same
    assert kernel.kernel_for(14, 14, cu, cu.clone()) is kernel.kernel
    assert kernel.kernel_for(14, 14, cu, cu[:2]) is kernel.kernel
    assert kernel.kernel_for(14, 15, cu, cu) is kernel.kernel
    used = torch.tensor([5, 9], dtype=torch.int32)
    assert kernel.kernel_for(14, 14, cu, cu, used) is kernel.seqused_kernel
