"""Query tiles in pairs (causal-like specs): a program runs the tile that sees the most keys,
then the one that sees the fewest. Each tile's arithmetic is unchanged, so the outputs and
log-sum-exps equal the unpaired kernel's bit for bit, at odd and even tile counts; and the
launch rule pairs only where half as many programs still fill the GPU."""

from __future__ import annotations

import pytest
import torch

from attncc.runtime.jit import interpreter

from ._support import compiled, evaluate

CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
PAIRED = ("causal", "causal_bottom_right", "gqa_causal", "alibi", "softcap", "prefix_lm")


def _inputs(name: str, rows: int, keys: int) -> list[torch.Tensor]:
    kernel = compiled(name, "fused")
    gen = torch.Generator().manual_seed(rows)
    heads, kv_heads = (4, 2) if name == "gqa_causal" else (2, 2)
    q = torch.randn(1, heads, rows, 32, generator=gen)
    k, v = (torch.randn(1, kv_heads, keys, 32, generator=gen) for _ in range(2))
    side = {"slopes": torch.rand(heads, generator=gen)}
    return [q, k, v, *(side[n] for n in kernel.input_names[3:])]


@pytest.mark.parametrize("name", PAIRED)
@pytest.mark.parametrize(("rows", "keys"), [(64, 64), (80, 80), (37, 53)])
def test_paired_tiles_match_the_unpaired_kernel(name: str, rows: int, keys: int) -> None:
    kernel = compiled(name, "fused")
    module = kernel.module(interpreted=True)
    args = _inputs(name, rows, keys)
    kernel.poison_outputs(True)  # a tile the pairs miss stays NaN
    try:
        with interpreter(True):
            tensors, params = module._bind(args, {})
            paired = module._forward(tensors, params, True, {**CONFIG, "paired": 1})
            single = module._forward(tensors, params, True, {**CONFIG, "paired": 0})
    finally:
        kernel.poison_outputs(False)
    for a, b in zip(paired, single, strict=True):
        assert not a.isnan().any()
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_paired_tiles_match_the_reference() -> None:
    kernel = compiled("causal", "fused")
    q, k, v = _inputs("causal", 80, 80)
    # the interpreter counts 2 multiprocessors: 5 tiles x 2 heads take the pairs by default
    verdict, lse_verdict, _, _ = evaluate(kernel, {"q": q, "k": k, "v": v}, {}, torch.float32)
    assert verdict.ok, verdict
    assert lse_verdict.ok, lse_verdict


@pytest.mark.parametrize(
    ("name", "pairs"),
    [("causal", True), ("fused", False), ("sliding_window", False), ("document_mask", False)],
)
def test_only_keys_that_grow_with_the_row_take_pairs(name: str, pairs: bool) -> None:
    source = compiled(name, "fused").source
    assert ("for turn in range(0, 1 + paired" in source) is pairs
    assert ("grid = (triton.cdiv(tiles, 1 + paired)" in source) is pairs


def test_the_launch_rule_pairs_where_half_the_programs_still_fill_the_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel = compiled("causal", "fused")
    module = kernel.module(interpreted=True)
    grids: list[tuple[int, int]] = []
    jitted = getattr(module, next(n for n in dir(module) if n.endswith("_fwd")))

    class Recorder:
        def __getitem__(self, grid: tuple[int, int]):  # type: ignore[no-untyped-def]
            grids.append(grid)
            return jitted[grid]

    monkeypatch.setattr(module, jitted.__name__, Recorder())
    args = _inputs("causal", 64, 64)  # 4 tiles of 16 rows, 2 heads: 8 programs unpaired
    with interpreter(True):
        tensors, params = module._bind(args, {})
        for sms, programs in ((5, 4), (6, 8)):  # 8 >= 3 * 5 // 2 = 7; 8 < 9
            monkeypatch.setattr(module, "_multiprocessors", lambda device, n=sms: n)
            module._forward(tensors, params, False, CONFIG)
            assert grids[-1][0] * grids[-1][1] == programs
