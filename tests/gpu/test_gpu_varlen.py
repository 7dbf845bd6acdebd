"""attncc.varlen on a CUDA GPU: the sequence ids and table checks of its one small kernel
(templates/triton/sequence_ids.py.jinja), and calls against each sequence run alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import attncc
from attncc.varlen import sequence_ids, varlen

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 7, 300])
def test_sequence_ids_on_the_gpu_match_searchsorted(batch: int) -> None:
    gen = torch.Generator().manual_seed(batch)
    q_lens = torch.randint(0, 90, (batch,), generator=gen).tolist()
    k_lens = torch.randint(0, 90, (batch,), generator=gen).tolist()
    cu_q, cu_k = _cu(q_lens), _cu(k_lens)
    used = torch.tensor([n // 3 for n in k_lens], dtype=torch.int32)
    want = sequence_ids(cu_q, sum(q_lens), (cu_k, sum(k_lens)))
    got = sequence_ids(
        cu_q.cuda(), sum(q_lens), (cu_k.cuda(), sum(k_lens)), used.cuda(), on_device=True
    )
    assert torch.equal(got.cpu(), want)


@pytest.mark.gpu
@pytest.mark.parametrize("one_table", [True, False])
def test_varlen_on_the_gpu_matches_each_sequence_alone(one_table: bool) -> None:
    spec = EXAMPLES / "causal.attn"
    kernel, batched = varlen(spec), attncc.compile(spec)
    lens = [1, 130, 64, 257, 3]
    cu_q = _cu(lens).cuda()
    cu_k = cu_q if one_table else cu_q.clone()
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(sum(lens), 4, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
        for _ in range(3)
    )
    out = kernel(q, k, v, cu_q, cu_k, max(lens), max(lens))
    for i in range(len(lens)):
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        alone = batched(*(t[rows].transpose(0, 1)[None] for t in (q, k, v)))
        torch.testing.assert_close(out[rows], alone[0].transpose(0, 1), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("tables", ["one", "two", "seqused_k"])
def test_varlen_under_torch_compile_matches_eager(tables: str) -> None:
    # traced, the sequence ids are PyTorch operations (no Triton kernel of attncc's to wrap)
    kernel = varlen(EXAMPLES / "causal.attn")
    lens = [5, 200, 64]
    cu = _cu(lens).cuda()
    cu_k = cu if tables == "one" else cu.clone()
    used = {"seqused_k": torch.tensor([5, 150, 1], dtype=torch.int32, device="cuda")}
    extra = used if tables == "seqused_k" else {}
    q, k, v = (torch.randn(sum(lens), 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    eager = kernel(q, k, v, cu, cu_k, max(lens), max(lens), **extra)

    def call(*args: torch.Tensor) -> torch.Tensor:
        return kernel(*args, **extra)  # type: ignore[no-any-return]

    compiled = torch.compile(call)(q, k, v, cu, cu_k, max(lens), max(lens))
    torch.testing.assert_close(compiled, eager, atol=0, rtol=0)


@pytest.mark.gpu
def test_traced_sequence_ids_match_the_kernels() -> None:
    # the ids index the offset tables: traced ones one too high read the next sequence's
    cu = _cu([5, 200, 0, 64]).cuda()
    traced = torch.compile(lambda table: sequence_ids(table, 269))(cu)
    assert torch.equal(traced, sequence_ids(cu, 269, on_device=True))


BROKEN = """
import torch
from attncc.varlen import sequence_ids

cu = torch.tensor([0, 4, 8], dtype=torch.int32, device="cuda")
sequence_ids(cu, {total}, (cu, {total}), {used}, on_device=True)
torch.cuda.synchronize()
"""


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("total", "used", "message"),
    [
        (9, "None", "cu_seqlens must end at the packed length"),
        (8, 'torch.tensor([3, 9], dtype=torch.int32, device="cuda")', "seqused_k must lie"),
    ],
)
def test_a_broken_table_stops_the_gpu_launch(total: int, used: str, message: str) -> None:
    # a device-side assertion leaves the CUDA context unusable: a process of its own
    script = textwrap.dedent(BROKEN.format(total=total, used=used))
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    assert run.returncode != 0
    assert message in run.stderr or message in run.stdout, run.stderr[-2000:]
