"""Recorded Triton launches packed for attncc's launcher (attncc.runtime.triton_launch), on
CPU against a recording stand-in for cuLaunchKernel: the parameters in the layout of
Triton's launcher, each call's pointers and moved maps in their slots, and the launches it
leaves to Triton. The real kernels run on a GPU (tests/runtime/test_triton_plan.py)."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from attncc.runtime import driver, native, tensor_descriptors, tensor_map, triton_launch

TYPES = ["*fp16", "i32", "constexpr", "fp32", "nvTmaDesc", "i32", "i64", "*i32", "i1"]
# each parameter's bytes: the constexpr has none; two scratch pointers close the list
SIZES = [8, 4, 4, 128, 4, 8, 8, 1, 8, 8]


class _Recorder:
    def __init__(self) -> None:
        self.launches: list[tuple[Any, ...]] = []
        self.entry = driver._ENTRY(self._launch)
        self.sizes = SIZES  # the launched kernel's parameters' bytes

    def _launch(self, function: int, *rest: Any) -> int:
        params = ctypes.cast(rest[8], ctypes.POINTER(ctypes.c_void_p))
        values = [ctypes.string_at(params[i], n) for i, n in enumerate(self.sizes)]
        self.launches.append((function, tuple(rest[:7]), rest[7], values))
        return 0


@pytest.fixture(params=["native", "python"])
def recorder(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[_Recorder]:
    recording = _Recorder()
    address = ctypes.cast(recording.entry, ctypes.c_void_p).value
    monkeypatch.setattr(driver, "entry_address", lambda: address)
    monkeypatch.setattr(driver, "parameter_sizes", lambda function: list(SIZES))
    monkeypatch.setattr(triton_launch, "_LAYOUT_CHECKS", {})  # each test's own driver
    monkeypatch.setattr(tensor_descriptors, "map_address", lambda m: ctypes.addressof(m))
    if request.param == "native":
        assert native.launcher() is not None, native.unavailable()
    else:
        monkeypatch.setattr(driver, "_native", lambda: None)
    yield recording


def _compiled(types: list[str] | None = None, **metadata: Any) -> Any:
    """A compiled kernel as the launchers read it: its metadata, and its signature's types."""
    fields = {"num_warps": 4, "num_ctas": 1, "shared": 2048, "launch_pdl": False} | metadata
    signature = {f"a{n}": kind for n, kind in enumerate(types or [])}
    return SimpleNamespace(
        metadata=SimpleNamespace(**fields), src=SimpleNamespace(signature=signature)
    )


def _map(address: int) -> bytes:
    return bytes(16) + (address >> 4 | 1 << 62).to_bytes(8, "little") + bytes(range(104))


def test_a_launch_passes_tritons_layout_and_each_calls_pointers(recorder: _Recorder) -> None:
    """Constexprs drop out, scalars take their C width, the map its 128 bytes; the input's
    pointer, the kept buffer's and the map's address word come from the call."""
    kept = torch.empty(4, dtype=torch.int32)
    held = ctypes.create_string_buffer(_map(2**36), 128)
    values = [None, 7, 64, 0.5, held, 3, 2**40, kept, True]
    field = tensor_map.address_field(_map, 2**36)
    assert field is not None
    launch = triton_launch.prepare(
        _compiled(),
        0x55,
        (5, 2, 1),
        values,
        TYPES,
        [(0, ("input", "q"))],
        [(4, field, ("alloc", 1))],
    )
    assert isinstance(launch, driver.Launch)
    q, out = torch.empty(8), torch.empty(16)
    launch.run(123, {"q": q}, [None, out], 0)
    ((function, dims, stream, passed),) = recorder.launches
    assert function == 0x55 and dims == (5, 2, 1, 128, 1, 1, 2048) and stream == 123
    assert passed == [
        struct.pack("<Q", q.data_ptr()), struct.pack("<i", 7), struct.pack("<f", 0.5),
        _map(out.data_ptr()), struct.pack("<i", 3), struct.pack("<q", 2**40),
        struct.pack("<Q", kept.data_ptr()), b"\x01", bytes(8), bytes(8),
    ]  # fmt: skip


def test_a_scratch_slot_is_the_base_plus_its_offset(recorder: _Recorder) -> None:
    values = [None, 7, 64, 0.5, ctypes.create_string_buffer(128), 3, 4, None, False]
    launch = triton_launch.prepare(
        _compiled(), 0x55, (1, 1, 1), values, TYPES, [(0, ("scratch", 1024)), (7, ("input", "q"))]
    )
    assert isinstance(launch, driver.Launch)
    q = torch.empty(2)
    launch.run(0, {"q": q}, [], 2**32)
    ((_, _, _, passed),) = recorder.launches
    assert passed[0] == struct.pack("<Q", 2**32 + 1024) and passed[6] == struct.pack(
        "<Q", q.data_ptr()
    )


def test_int_slots_write_each_calls_value_and_a_constexprs_keeps_its_own(
    recorder: _Recorder,
) -> None:
    """A length family's plan (attncc.runtime.length_family): slots at int arguments take
    each call's value in the parameter's width; one at a constexpr (an int of 1 the kernel
    was compiled for, the same across the family) launches with the compiled value."""
    values = [None, 7, 1, 0.5, ctypes.create_string_buffer(128), 3, 4, None, False]
    slots = [(0, ("input", "q")), (1, ("input", "#0")), (2, ("input", "#1")), (6, ("input", "#2"))]
    launch = triton_launch.prepare(_compiled(), 0x55, (1, 1, 1), values, TYPES, slots)
    assert isinstance(launch, driver.Launch)
    q = torch.empty(2)
    launch.run(0, {"q": q, "#0": 4097, "#1": 1, "#2": 2**33 + 5}, [], 0)
    ((_, _, _, passed),) = recorder.launches
    assert passed[1] == struct.pack("<i", 4097) and passed[5] == struct.pack("<q", 2**33 + 5)


# a kernel without tensor maps, as a call no plan recorded launches it (DirectLaunch)
DIRECT_TYPES = ["*fp16", "i32", "constexpr", "fp32", "i64", "*i32", "i1"]
DIRECT_SIZES = [8, 4, 4, 8, 8, 1, 8, 8]


@pytest.fixture
def direct(recorder: _Recorder, monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    recorder.sizes = DIRECT_SIZES
    monkeypatch.setattr(driver, "parameter_sizes", lambda function: list(DIRECT_SIZES))
    monkeypatch.setattr(triton_launch, "loaded_function", lambda compiled, device: 0x55)
    monkeypatch.setattr(triton_launch, "_DIRECT", {})
    return recorder


def test_a_direct_launch_packs_the_bytes_a_prepared_launch_passes(direct: _Recorder) -> None:
    """A call of a geometry no plan recorded gives every argument at once: its launch packs
    them in one struct call, the bytes ``prepare``'s launch passes for the same values."""
    q, kept = torch.empty(8), torch.empty(4, dtype=torch.int32)
    values = [q, 7, 64, 0.5, 2**40, kept, True]
    compiled = _compiled(DIRECT_TYPES)
    launch = triton_launch.direct_launch(compiled, 0)
    assert isinstance(launch, triton_launch.DirectLaunch)
    assert triton_launch.direct_launch(compiled, 0) is launch  # once a kernel
    assert launch.issue((5, 2, 1), values, 123)
    prepared = triton_launch.prepare(compiled, 0x55, (5, 2, 1), values, DIRECT_TYPES, [])
    assert isinstance(prepared, driver.Launch)
    prepared.run(123, {}, (), 0)
    direct_call, prepared_call = direct.launches
    assert direct_call == prepared_call
    function, dims, stream, passed = direct_call
    assert function == 0x55 and dims == (5, 2, 1, 128, 1, 1, 2048) and stream == 123
    assert passed[0] == struct.pack("<Q", q.data_ptr()) and passed[4] == struct.pack(
        "<Q", kept.data_ptr()
    )


def test_a_value_that_does_not_pack_launches_nothing(direct: _Recorder) -> None:
    """Where a value does not fit its parameter the caller launches through Triton, whose
    own launcher reports it."""
    launch = triton_launch.direct_launch(_compiled(DIRECT_TYPES), 0)
    assert isinstance(launch, triton_launch.DirectLaunch)
    for wrong in ([None, 2**40, 64, 0.5, 1, None, True], [None, 7, 64, "x", 1, None, True]):
        assert not launch.issue((1, 1, 1), wrong, 0)
    assert direct.launches == []


@pytest.mark.parametrize(
    ("compiled", "why"),
    [
        (_compiled(DIRECT_TYPES, num_ctas=2), "cuLaunchKernelEx's attributes"),
        (_compiled(TYPES), "type nvTmaDesc"),
        (_compiled(["fp16" if t == "fp32" else t for t in DIRECT_TYPES]), "type fp16"),
    ],
)
def test_kernels_a_direct_launch_cannot_pack_say_why(
    direct: _Recorder, compiled: Any, why: str
) -> None:
    refusal = triton_launch.direct_launch(compiled, 0)
    assert isinstance(refusal, str) and why in refusal


@pytest.mark.parametrize(
    ("compiled", "sizes", "types", "why"),
    [
        (_compiled(num_ctas=2), SIZES, TYPES, "cuLaunchKernelEx's attributes"),
        (_compiled(global_scratch_size=64), SIZES, TYPES, "scratch memory"),
        (_compiled(), [*SIZES, 8], TYPES, "differ from Triton's signature"),
        (_compiled(), None, TYPES, "cannot list the kernel's parameters"),
        (_compiled(), SIZES, ["fp16" if t == "fp32" else t for t in TYPES], "type fp16"),
    ],
)
def test_launches_it_cannot_pack_exactly_keep_tritons_launcher(
    recorder: _Recorder,
    monkeypatch: pytest.MonkeyPatch,
    compiled: Any,
    sizes: list[int] | None,
    types: list[str],
    why: str,
) -> None:
    monkeypatch.setattr(driver, "parameter_sizes", lambda function: sizes)
    values = [None, 7, 64, 0.5, ctypes.create_string_buffer(128), 3, 4, None, True]
    refusal = triton_launch.prepare(compiled, 0x55, (1, 1, 1), values, types, [(0, ("input", "q"))])
    assert isinstance(refusal, str) and why in refusal


def test_a_descriptor_left_to_tritons_wrapper_keeps_its_launcher(recorder: _Recorder) -> None:
    source = ("desc", ("input", "k"), (64, 32), (32, 1), (16, 32), "zero")
    values = [None, 7, 64, 0.5, ctypes.create_string_buffer(128), 3, 4, None, True]
    refusal = triton_launch.prepare(_compiled(), 0x55, (1, 1, 1), values, TYPES, [(0, source)])
    assert isinstance(refusal, str) and "from desc" in refusal


class _Driver:
    """attncc's driver as loaded_function uses it: loads, functions and their limits."""

    def __init__(self, threads: int, refuse_shared: bool = False) -> None:
        self.loads: list[tuple[bytes, tuple[str, ...]]] = []
        self.preferring: list[int] = []
        self.threads, self.refuse_shared = threads, refuse_shared

    def load_kernels(self, cubin: bytes, names: tuple[str, ...]) -> tuple[driver.Kernel, ...]:
        self.loads.append((cubin, names))
        return (driver.Kernel(0x700 + len(self.loads), names[0]),)

    def function(self, kernel: driver.Kernel, device: int, shared: int) -> int:
        if self.refuse_shared:
            raise RuntimeError(f"attncc: cannot give a CUDA kernel {shared} bytes")
        return kernel.handle + 0x10000 * device

    def max_threads(self, function: int) -> int:
        return self.threads

    def prefer_shared(self, function: int) -> None:
        self.preferring.append(function)


def _cubin(shared: int, num_warps: int = 4) -> Any:
    metadata = SimpleNamespace(shared=shared, num_warps=num_warps)
    return SimpleNamespace(kernel=b"cubin", name="attn_fwd", metadata=metadata)


def test_a_kernel_is_loaded_once_per_device_through_attnccs_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Triton's own loading would build its launcher (a C compiler run): the cubin goes
    through attncc's driver instead, once per compiled kernel and device, and a kernel
    using more than 48 KB of shared memory prefers shared memory, as Triton's loader sets."""
    fake = _Driver(threads=1024)
    for name in ("load_kernels", "function", "max_threads", "prefer_shared"):
        monkeypatch.setattr(driver, name, getattr(fake, name))
    monkeypatch.setattr(triton_launch, "_LOADED", {})
    monkeypatch.setattr(triton_launch, "_VERDICTS", {})
    small, large = _cubin(shared=2048), _cubin(shared=160 * 1024)
    first = triton_launch.loaded_function(small, 0)
    assert triton_launch.loaded_function(small, 0) == first
    assert fake.loads == [(b"cubin", ("attn_fwd",))] and fake.preferring == []
    assert triton_launch.loaded_function(small, 1) != first  # another device: its own load
    wide = triton_launch.loaded_function(large, 0)
    assert fake.preferring == [wide] and len(fake.loads) == 3


@pytest.mark.parametrize(
    ("fake", "why"),
    [
        (_Driver(threads=96), "more threads than the kernel's registers allow"),
        (_Driver(threads=1024, refuse_shared=True), "does not load through attncc's driver"),
    ],
)
def test_a_kernel_the_driver_cannot_run_as_configured_keeps_tritons_launch(
    monkeypatch: pytest.MonkeyPatch, fake: _Driver, why: str
) -> None:
    """Triton's launch raises its own error for these (OutOfResources): no launch here."""
    for name in ("load_kernels", "function", "max_threads", "prefer_shared"):
        monkeypatch.setattr(driver, name, getattr(fake, name))
    monkeypatch.setattr(triton_launch, "_LOADED", {})
    monkeypatch.setattr(triton_launch, "_VERDICTS", {})
    refusal = triton_launch.loaded_function(_cubin(shared=232448), 0)
    assert isinstance(refusal, str) and why in refusal


def test_a_functions_parameter_sizes_are_asked_of_the_driver_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each new call geometry prepares its launches again; the kernel's parameter list is
    the function's, so the driver is asked once a function, not once a launch."""
    asked: list[tuple[int, int]] = []

    def info(function: Any, index: int, offset: Any, size: Any) -> int:
        asked.append((function.value, index))
        if index == 3:
            return driver._INVALID_VALUE
        ctypes.cast(size, ctypes.POINTER(ctypes.c_size_t))[0] = 8 if index else 4
        return 0

    monkeypatch.setattr(driver, "lib", lambda: SimpleNamespace(cuFuncGetParamInfo=info))
    monkeypatch.setattr(driver, "_PARAMETER_SIZES", {})
    assert [driver.parameter_sizes(0x1000) for _ in range(3)] == [[4, 8, 8]] * 3
    assert driver.parameter_sizes(0x2000) == [4, 8, 8]
    assert asked == [(0x1000, i) for i in range(4)] + [(0x2000, i) for i in range(4)]
