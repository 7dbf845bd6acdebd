"""Triton launch plans (attncc.runtime.triton_plan): a repeated call of a geometry replays the
launches its first call recorded, and gets exactly what the full path gives.

On the CPU the kernels run in the interpreter; with a GPU (the `kernels` step of
benchmarks/gpu_suite.sh) the same tests replay compiled kernels through attncc's launcher
(attncc.runtime.triton_launch).
"""

from __future__ import annotations

import types
import weakref
from typing import Any

import numpy as np
import pytest
import torch
from triton.runtime.jit import KernelInterface

from attncc.checking import draw_sizes, make_inputs
from attncc.runtime import triton_plan
from attncc.runtime.jit import interpreter
from attncc.runtime.launch_plan import Plans
from tests.kernels._support import DEVICE, compiled

CASES = [
    ("causal", "fused"),
    ("causal", "default"),  # one query: the fused kernel hands it to its split-KV launch
    ("document_mask", "fused"),  # a tile index built by a kernel of its own first
    ("alibi", "fused"),
    ("paged_decode", "split_kv"),
    ("decode_window", "split_kv"),
    ("gqa_causal", "naive"),
    ("sinks", "fused"),
]


def _draw(name: str, schedule: str, seed: int) -> tuple[Any, dict[str, torch.Tensor]]:
    kernel = compiled(name, schedule)
    rng = np.random.default_rng(seed)
    sizes = draw_sizes(kernel.ir, rng, max_len=40, head_dims=(16,))
    if schedule == "default" and kernel.ir.query_axis is not None:
        sizes[kernel.ir.query_axis.dim] = 1
    return kernel, sizes  # type: ignore[return-value]


def _assert_through_attnccs_launcher(
    kernel: Any, inputs: dict[str, torch.Tensor], return_lse: bool
) -> None:
    """On a GPU, the replay of this call issues every launch through attncc's own launcher
    (attncc.runtime.triton_launch), not Triton's."""
    if DEVICE == "cuda":
        plan = kernel._geometry(Plans.key(inputs, {}, return_lse, False, stream=False)).plan
        assert plan.issues is not None, plan.launcher_refusal


def _full_path(kernel: Any, inputs: dict[str, torch.Tensor], return_lse: bool) -> Any:
    """The generated module's own entry, without plans: checks, configuration, launches."""
    on_cpu = DEVICE == "cpu"
    with interpreter(on_cpu):
        out, lse = kernel.module(on_cpu)._forward(dict(inputs), {}, return_lse)
    return out, lse


@pytest.mark.parametrize(("name", "schedule"), CASES)
@pytest.mark.parametrize("return_lse", [False, True])
def test_a_repeated_call_replays_and_matches_the_full_path(
    name: str, schedule: str, return_lse: bool
) -> None:
    kernel, sizes = _draw(name, schedule, seed=3)
    rng = np.random.default_rng(5)
    first = make_inputs(kernel.ir, sizes, torch.float32, DEVICE, rng)
    second = make_inputs(kernel.ir, sizes, torch.float32, DEVICE, rng)
    kernel(**first, return_lse=return_lse)
    assert kernel.launch_path(**second, return_lse=return_lse) == "replay"
    _assert_through_attnccs_launcher(kernel, second, return_lse)
    got = kernel(**second, return_lse=return_lse)
    out, lse = _full_path(kernel, second, return_lse)
    if return_lse:
        got_out, got_lse = got
        torch.testing.assert_close(got_lse, kernel._returned_lse(lse), rtol=0, atol=0)
    else:
        got_out = got
    torch.testing.assert_close(got_out, out, rtol=0, atol=0, equal_nan=True)


def test_a_first_call_leaves_the_callers_params_as_they_were() -> None:
    """The full path fills in the params' defaults on a copy: the caller's dict (the one a
    repeated call's key is built from, before and after the call) keeps only what it gave,
    and a key computed after the first call finds the geometry it recorded."""
    kernel, sizes = _draw("alibi", "fused", seed=3)
    inputs = make_inputs(kernel.ir, sizes, torch.float32, DEVICE, np.random.default_rng(5))
    tensors, params = kernel._host._bind((), inputs)
    given = dict(params)
    kernel._launch(tensors, params, False)
    assert params == given and "scale" not in params
    assert kernel._geometry(Plans.key(tensors, params, False, False, stream=False)) is not None


def test_replays_on_fresh_tensors_move_the_descriptor_maps_to_them() -> None:
    """bf16 at a head dim the TMA copies take, each call on tensors at new addresses: every
    replay gives exactly the full path's output. On a GPU a configuration with TMA copies
    replays with its maps kept and moved (one word each), never encoded again."""
    kernel = compiled("causal", "fused")
    gen = torch.Generator().manual_seed(4)
    calls = [
        {n: torch.randn(1, 2, 64, 64, generator=gen).to(DEVICE, torch.bfloat16) for n in "qkv"}
        for _ in range(4)
    ]
    kernel(**calls[0])
    for inputs in calls[1:]:
        assert kernel.launch_path(**inputs) == "replay"
        torch.testing.assert_close(
            kernel(**inputs), _full_path(kernel, inputs, False)[0], rtol=0, atol=0
        )
    if DEVICE == "cuda" and kernel.launch_config(**calls[0]).get("tma"):
        key = Plans.key(calls[0], {}, False, False, stream=False)
        assert kernel._geometry(key).plan.moves_maps
        _assert_through_attnccs_launcher(kernel, calls[0], False)


def test_a_changed_layout_dtype_or_size_never_reuses_a_plan() -> None:
    kernel = compiled("causal", "fused")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=gen).to(DEVICE) for _ in range(3))
    kernel(q, k, v)
    # the same sizes with q transposed in memory, then fp16, then more queries: each is a
    # geometry of its own, with its own first call
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert kernel.launch_path(q_strided, k, v) == "full: no call of this geometry yet"
    for args in ((q_strided, k, v), (q.half(), k.half(), v.half())):
        want = _full_path(kernel, dict(zip("qkv", args, strict=True)), False)[0]
        torch.testing.assert_close(kernel(*args), want)
    longer = torch.randn(1, 2, 40, 16, generator=gen).to(DEVICE)
    assert kernel.launch_path(longer, k, v) == "full: no call of this geometry yet"


def test_a_misaligned_input_is_a_geometry_of_its_own() -> None:
    kernel = compiled("causal", "fused")
    base = torch.randn(2 * 24 * 16 + 1, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    aligned = base[: 2 * 24 * 16].view(1, 2, 24, 16)
    shifted = base[1:].view(1, 2, 24, 16)  # 4 bytes off: Triton specializes on alignment
    kernel(aligned, aligned, aligned)
    assert kernel.launch_path(shifted, aligned, aligned).startswith("full")
    got = kernel(shifted, aligned, aligned)
    want = _full_path(kernel, {"q": shifted, "k": aligned, "v": aligned}, False)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_checks_poisoning_outputs_drop_the_plans() -> None:
    kernel, sizes = _draw("causal", "fused", seed=4)
    inputs = make_inputs(kernel.ir, sizes, torch.float32, DEVICE, np.random.default_rng(0))
    kernel(**inputs)
    kernel.poison_outputs(True)
    try:
        assert kernel.launch_path(**inputs) == "full: no call of this geometry yet"
    finally:
        kernel.poison_outputs(False)


class _Doubler(KernelInterface):  # type: ignore[type-arg]
    """A stand-in kernel: out = 2 x (+ the kept buffer's values where given)."""

    arg_names = ("x", "out", "extra")

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        x, out = args[0], args[1]
        extra = kwargs.get("extra", args[2] if len(args) > 2 else None)
        out.copy_(x * 2 + (extra if extra is not None else 0))


def _module() -> types.ModuleType:
    module = types.ModuleType("fake_generated")
    module.doubler = _Doubler()  # type: ignore[attr-defined]
    return module


def _record(launch: Any, x: torch.Tensor) -> tuple[Any, Any, str | None]:
    return triton_plan.record(_module_of(launch), lambda: launch(x), {"x": x}, compiled=False)


_MODULES: dict[int, types.ModuleType] = {}


def _module_of(launch: Any) -> types.ModuleType:
    return _MODULES.setdefault(id(launch), _module())


def test_a_recorded_plan_allocates_fills_and_passes_kept_buffers() -> None:
    kept = torch.ones(4)

    def launch(x: torch.Tensor) -> Any:
        module = _module_of(launch)
        out = torch.empty(4)
        out.fill_(float("nan"))
        lse = torch.empty(0)
        module.doubler[(1,)](x, out, extra=kept)
        return out, lse

    x = torch.arange(4.0)
    (out, _), plan, refusal = _record(launch, x)
    assert refusal is None and plan is not None
    assert torch.equal(out, x * 2 + 1)
    y = torch.full((4,), 3.0)
    replayed = plan({"x": y})
    assert replayed is not None
    assert torch.equal(replayed[0], y * 2 + 1)
    assert replayed[0].data_ptr() != out.data_ptr()  # a fresh output every call


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("view", "torch.t"),
        ("fill_input", "fill_ on a tensor that is not a fresh allocation"),
        ("callable_grid", "a grid that is not a tuple of ints"),
        ("input_as_output", "an output that is not an allocation of the call"),
        ("nothing", "no kernel launched"),
    ],
)
def test_what_a_replay_could_not_repeat_keeps_the_full_path(body: str, why: str) -> None:
    def launch(x: torch.Tensor) -> Any:
        module = _module_of(launch)
        out, lse = torch.empty(4), torch.empty(0)
        if body == "view":
            module.doubler[(1,)](x.t().contiguous(), out, None)
        elif body == "fill_input":
            x.fill_(1.0)
            module.doubler[(1,)](x, out, None)
        elif body == "callable_grid":
            module.doubler[lambda meta: (1,)](x, out, None)
        elif body == "input_as_output":
            module.doubler[(1,)](x, out, None)
            return x, lse
        return out, lse

    _, plan, refusal = _record(launch, torch.arange(4.0))
    assert plan is None
    assert refusal == why


def test_recording_leaves_the_kernels_as_they_were() -> None:
    def launch(x: torch.Tensor) -> Any:
        out = torch.empty(4)
        _module_of(launch).doubler[(1,)](x, out, None)
        return out, torch.empty(0)

    _record(launch, torch.arange(4.0))
    doubler = _module_of(launch).doubler
    assert "run" not in vars(doubler)  # the class's run again, not the recorder's


class _Probe(KernelInterface):  # type: ignore[type-arg]
    """A stand-in kernel that notes (weakly, as a kernel keeps nothing) what it was given."""

    arg_names = ("x", "out", "buffer", "scratch")

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        x, out, buffer, scratch = args
        self.seen.append(tuple(weakref.ref(a) for a in args))
        buffer += 1  # state the module relies on across calls
        scratch.copy_(x)
        out.copy_(scratch + buffer)


def test_a_buffer_the_module_keeps_is_reused_and_scratch_is_fresh() -> None:
    cache: dict[str, torch.Tensor] = {}
    module = types.ModuleType("fake_generated")
    module.probe = _Probe()  # type: ignore[attr-defined]

    def launch(x: torch.Tensor) -> Any:
        if "buffer" not in cache:  # made by the first call, as an lru_cache'd helper does
            cache["buffer"] = torch.zeros(4)
        scratch, out = torch.empty(4), torch.empty(4)
        module.probe[(1,)](x, out, cache["buffer"], scratch)
        return out, torch.empty(0)

    x = torch.zeros(4)
    _, plan, refusal = triton_plan.record(module, lambda: launch(x), {"x": x}, False)
    assert refusal is None and plan is not None
    replayed = plan({"x": torch.full((4,), 10.0)})
    assert replayed is not None
    first, second = module.probe.seen
    assert second[2]() is cache["buffer"]  # the module's own buffer, not a fresh zeros
    # the buffer is passed as it is; scratch and out are allocated per call (nothing holds
    # the first call's scratch); the zero-element lse holds no data: the recorded one serves
    assert [a.kept is not None for a in plan.allocations] == [True, False, False, True]
    assert first[3]() is None
    assert torch.equal(replayed[0], torch.full((4,), 12.0))
    again = plan({"x": torch.full((4,), 20.0)})
    assert again is not None and again[1] is replayed[1] and again[1].numel() == 0
    assert again[0] is not replayed[0] and torch.equal(replayed[0], torch.full((4,), 12.0))


def test_fp32_calls_follow_pytorchs_tf32_setting_even_when_replayed() -> None:
    kernel = compiled("causal", "fused")
    module = kernel.module(False)  # the compiled module decides; the interpreter is exact
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    q = torch.randn(1, 2, 24, 16, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    try:
        matmul.fp32_precision = "ieee"
        assert module._dot_precision(torch.float32) == "tf32x3"
        assert module._dot_precision(torch.float16) == "tf32"  # 16-bit operands ignore it
        kernel(q, q, q)
        assert kernel.launch_path(q, q, q) == "replay"
        matmul.fp32_precision = "tf32"
        assert module._dot_precision(torch.float32) == "tf32"
        # the recorded launches multiply in tf32x3: a new first call records tf32 ones
        assert kernel.launch_path(q, q, q) == "full: no call of this geometry yet"
        kernel(q, q, q)
        assert kernel.launch_path(q, q, q) == "replay"
    finally:
        matmul.fp32_precision = before


class _StreamPlan:
    """A stand-in plan: bound to ``stream`` (None: it serves every stream)."""

    def __init__(self, stream: int | None) -> None:
        self.stream = stream

    def serves(self, stream: int) -> bool:
        return self.stream is None or stream == self.stream


def test_a_geometry_serves_each_stream_its_own_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A geometry whose plan is bound to the stream it was recorded on (it holds buffers kept
    per stream) serves another stream only the plan recorded there, and keeps those of its
    latest _STREAM_PLANS streams; a plan bound to none serves every stream."""
    from attncc.runtime import kernel as kernel_module

    current = [5]
    monkeypatch.setattr(kernel_module, "_RAW_STREAM", lambda index: current[0])
    geometry = kernel_module._Geometry({}, torch.float16, torch.device("cuda", 0), {}, {})
    geometry.plan = _StreamPlan(5)  # type: ignore[assignment]
    assert geometry.serving() is geometry.plan
    current[0] = 7
    assert geometry.serving() is None
    geometry.remember_stream_plan(_StreamPlan(7))  # type: ignore[arg-type]
    assert geometry.serving().stream == 7  # type: ignore[union-attr]
    for stream in range(100, 100 + kernel_module._STREAM_PLANS):
        geometry.remember_stream_plan(_StreamPlan(stream))  # type: ignore[arg-type]
    assert geometry.serving() is None  # the oldest dropped
    assert len(geometry.stream_plans) == kernel_module._STREAM_PLANS
    geometry.plan = _StreamPlan(None)  # type: ignore[assignment]
    assert geometry.serving() is geometry.plan


def test_past_its_first_geometries_a_kernel_records_one_at_its_second_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decode over a cache growing a token a call: past _FIRST_SIGHT_RECORDS geometries, a
    new one's first call runs unrecorded (on a GPU through attncc's launcher) or, where its
    length family replays it, through the family's plan, and its second makes it a plan of
    its own, which later calls replay; every call gives the full path's output."""
    from attncc.runtime import kernel as kernel_module
    from attncc.runtime import length_family

    kernel = compiled("decode", "split_kv")
    monkeypatch.setattr(kernel_module, "_FIRST_SIGHT_RECORDS", 2)
    monkeypatch.setattr(kernel, "_recorded", 0)
    monkeypatch.setattr(kernel, "_seen_once", {})
    monkeypatch.setattr(kernel, "_families", length_family.Families(kernel._families.length))
    gen = torch.Generator().manual_seed(6)

    def call(length: int) -> bool:
        """One call of a cache of ``length`` tokens; whether its geometry is recorded."""
        inputs = {
            "q": torch.randn(2, 4, 16, generator=gen).to(DEVICE),
            "k": torch.randn(2, length, 2, 16, generator=gen).to(DEVICE),
            "v": torch.randn(2, length, 2, 16, generator=gen).to(DEVICE),
            "cache_len": torch.tensor([length, length - 3], dtype=torch.int32).to(DEVICE),
        }
        out, _ = _full_path(kernel, inputs, False)
        torch.testing.assert_close(kernel(**inputs), out, rtol=0, atol=0)
        key = Plans.key(inputs, {}, False, False, stream=False)
        return kernel._geometry(key) is not None

    assert [call(n) for n in (50, 51, 52, 53, 52, 52, 50)] == [
        True, True, False, False, True, True, True
    ]  # fmt: skip
    assert len(kernel._seen_once) == 1  # 53's key alone
