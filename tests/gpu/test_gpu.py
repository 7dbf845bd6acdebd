"""The CPU suite's properties at realistic sizes on a CUDA GPU (compiled Triton kernels; the
CUDA target's are test_gpu_cuda.py's).

Run on the device by benchmarks/gpu_suite.sh; without a GPU every test here is skipped.
Every distinct (dtype, head dim, block shape) is a fresh Triton compile, so trial counts stay
small; `attncc check --device cuda` in the same suite adds more cases per example.
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


@pytest.mark.parametrize("schedule", ["fused", "naive", "split_kv"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_example_matches_reference_on_gpu(path: str, schedule: str) -> None:
    _, lowered = attncc.optimise(path)
    if schedule == "split_kv" and split_kv_blocker(lowered):
        pytest.skip(f"split_kv cannot run this spec: {split_kv_blocker(lowered)}")
    if lowered.sink is not None and schedule != "fused":  # sinks run fused only: refused
        with pytest.raises(ValueError, match="a softmax sink runs fused only"):
            attncc.compile(path, target="triton", schedule=schedule)  # type: ignore[arg-type]
        return
    if lowered.fp8 and schedule != "fused":  # FP8 runs fused only: refused
        with pytest.raises(ValueError, match="FP8 inputs run fused only"):
            attncc.compile(path, target="triton", schedule=schedule)  # type: ignore[arg-type]
        return
    kernel = attncc.compile(path, target="triton", schedule=schedule)  # type: ignore[arg-type]
    max_len = 120 if schedule == "split_kv" else 700
    results = check(kernel, trials=3, seed=11, device="cuda", max_len=max_len)
    assert all(r.ok for r in results), table(results)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_long_sequences_on_gpu(path: str) -> None:
    """Lengths past 1k cross many key tiles and the causal diagonal at several offsets."""
    kernel = attncc.compile(path, target="triton")
    results = check(kernel, trials=2, seed=5, device="cuda", dtypes=(torch.bfloat16,), max_len=1500)
    assert all(r.ok for r in results), table(results)


@pytest.mark.parametrize("target", ["triton", "cuda"])
def test_torch_compile_fullgraph_on_gpu(target: str) -> None:
    """The kernel inside a torch.compile'd graph gives what it gives eagerly, bit for bit, and
    that matches the reference. (The graph's bf16 `+ 1.0` rounds outputs near 5 by up to
    0.016 on its own, so the reference comparison is of the attention output.)"""
    kernel = attncc.compile(EXAMPLE_DIR / "causal.attn", target=target)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 300, 64, generator=gen).bfloat16().cuda() for _ in range(3))

    @torch.compile(fullgraph=True)
    def layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return kernel(q * 1.0, k, v) + 1.0

    out = layer(q, k, v)
    attention = kernel(q, k, v)
    assert torch.equal(out, attention + 1.0)
    expected = torch.from_numpy(reference(kernel.spec)(q.cpu(), k.cpu(), v.cpu()))
    assert (attention.double().cpu() - expected).abs().max() < 2e-2


TMA_CASES = [("causal", 96), ("gqa_causal", 128), ("document_mask", 128), ("alibi", 64)]


@pytest.mark.parametrize(("name", "head_dim"), TMA_CASES)
def test_tma_descriptor_loads_on_gpu(name: str, head_dim: int) -> None:
    """Every tuning candidate with TMA copies gives what the reference gives (the correctness
    runs above use the default configuration only: TMA at head dims 65-128, pointer loads at
    others and with a tile index)."""
    from attncc.runtime.autotune import PREFILL_CANDIDATES, _as_launch

    kernel = attncc.compile(EXAMPLE_DIR / f"{name}.attn", target="triton")
    module = kernel.module(interpreted=False)
    gen = torch.Generator().manual_seed(head_dim)
    heads, kv_heads = (8, 2) if name == "gqa_causal" else (4, 4)
    q = torch.randn(2, heads, 777, head_dim, generator=gen)
    k, v = (torch.randn(2, kv_heads, 777, head_dim, generator=gen) for _ in range(2))
    extra = {
        "document_mask": [torch.randint(0, 3, (2, 777), generator=gen).sort(-1).values.int()],
        "alibi": [torch.rand(heads, generator=gen)],
    }
    args = [q, k, v, *extra.get(name, [])]
    expected = torch.from_numpy(reference(kernel.spec)(*args)).float()
    tensors, params = module._bind([a.cuda() for a in args], {})
    tensors = {n: t.bfloat16() if t.is_floating_point() else t for n, t in tensors.items()}
    for tile in PREFILL_CANDIDATES:
        if not tile.tma:
            continue
        out, _ = module._forward(tensors, params, False, _as_launch(tile, tma=1))
        error = (out.float().cpu() - expected).abs().max()
        assert error < 3e-2, (tile, float(error))


# (spec, [(B, heads, length)]): the first call compiles; none of the others may. Lengths are
# multiples of 16 and at least the default tile's rows (128 at most): Triton specializes the
# lengths' divisibility by 16 (one compile more for others), and a query axis shorter than the
# tile takes a smaller BLOCK_M (one compile per power of two: a 64-row sliding-window call
# recompiled on an H200)
NO_RECOMPILE_CASES = [
    ("causal", [(16, 4, 1024), (8, 4, 2048), (1, 4, 768), (3, 4, 320)]),
    ("sliding_window", [(2, 4, 1024), (1, 4, 4096), (5, 4, 208)]),
    # decode: (B x kv heads) programs of 16 and more keep the split count, which also
    # sizes the merge, within 16; one program row fewer doubles it (a second compile). Caches
    # past 8k take another tile from the heuristic table (attncc.runtime.heuristics): a compile.
    ("decode", [(8, 32, 1008), (8, 32, 8192), (2, 32, 6000), (3, 32, 336)]),
]


@pytest.mark.parametrize(
    ("name", "calls"), NO_RECOMPILE_CASES, ids=[c[0] for c in NO_RECOMPILE_CASES]
)
def test_new_lengths_and_batch_sizes_do_not_recompile(
    name: str, calls: list[tuple[int, int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sizes are runtime values: after the first call, new batch sizes (ones, odd numbers,
    multiples of 16), lengths and window sizes launch the same compiled kernels."""
    import triton

    monkeypatch.setenv("ATTNCC_AUTOTUNE", "0")  # the heuristic table's configuration, untuned
    kernel = attncc.compile(EXAMPLE_DIR / f"{name}.attn", target="triton")
    compiled: list[str] = []

    def record(*, fn: object, **_: object) -> None:
        compiled.append(str(getattr(fn, "name", fn)))

    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", record)
    kv_heads = 8
    for i, (batch, heads, length) in enumerate(calls):
        if name == "decode":
            q = torch.randn(batch, heads, 64, device="cuda", dtype=torch.bfloat16)
            k, v = (
                torch.randn(batch, length, kv_heads, 64, device="cuda", dtype=torch.bfloat16)
                for _ in range(2)
            )
            lengths = torch.full((batch,), length, device="cuda", dtype=torch.int32)
            kernel(q, k, v, lengths)
        else:
            q, k, v = (
                torch.randn(batch, heads, length, 64, device="cuda", dtype=torch.bfloat16)
                for _ in range(3)
            )
            kernel(q, k, v, **({"window": length // 2 + 1} if name == "sliding_window" else {}))
        torch.cuda.synchronize()
        if i == 0:
            first = len(compiled)
            assert first > 0, "the hook saw no compile: it no longer observes Triton's JIT"
    assert compiled[first:] == [], f"recompiled for {calls}: {compiled[first:]}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_quantize_kernel_matches_torch_on_gpu(dtype: torch.dtype, d: int) -> None:
    """attncc.fp8.quantize's compiled kernel against quantize_torch on the GPU: bits without
    the rotation; with it, integer inputs (exact sums in any order) also to the bit. A block
    of zeros gets descale 1; a NaN stays NaN, and its block's descale is that of the rest."""
    from attncc.fp8 import quantize, quantize_torch

    gen = torch.Generator(device="cuda").manual_seed(d)
    q, k, v = (
        torch.randn(2, 4, s, d, device="cuda", generator=gen).to(dtype) for s in (1000, 700, 700)
    )
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # a [B, S, H, D] layout
    k[1, 2, 64:128] = 0.0
    v[0, 1, 5, 3] = float("nan")
    for hadamard in (False, True):
        if hadamard:
            q, k = (q * 8).round(), (k * 8).round()
        got = quantize(q, k, v, block=(128, 64), hadamard=hadamard)
        want = quantize_torch(q, k, v, block=(128, 64), hadamard=hadamard)
        for name in ("q", "k", "v"):
            a, b = getattr(got, name), getattr(want, name)
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (name, hadamard)
            assert torch.equal(getattr(got, f"{name}_descale"), getattr(want, f"{name}_descale"))
        assert got.k_descale[1, 2, 1] == 1.0 and got.v[0, 1, 5, 3].float().isnan()
        amax = v[0, 1, :64].float().nan_to_num(0.0).abs().amax()
        assert got.v_descale[0, 1, 0] == amax / torch.full_like(amax, 448.0)
    # the last call's geometry again, new values: a replay of its recorded launches
    again = quantize(q * 0.5, k, v, block=(128, 64), hadamard=True)
    want = quantize_torch(q * 0.5, k, v, block=(128, 64), hadamard=True)
    for name in ("q", "k", "v", "q_descale", "k_descale", "v_descale"):
        a, b = getattr(again, name), getattr(want, name)
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


def _softcap_recording_defines(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, list[dict[str, Any]]]:
    """The soft-capping example compiled for ``target`` (the CUDA target skipped off an sm_90
    GPU), and the list the CUDA host's compiled variants (its _defines) are recorded into."""
    if target == "cuda" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a kernel needs an H100/H200")
    kernel = attncc.compile(EXAMPLE_DIR / "softcap.attn", target=target)
    asked: list[dict[str, Any]] = []
    if target == "cuda":
        module = kernel.module(interpreted=False)
        defines = module._defines
        monkeypatch.setattr(
            module, "_defines", lambda *a: asked.append(dict(defines(*a))) or defines(*a)
        )
    return kernel, asked


@pytest.mark.parametrize("cap", [30.0, 56.8])
@pytest.mark.parametrize("target", ["triton", "cuda"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_softcap_rows_far_below_the_cap_on_gpu(
    head_dim: int, target: str, cap: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 soft-capping takes a softmax reference fixed from the cap (Triton's
    FIXED_REFERENCE, the sm_90a kernel's ATTNCC_FIXED_REFERENCE, which the host compiles it
    with): rows whose every score sits near -cap have weights down to 2^-86 (cap 30) or
    2^-100 (56.8, the largest cap that takes it, its largest weights up to 2^64) and must
    still match the float64 reference (tanh.approx.f32)."""
    from kernels._support import evaluate

    kernel, asked = _softcap_recording_defines(target, monkeypatch)
    gen = torch.Generator().manual_seed(head_dim)
    q = torch.randn(2, 4, 300, head_dim, generator=gen)
    k, v = (torch.randn(2, 4, 300, head_dim, generator=gen) for _ in range(2))
    k[:, 1], q[:, 1] = k[:, 1].abs() * 4.0, -q[:, 1].abs() * 4.0  # head 1: scores << -cap
    inputs = {n: t.to("cuda", torch.bfloat16) for n, t in {"q": q, "k": k, "v": v}.items()}
    assert kernel.backend_for(**inputs, cap=cap) == target
    verdict, lse_verdict, _, lse = evaluate(kernel, inputs, {"cap": cap}, torch.bfloat16)
    assert verdict.ok, verdict
    assert lse_verdict.ok, lse_verdict
    assert (lse[:, 1] < -20.0).all()
    if target == "cuda":
        assert any(d.get("ATTNCC_FIXED_REFERENCE") == 1 for d in asked)


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("target", ["triton", "cuda"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_softcap_rows_of_one_key_on_gpu(
    head_dim: int, target: str, return_lse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the fixed softmax reference no weight is exactly 1: with one visible key a row
    (causal, every query before the second key) gets that key's value back only if the
    output divides by the weight as P V rounds it (the sm_90a kernel's sums of the packed
    weights, or its row sums by MMA at head dim 64 without the lse); the lse takes the
    unrounded sum. Both within the rule, with the lse returned and without."""
    from kernels._support import numpy64

    from attncc.tolerance import compare

    kernel, asked = _softcap_recording_defines(target, monkeypatch)
    gen = torch.Generator().manual_seed(head_dim)
    q = torch.randn(2, 4, 300, head_dim, generator=gen)
    k, v = (torch.randn(2, 4, 1, head_dim, generator=gen) for _ in range(2))
    v = v * 4.0  # values near 4: a weight's rounding (2^-9 of it) passes the rule's floor
    inputs = {n: t.to("cuda", torch.bfloat16) for n, t in {"q": q, "k": k, "v": v}.items()}
    assert kernel.backend_for(**inputs) == target
    got = kernel(**inputs, return_lse=return_lse)
    out, lse = got if return_lse else (got, None)
    host = {n: t.cpu() for n, t in inputs.items()}
    exact_out, exact_lse = reference(kernel.spec)(**host, return_lse=True)
    naive_out, naive_lse = reference(kernel.spec, rounding="bfloat16")(**host, return_lse=True)
    verdict = compare(numpy64(out), exact_out, naive_out, "bfloat16")
    assert verdict.ok, verdict
    if lse is not None:
        lse_verdict = compare(numpy64(lse), exact_lse, naive_lse, "float32")
        assert lse_verdict.ok, lse_verdict
    if target == "cuda":
        fixed = [d for d in asked if "ATTNCC_FIXED_REFERENCE" in d]
        assert fixed and all(d["ATTNCC_LSE_SUMS"] == int(return_lse) for d in fixed), fixed


def _assert_replays_from_c(kernel: Any, args: Any) -> None:
    """A call with these inputs finds its replay in the kernel's table, and it launches."""
    from attncc.runtime import kernel as kernel_module
    from attncc.runtime import native

    launcher = native.launcher()
    assert launcher is not None, native.unavailable()
    tensors, params = kernel._host._bind(tuple(args), {})
    table, stream_of = kernel._replays.table, kernel_module._RAW_STREAM
    assert launcher.replay(table, (False, False), tensors, params, torch.Tensor, stream_of)


def test_repeated_eager_calls_replay_from_c() -> None:
    """A plain eager call like an earlier one goes from its bound inputs to its launches in
    one C call (Kernel._replays: the C launcher's replay of the plan that served the first),
    with its own data: fresh tensors share one replay, another stride gets its own; a Triton
    launch hook sends calls to Triton's own launcher (the hook sees them); an fp32 replay
    follows PyTorch's TF32 setting (its error against float64 moves with it). Every output
    against the reference."""
    kernel = attncc.compile(EXAMPLE_DIR / "causal.attn", target="triton")
    expected_fn = reference(kernel.spec)
    gen = torch.Generator(device="cuda").manual_seed(3)

    def inputs(dtype: torch.dtype = torch.float16) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.randn(2, 8, 64, 64, device="cuda", dtype=torch.float32, generator=gen).to(dtype)
            for _ in range(3)
        )

    def error(out: torch.Tensor, args: tuple[torch.Tensor, ...]) -> float:
        expected = torch.from_numpy(expected_fn(*(a.cpu() for a in args)))
        return float((out.double().cpu() - expected).abs().max())

    for _ in range(3):
        args = inputs()
        assert error(kernel(*args), args) < 2e-3
        assert len(kernel._replays) == 1  # from the first call on
    _assert_replays_from_c(kernel, args)
    q, k, v = inputs()
    strided = (q, k.transpose(1, 2).contiguous().transpose(1, 2), v)
    for _ in range(2):
        assert error(kernel(*strided), strided) < 2e-3
    assert len(kernel._replays) == 2

    from triton import knobs

    seen: list[Any] = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        args = inputs()
        assert error(kernel(*args), args) < 2e-3
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    torch.cuda.synchronize()
    assert len(seen) == 1  # Triton's launcher ran the call

    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        errors = []
        for allowed in (False, False, True, True, False):
            torch.backends.cuda.matmul.allow_tf32 = allowed
            args = inputs(torch.float32)
            errors.append(error(kernel(*args), args))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    exact = [errors[i] for i in (0, 1, 4)]
    assert max(exact) < 1e-5 and min(errors[2:4]) > 10 * max(exact), errors


@pytest.mark.parametrize(
    ("name", "target"),
    [("decode", "auto"), ("paged_decode", "auto"), ("decode", "cuda")],
)
def test_repeated_decode_calls_replay_from_c(name: str, target: str) -> None:
    """Split-KV decode (Triton's two kernels and a scratch block; the CUDA target's plan,
    its partial results the plan's buffers) replays from C too: one replay for calls on
    fresh caches, each output against the reference."""
    from attncc.bench import Shape, bench_inputs, sizes_for

    kernel = attncc.compile(EXAMPLE_DIR / f"{name}.attn", target=target)  # type: ignore[arg-type]
    expected_fn = reference(kernel.spec)
    sizes = sizes_for(kernel.ir, Shape.parse("2,32:8,1000,128"))
    for _ in range(3):
        inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=4)
        args = [inputs[n] for n in kernel.input_names]
        out = kernel(*args)
        expected = torch.from_numpy(expected_fn(*(a.cpu() for a in args)))
        assert (out.double().cpu() - expected).abs().max() < 2e-2
        assert len(kernel._replays) == 1  # from the first call on
    _assert_replays_from_c(kernel, args)


@pytest.mark.parametrize("target", ["auto", "cuda"])
def test_decode_calls_on_two_streams_at_once_agree_with_one_call(target: str) -> None:
    """Split-KV decode on two streams at once (both streams waiting on one event behind a
    millisecond's GPU sleep, so the two calls' kernels start together), after first calls
    on the default stream recorded the plan: every output equals that of the same inputs'
    call alone. The streams swap two queries each round, so a merge reading another call's
    or an earlier round's partial results, or an output never written, differs. Each
    call's chunks count their arrivals in counters of its own stream; a Triton plan
    replaying the recorded call's counters on every stream let the two calls' chunks count
    in the same ones. Each stream's first call records a plan of its own, which its later
    calls replay from C."""
    from attncc.bench import Shape, bench_inputs, sizes_for

    kernel = attncc.compile(EXAMPLE_DIR / "decode.attn", target=target)  # type: ignore[arg-type]
    sizes = sizes_for(kernel.ir, Shape.parse("1,32:8,8192,128"))
    inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=4)
    args = [inputs[n] for n in kernel.input_names]
    queries = [args[0], torch.randn_like(args[0])]
    expected = [kernel(q, *args[1:]) for q in queries]
    reference_out = torch.from_numpy(reference(kernel.spec)(*(a.cpu() for a in args)))
    assert (expected[0].double().cpu() - reference_out).abs().max() < 2e-2
    assert not torch.equal(expected[0], expected[1])
    streams = [torch.cuda.Stream() for _ in range(2)]
    wrong = []
    for trial in range(20):
        torch.cuda._sleep(2_000_000)
        gate = torch.cuda.Event()
        gate.record()
        for stream in streams:
            stream.wait_event(gate)
        outs = []
        for i, stream in enumerate(streams):
            which = (i + trial) % 2
            with torch.cuda.stream(stream):
                outs.append((which, kernel(queries[which], *args[1:])))
        torch.cuda.synchronize()
        wrong += [(trial, w) for w, out in outs if not torch.equal(out, expected[w])]
    assert wrong == []
    for stream in streams:  # each stream's calls replay a plan of their own by now
        with torch.cuda.stream(stream):
            _assert_replays_from_c(kernel, [queries[0], *args[1:]])


@pytest.mark.parametrize("layout", ["view", "cat"])
def test_an_auto_decode_over_a_growing_cache_replays_its_length_family(
    layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers' causal spec on target auto (its CUDA host module hands one-query calls
    to the Triton fallback's split-KV kernels) over a cache growing a token a call, the
    cache's length passed as `offset`: views of one buffer, or caches of their own as
    torch.cat makes them. After a length family's first two lengths, each call goes to the
    fallback's family plan without the CUDA host module's checks, every output equals its
    own full path's, and a length called again replays from C."""
    monkeypatch.setenv("ATTNCC_TARGET", "auto")  # the suite's default is triton
    kernel = attncc.compile(Path(attncc.__file__).parent / "specs" / "hf_causal.attn")
    assert kernel.fallback is not None  # (auto resolved to the CUDA target)
    gen = torch.Generator().manual_seed(11)
    k = torch.randn(2, 8, 4200, 128, generator=gen).bfloat16().cuda()
    v = torch.randn_like(k)
    q = torch.randn(2, 32, 1, 128, generator=gen).bfloat16().cuda()

    def at(n: int) -> dict[str, Any]:
        keys, values = k[:, :, :n], v[:, :, :n]
        if layout == "cat":
            keys, values = keys.contiguous(), values.contiguous()
        return {"q": q, "k": keys, "v": values, "scale": 128**-0.5, "offset": n - 1}

    host_calls: list[int] = []
    forward = kernel._host._forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        host_calls.append(1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(kernel._host, "_forward", counted)
    for n in range(4100, 4140):
        inputs = at(n)
        got = kernel(**inputs)
        fallback = kernel._fallback_kernel
        assert fallback is not None
        tensors = {name: inputs[name] for name in "qkv"}
        params = {"scale": inputs["scale"], "offset": inputs["offset"]}
        want = fallback.module(False)._forward(tensors, params, False)[0]
        assert torch.equal(got, want), n
        if n == 4110:
            host_calls.clear()
            assert fallback.launch_path(**at(n + 1)) == "replay: its length family"
    # the multiples of 16 (4112, 4128) are a family of their own (Triton specializes on the
    # length, not on the offset): the host module sees its first call alone, then hands the
    # family to the fallback at every length
    assert len(host_calls) == 1
    # a length called again (a model's next layer) gets a plan of its own, replayed from C
    inputs = at(4139)
    assert torch.equal(kernel(**inputs), got)
    from attncc.runtime import kernel as kernel_module
    from attncc.runtime import native

    launcher = native.launcher()
    assert launcher is not None, native.unavailable()
    tensors, params = kernel._host._bind((), inputs)
    table, stream_of = kernel._replays.table, kernel_module._RAW_STREAM
    replayed = launcher.replay(table, (False, False), tensors, params, torch.Tensor, stream_of)
    assert replayed is not None and torch.equal(replayed[0], got)


@pytest.mark.parametrize("target", ["triton", "cuda"])
def test_compiled_callers_repeated_calls_replay_from_c(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torch.compile'd caller's op calls take the C replay as eager calls do: after its
    first call, none goes through the plans' Python (Kernel._launch) or a redispatch from
    the op's autograd kernel, and each gives what an eager call gives."""
    kernel = attncc.compile(EXAMPLE_DIR / "causal.attn", target=target)
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 8, 256, 64, generator=gen).half().cuda() for _ in range(3))
    layer = torch.compile(lambda q, k, v: kernel(q, k, v))
    with torch.no_grad():
        first = layer(q, k, v)
        launches: list[int] = []
        original = kernel._launch

        def counted(*args: Any) -> Any:
            launches.append(1)
            return original(*args)

        monkeypatch.setattr(kernel, "_launch", counted)
        redispatch = torch._ops.OpOverload.redispatch

        def counted_redispatch(self: Any, *args: Any, **kwargs: Any) -> Any:
            launches.append(2)
            return redispatch(self, *args, **kwargs)

        monkeypatch.setattr(torch._ops.OpOverload, "redispatch", counted_redispatch)
        outs = [layer(q, k, v) for _ in range(3)]
    assert launches == []
    eager = kernel(q, k, v)
    assert all(torch.equal(out, eager) for out in (first, *outs))


@pytest.mark.parametrize("target", ["auto", "cuda"])
def test_a_compiled_decode_loop_compiles_twice_over_growing_caches(target: str) -> None:
    """torch.compile (inductor) over a decode step whose cache grows by a token a step, and
    a prefill of the same length: the caller compiles for the first length and once more
    for every later one (the lengths traced symbolically), and each step gives the eager
    call's output, on either target's kernels."""
    import torch._dynamo.testing

    prefill = attncc.compile(EXAMPLE_DIR / "causal.attn", target=target)  # type: ignore[arg-type]
    decode = attncc.compile(EXAMPLE_DIR / "decode.attn", target=target)  # type: ignore[arg-type]

    def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        lengths = torch.full((2,), k.shape[2], dtype=torch.int32, device=k.device)
        out = decode(q[:, :, -1], k.transpose(1, 2), v.transpose(1, 2), lengths)
        return prefill(q, k, v), out

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(step, backend=counter)
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for n in (1000, 1001, 1002, 1003):
            q, k, v = (torch.randn(2, 8, n, 64, generator=gen).bfloat16().cuda() for _ in range(3))
            torch.testing.assert_close(compiled(q, k, v), step(q, k, v), rtol=0, atol=0)
    assert counter.frame_count == 2


@pytest.mark.parametrize("target", ["auto", "cuda"])
def test_a_captured_decode_counts_in_counters_zeroed_before_the_capture(target: str) -> None:
    """A CUDA graph captured after an eager call: its call's arrival counters are the spare
    buffer that eager call zeroed (no fill captured into the graph, where each replay
    would run it), and its replays on new queries give what eager calls give."""
    from attncc.bench import Shape, bench_inputs, sizes_for

    kernel = attncc.compile(EXAMPLE_DIR / "decode.attn", target=target)  # type: ignore[arg-type]
    sizes = sizes_for(kernel.ir, Shape.parse("1,32:8,8192,128"))
    inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, documents=4)
    args = [inputs[n] for n in kernel.input_names]
    kernel(*args)
    runs = kernel._fallback_kernel if kernel.backend_for(*args) != kernel.target else kernel
    module = runs._host  # type: ignore[union-attr]
    spare = module._SPARE_ARRIVALS["cuda:0"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernel(*args)
    assert "cuda:0" not in module._SPARE_ARRIVALS
    assert any(spare is buffer for kept in module._ARRIVALS.values() for buffer in kept)
    for seed in range(3):
        args[0].copy_(torch.randn(args[0].shape, generator=torch.Generator().manual_seed(seed)))
        graph.replay()
        assert torch.equal(captured, kernel(*args))
