"""Launch plans and driver launches of the CUDA target, on CPU: the packed parameters a
launch hands the driver (a fake one here), which calls share a plan, and what a plan does
with a call (the launches themselves need a GPU: tests/gpu/test_gpu_cuda.py)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from attncc.runtime import driver, launch_plan, native, tensor_map


class _FakeDriver:
    """The driver calls of launches, recorded; each parameter read back from its pointer."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.attribute_sets: list[int] = []
        self.launches: list[list[bytes]] = []

    def cuKernelGetFunction(self, out: object, kernel: ctypes.c_void_p) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = 0x1234
        return 0

    def cuFuncSetAttribute(self, function: object, attribute: int, value: int) -> int:
        self.attribute_sets.append(value)
        return 0

    def cuLaunchKernel(self, function: object, *rest: object) -> int:
        params = ctypes.cast(rest[8], ctypes.POINTER(ctypes.c_void_p))
        self.launches.append([ctypes.string_at(params[i], n) for i, n in enumerate(self.sizes)])
        return 0


@pytest.fixture(params=["native", "python"])
def fake_driver(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[_FakeDriver]:
    """A fake driver, its cuLaunchKernel called through an entry address by the C launcher
    (attncc.runtime.native, built here with the system's compiler) or by its Python twin."""
    fake = _FakeDriver([8, 4, 4, 128, 8])
    monkeypatch.setattr(driver, "lib", lambda: fake)
    monkeypatch.setattr(driver, "_FUNCTIONS", {})
    entry = driver._ENTRY(fake.cuLaunchKernel)  # kept alive by the fixture's frame
    monkeypatch.setattr(driver, "entry_address", lambda: ctypes.cast(entry, ctypes.c_void_p).value)
    if request.param == "native":
        assert native.launcher() is not None, native.unavailable()
    else:
        monkeypatch.setattr(driver, "_native", lambda: None)
    yield fake


def _bytes(value: np.generic | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.tobytes()


ARGS = [np.uint64(2**40 + 3), np.int32(-7), np.float32(0.5), bytes(range(128)), np.uint64(0)]


def test_a_launch_passes_every_parameter_and_opts_in_once(fake_driver: _FakeDriver) -> None:
    """Every value reaches the driver as its own bytes (maps whole) when the launch is
    issued, not when prepared; the shared-memory limit is raised once per function, again
    only for a larger request."""
    kernel = type("Kernel", (), {"handle": 99})()
    for issued, shared in enumerate((200_000, 100_000, 220_000)):
        function = driver.function(kernel, 0, shared)
        launch = driver.Launch(function, (1, 1, 1), (384, 1, 1), shared, 7, ARGS)
        assert len(fake_driver.launches) == issued  # prepared, not issued
        launch()
    assert fake_driver.launches[0] == [_bytes(a) for a in ARGS]
    assert fake_driver.launches[0] == fake_driver.launches[2]
    assert fake_driver.attribute_sets == [200_000, 220_000]


def test_slots_take_each_calls_pointers_and_maps(fake_driver: _FakeDriver) -> None:
    """A prepared launch issued again with new values for its slots (a pointer, a map)
    passes them and keeps every other parameter; a call with the wrong number of values is
    refused before anything launches."""
    launch = driver.Launch(0x1234, (2, 1, 1), (128, 1, 1), 0, 0, ARGS, slots=(0, 3, 4))
    launch(2**33 + 16, bytes([7]) * 128, 2**20)
    launch(2**34, bytes([9]) * 128, 0)
    first, second = fake_driver.launches
    assert first == [
        np.uint64(2**33 + 16).tobytes(), *[_bytes(a) for a in ARGS[1:3]], bytes([7]) * 128,
        np.uint64(2**20).tobytes(),
    ]  # fmt: skip
    assert second[0] == np.uint64(2**34).tobytes() and second[3] == bytes([9]) * 128
    assert second[1:3] == first[1:3] and second[4] == bytes(8)
    with pytest.raises(TypeError, match="3 slots, given 2 values"):
        launch(1, bytes(128))
    assert len(fake_driver.launches) == 2


def _inputs(n: int = 64, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    q, k, v = (torch.randn(2, 4, n, 64).to(dtype) for _ in range(3))
    return {"q": q, "k": k, "v": v, "doc": torch.randint(0, 3, (2, n), dtype=torch.int32)}


@pytest.fixture(params=["native", "python"])
def key_builder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Plans.key built by the C launcher's plan_key, or by its Python twin (the launcher not
    built)."""
    if request.param == "native":
        assert native.launcher() is not None, native.unavailable()
    else:
        monkeypatch.setattr(native, "built", lambda: None)
    return str(request.param)


def test_the_c_key_is_the_python_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both builders give equal keys (one plan table serves a process that starts on the
    Python key while the launcher builds): with and without params, with a stream."""
    assert native.launcher() is not None, native.unavailable()
    inputs = _inputs()
    other = {**_inputs(), "k": _inputs()["k"].transpose(2, 3)}
    cases = [
        (inputs, {"scale": 0.125, "window": 3, "causal": True}, False, True),
        (other, {}, True, False),
        ({}, {"scale": 2.0}, False, False),
    ]
    built = [launch_plan.Plans.key(*case) for case in cases]
    monkeypatch.setattr(native, "built", lambda: None)
    assert [launch_plan.Plans.key(*case) for case in cases] == built
    assert all(isinstance(k, tuple) for k in built)


def test_calls_alike_but_for_their_data_share_a_plan_key(key_builder: str) -> None:
    """The key reads geometry, not data: fresh tensors of the same shapes, strides, dtypes
    and alignment share it; a different stride, dtype, 16-byte alignment, size, param value
    or type, return_lse or fallback each make another."""
    key = launch_plan.Plans.key
    base = key(_inputs(), {"scale": 0.125}, False, True)
    assert base is not None and key(_inputs(), {"scale": 0.125}, False, True) == base
    other = _inputs()
    transposed = {**other, "k": other["k"].transpose(1, 2).contiguous().transpose(1, 2)}
    offset = torch.randn(2 * 4 * 64 * 64 + 1).bfloat16()[1:].view(2, 4, 64, 64)
    variants = [
        key(transposed, {"scale": 0.125}, False, True),
        key(_inputs(dtype=torch.float16), {"scale": 0.125}, False, True),
        key({**other, "q": offset}, {"scale": 0.125}, False, True),
        key(_inputs(n=65), {"scale": 0.125}, False, True),
        key(_inputs(), {"scale": 0.25}, False, True),
        key(_inputs(), {"scale": 1}, False, True),
        key(_inputs(), {}, False, True),
        key(_inputs(), {"scale": 0.125}, True, True),
        key(_inputs(), {"scale": 0.125}, False, False),
    ]
    assert base not in variants and len(set(variants)) == len(variants)


def test_calls_no_plan_may_take_have_no_key(key_builder: str) -> None:
    """Tensor subclasses (fake or functional tensors while tracing) and params that are not
    plain numbers (a tensor's value could change between calls) get no key."""

    class Sub(torch.Tensor):
        pass

    inputs = _inputs()
    assert (
        launch_plan.Plans.key({**inputs, "q": inputs["q"].as_subclass(Sub)}, {}, False, False)
        is None
    )
    assert launch_plan.Plans.key(inputs, {"scale": torch.tensor(0.5)}, False, False) is None
    assert launch_plan.Plans.key(inputs, {"scale": np.float64(0.5)}, False, False) is None
    assert launch_plan.Plans.key({**inputs, "q": [1.0]}, {}, False, False) is None
    assert (
        launch_plan.Plans.key({**inputs, "q": torch.nn.Parameter(inputs["q"])}, {}, False, False)
        is None
    )


def test_plans_keep_the_newest_up_to_their_limit() -> None:
    plans = launch_plan.Plans(limit=3)
    for i in range(5):
        plans.remember((i,), f"plan {i}")
    assert len(plans) == 3 and plans.get((0,)) is None and plans.get((4,)) == "plan 4"
    plans.remember(None, "no key")
    assert plans.get(None) is None and len(plans) == 3
    plans.clear()
    assert len(plans) == 0


class _Recorded:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fields: list[Any] = []

    def __call__(self, *values: Any) -> None:
        self.calls.append(values)

    def address_slots(self, fields: Any) -> None:
        self.fields = list(fields)


def _plain_map(ptr: int, *layout: Any) -> bytes:
    return ptr.to_bytes(128, "little")


def _plan(
    monkeypatch: pytest.MonkeyPatch, encoding: Any = _plain_map, **kwargs: Any
) -> tuple[launch_plan.FusedPlan, Any]:
    contexts = [11]
    monkeypatch.setattr(driver, "current_context", lambda: contexts[0])
    monkeypatch.setattr(tensor_map, "encode", encoding)
    monkeypatch.setattr(tensor_map, "encode_map", encoding)

    def allocate() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty(2, 4, 64, 64), torch.empty(0)

    def pointers(tensors: dict[str, Any], out: torch.Tensor, lse: torch.Tensor) -> tuple[int, ...]:
        return (tensors["k"].data_ptr(), tensors["doc"].data_ptr(), out.data_ptr())

    plan = launch_plan.FusedPlan(allocate, pointers, _Recorded(), **kwargs)  # type: ignore[arg-type]
    return plan, contexts


def test_a_plan_fills_each_calls_pointers_index_and_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builder gets the call's pointers and the plan's index buffer; the attention
    kernel the same pointers, the same index and the maps of this call's K; an int64
    document id tensor is converted to its declared int32 first (its pointer is the
    copy's)."""
    layout = (torch.bfloat16, 64, 64, 64, 65, 128)
    plan, _ = _plan(
        monkeypatch,
        first=_Recorded(),
        buffers=[((40,), torch.int32)],
        maps=[("k", layout)],
        conversions=[("doc", torch.int32)],
    )
    inputs = {**_inputs(), "doc": torch.zeros(2, 64, dtype=torch.int64)}
    done = plan(inputs)
    assert done is not None
    out, _ = done
    (built,) = plan.first.calls  # type: ignore[union-attr]
    (attended,) = plan.attend.calls  # type: ignore[attr-defined]
    k_ptr = inputs["k"].data_ptr()
    assert built[0] == k_ptr and built[2] == out.data_ptr()
    assert built[1] != inputs["doc"].data_ptr()  # the converted copy
    # the map packed in the launch moves to this call's K: its address, one word of it
    assert attended[:4] == built and attended[4] == k_ptr
    assert plan.attend.fields == [tensor_map.AddressField(0, 0, 0)]  # type: ignore[attr-defined]


def _shifted_map(ptr: int, *layout: Any) -> bytes:
    """A map whose word at byte 16 holds the address in 16-byte units over flag bits, the
    rest the layout's: as the driver's own format may hold it."""
    head = bytes([len(layout)]) * 16
    word = ((ptr >> 4) | (5 << 56)).to_bytes(8, "little")
    return head + word + bytes(range(104))


def _scrambled_map(ptr: int, *layout: Any) -> bytes:
    return bytes((ptr * 2654435761 >> i) & 0xFF for i in range(128))


def test_an_address_field_is_read_from_the_encodings_and_reproduces_them() -> None:
    """The word that changes with the address, its shift and the bits around it are found by
    encoding at a few addresses; rewriting it gives exactly the encoding of another address.
    An encoding no single word's rewrite reproduces has no field."""
    field = tensor_map.address_field(lambda at: _shifted_map(at), 2**36 + 4096)
    assert field is not None and (field.offset, field.shift) == (16, 4)
    elsewhere = 2**41 + 16 * 12345
    assert field.patched(_shifted_map(2**36 + 4096), elsewhere) == _shifted_map(elsewhere)
    assert tensor_map.address_field(_scrambled_map, 2**36 + 4096) is None


def test_a_plan_without_an_address_field_encodes_each_calls_maps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layout = (torch.bfloat16, 64, 64, 64, 65, 128)
    plan, _ = _plan(monkeypatch, _scrambled_map, maps=[("k", layout)])
    inputs = _inputs()
    assert plan(inputs) is not None
    (attended,) = plan.attend.calls  # type: ignore[attr-defined]
    assert attended[-1] == _scrambled_map(inputs["k"].data_ptr())
    assert plan.fields == ()


def test_address_slots_rewrite_one_word_of_the_packed_map(fake_driver: _FakeDriver) -> None:
    """A map slot given an address field takes an address: the launch passes the map packed
    first with that word rewritten, every other byte as packed; a pointer slot is unchanged."""
    first = _shifted_map(2**36)
    args = [*ARGS[:3], first, ARGS[4]]
    launch = driver.Launch(0x1234, (2, 1, 1), (128, 1, 1), 0, 0, args, slots=(0, 3))
    field = tensor_map.address_field(_shifted_map, 2**36)
    launch.address_slots([field])
    launch(2**33, 2**40 + 16 * 77)
    (passed,) = fake_driver.launches
    assert passed[0] == np.uint64(2**33).tobytes()
    assert passed[3] == _shifted_map(2**40 + 16 * 77)
    with pytest.raises(ValueError, match="maps' slots only"):
        driver.Launch(0x1234, (1, 1, 1), (32, 1, 1), 0, 0, args, slots=(0,)).address_slots([field])


def test_a_plan_launches_nothing_in_another_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread whose current CUDA context is not the plan's (its function handles belong to
    that one) gets None, nothing launched: the caller takes the full path."""
    plan, contexts = _plan(monkeypatch)
    assert plan(_inputs()) is not None
    contexts[0] = 12
    assert plan(_inputs()) is None
    assert len(plan.attend.calls) == 1  # type: ignore[attr-defined]


def test_an_empty_plan_zeroes_the_output() -> None:
    plan = launch_plan.EmptyPlan(lambda: (torch.full((2, 3), 5.0), torch.full((2,), 5.0)))
    out, lse = plan({})
    assert torch.equal(out, torch.zeros(2, 3)) and bool(torch.isneginf(lse).all())


def test_a_cuda_plans_outputs_are_fresh_and_an_unasked_log_sum_exp_is_shared() -> None:
    """The CUDA host's plan allocator (its shapes worked out once): a new output every call;
    without return_lse one zero-element log-sum-exp serves every call (it holds no data),
    with it a new one of the full shape; poisoned outputs are NaN-filled."""
    import attncc

    host = attncc.compile("examples/causal.attn", target="cuda")._host
    sizes = {"B": 2, "H": 3, "M": 5, "D": 4}
    allocate = host._allocator(sizes, torch.float16, torch.device("cpu"), False)
    (out, lse), (again, lse_again) = allocate(), allocate()
    assert out.shape == (2, 3, 5, 4) and out.dtype == torch.float16 and again is not out
    assert lse.numel() == 0 and lse_again is lse
    asked = host._allocator(sizes, torch.float16, torch.device("cpu"), True)
    (_, full), (_, other) = asked(), asked()
    assert full.shape == (2, 3, 5) and other is not full
    host._POISON = True
    try:
        assert bool(torch.isnan(allocate()[0]).all())
    finally:
        host._POISON = False


def test_a_backward_plan_fills_each_calls_pointers_and_fresh_buffers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sm_90a backward's plan: each launch gets the call's input pointers (converted
    inputs' copies) where it reads the inputs, then its own buffers' pointers in order, dO
    and the lse's gradient as given and every other buffer fresh on each call; the buffers
    named as the result come back; another CUDA context launches nothing."""
    contexts = [11]
    monkeypatch.setattr(driver, "current_context", lambda: contexts[0])

    def allocate() -> dict[str, torch.Tensor]:
        return {name: torch.empty(4) for name in ("delta", "grad", "other")}

    def pointers(tensors: dict[str, Any], out: torch.Tensor, lse: torch.Tensor) -> tuple[int, ...]:
        return (tensors["doc"].data_ptr(), out.data_ptr(), lse.data_ptr())

    first, second = _Recorded(), _Recorded()
    plan = launch_plan.BackwardPlan(
        allocate,
        pointers,
        [(first, True, ("dout", "dlse", "delta")), (second, False, ("delta", "grad"))],  # type: ignore[list-item]
        ("grad", "other"),
        conversions=[("doc", torch.int32)],
    )
    doc = torch.zeros(2, 64, dtype=torch.int64)
    out, lse, dout, dlse = (torch.empty(3) for _ in range(4))
    done = plan({"doc": doc}, out, lse, dout, dlse)
    assert done is not None
    grad, _ = done
    ((doc_ptr, out_ptr, lse_ptr, dout_ptr, dlse_ptr, delta_ptr),) = first.calls
    assert doc_ptr != doc.data_ptr()  # the converted copy
    assert (out_ptr, lse_ptr, dout_ptr, dlse_ptr) == tuple(
        t.data_ptr() for t in (out, lse, dout, dlse)
    )
    assert second.calls == [(delta_ptr, grad.data_ptr())]
    again = plan({"doc": doc}, out, lse, dout, dlse)
    assert again is not None and again[0] is not grad  # fresh buffers
    contexts[0] = 12
    assert plan({"doc": doc}, out, lse, dout, dlse) is None
    assert len(first.calls) == 2 and len(second.calls) == 2


@pytest.mark.parametrize(
    "shape", [(2, 8, 64, 64), (5,), (), (0, 3), (3, 0, 2), (1, 1, 1, 1, 1), (7, 1, 3)]
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int32, torch.uint8])
def test_an_allocator_makes_what_torch_empty_and_zeros_make(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    for zeros, factory in ((False, torch.empty), (True, torch.zeros)):
        new = launch_plan.allocator(shape, dtype, "cpu", zeros)
        made, expected = new(), factory(shape, dtype=dtype)
        assert (made.shape, made.stride(), made.dtype) == (expected.shape, expected.stride(), dtype)
        assert made.is_contiguous() and not made.requires_grad
        assert new().data_ptr() != made.data_ptr() or made.numel() == 0  # a new tensor a call
        if zeros:
            assert made.numel() == 0 or not made.any()


_CONTEXT_ENTRY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))


def test_a_plans_c_replay_launches_what_the_plan_launches(
    fake_driver: _FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FusedPlan.native_replay (the C launcher's Replay of the plan, once a call found where
    its maps move): a call's first and attention launches get this call's pointers, a fresh
    output, the plan's buffers (the same in both and in every call: a tile index, split-KV's
    partial results; the launches' one stream runs calls in turn) and K's map moved to this
    call's K, as the plan's own call passes them; in another context it launches nothing.
    Without the C launcher there is no replay."""
    fake_driver.sizes = [8, 8, 8, 8, 8, 128]
    contexts = [11]

    def current(out: Any) -> int:
        out[0] = contexts[0]
        return 0

    entry = _CONTEXT_ENTRY(current)
    address = int(ctypes.cast(entry, ctypes.c_void_p).value or 0)
    monkeypatch.setattr(driver, "context_entry", lambda: address)
    if native.built() is None:
        monkeypatch.setattr(driver, "current_context", lambda: contexts[0])
    monkeypatch.setattr(tensor_map, "encode", _shifted_map)
    monkeypatch.setattr(tensor_map, "encode_map", _shifted_map)
    first = _inputs()
    args = [np.uint64(0)] * 5 + [_shifted_map(first["k"].data_ptr())]
    attend = driver.Launch(0x1234, (2, 1, 1), (128, 1, 1), 0, 7, args, slots=(0, 1, 2, 3, 4, 5))
    before = driver.Launch(0x1235, (1, 1, 1), (64, 1, 1), 0, 7, args, slots=(0, 1, 2, 3, 4))
    outputs = launch_plan.Outputs(
        launch_plan.allocator((2, 4, 64, 64), torch.float32, "cpu"), torch.empty(0), lambda: False
    )

    def pointers(tensors: dict[str, Any], out: torch.Tensor, lse: torch.Tensor) -> tuple[int, ...]:
        return (tensors["k"].data_ptr(), tensors["doc"].data_ptr(), out.data_ptr())

    plan = launch_plan.FusedPlan(
        outputs, pointers, attend, first=before,
        buffers=[((40,), torch.int32), ((3, 64), torch.float32)],
        maps=[("k", (torch.bfloat16, 64, 64, 64, 65, 128))],
        sources=(("input", "k"), ("input", "doc"), ("output", 0)),
    )  # fmt: skip
    assert plan.native_replay() is None  # no call yet: where the maps move is not known
    done = plan(first)
    assert done is not None
    replay = plan.native_replay()
    if native.built() is None or driver._native() is None:
        assert replay is None
        return
    later = _inputs()
    replayed = replay(later)
    assert replayed is not None
    out, lse = replayed
    assert out.shape == (2, 4, 64, 64) and lse is outputs.parts[1] and out is not done[0]
    (b1, a1, b2, a2) = fake_driver.launches

    def word(value: int) -> bytes:
        return np.uint64(value).tobytes()

    for (began, attended), call, result in ((b1, a1), first, done[0]), ((b2, a2), later, out):
        pointers_passed = [word(call["k"].data_ptr()), word(call["doc"].data_ptr())]
        assert began[:2] == attended[:2] == pointers_passed
        assert began[2] == attended[2] == word(result.data_ptr())
        # the call's two buffers, apart and the same in both launches
        assert began[3:5] == attended[3:5] and word(0) not in began[3:5] and b1[3] != b1[4]
        assert attended[5] == _shifted_map(call["k"].data_ptr())
    assert b1[3:5] == b2[3:5]  # kept
    contexts[0] = 12
    assert replay(later) is None and len(fake_driver.launches) == 4
