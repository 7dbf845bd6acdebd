"""benchmarks/varlen_speed.py (the GPU suite's `varlen` step) imports and parses its
arguments without a GPU, and the document-mask spec it times beside attncc.varlen computes
what varlen does on the same packed data (checked here in the Triton interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from script_module import load_script

import attncc

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "varlen_speed.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script(SCRIPT, "varlen_speed_script")


def test_help_runs_without_a_gpu() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "--means" in done.stdout


def test_arguments(script: ModuleType) -> None:
    args = script.parse(["--means", "64,256", "--masks", "causal", "--impls", "varlen,flex"])
    assert (args.means, args.masks, args.impls) == ([64, 256], ["causal"], ["varlen", "flex"])
    assert (args.total, args.heads, args.head_dim, args.dtype) == (16384, 16, 128, "bf16")
    with pytest.raises(SystemExit):
        script.parse(["--impls", "varlen,sdpa"])
    with pytest.raises(SystemExit):
        script.parse(["--masks", "window"])


def test_sequence_lengths_pack_the_total_around_the_mean(script: ModuleType) -> None:
    lengths = script.sequence_lengths(512, 16384, torch.Generator().manual_seed(0))
    assert sum(lengths) == 16384 and min(lengths) >= 1 and max(lengths) <= 1023
    assert 20 <= len(lengths) <= 45  # 32 expected
    assert script.visible_pairs([3, 2], causal=True) == 6 + 3
    assert script.visible_pairs([3, 2], causal=False) == 9 + 4


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_document_mask_spec_computes_what_varlen_does(script: ModuleType, causal: bool) -> None:
    lengths = [5, 17, 1, 9]
    cu = torch.tensor([0, 5, 22, 23, 32], dtype=torch.int32)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(32, 2, 16, generator=generator) for _ in range(3))
    spec = script.EXAMPLES / ("causal.attn" if causal else "fused.attn")
    packed = attncc.varlen(spec)(q, k, v, cu, cu, max(lengths), max(lengths))
    doc = torch.repeat_interleave(torch.arange(4, dtype=torch.int32), torch.tensor(lengths))
    source = script.EXAMPLES / "document_mask.attn" if causal else script.DOCUMENT_FULL
    qb, kb, vb = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))
    batched = attncc.compile(source)(qb, kb, vb, doc[None])[0].transpose(0, 1)
    torch.testing.assert_close(batched, packed, rtol=1e-5, atol=1e-5)


def test_causal_varlen_lists_no_more_tiles_than_the_document_mask_kernel(
    script: ModuleType,
) -> None:
    """--tiles' counts (the tile index builders in the interpreter): with one cu_seqlens
    tensor or two, causal varlen lists exactly the document-mask kernel's tiles, and runs
    exactly its partial ones masked. With two tables the local positions go through the
    query's sequence, so causality separates into the row's diagonal in packed keys against
    the key index; through each side's own sequence it listed the tiles above the diagonal
    of every query tile holding a sequence boundary, and ran every tile masked."""
    lengths = script.sequence_lengths(128, 1024, torch.Generator().manual_seed(0))
    for causal in (True, False):
        counts = script.tile_counts(lengths, causal, 64, 64)
        assert counts["varlen"] == counts["docmask"]
        assert counts["varlen, two tables"] == counts["docmask"]
    args = script.parse(["--tiles", "--blocks", "128x64,64x64"])
    assert args.tiles and args.blocks == [(128, 64), (64, 64)]
    with pytest.raises(SystemExit):
        script.parse(["--tiles", "--blocks", "64"])
