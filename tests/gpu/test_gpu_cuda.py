"""The CUDA target on a GPU: every example against the float64 reference (both schedules),
the fp32 path, strided inputs, the few-query dispatch and CUDA graphs (torch.compile of both
targets: tests/gpu/test_gpu.py).

Run on the device by benchmarks/gpu_suite.sh; without a GPU every test here is skipped.
Each (float type, padded head dim, kernel set) is one NVRTC compile (cached on disk), so
trial counts stay small.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import attncc
from attncc.checking import check, table
from attncc.passes.schedule import split_kv_blocker
from attncc.reference import reference

pytestmark = pytest.mark.gpu

EXAMPLE_DIR = Path(__file__).parents[2] / "examples"
EXAMPLES = sorted(str(p) for p in EXAMPLE_DIR.glob("*.attn"))


@pytest.mark.parametrize("schedule", ["fused", "split_kv"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_cuda_example_matches_reference(path: str, schedule: str) -> None:
    _, lowered = attncc.optimise(path)
    if schedule == "split_kv" and split_kv_blocker(lowered):
        pytest.skip(f"split_kv cannot run this spec: {split_kv_blocker(lowered)}")
    if lowered.sink is not None:  # the CUDA kernels have no sink term: refused, never dropped
        with pytest.raises(ValueError, match="target cuda has no softmax sink yet"):
            attncc.compile(path, target="cuda", schedule=schedule)  # type: ignore[arg-type]
        return
    if lowered.fp8:  # fused only (split_kv_blocker above says so for split-KV)
        # the sm_90a FP8 kernel takes head dims up to 128 and quantize's key-major V, which
        # check's drawn shapes and layouts are not: its own test below checks it on
        # quantize's output (test_fp8_kernel_matches_the_triton_fp8_kernel_within_its_error)
        assert attncc.compile(path, target="cuda").target == "cuda"
        return
    kernel = attncc.compile(path, target="cuda", schedule=schedule)  # type: ignore[arg-type]
    max_len = 120 if schedule == "split_kv" else 700
    results = check(kernel, trials=3, seed=11, device="cuda", max_len=max_len)
    assert all(r.ok for r in results), table(results)


@pytest.mark.parametrize("name", ["causal", "document_mask", "decode", "paged_decode"])
def test_cuda_long_sequences(name: str) -> None:
    kernel = attncc.compile(EXAMPLE_DIR / f"{name}.attn", target="cuda")
    results = check(kernel, trials=2, seed=5, device="cuda", dtypes=(torch.bfloat16,), max_len=1500)
    assert all(r.ok for r in results), table(results)


@pytest.mark.parametrize("head_dim", [16, 40, 64, 96, 128, 200, 256])
def test_cuda_head_dims_and_dtypes(head_dim: int) -> None:
    kernel = attncc.compile(EXAMPLE_DIR / "causal.attn", target="cuda")
    expected_fn = reference(kernel.spec)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        q, k, v = (torch.randn(2, 3, 77, head_dim, device="cuda", dtype=dtype) for _ in range(3))
        out, lse = kernel(q, k, v, return_lse=True)
        exp_out, exp_lse = expected_fn(q.cpu(), k.cpu(), v.cpu(), return_lse=True)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        assert (out.double().cpu() - torch.from_numpy(exp_out)).abs().max() < tol, (dtype, head_dim)
        assert (lse.double().cpu() - torch.from_numpy(exp_lse)).abs().max() < 1e-3


@pytest.mark.parametrize(("head_dim", "value_dim"), [(192, 128), (128, 256), (160, 160)])
def test_cuda_value_dims_of_their_own(head_dim: int, value_dim: int) -> None:
    """examples/mla_causal.attn (MLA's 192 / 128) on the sm_90a kernel: past 128, head dims
    pad to its 64-column blocks (160 runs as 192), each of Q/K's and V's apart."""
    kernel = attncc.compile(EXAMPLE_DIR / "mla_causal.attn", target="cuda")
    expected_fn = reference(kernel.spec)
    gen = torch.Generator(device="cuda").manual_seed(7)
    for dtype in (torch.bfloat16, torch.float16):
        q, k = (
            torch.randn(2, 3, 300, head_dim, device="cuda", dtype=dtype, generator=gen)
            for _ in "qk"
        )
        v = torch.randn(2, 3, 300, value_dim, device="cuda", dtype=dtype, generator=gen)
        host = kernel._host
        tensors, params = host._bind([q, k, v], {})
        assert host._takes_wgmma(tensors, *host._check(tensors, params))
        out = kernel(q, k, v)
        expected = torch.from_numpy(expected_fn(q.cpu(), k.cpu(), v.cpu()))
        assert out.shape == (2, 3, 300, value_dim)
        assert (out.double().cpu() - expected).abs().max() < 3e-2, (dtype, head_dim, value_dim)


@pytest.mark.parametrize("scale", [-0.2, 0.0, 0.09, 1.0])
def test_cuda_prefill_scale_in_exp(scale: float) -> None:
    # without score modifications the prefill kernel keeps raw dot products and scales inside
    # exp2: a negative scale flips Q, a zero one must not turn masked -inf into NaN, and a
    # large one (scores of std 11) moves the running max by many 2^8 steps
    kernel = attncc.compile(EXAMPLE_DIR / "causal.attn", target="cuda")
    expected_fn = reference(kernel.spec)
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (
        torch.randn(2, 3, 700, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        for _ in range(3)
    )
    out, lse = kernel(q, k, v, scale=scale, return_lse=True)
    exp_out, exp_lse = expected_fn(q.cpu(), k.cpu(), v.cpu(), scale=scale, return_lse=True)
    exp_lse_t = torch.from_numpy(exp_lse)
    assert (out.double().cpu() - torch.from_numpy(exp_out)).abs().max() < 3e-2, scale
    lse_bound = 1e-3 * (1.0 + exp_lse_t.abs().max().item())  # fp32 sums of exact bf16 products
    assert (lse.double().cpu() - exp_lse_t).abs().max() < lse_bound, scale


def test_cuda_strided_and_unaligned_inputs_take_the_scalar_loads() -> None:
    kernel = attncc.compile(EXAMPLE_DIR / "gqa_causal.attn", target="cuda")
    wide = torch.randn(1, 4, 50, 70, device="cuda", dtype=torch.bfloat16)
    q = wide[..., 1:65]  # misaligned start, row stride 70
    k = torch.randn(1, 2, 64, 50, device="cuda", dtype=torch.bfloat16).transpose(2, 3)
    v = torch.randn(1, 2, 50, 64, device="cuda", dtype=torch.bfloat16)
    out = kernel(q, k, v)
    expected = reference(kernel.spec)(q.cpu(), k.cpu(), v.cpu())
    assert (out.double().cpu() - torch.from_numpy(expected)).abs().max() < 3e-2


def test_cuda_matches_triton_on_decode_and_prefill() -> None:
    for name, shape in (("decode", None), ("gqa_causal", (2, 8, 300, 128))):
        cuda = attncc.compile(EXAMPLE_DIR / f"{name}.attn", target="cuda")
        triton = attncc.compile(EXAMPLE_DIR / f"{name}.attn", target="triton")
        if name == "decode":
            q = torch.randn(4, 32, 128, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(4, 3000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
            lens = torch.tensor([1, 700, 2999, 3000], device="cuda", dtype=torch.int32)
            args: tuple[torch.Tensor, ...] = (q, k, v, lens)
        else:
            assert shape is not None
            q = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
            kv = (shape[0], 2, shape[2], shape[3])
            args = (
                q,
                torch.randn(kv, device="cuda", dtype=torch.bfloat16),
                torch.randn(kv, device="cuda", dtype=torch.bfloat16),
            )
        a, b = cuda(*args), triton(*args)
        assert (a.float() - b.float()).abs().max() < 2e-2, name


def test_auto_target_runs_cuda_where_it_is_faster_and_triton_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """target "auto" (the default) on an H100/H200: CUDA for fused prefill (a tile index
    too), Triton for decode; an auto CUDA kernel's calls without an sm_90a kernel (fp32,
    head dim 288) or with fewer query tiles than multiprocessors run the Triton kernel,
    built on the first of them. Every call matches the reference."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("auto picks the CUDA target on sm_90 GPUs only")
    monkeypatch.delenv("ATTNCC_TARGET", raising=False)  # the suite's conftest pins triton
    kernel = attncc.compile(EXAMPLE_DIR / "causal.attn")
    assert kernel.target == "cuda"
    assert attncc.compile(EXAMPLE_DIR / "document_mask.attn").target == "cuda"
    assert attncc.compile(EXAMPLE_DIR / "decode.attn").target == "triton"
    gen = torch.Generator().manual_seed(2)
    cases = ((torch.bfloat16, 128, 600), (torch.bfloat16, 256, 600), (torch.float32, 64, 600))
    cases += ((torch.bfloat16, 288, 600),)
    # 8 x 16 x 600 queries: 640 tiles of 128 rows, over three for each of 132 multiprocessors
    # (causal: with fewer the Triton kernel, its tiles in pairs, is faster); 2 x 3 x 300 (18
    # tiles) goes to Triton even where the sm_90a kernels could take it
    cases += ((torch.bfloat16, 128, 300),)
    for index, (dtype, head_dim, rows) in enumerate(cases):
        batch, heads = (8, 16) if rows == 600 else (2, 3)
        qkv = [torch.randn(batch, heads, rows, head_dim, generator=gen).to(dtype) for _ in "qkv"]
        out = kernel(*(t.cuda() for t in qkv))
        expected = torch.from_numpy(reference(kernel.spec)(*qkv))
        error = (out.double().cpu() - expected).abs().max().item()
        assert error < 3e-2, (dtype, head_dim, error)
        # the first two calls (bf16, head dims 128 and 256, 640 tiles) ran the sm_90a kernel,
        # the others Triton
        on_cuda = dtype == torch.bfloat16 and head_dim <= 256 and rows == 600
        assert (kernel._fallback_kernel is None) == (index < 2)
        backend = kernel.backend_for(*(t.cuda() for t in qkv))
        assert backend == ("cuda" if on_cuda else "triton")


def test_cuda_graph_capture() -> None:
    # torch.compile of the CUDA target: tests/gpu/test_gpu.py, parametrized by target
    decode = attncc.compile(EXAMPLE_DIR / "decode.attn", target="cuda")
    dq = torch.randn(2, 32, 128, device="cuda", dtype=torch.bfloat16)
    dk, dv = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    lens = torch.tensor([1000, 1024], device="cuda", dtype=torch.int32)
    eager = decode(dq, dk, dv, lens)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        decode(dq, dk, dv, lens)  # warm up on the capture stream
        with torch.cuda.graph(graph, stream=stream):
            captured = decode(dq, dk, dv, lens)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_cuda_launch_plans_serve_repeated_calls() -> None:
    """A call like an earlier one reuses its launch plan with its own data: fresh tensors
    share one plan; int64 document ids (converted per call), a K of other strides and
    another stream each take a plan of their own; a CUDA graph captured on the plan path
    (the C launcher's replay of it) replays the eager result. Every output against the
    reference."""
    kernel = attncc.compile(EXAMPLE_DIR / "document_mask.attn", target="cuda")
    module = kernel.module(False)
    module._PLANS.clear()
    expected_fn = reference(kernel.spec)
    gen = torch.Generator(device="cuda").manual_seed(7)

    def inputs(ids: torch.dtype = torch.int32) -> tuple[torch.Tensor, ...]:
        q, k, v = (
            torch.randn(2, 4, 300, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(3)
        )
        doc = torch.randint(0, 3, (2, 300), device="cuda", generator=gen).sort(dim=1).values
        return q, k, v, doc.to(ids)

    def assert_close(out: torch.Tensor, args: tuple[torch.Tensor, ...]) -> None:
        expected = torch.from_numpy(expected_fn(*(a.cpu() for a in args)))
        assert (out.double().cpu() - expected).abs().max() < 3e-2

    for _ in range(3):
        args = inputs()
        assert_close(kernel(*args), args)
    assert len(module._PLANS) == 1
    # the later calls went from their bound inputs to the launches in one C call
    assert len(kernel._replays) == 1
    # K's and V's maps move to each call's tensors by their address word, found from the
    # driver's own encodings (tensor_map.address_field), not encoded again
    (plan,) = module._PLANS._plans.values()
    assert plan.maps and plan.fields and len(plan.fields) == len(plan.maps)
    args = inputs(torch.int64)
    assert_close(kernel(*args), args)
    q, k, v, doc = inputs()
    args = (q, k.transpose(1, 2).contiguous().transpose(1, 2), v, doc)
    assert_close(kernel(*args), args)
    assert_close(kernel(*args), args)
    assert len(module._PLANS) == 3
    # converted document ids keep the plan's Python (a conversion a call); the other K
    # strides are a replay of their own
    assert len(kernel._replays) == 2
    stream = torch.cuda.Stream()
    args = inputs()
    with torch.cuda.stream(stream):
        kernel(*args)  # a plan for this stream, outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = kernel(*args)
    assert len(module._PLANS) == 4 and len(kernel._replays) == 3
    graph.replay()
    torch.cuda.synchronize()
    assert_close(captured, args)
    assert torch.equal(captured, kernel(*args))


# ----------------------------------------------------------------------------- split-KV decode
# The tensor-core split-KV kernel streams each chunk with several warps, merges them in shared
# memory and merges the chunks in the last program to finish (an arrival counter per (batch
# entry, kv head, 16 rows)); these shapes reach one chunk and the most, head dims 64/128/256
# (their warp and stage configurations), rows past one 16-row tile, and empty caches.


def _assert_matches_reference(
    kernel: Any, args: tuple[torch.Tensor, ...], tol: float = 3e-2
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = kernel(*args, return_lse=True)
    exp_out, exp_lse = reference(kernel.spec)(*(a.cpu() for a in args), return_lse=True)
    exp_out, exp_lse = torch.from_numpy(exp_out), torch.from_numpy(exp_lse)
    assert (out.double().cpu() - exp_out).abs().max() < tol
    seen = torch.isfinite(exp_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), seen)  # no visible key: lse -inf, never NaN
    assert (lse.double().cpu()[seen] - exp_lse[seen]).abs().max() < 1e-2
    return out, lse


@pytest.mark.parametrize(
    ("lens", "head_dim", "keys"),
    [
        ((5000,), 128, 5000),
        ((0, 17, 2100), 64, 2100),
        ((695, 300), 256, 700),
        ((4096, 4095, 2000, 1), 128, 4096),
    ],
)
def test_cuda_decode_split_merge(lens: tuple[int, ...], head_dim: int, keys: int) -> None:
    kernel = attncc.compile(EXAMPLE_DIR / "decode.attn", target="cuda")
    batch = len(lens)
    q = torch.randn(batch, 32, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (
        torch.randn(batch, keys, 8, head_dim, device="cuda", dtype=torch.bfloat16) for _ in "kv"
    )
    cache_len = torch.tensor(lens, device="cuda", dtype=torch.int32)
    out, lse = _assert_matches_reference(kernel, (q, k, v, cache_len))
    if 0 in lens:
        assert not out[lens.index(0)].any()
    # the counters are zero again after a call: the next one merges the same way
    again, again_lse = kernel(q, k, v, cache_len, return_lse=True)
    assert torch.equal(again, out) and torch.equal(again_lse, lse)


def test_cuda_decode_never_reads_keys_past_the_cache() -> None:
    """Keys no row sees are zero-filled, not loaded: NaN past cache_len (an unwritten cache)
    and page-table entries past it (padding) change nothing."""
    decode = attncc.compile(EXAMPLE_DIR / "decode.attn", target="cuda")
    q = torch.randn(2, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 3000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    lens = torch.tensor([1234, 2999], device="cuda", dtype=torch.int32)
    clean = decode(q, k, v, lens)
    for b, n in enumerate(lens.tolist()):
        k[b, n:] = float("nan")
        v[b, n:] = float("nan")
    assert torch.equal(decode(q, k, v, lens), clean)

    paged = attncc.compile(EXAMPLE_DIR / "paged_decode.attn", target="cuda")
    pages, page = 64, 16
    k_pages, v_pages = (
        torch.randn(pages, page, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv"
    )
    table = torch.randperm(pages, device="cuda", dtype=torch.int32)[:48].reshape(2, 24)
    lens = torch.tensor([100, 377], device="cuda", dtype=torch.int32)
    clean = paged(q, k_pages, v_pages, table, lens)
    _assert_matches_reference(paged, (q, k_pages, v_pages, table, lens))
    for b, n in enumerate(lens.tolist()):
        table[b, -(-n // page) :] = 1 << 30
    assert torch.equal(paged(q, k_pages, v_pages, table, lens), clean)


def test_cuda_speculative_decode_rows_past_one_tile() -> None:
    # 4 query heads a kv head x 8 draft tokens: 32 rows, two 16-row programs a chunk
    kernel = attncc.compile(EXAMPLE_DIR / "speculative_decode.attn", target="cuda")
    q = torch.randn(2, 32, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    lens = torch.tensor([8, 3999], device="cuda", dtype=torch.int32)
    _assert_matches_reference(kernel, (q, k, v, lens))


def test_cuda_decode_strided_cache_takes_the_scalar_loads() -> None:
    kernel = attncc.compile(EXAMPLE_DIR / "decode.attn", target="cuda")
    q = torch.randn(2, 128, 32, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 900, 8, 130, device="cuda", dtype=torch.bfloat16)[..., 1:129]  # unaligned
    v = torch.randn(2, 8, 900, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    lens = torch.tensor([900, 450], device="cuda", dtype=torch.int32)
    _assert_matches_reference(kernel, (q, k, v, lens))


def _wgmma_probes(*names: str) -> list[Any]:
    """The probe kernels ``names`` of wgmma_probe.cu.jinja, compiled for sm_90a."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 GPU (H100/H200)")
    from attncc.codegen.cuda import render_wgmma_probe
    from attncc.runtime import nvrtc

    source = render_wgmma_probe()
    key = nvrtc.source_key(source)
    return list(nvrtc.kernels(source, key, (), names, torch.device("cuda"), "a"))


def test_wgmma_probe_matches_a_matmul() -> None:
    """The Hopper primitives (templates/cuda/wgmma.cu.jinja: 128-byte swizzled K-major tiles,
    their matrix descriptors, wgmma m64n64k16 and its accumulator layout) give A * B^T: the
    first step of the warp-specialized schedule in docs/design.md."""
    from attncc.runtime import nvrtc

    (probe,) = _wgmma_probes("attncc_wgmma_probe")
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(64, 128, generator=gen).bfloat16().cuda() for _ in range(2))
    c = torch.full((64, 64), float("nan"), device="cuda")
    args = [nvrtc.pointer(a), nvrtc.pointer(b), nvrtc.pointer(c)]
    nvrtc.launch(probe, (1, 1, 1), (128, 1, 1), args, torch.device("cuda"))
    torch.cuda.synchronize()
    expected = a.float() @ b.float().T
    assert (c - expected).abs().max().item() < 1e-3


def test_wgmma_pv_probe_matches_a_matmul() -> None:
    """P from registers (the accumulator layout packed to bf16 pairs) times V MN-major in
    shared memory (wgmma m64n128k16, tnspB): P * V. The descriptor's byte offsets are the
    kernel's arguments; where the layout assumed in wgmma.cu.jinja (8192 bytes between
    64-column blocks, 1024 between 8-key groups) fails, the message says whether the swapped
    reading holds, so one device call settles it."""
    from attncc.runtime import nvrtc

    (probe,) = _wgmma_probes("attncc_wgmma_pv_probe")
    gen = torch.Generator().manual_seed(1)
    p = torch.rand(64, 64, generator=gen).bfloat16().cuda()
    v = torch.randn(64, 128, generator=gen).bfloat16().cuda()
    expected = p.float() @ v.float()

    def error(leading: int, stride: int) -> float:
        o = torch.full((64, 128), float("nan"), device="cuda")
        args = [nvrtc.pointer(p), nvrtc.pointer(v), nvrtc.pointer(o)]
        args += [nvrtc.int32(leading), nvrtc.int32(stride)]
        nvrtc.launch(probe, (1, 1, 1), (128, 1, 1), args, torch.device("cuda"))
        torch.cuda.synchronize()
        return float((o - expected).abs().max().item())

    assumed = error(64 * 128, 1024)
    if not assumed < 1e-3:
        swapped = error(1024, 64 * 128)
        raise AssertionError(f"P * V off by {assumed:.3g}; with the offsets swapped: {swapped:.3g}")


def test_wgmma_fp8_probe_matches_a_matmul() -> None:
    """e4m3 operands K-major in 128-byte swizzled lines (128 elements a line), wgmma
    m64n128k32: A * B^T of the FP8 values, summed in float32."""
    from attncc.runtime import nvrtc

    (probe,) = _wgmma_probes("attncc_wgmma_fp8_probe")
    gen = torch.Generator().manual_seed(2)
    a = (torch.randn(64, 128, generator=gen) * 4).to(torch.float8_e4m3fn).cuda()
    b = (torch.randn(128, 128, generator=gen) * 4).to(torch.float8_e4m3fn).cuda()
    c = torch.full((64, 128), float("nan"), device="cuda")
    args = [nvrtc.pointer(a), nvrtc.pointer(b), nvrtc.pointer(c)]
    nvrtc.launch(probe, (1, 1, 1), (128, 1, 1), args, torch.device("cuda"))
    torch.cuda.synchronize()
    expected = a.double() @ b.double().T
    # Hopper sums FP8 products with fewer bits than float32 (2^-13 or so of the sum, measured
    # 3.6e-5 of the largest here); a misplaced element is off by its whole size
    error = (c.double() - expected).abs().max().item() / expected.abs().max().item()
    assert error <= 1e-3, error


def test_wgmma_fp8_pv_probe_matches_a_matmul() -> None:
    """P from registers, rounded to e4m3 and moved from the accumulator layout to the FP8 A
    layout (e4m3_a_fragment's shuffles), times V key-major (wgmma m64n128k32): P * V of the
    rounded P. A key landing in the wrong place shows as a large error."""
    from attncc.runtime import nvrtc

    (probe,) = _wgmma_probes("attncc_wgmma_fp8_pv_probe")
    gen = torch.Generator().manual_seed(3)
    p = torch.rand(64, 128, generator=gen).cuda()
    vt = (torch.randn(128, 128, generator=gen) * 4).to(torch.float8_e4m3fn).cuda()
    o = torch.full((64, 128), float("nan"), device="cuda")
    args = [nvrtc.pointer(p), nvrtc.pointer(vt), nvrtc.pointer(o)]
    nvrtc.launch(probe, (1, 1, 1), (128, 1, 1), args, torch.device("cuda"))
    torch.cuda.synchronize()
    expected = p.to(torch.float8_e4m3fn).double() @ vt.double().T
    error = (o.double() - expected).abs().max().item() / expected.abs().max().item()
    assert error <= 1e-3, error  # the FP8 sums' precision, as in the probe above


@pytest.mark.parametrize("name", ["fp8_block", "fp8_causal"])
# keys a multiple of 16: quantize's key-major V then has 16-byte strides, as a tensor map needs
@pytest.mark.parametrize(("rows", "keys"), [(1000, 1024), (200, 704), (384, 256)])
def test_fp8_kernel_matches_the_triton_fp8_kernel_within_its_error(
    name: str, rows: int, keys: int
) -> None:
    """The CUDA target's FP8 kernel (e4m3 wgmma, P packed by e4m3_a_fragment, V key-major
    through its tensor map, the value scale a tile) on quantize's output: within the FP8
    error of the Triton target's FP8 kernel (both against float64 of the unquantised
    inputs), ragged lengths included; the causal mask where the spec has it."""
    import math

    from attncc.fp8 import quantize

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the CUDA FP8 kernel needs an sm_90 GPU (H100/H200)")
    gen = torch.Generator(device="cuda").manual_seed(rows + keys)
    q = torch.randn(2, 3, rows, 128, device="cuda", generator=gen)
    k, v = (torch.randn(2, 3, keys, 128, device="cuda", generator=gen) for _ in range(2))
    x = quantize(q, k, v, block=(128, 128))
    args = (x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale)
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.attn"
    cuda = attncc.compile(path, target="cuda")(*args)
    triton_out = attncc.compile(path, target="triton")(*args)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(128)
    if name == "fp8_causal":
        mask = torch.ones(rows, keys, dtype=torch.bool, device="cuda").tril()
        s = s.masked_fill(~mask, float("-inf"))
    exact = torch.softmax(s, -1).nan_to_num() @ v.double()

    def rmse(out: torch.Tensor) -> float:
        return float((out.double() - exact).pow(2).mean().sqrt())

    assert cuda.dtype == torch.bfloat16 and torch.isfinite(cuda).all()
    assert rmse(cuda) <= 1.1 * rmse(triton_out) + 1e-4, (rmse(cuda), rmse(triton_out))


def test_fp8_kernel_zero_value_scale_adds_nothing() -> None:
    """A key block whose value descale is 0 adds nothing to P·V and still counts in the
    normaliser (as the Triton FP8 kernel), the first tile of a head included; value scales
    far apart (a factor 8 between blocks) move O's unit without losing accuracy."""
    import dataclasses
    import math

    from attncc.fp8 import quantize

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the CUDA FP8 kernel needs an sm_90 GPU (H100/H200)")
    gen = torch.Generator(device="cuda").manual_seed(9)
    q, k = (torch.randn(1, 2, 512, 128, device="cuda", generator=gen) for _ in range(2))
    v = torch.randn(1, 2, 512, 128, device="cuda", generator=gen)
    v[:, :, 256:384] *= 8.0  # a block with a value scale 8x its neighbours'
    x = quantize(q, k, v, block=(128, 128))
    x = dataclasses.replace(x, v_descale=x.v_descale.clone())
    x.v_descale[:, :, 1] = 0.0
    x.v_descale[:, 1, 0] = 0.0
    args = (x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale)
    path = Path(__file__).resolve().parents[2] / "examples" / "fp8_block.attn"
    cuda = attncc.compile(path, target="cuda")(*args)
    triton_out = attncc.compile(path, target="triton")(*args)
    kept = x.v_descale.repeat_interleave(128, -1)[..., None] != 0
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(128)
    exact = torch.softmax(s, -1) @ (v.double() * kept)

    def rmse(out: torch.Tensor) -> float:
        return float((out.double() - exact).pow(2).mean().sqrt())

    assert torch.isfinite(cuda).all()
    assert rmse(cuda) <= 1.1 * rmse(triton_out) + 1e-4, (rmse(cuda), rmse(triton_out))


def assert_fp8_within_triton_error(name: str, x: Any) -> None:
    """The CUDA FP8 kernel on ``x`` (attncc.fp8.quantize's, block (128, 128), descales as
    given) gives the attention of the dequantised inputs within 1.1x the Triton FP8
    kernel's error of it (float64, causal for fp8_causal)."""
    import math

    args = (x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale)
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.attn"
    cuda = attncc.compile(path, target="cuda")(*args)
    triton_out = attncc.compile(path, target="triton")(*args)

    def dequantised(t: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
        return t.double() * descale.double().repeat_interleave(128, -1)[..., None]

    s = dequantised(x.q, x.q_descale) @ dequantised(x.k, x.k_descale).transpose(-1, -2)
    s = s / math.sqrt(x.q.shape[-1])
    if name == "fp8_causal":
        rows, keys = s.shape[-2:]
        mask = torch.ones(rows, keys, dtype=torch.bool, device="cuda").tril()
        s = s.masked_fill(~mask, float("-inf"))
    exact = torch.softmax(s, -1) @ dequantised(x.v, x.v_descale)

    def rmse(out: torch.Tensor) -> float:
        return float((out.double() - exact).pow(2).mean().sqrt())

    assert torch.isfinite(cuda).all()
    assert rmse(cuda) <= 1.1 * rmse(triton_out) + 1e-4, (rmse(cuda), rmse(triton_out))


def quantized_normals(seed: int, batch: int, heads: int, seqlen: int) -> Any:
    """attncc.fp8.quantize's block (128, 128) quantisation of normal q, k and v of one
    length, for the CUDA FP8 kernel's tests (skipped without an sm_90 GPU)."""
    from attncc.fp8 import quantize

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the CUDA FP8 kernel needs an sm_90 GPU (H100/H200)")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, heads, seqlen, 128)
    q, k, v = (torch.randn(shape, device="cuda", generator=gen) for _ in range(3))
    return quantize(q, k, v, block=(128, 128))


@pytest.mark.parametrize("name", ["fp8_block", "fp8_causal"])
def test_fp8_kernel_descales_of_any_sign(name: str) -> None:
    """Negative and zero descales beside positive ones in one head (a kernel that took the
    max of raw dot products and scaled it after, as with a positive factor, gets these
    rows wrong): the result is the attention of the dequantised inputs, within the Triton
    FP8 kernel's error of it."""
    import dataclasses

    x = quantized_normals(11, 1, 2, 640)
    q_descale, k_descale = x.q_descale.clone(), x.k_descale.clone()
    q_descale[:, 0, 1] *= -1.0  # a negative factor a query block long
    k_descale[:, 0, 2] *= -1.0  # and one a key block long, in the same head
    k_descale[:, 1, 3] = 0.0  # a zero factor: that block's scores are all 0
    assert_fp8_within_triton_error(
        name, dataclasses.replace(x, q_descale=q_descale, k_descale=k_descale)
    )


@pytest.mark.parametrize("name", ["fp8_block", "fp8_causal"])
def test_fp8_kernel_value_scales_far_apart(name: str) -> None:
    """Value blocks whose descales jump by factors on both sides of the ratios the kernel
    folds into its weights (1/8 to 7/4): every tile either folds or moves O to its scale,
    and the result is the attention of the dequantised inputs within the Triton FP8
    kernel's error of it."""
    import dataclasses

    x = quantized_normals(17, 2, 2, 1152)
    jumps = torch.tensor([1.0, 1.7, 1.8, 0.13, 0.12, 8.0, 0.5, 1.0, 40.0], device="cuda")
    assert_fp8_within_triton_error(
        name, dataclasses.replace(x, v_descale=x.v_descale * jumps.cumprod(0))
    )


@pytest.mark.parametrize("name", ["fp8_block", "fp8_causal"])
@pytest.mark.parametrize("score_scale", [2.0, 4.0])
def test_fp8_kernel_peaked_scores_within_triton_error(name: str, score_scale: float) -> None:
    """Scores 2-4x those of quantize's normal inputs (K's descales scaled): each row's
    softmax peaks on a few keys, whose weights the kernel must not round to e4m3's 3
    mantissa bits. A reference max that followed the tile maxima only past a slack of 8
    log2 units left a row's largest weight anywhere in (1, 2^8]: RMSE 1.16e-2 against the
    Triton FP8 kernel's 4.72e-3 at 4x (H200)."""
    import dataclasses

    x = quantized_normals(23, 2, 4, 1024)
    assert_fp8_within_triton_error(
        name, dataclasses.replace(x, k_descale=x.k_descale * score_scale)
    )


@pytest.mark.parametrize("name", ["fp8_block", "fp8_causal"])
def test_fp8_kernel_value_scales_powers_of_two_apart(name: str) -> None:
    """Value descales of one mantissa a head, blocks 2^-1, 2^-3, 2^1 and 2^-4 apart, on
    peaked scores: the ratios of 2^-3 .. 2^0 fold into the weights' exponent exactly, the
    others move O to the tile's scale; within the Triton FP8 kernel's error either way."""
    import dataclasses

    x = quantized_normals(29, 2, 2, 1152)
    steps = torch.tensor([1.0, 0.5, 0.125, 2.0, 1.0, 0.0625, 0.5, 1.0, 1.0], device="cuda")
    v_descale = x.v_descale[..., :1] * steps.cumprod(0)
    x = dataclasses.replace(x, k_descale=x.k_descale * 4.0, v_descale=v_descale)
    assert_fp8_within_triton_error(name, x)


@pytest.mark.parametrize("target", ["cuda", "triton"])
def test_fp8_small_weights_stay_e4m3_normals(target: str) -> None:
    """A row with one dominant key and 255 keys each weighing e^-5.8125 (0.003) of it: both
    FP8 kernels' weights (times 2^8) keep those as e4m3 normals (0.75 / 256, 1% low), where
    weights in [0, 1] round them to the subnormal 0.0039, 31% high."""
    from fp8_cases import SMALL_WEIGHT_OUT, small_weight_rows

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the CUDA FP8 kernel needs an sm_90 GPU (H100/H200)")
    kernel = attncc.compile(EXAMPLE_DIR / "fp8_block.attn", target=target)
    out = kernel(*small_weight_rows(128, "cuda"), scale=0.125)
    assert abs(out[..., 0].float() - SMALL_WEIGHT_OUT).max().item() <= 0.03 * SMALL_WEIGHT_OUT


FP8_PER_HEAD = """attention fp8_per_head
dims  B, H, M, N, D
in    q[B, H, M, D]: f8e4m3
in    k[B, H, N, D]: f8e4m3
in    v[B, H, N, D]: f8e4m3
in    q_descale[B, H]: f32
in    k_descale[B, H]: f32
in    v_descale[B, H]: f32
param scale: f32 = 1 / sqrt(D)
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] * scale
s = s * q_descale[b, h] * k_descale[b, h]
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d] * v_descale[b, h]
out o
"""


@pytest.mark.parametrize("score_scale", [1.0, 4.0])
def test_fp8_kernel_descales_per_head_within_triton_error(
    tmp_path: Path, score_scale: float
) -> None:
    """Descales per head (one number a head for each of q, k and v; quantize's per-tensor
    codes), K's scaled for peaked scores: the CUDA FP8 kernel within the Triton FP8
    kernel's error against float64 of the dequantised inputs."""
    import math

    from attncc.fp8 import quantize

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the CUDA FP8 kernel needs an sm_90 GPU (H100/H200)")
    gen = torch.Generator(device="cuda").manual_seed(31)
    q, k, v = (torch.randn(4, 8, 1024, 128, device="cuda", generator=gen) for _ in range(3))
    x = quantize(q, k, v, block=None)
    heads = torch.rand(4, 8, device="cuda", generator=gen) + 0.5  # a descale a head
    q_descale, v_descale = x.q_descale * heads, x.v_descale * heads.flip(1)
    k_descale = x.k_descale * heads.flip(0) * score_scale
    path = tmp_path / "fp8_per_head.attn"
    path.write_text(FP8_PER_HEAD)
    args = (x.q, x.k, x.v, q_descale, k_descale, v_descale)
    cuda, cuda_lse = attncc.compile(path, target="cuda")(*args, return_lse=True)
    triton_out, triton_lse = attncc.compile(path, target="triton")(*args, return_lse=True)
    s = (x.q.double() * q_descale.double()[..., None, None]) @ (
        x.k.double() * k_descale.double()[..., None, None]
    ).transpose(-1, -2)
    s = s / math.sqrt(128)
    exact = torch.softmax(s, -1) @ (x.v.double() * v_descale.double()[..., None, None])

    def rmse(out: torch.Tensor) -> float:
        return float((out.double() - exact).pow(2).mean().sqrt())

    assert torch.isfinite(cuda).all()
    assert rmse(cuda) <= 1.1 * rmse(triton_out) + 1e-4, (rmse(cuda), rmse(triton_out))
    # the kernel's weights carry a factor 2^8 (FP8_WEIGHT_LOG2) that the lse must not
    lse = torch.logsumexp(s, -1)
    lse_error = float((cuda_lse.double() - lse).abs().max())
    triton_lse_error = float((triton_lse.double() - lse).abs().max())
    assert lse_error <= 1.1 * triton_lse_error + 1e-4, lse_error
    # its weights carry 2^8 too: an lse that kept the factor is 8 ln 2 = 5.5 off, where the
    # FP8 MMAs' sums of the scores leave 3.9e-3 / 2.5e-2 (K's descale x1 / x4, H200)
    assert triton_lse_error <= 0.1, triton_lse_error


WGMMA_CONFIGS = [
    {"wgmma": 1, "num_warps": w, "BLOCK_N": n} for w, n in ((8, 128), (8, 64), (4, 128), (4, 64))
]
# variant 2: cp.async and tensor copies (TMA), two and three stages, ping-pong
WGMMA_CONFIGS += [
    {"wgmma": 2, "num_warps": 8, "BLOCK_N": n, "pingpong": pp, "tma": tma, "stages": stages}
    for n, pp, tma, stages in (
        (128, 0, 0, 2),
        (64, 0, 0, 2),
        (128, 1, 0, 2),
        (64, 1, 0, 3),
        (128, 0, 1, 2),
        (64, 0, 1, 2),
        (128, 0, 1, 3),
        (64, 0, 1, 3),
        (128, 1, 1, 2),
        (64, 1, 1, 3),
    )
]
# variant 2 with one MMA group, two blocks a multiprocessor
WGMMA_CONFIGS += [
    {"wgmma": 2, "num_warps": 4, "BLOCK_N": n, "tma": tma, "stages": 2}
    for n, tma in ((64, 1), (128, 1), (64, 0))
]
# head dims up to 64: variant 2 with three MMA groups (192 query rows)
WGMMA_CONFIGS_64 = [
    {"wgmma": 2, "num_warps": 12, "BLOCK_N": n, "tma": tma, "stages": stages}
    for n, tma, stages in ((128, 1, 3), (64, 1, 3), (128, 0, 2))
]


@pytest.mark.parametrize(
    "name",
    [
        "causal",
        "fused",
        "gqa_causal",
        "document_mask",
        "softcap",
        "alibi",
        "sliding_window",
        "prefix_lm",
        "bias",
    ],
)
@pytest.mark.parametrize("shape", ["2,3,333,128", "1,4,200,64"])
def test_wgmma_kernel_matches_the_reference(name: str, shape: str) -> None:
    """The fused kernel's sm_90a variant (hopper.cu.jinja, the default on an H100/H200) on
    ragged lengths against the float64 reference: bf16 at head dim 128 in every tile it
    takes, with the mma.sync kernel ({"wgmma": 0}) on the same inputs; fp16 and head dim 64
    in the default tiles, and head dim 64 with three MMA groups (each configuration is a
    compile)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 GPU (H100/H200)")
    from attncc.bench import Shape, bench_inputs, sizes_for

    kernel = attncc.compile(EXAMPLE_DIR / f"{name}.attn", target="cuda")
    parsed = Shape.parse(shape if name != "gqa_causal" else shape.replace(",3,", ",4:2,", 1))
    sizes = sizes_for(kernel.ir, parsed)
    module = kernel.module(interpreted=False)
    for dtype in (torch.bfloat16, torch.float16):
        inputs = bench_inputs(kernel.ir, sizes, dtype, documents=3)
        args = [inputs[n] for n in kernel.input_names]
        expected, exp_lse = reference(kernel.spec)(*(a.cpu() for a in args), return_lse=True)
        expected_t, exp_lse_t = torch.from_numpy(expected), torch.from_numpy(exp_lse)
        seen = torch.isfinite(exp_lse_t)
        tensors, bound = module._bind(args, {})
        params = {**kernel.param_defaults(sizes), **bound}
        every_tile = dtype == torch.bfloat16 and parsed.head_dim == 128
        others = [{"wgmma": 1}, {"wgmma": 2}]
        others += WGMMA_CONFIGS_64 if parsed.head_dim == 64 else []
        for config in [{"wgmma": 0}, *WGMMA_CONFIGS] if every_tile else others:
            out, lse = module._forward(tensors, params, True, config)
            error = (out.double().cpu() - expected_t).abs().max().item()
            assert error < 3e-2, (dtype, config, error)
            assert torch.equal(torch.isfinite(lse.cpu()), seen), (dtype, config)
            lse_error = (lse.double().cpu()[seen] - exp_lse_t[seen]).abs().max().item()
            assert lse_error < 1e-2, (dtype, config, lse_error)


# variant 2's persistent grid: two groups with ping-pong and tensor copies, with two Q
# buffers (the default) and one, cp.async without ping-pong, one MMA group (two blocks a
# multiprocessor) with two Q buffers and one
PERSISTENT_CONFIGS = [
    {"wgmma": 2, "num_warps": 8, "BLOCK_N": 128, "pingpong": 1, "tma": 1, "stages": 2},
    {"wgmma": 2, "num_warps": 8, "BLOCK_N": 128, "pingpong": 1, "tma": 1, "stages": 3},
    {"wgmma": 2, "num_warps": 8, "BLOCK_N": 64, "pingpong": 0, "tma": 0, "stages": 2},
    {"wgmma": 2, "num_warps": 4, "BLOCK_N": 64, "tma": 1, "stages": 2},
    {"wgmma": 2, "num_warps": 4, "BLOCK_N": 64, "tma": 1, "stages": 2, "q_buffers": 1},
]


@pytest.mark.parametrize(
    "name",
    [
        "causal",
        "fused",
        "gqa_causal",
        "sliding_window",
        "softcap",
        "prefix_lm",
        "alibi",
        "document_mask",
    ],
)
def test_persistent_blocks_take_many_items(name: str) -> None:
    """Variant 2 with few blocks, each looping over many items (query blocks of several
    programs, in groups), its ring of K/V stages and its Q copies running on across them:
    bit-identical to a block an item (same tiles, same arithmetic) and within the tolerance
    of the float64 reference, for every configuration, a negative scale (Q's sign flip per
    group) and head dim 64 with three MMA groups; the document mask's tile index comes from
    its builder kernel."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 GPU (H100/H200)")
    from attncc.bench import Shape, bench_inputs, sizes_for

    kernel = attncc.compile(EXAMPLE_DIR / f"{name}.attn", target="cuda")
    module = kernel.module(interpreted=False)
    three_groups = {"wgmma": 2, "num_warps": 12, "BLOCK_N": 128, "tma": 1, "stages": 3}
    for shape, configs in (
        ("2,3,333,128", PERSISTENT_CONFIGS),
        ("2,2,457,64", [three_groups]),
        ("4,16,1000,128", [{}]),  # the defaults: more items than the grid's blocks
    ):
        batch, _, rest = shape.split(",", 2)
        parsed = Shape.parse(f"{batch},4:2,{rest}" if name == "gqa_causal" else shape)
        sizes = sizes_for(kernel.ir, parsed)
        inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=3)
        args = [inputs[n] for n in kernel.input_names]
        tensors, bound = module._bind(args, {})
        scales = [None, -0.2] if "scale" in kernel.param_defaults(sizes) else [None]
        for scale in scales:
            params = {**kernel.param_defaults(sizes), **bound}
            if scale is not None:
                params["scale"] = scale
            scale_kw = {} if scale is None else {"scale": scale}
            expected = reference(kernel.spec)(*(a.cpu() for a in args), **scale_kw)
            for config in configs:
                one, one_lse = module._forward(tensors, params, True, {**config, "persistent": 0})
                error = (one.double().cpu() - torch.from_numpy(expected)).abs().max().item()
                assert error < 3e-2, (shape, scale, config, error)
                grids = [{}] if not config else [{"blocks": 1}, {"blocks": 5, "group_programs": 2}]
                grids += [{"blocks": 7, "group_programs": 4}] if config else [{"group_programs": 8}]
                for grid in grids:
                    out, lse = module._forward(tensors, params, True, {**config, **grid})
                    assert torch.equal(out, one), (shape, scale, config, grid)
                    assert torch.equal(lse, one_lse), (shape, scale, config, grid)
                    # the work counter is left zero for the next launch
                    assert not module._arrivals(args[0].device, 2)[:2].any().item()


@pytest.mark.parametrize("head_dim", [64, 128])
def test_document_mask_groups_skip_the_tiles_their_rows_cannot_see(head_dim: int) -> None:
    """Blocks across a document boundary: each MMA group walks only the key tiles its own
    rows can see (the tile index has each group's bits), the block those any group sees.
    1000 tokens in 3 documents put boundaries inside 192-row blocks (three groups, head dim
    64) and 128-row ones (two groups), so a group of rows in a later document skips an
    earlier one's tiles, which the block's first group sees; both against the float64
    reference, every row's log-sum-exp too."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 GPU (H100/H200)")
    from attncc.bench import Shape, bench_inputs, sizes_for

    kernel = attncc.compile(EXAMPLE_DIR / "document_mask.attn", target="cuda")
    module = kernel.module(interpreted=False)
    sizes = sizes_for(kernel.ir, Shape.parse(f"2,2,1000,{head_dim}"))
    inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=3)
    args = [inputs[n] for n in kernel.input_names]
    tensors, bound = module._bind(args, {})
    params = {**kernel.param_defaults(sizes), **bound}
    expected, exp_lse = reference(kernel.spec)(*(a.cpu() for a in args), return_lse=True)
    groups = [{"num_warps": 8, "pingpong": 1}]
    groups += [{"num_warps": 12, "pingpong": 1}, {"num_warps": 12}] if head_dim == 64 else []
    for config in [{}, *({"wgmma": 2, "BLOCK_N": 128, "tma": 1, **g} for g in groups)]:
        out, lse = module._forward(tensors, params, True, config)
        error = (out.double().cpu() - torch.from_numpy(expected)).abs().max().item()
        assert error < 3e-2, (config, error)
        lse_error = (lse.double().cpu() - torch.from_numpy(exp_lse)).abs().max().item()
        assert lse_error < 1e-2, (config, lse_error)


def _strided_views(b: int, h: int, n: int, d: int, gen: torch.Generator) -> list[torch.Tensor]:
    """[b, h, n, d] views of K/V-like tensors in other layouts: sequence outside the heads
    (a transpose), head-dim rows padded to d + 8 (nothing contiguous past the head dim), and
    a batch broadcast (stride 0)."""
    seq_first = torch.randn(b, n, h, d, generator=gen).bfloat16().cuda().transpose(1, 2)
    padded = torch.randn(b, h, n, d + 8, generator=gen).bfloat16().cuda()[..., :d]
    broadcast = torch.randn(1, h, n, d, generator=gen).bfloat16().cuda().expand(b, h, n, d)
    return [seq_first, padded, broadcast]


@pytest.mark.parametrize("name", ["causal", "gqa_causal", "fused"])
def test_tma_copies_match_cp_async_on_strided_layouts(name: str) -> None:
    """Variant 2's tensor copies (one map per operand viewing it as head dim x keys x program
    base) read exactly what its cp.async copies read, on ragged lengths and layouts that are
    not contiguous: the outputs are bit-identical (same data, same arithmetic), and match the
    float64 reference."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 GPU (H100/H200)")
    kernel = attncc.compile(EXAMPLE_DIR / f"{name}.attn", target="cuda")
    module = kernel.module(interpreted=False)
    gen = torch.Generator().manual_seed(5)
    b, n, kv_heads = 2, 333, 2
    heads = 4 if name == "gqa_causal" else kv_heads
    q = torch.randn(b, heads, n, 128, generator=gen).bfloat16().cuda()
    keys = _strided_views(b, kv_heads, n, 128, gen)
    values = _strided_views(b, kv_heads, n, 128, gen)
    for k, v in zip(keys, values[1:] + values[:1], strict=True):
        tensors, params = module._bind([q, k, v], {})
        outs = []
        for tma in (0, 1):
            config = {"wgmma": 2, "num_warps": 8, "BLOCK_N": 128, "tma": tma, "stages": 3}
            outs.append(module._forward(tensors, params, False, config)[0])
        assert torch.equal(outs[0], outs[1]), (k.stride(), v.stride())
        expected = reference(kernel.spec)(q.cpu(), k.cpu(), v.cpu())
        error = (outs[1].double().cpu() - torch.from_numpy(expected)).abs().max().item()
        assert error < 3e-2, (k.stride(), error)


@pytest.mark.parametrize("target", ["triton", "cuda"])
@pytest.mark.parametrize(("name", "queries"), [("decode", 0), ("speculative_decode", 40)])
def test_cache_memory_past_the_lengths_never_reaches_the_output(
    target: str, name: str, queries: int
) -> None:
    """A preallocated cache holds garbage (NaN here) past each sequence's length: every
    kernel gives what the same cache with zeros there gives (40 draft queries take the fused
    kernels, one the split-KV ones)."""
    kernel = attncc.compile(EXAMPLE_DIR / f"{name}.attn", target=target)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(3)
    shape = (3, 8, queries, 64) if queries else (3, 8, 64)
    q = torch.randn(*shape, generator=gen).bfloat16().cuda()
    k, v = (torch.randn(3, 300, 2, 64, generator=gen).bfloat16().cuda() for _ in range(2))
    lengths = torch.tensor([300, 57, 200], dtype=torch.int32, device="cuda")
    past = torch.arange(300, device="cuda")[None, :] >= lengths[:, None]
    clean = [t.masked_fill(past[:, :, None, None], 0.0) for t in (k, v)]
    dirty = [t.masked_fill(past[:, :, None, None], float("nan")) for t in (k, v)]
    expected = kernel(q, *clean, lengths)
    out = kernel(q, *dirty, lengths)
    assert torch.isfinite(out).all()
    assert (out.float() - expected.float()).abs().max().item() < 2e-2  # merge order may vary
