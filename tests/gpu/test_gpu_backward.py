"""Gradients of the fused kernels at training sizes on a CUDA GPU (B=2, H=8, S=1024-2048,
D=64/128, bf16) against the float64 autograd reference, by flash-attn's rule.

The logic is tests/grad_cases.py's, which tests/kernels/test_backward_tiny.py runs at tiny
sizes on the CPU; the float64 reference there notes its memory at S=2048 (a few GB).
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from grad_cases import EXAMPLES, NAMES, draw, gradient_verdicts, note_replays
from torch.utils.checkpoint import checkpoint

import attncc
from attncc.runtime import autograd

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


@pytest.mark.gpu
@pytest.mark.parametrize(("seq", "head_dim"), [(1024, 128), (2048, 64)])
@pytest.mark.parametrize("name", NAMES)
def test_gradients_at_training_sizes_on_gpu(name: str, seq: int, head_dim: int) -> None:
    given, params = draw(name, 2, 8, seq, head_dim, torch.bfloat16, "cuda")
    verdicts = gradient_verdicts(name, given, params)
    failing = {n: v for n, v in verdicts.items() if not v.ok}
    assert not failing, failing
    torch.cuda.empty_cache()


# the specs the CUDA target's sm_90a backward takes: masks that fold into the key interval,
# a union of two (prefix LM), the bottom-right diagonal, document masks (a tile index), score
# modifications (the chain rule through tanh; side inputs read per head, per score, through
# a gathered index)
CUDA_BACKWARD = (
    "fused",
    "causal",
    "gqa_causal",
    "sliding_window",
    "prefix_lm",
    "causal_bottom_right",
    "softcap",
    "alibi",
    "bias",
    "relative_bias",
    "document_mask",
)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("seq", "head_dim", "dtype"),
    [(1024, 128, torch.bfloat16), (1000, 64, torch.float16), (333, 128, torch.float16)],
)
@pytest.mark.parametrize("name", CUDA_BACKWARD)
def test_cuda_backward_gradients(
    name: str, seq: int, head_dim: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sm_90a backward (a block a key tile, dQ added in float32) by flash-attn's rule,
    on lengths that leave partial query and key tiles (1000, 333) and both head dims, asked
    for (ATTNCC_BACKWARD=cuda: by default head dims of 64 take the Triton backward, as fast).
    Side inputs (ALiBi's slopes, biases) in Q's dtype without a gradient: the sm_90a
    backward computes none (a call that needs one takes the Triton backward)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a backward needs an sm_90 GPU")
    monkeypatch.setenv("ATTNCC_BACKWARD", "cuda")
    given, params = draw(name, 2, 8, seq, head_dim, dtype, "cuda")
    given = {n: t.to(dtype) if t.is_floating_point() else t for n, t in given.items()}
    needs = ("q", "k", "v")
    verdicts = gradient_verdicts(name, given, params, "cuda", "cuda", needs)
    failing = {n: v for n, v in verdicts.items() if not v.ok}
    assert not failing, failing
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "head_dim"), [("causal", 128), ("causal", 256), ("alibi", 192)])
def test_float32_gradients_at_wide_head_dims(
    name: str, head_dim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 takes the Triton backward, whose default tiles ask 256-512 KiB of shared
    memory at these head dims (an H200 has 227): it runs on smaller ones, never raising
    Triton's OutOfResources."""
    monkeypatch.setenv("ATTNCC_BACKWARD", "triton")
    given, params = draw(name, 1, 4, 700, head_dim, torch.float32, "cuda")
    verdicts = gradient_verdicts(name, given, params, "triton", "triton: asked for")
    failing = {n: v for n, v in verdicts.items() if not v.ok}
    assert not failing, failing
    torch.cuda.empty_cache()


def _sm90a_backward(
    spec_text: str | None, path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path | None:
    """Ask for the sm_90a backward (skipping off an sm_90 GPU); ``spec_text`` written to
    ``path`` (None: the example's own spec)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a backward needs an sm_90 GPU")
    monkeypatch.setenv("ATTNCC_BACKWARD", "cuda")
    if spec_text is None:
        return None
    path.write_text(spec_text)
    return path


# GQA with ALiBi: the scores read the query head (slopes[h]) in every step of a block
# that walks its group's heads
GQA_ALIBI = (
    (EXAMPLES / "gqa_causal.attn")
    .read_text()
    .replace("param scale", "in    slopes[H]\nparam scale")
    .replace("mask m >= n", "s = s - slopes[h] * (m - n)\nmask m >= n")
)
assert "slopes[h]" in GQA_ALIBI


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("spec_text", "seq", "head_dim", "dtype"),
    [
        (None, 1000, 64, torch.float16),
        (None, 2048, 128, torch.bfloat16),
        (GQA_ALIBI, 1000, 128, torch.bfloat16),
        (GQA_ALIBI, 333, 64, torch.float16),
    ],
)
@pytest.mark.parametrize("heads", [8, 12])
def test_cuda_backward_walks_a_gqa_group(
    spec_text: str | None,
    seq: int,
    head_dim: int,
    dtype: torch.dtype,
    heads: int,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sm_90a backward's blocks walk the query heads of their GQA group (4 a kv head),
    dK and dV summed in registers and written once: gradients by flash-attn's rule, with a
    score modification reading each head's slope, on partial tiles, and with 2 x 12 heads
    (6 kv programs: a grid chunk left partial)."""
    spec = _sm90a_backward(spec_text, tmp_path / "gqa_alibi.attn", monkeypatch)
    given, params = draw("gqa_causal", 2, heads, seq, head_dim, dtype, "cuda")
    if spec_text is not None:
        gen = torch.Generator().manual_seed(heads)
        given["slopes"] = (torch.rand(heads, generator=gen) + 0.1).to("cuda", dtype)
    kernel = attncc.compile(spec or EXAMPLES / "gqa_causal.attn", target="cuda")
    assert kernel.module(False)._backward_group(4) == 4
    verdicts = gradient_verdicts(
        "gqa_causal", given, params, "cuda", "cuda", ("q", "k", "v"), spec=spec
    )
    failing = {n: v for n, v in verdicts.items() if not v.ok}
    assert not failing, failing
    torch.cuda.empty_cache()


# document masks without causality (the example's mask less `m >= n`): a key tile's live
# query tiles lie on both sides of the one its block's walk starts at, so the walk of the
# tile index's bits wraps around
CAUSAL_DOCUMENTS = (EXAMPLES / "document_mask.attn").read_text()
DOCUMENTS_BOTH_WAYS = CAUSAL_DOCUMENTS.replace(" and m >= n", "")
assert DOCUMENTS_BOTH_WAYS != CAUSAL_DOCUMENTS


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("spec_text", "documents"), [(None, 24), (DOCUMENTS_BOTH_WAYS, 4), (DOCUMENTS_BOTH_WAYS, 24)]
)
def test_cuda_backward_walks_the_tile_index(
    spec_text: str | None,
    documents: int,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sm_90a backward's blocks walk the live bits of their tile index (most query tiles
    dead with 24 documents in 1000 tokens; the walk wrapping around without causality) and
    still reach every query tile that meets their keys: gradients by flash-attn's rule."""
    spec = _sm90a_backward(spec_text, tmp_path / "documents_both_ways.attn", monkeypatch)
    given, params = draw("document_mask", 2, 8, 1000, 128, torch.bfloat16, "cuda")
    gen = torch.Generator().manual_seed(documents)
    doc = torch.randint(0, documents, (2, 1000), generator=gen).sort(dim=-1).values
    given["doc"] = doc.to("cuda", torch.int32)
    verdicts = gradient_verdicts(
        "document_mask", given, params, "cuda", "cuda", ("q", "k", "v"), spec=spec
    )
    failing = {n: v for n, v in verdicts.items() if not v.ok}
    assert not failing, failing
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize(("keys", "head_dim"), [(1024, 64), (2048, 128), (512, 128)])
@pytest.mark.parametrize("name", ["causal", "gqa_causal"])
def test_the_default_backward_backend(
    name: str, keys: int, head_dim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unasked (ATTNCC_BACKWARD unset), an sm_90 GPU runs the sm_90a backward at head dims
    64 and 128 from 1024 keys, where it is ahead, and the Triton backward below, where that
    is as fast; both by flash-attn's rule."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a backward needs an sm_90 GPU")
    monkeypatch.delenv("ATTNCC_BACKWARD", raising=False)
    given, params = draw(name, 1, 8, keys, head_dim, torch.bfloat16, "cuda")
    as_fast = (
        "below 1024 keys the Triton backward is as fast, and head dims other than 64 and 128"
        " are not measured (ATTNCC_BACKWARD=cuda asks for this one)"
    )
    expected = "cuda" if keys >= 1024 else f"triton: {as_fast}"
    verdicts = gradient_verdicts(name, given, params, target="cuda", backend=expected)
    failing = {n: v for n, v in verdicts.items() if not v.ok}
    assert not failing, failing


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("name", "head_dim"),
    [
        ("document_mask", 64),
        ("causal", 64),
        ("causal", 128),
        ("gqa_causal", 64),
        ("alibi", 64),
        ("bias", 64),
    ],
)
def test_a_backward_never_waits_for_the_gpu(name: str, head_dim: int) -> None:
    """No step of a backward synchronises the host with the device (a copy from a host
    list, a value read back): each would hold the CPU until the GPU's queue drains, so
    kernels and host work no longer overlap. CUDA's sync debug mode raises on any; causal
    at head dim 128 and 2048 keys takes the sm_90a backward on an H100 or H200."""
    seq = 2048 if head_dim == 128 else 256
    given, params = draw(name, 2, 4, seq, head_dim, torch.bfloat16, "cuda")
    kernel = attncc.compile(EXAMPLES / f"{name}.attn")
    floats = [n for n in kernel.input_names if given[n].is_floating_point()]
    for n in floats:
        given[n].requires_grad_(True)
    out = kernel(**given, **params)
    grad = torch.randn_like(out)
    torch.autograd.grad(out, [given[n] for n in floats], grad, retain_graph=True)  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.autograd.grad(out, [given[n] for n in floats], grad, retain_graph=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("wrapper", ["torch.compile", "checkpoint"])
def test_the_sm90a_backward_traced_and_checkpointed(
    wrapper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default sm_90a backward (target auto, causal, head dim 128, 2048 keys) under
    torch.compile(fullgraph=True) and torch.utils.checkpoint gives the eager call's
    gradients: dK and dV bit for bit (each written once by one block), dQ within one bf16
    step of its largest value (its float32 sums are added in any order)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a backward needs an sm_90 GPU")
    monkeypatch.setenv("ATTNCC_TARGET", "auto")  # the suite's default is triton
    monkeypatch.delenv("ATTNCC_BACKWARD", raising=False)
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    gen = torch.Generator().manual_seed(11)
    inputs = [torch.randn(1, 4, 2048, 128, generator=gen).bfloat16().cuda() for _ in range(3)]
    grad = torch.randn(1, 4, 2048, 128, generator=gen).bfloat16().cuda()

    def layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return kernel(q, k, v)

    def gradients(fn: Any) -> tuple[torch.Tensor, ...]:
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        return torch.autograd.grad(fn(*leaves), leaves, grad)

    eager = gradients(layer)
    assert autograd.last_backend() == "cuda", autograd.last_backend()
    if wrapper == "torch.compile":
        wrapped = gradients(torch.compile(layer, fullgraph=True))
    else:
        wrapped = gradients(lambda *a: checkpoint(layer, *a, use_reentrant=False))
    assert autograd.last_backend() == "cuda", autograd.last_backend()
    dq, dk, dv = wrapped
    assert torch.equal(dk, eager[1]) and torch.equal(dv, eager[2])
    step = eager[0].abs().max().item() * 2**-7
    assert (dq - eager[0]).abs().max().item() <= step


@pytest.mark.gpu
@pytest.mark.parametrize("eager_first", [False, True])
@pytest.mark.parametrize("name", ["causal", "document_mask"])
def test_the_sm90a_backward_in_a_cuda_graph(
    name: str, eager_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forward and backward captured in a CUDA graph (as torch.compile's reduce-overhead mode
    and hand-written training steps do) and replayed on new inputs copied into the captured
    ones: the replay's gradients are those of an eager call on the same inputs (dK and dV bit
    for bit, dQ within one bf16 step of its largest value), the sm_90a backward having run.
    `eager_first`: a step on the default stream before the side stream's warm-up, on a
    length of its own (2176), so that it builds the default stream's launch plans: the
    sm_90a plan once held the lse of the call that built it, whose grad_fn kept that step's
    gradient accumulators (on the default stream) alive, and the capture then failed
    ("operation would make the legacy stream depend on a capturing blocking stream"). With
    2048, the other case's last eager step had built them first."""
    seq = 2176 if eager_first else 2048
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a backward needs an sm_90 GPU")
    monkeypatch.setenv("ATTNCC_TARGET", "auto")  # the suite's default is triton
    monkeypatch.delenv("ATTNCC_BACKWARD", raising=False)
    kernel = attncc.compile(EXAMPLES / f"{name}.attn")
    given, _ = draw(name, 1, 4, seq, 128, torch.bfloat16, "cuda")
    leaves = [given[n].clone().requires_grad_(True) for n in ("q", "k", "v")]
    extra = [given[n] for n in kernel.input_names if n not in ("q", "k", "v")]
    grad = torch.randn_like(given["q"])

    def step() -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(kernel(*leaves, *extra), leaves, grad)

    if eager_first:
        step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # first calls compile and record their launches outside capture
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    assert autograd.last_backend() == "cuda", autograd.last_backend()
    fresh, _ = draw(name, 1, 4, seq, 128, torch.bfloat16, "cuda")
    fresh = {n: t.flip(2) if n in ("q", "k", "v") else t for n, t in fresh.items()}
    with torch.no_grad():
        for leaf, n in zip(leaves, ("q", "k", "v"), strict=True):
            leaf.copy_(fresh[n])
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    dq, dk, dv = captured
    assert torch.equal(dk, eager[1]) and torch.equal(dv, eager[2])
    step_size = eager[0].abs().max().item() * 2**-7
    assert (dq - eager[0]).abs().max().item() <= step_size


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["alibi", "bias"])
def test_a_repeated_backward_with_side_gradients_replays(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A side input requiring grad (ALiBi's learnt slopes, a bias) takes the Triton
    backward; a repeat of it replays the recorded launches and the side buffers' recipes,
    and gives the first call's gradients (each within one bf16 step of its largest)."""
    monkeypatch.setenv("ATTNCC_TARGET", "auto")  # the suite's default is triton
    kernel = attncc.compile(EXAMPLES / f"{name}.attn")
    given, params = draw(name, 1, 4, 1024, 128, torch.bfloat16, "cuda")
    leaves = {n: t.clone().requires_grad_(t.is_floating_point()) for n, t in given.items()}
    out = kernel(**leaves, **params)
    grad = torch.randn_like(out)
    inputs = [t for t in leaves.values() if t.requires_grad]
    assert len(inputs) == 4
    first = torch.autograd.grad(out, inputs, grad, retain_graph=True)
    backward = kernel._backward
    assert isinstance(backward, autograd.Backward) and len(backward._repeats) == 1
    replayed = note_replays(monkeypatch)
    second = torch.autograd.grad(out, inputs, grad, retain_graph=True)
    assert replayed == [True]
    assert autograd.last_backend().startswith("triton"), autograd.last_backend()
    for got, want in zip(second, first, strict=True):
        step = want.abs().max().item() * 2**-7
        assert (got.float() - want.float()).abs().max().item() <= step


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("name", ["causal", "gqa_causal", "document_mask"])
def test_a_repeated_backward_takes_its_recorded_call(
    name: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backward like an earlier one (same inputs' geometry, needed gradients, dO layout)
    replays its recorded call (Backward's repeats), on either backend: its gradients are
    the first call's (dK and dV bit for bit, dQ within one bf16 step); a dO of another
    layout (transposed, or off 16-byte alignment), or fewer inputs requiring grad, never
    reuses it and still gets the right gradients."""
    if backend == "cuda" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a backward needs an sm_90 GPU")
    monkeypatch.setenv("ATTNCC_TARGET", "auto")  # the suite's default is triton
    monkeypatch.setenv("ATTNCC_BACKWARD", backend)
    kernel = attncc.compile(EXAMPLES / f"{name}.attn")
    given, _ = draw(name, 1, 4, 2048, 128, torch.bfloat16, "cuda")
    leaves = [given[n].clone().requires_grad_(True) for n in ("q", "k", "v")]
    extra = [given[n] for n in kernel.input_names if n not in ("q", "k", "v")]
    out = kernel(*leaves, *extra)
    grad = torch.randn_like(out)
    backward = kernel._backward
    assert isinstance(backward, autograd.Backward)

    def close(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
        assert autograd.last_backend().startswith(backend), autograd.last_backend()
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
        step = want[0].abs().max().item() * 2**-7
        assert (got[0] - want[0]).abs().max().item() <= step

    first = torch.autograd.grad(out, leaves, grad, retain_graph=True)
    assert len(backward._repeats) == 1
    close(torch.autograd.grad(out, leaves, grad, retain_graph=True), first)
    # dO with the other strides: copied to the output's by the full path
    transposed = grad.transpose(1, 2).contiguous().transpose(1, 2)
    close(torch.autograd.grad(out, leaves, transposed, retain_graph=True), first)
    # dO off 16-byte alignment: the Triton backward
    shifted = torch.empty(grad.numel() + 1, dtype=grad.dtype, device=grad.device)[1:]
    shifted = shifted.view_as(grad).copy_(grad)
    again = torch.autograd.grad(out, leaves, shifted, retain_graph=True)
    assert autograd.last_backend().startswith("triton"), autograd.last_backend()
    for got, want in zip(again, first, strict=True):
        step = want.abs().max().item() * 2**-6
        assert (got - want).abs().max().item() <= step
    # only K requiring grad: a call of its own, the other gradients not computed
    (dk,) = torch.autograd.grad(kernel(given["q"], leaves[1], given["v"], *extra), leaves[1], grad)
    assert torch.equal(dk, first[1])
    assert len(backward._repeats) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_a_training_step_on_the_gpu_frees_its_inputs(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first step of a geometry builds the backward's launch plans, which outlive it;
    they hold no tensor of that step (the sm_90a plan once held its lse, whose grad_fn
    reaches the inputs' gradient accumulators, so it kept the step's inputs alive), and
    nothing is left in a reference cycle: with the garbage collector off, the inputs, the
    output and the log-sum-exp are freed once out of scope (tests/kernels/
    test_backward_tiny.py checks the same of every example on the CPU)."""
    if backend == "cuda" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a backward needs an sm_90 GPU")
    monkeypatch.setenv("ATTNCC_TARGET", "auto")  # the suite's default is triton
    monkeypatch.setenv("ATTNCC_BACKWARD", backend)
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(2):  # a geometry of this test's own: its first step, then a repeat
            leaves = [
                torch.randn(1, 8, 2240, 128, device="cuda", dtype=torch.bfloat16).requires_grad_()
                for _ in range(3)
            ]
            out, lse = kernel(*leaves, return_lse=True)
            (out.float().sum() + lse.sum()).backward()
            assert autograd.last_backend().startswith(backend), autograd.last_backend()
            freed = [weakref.ref(t) for t in (*leaves, out, lse)]
            del leaves, out, lse
            assert all(ref() is None for ref in freed)
    finally:
        if enabled:
            gc.enable()
