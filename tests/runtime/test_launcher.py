"""The kernel launcher's two implementations (attncc.runtime.launcher.c, built with the
system's C compiler, and driver.PythonLaunch) on CPU, against a recording stand-in for
cuLaunchKernel: each slot kind, the words they write, what they refuse, and the same
parameters from both for the same call."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from attncc.runtime import driver, native

FROM_INPUT, FROM_ITEM, FROM_BASE = driver.FROM_INPUT, driver.FROM_ITEM, driver.FROM_BASE


class _Recorder:
    """cuLaunchKernel's stand-in: every launch's function, dims, stream and parameters."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.launches: list[tuple[Any, ...]] = []
        self.code = 0
        self.entry = driver._ENTRY(self._launch)

    def _launch(self, function: int, *rest: Any) -> int:
        params = ctypes.cast(rest[8], ctypes.POINTER(ctypes.c_void_p))
        values = [ctypes.string_at(params[i], n) for i, n in enumerate(self.sizes)]
        self.launches.append((function, tuple(rest[:7]), rest[7], values))
        return self.code

    @property
    def address(self) -> int:
        return int(ctypes.cast(self.entry, ctypes.c_void_p).value or 0)


@pytest.fixture(params=["native", "python"])
def implementation(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "native":
        module = native.launcher()
        assert module is not None, native.unavailable()
        yield module.Launch
    else:
        yield driver.PythonLaunch


def _params() -> tuple[bytes, list[int]]:
    """Three 8-byte parameters and a 128-byte map: 152 bytes."""
    return bytes(range(152)), [0, 8, 16, 24]


def _word(value: int) -> bytes:
    return struct.pack("<Q", value % 2**64)


def test_each_slot_kind_writes_its_word(implementation: Any) -> None:
    """An input by name (its data_ptr()), an item by position (an int), the base plus an
    offset, and a map's address word shifted and biased; the rest of the buffer as packed,
    the grid, block, shared memory and stream as given."""
    recorder = _Recorder([8, 8, 8, 128])
    params, offsets = _params()
    slots = [
        (0, FROM_INPUT, "q", 0, 0, 8),
        (8, FROM_ITEM, 1, 0, 0, 8),
        (16, FROM_BASE, None, 0, 4096, 8),
        (24 + 32, FROM_INPUT, "k", 4, 2**63 + 5, 8),
    ]
    launch = implementation(
        recorder.address, 0x77, (3, 2, 1), (128, 1, 1), 1024, params, offsets, slots
    )
    q, k = torch.empty(4), torch.empty(8)
    assert launch.run(99, {"q": q, "k": k}, [None, 2**40 + 8], 2**30) == 0
    ((function, dims, stream, values),) = recorder.launches
    assert function == 0x77 and dims == (3, 2, 1, 128, 1, 1, 1024) and stream == 99
    assert values[0] == _word(q.data_ptr())
    assert values[1] == _word(2**40 + 8)
    assert values[2] == _word(2**30 + 4096)
    expected_map = bytearray(params[24:])
    expected_map[32:40] = _word(2**63 + 5 + (k.data_ptr() >> 4))
    assert values[3] == bytes(expected_map)
    assert launch.buffer() == b"".join(values)  # the buffer as passed, 152 bytes


def test_a_whole_map_slot_copies_bytes_and_none_is_a_null_pointer(implementation: Any) -> None:
    recorder = _Recorder([8, 8, 8, 128])
    params, offsets = _params()
    slots = [(0, FROM_ITEM, 0, 0, 0, 8), (24, FROM_ITEM, 1, 0, 0, 128)]
    launch = implementation(recorder.address, 1, (1, 1, 1), (32, 1, 1), 0, params, offsets, slots)
    launch.run(0, None, (None, bytes([3]) * 128), 0)
    ((_, _, _, values),) = recorder.launches
    assert values[0] == bytes(8) and values[3] == bytes([3]) * 128


def test_the_drivers_result_code_comes_back(implementation: Any) -> None:
    recorder = _Recorder([8, 8, 8, 128])
    recorder.code = 700
    params, offsets = _params()
    launch = implementation(recorder.address, 1, (1, 1, 1), (32, 1, 1), 0, params, offsets, [])
    assert launch.run(0, None, (), 0) == 700


def test_a_missing_input_or_a_map_of_the_wrong_length_launches_nothing(
    implementation: Any,
) -> None:
    recorder = _Recorder([8, 8, 8, 128])
    params, offsets = _params()
    by_name = [(0, FROM_INPUT, "q", 0, 0, 8)]
    launch = implementation(recorder.address, 1, (1, 1, 1), (32, 1, 1), 0, params, offsets, by_name)
    with pytest.raises(KeyError):
        launch.run(0, {"k": torch.empty(1)}, (), 0)
    whole = [(24, FROM_ITEM, 0, 0, 0, 128)]
    launch = implementation(recorder.address, 1, (1, 1, 1), (32, 1, 1), 0, params, offsets, whole)
    with pytest.raises(ValueError, match="128-byte slot given 64 bytes"):
        launch.run(0, None, (bytes(64),), 0)
    assert recorder.launches == []


def test_a_slot_outside_the_parameters_is_refused_when_prepared() -> None:
    module = native.launcher()
    assert module is not None, native.unavailable()
    params, offsets = _params()
    with pytest.raises(ValueError, match="outside the buffer"):
        module.Launch(
            1, 1, (1, 1, 1), (32, 1, 1), 0, params, offsets, [(148, FROM_ITEM, 0, 0, 0, 8)]
        )


def test_driver_launches_take_the_c_launcher_where_it_builds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """driver.Launch prepares the C object; with ATTNCC_NATIVE_LAUNCH=0 (or no compiler)
    the Python one, and says why."""
    module = native.launcher()
    assert module is not None, native.unavailable()
    monkeypatch.setattr(driver, "entry_address", lambda: 1)
    import numpy as np

    launch = driver.Launch(1, (1, 1, 1), (32, 1, 1), 0, 0, [np.uint64(0)], slots=(0,))
    assert isinstance(launch._issue, module.Launch)
    monkeypatch.setenv("ATTNCC_NATIVE_LAUNCH", "0")
    native.reset()
    try:
        launch = driver.Launch(1, (1, 1, 1), (32, 1, 1), 0, 0, [np.uint64(0)], slots=(0,))
        assert isinstance(launch._issue, driver.PythonLaunch)
        assert native.unavailable() == "ATTNCC_NATIVE_LAUNCH=0"
    finally:
        monkeypatch.delenv("ATTNCC_NATIVE_LAUNCH")
        native.reset()


def test_a_fixed_launch_writes_the_values_and_keeps_the_other_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Launch.fixed`` (a length family's plan made one geometry's): the slots taking an
    input it is given a value for are written into its parameters and gone; the others
    still take each call's values; the launch it was made from is unchanged."""
    import numpy as np

    recorder = _Recorder([8, 4, 8])
    monkeypatch.setattr(driver, "entry_address", lambda: recorder.address)
    kinds = (np.uint64, np.int32, np.uint64)
    launch = driver.Launch(7, (2, 1, 1), (32, 1, 1), 0, 0, [0, 100, 0], kinds=kinds)
    offsets = launch.offsets
    launch.with_slots(
        [(offsets[0], FROM_INPUT, "q", 0, 0, 8), (offsets[1], FROM_INPUT, "#0", 0, 0, 8)]
    )
    fixed = launch.fixed({"#0": 4097})
    assert [slot[2] for slot in fixed.slots] == ["q"]
    fixed.run(5, {"q": 0x1000}, (), 0)
    launch.run(5, {"q": 0x2000, "#0": 4100}, (), 0)
    (_, _, _, first), (_, _, _, second) = recorder.launches
    assert first == [_word(0x1000), struct.pack("<i", 4097), _word(0)]
    assert second == [_word(0x2000), struct.pack("<i", 4100), _word(0)]


def test_a_failed_launch_raises_naming_the_drivers_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """``issue`` hands back the driver's code for the caller to check; ``run`` and a
    positional call raise with the error's name."""
    import numpy as np

    recorder = _Recorder([8])
    recorder.code = 700
    monkeypatch.setattr(driver, "entry_address", lambda: recorder.address)
    monkeypatch.setattr(driver, "error_name", lambda code: f"CUDA_ERROR_{code}")
    launch = driver.Launch(1, (1, 1, 1), (32, 1, 1), 0, 0, [np.uint64(0)], slots=(0,))
    assert launch.issue(0, None, (5,), 0) == 700
    with pytest.raises(RuntimeError, match="cuLaunchKernel: CUDA_ERROR_700"):
        launch.run(0, None, (5,), 0)
    with pytest.raises(RuntimeError, match="CUDA_ERROR_700"):
        launch(5)
    with pytest.raises(RuntimeError, match="CUDA_ERROR_700"):
        driver.check(700)


def test_a_launcher_that_does_not_build_says_why_and_launches_in_python(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A compiler that fails (here `false`) leaves no launcher module and a reason; driver
    launches then take the Python implementation."""
    import numpy as np

    monkeypatch.setenv("ATTNCC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    native.reset()
    try:
        assert native.launcher() is None
        assert "could not be built: false failed" in (native.unavailable() or "")
        monkeypatch.setattr(driver, "entry_address", lambda: 1)
        launch = driver.Launch(1, (1, 1, 1), (32, 1, 1), 0, 0, [np.uint64(0)], slots=(0,))
        assert isinstance(launch._issue, driver.PythonLaunch)
    finally:
        native.reset()


def test_a_background_build_is_the_one_later_launches_use(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """build_in_background starts the build on its own thread; launcher() waits for that
    build and returns its module, built once into the cache."""
    import threading

    monkeypatch.setenv("ATTNCC_CACHE_DIR", str(tmp_path))
    native.reset()
    try:
        native.build_in_background()
        module = native.launcher()
        assert module is not None, native.unavailable()
        for thread in threading.enumerate():
            if thread.name == "attncc-launcher-build":
                thread.join()
        assert native.launcher() is module
        assert len(list((tmp_path / "native").glob("attncc_launcher_*"))) == 1
    finally:
        native.reset()


def test_threads_sharing_a_launch_never_mix_their_parameters(implementation: Any) -> None:
    """Two threads issue one prepared launch with their own values while the driver call
    waits (the GIL released): each launch passes its own call's values."""
    import threading
    import time

    seen: list[tuple[bytes, bytes]] = []  # (the calling thread's value, the one passed)

    def slow_launch(function: int, *rest: Any) -> int:
        time.sleep(0.001)  # another thread runs meanwhile
        params = ctypes.cast(rest[8], ctypes.POINTER(ctypes.c_void_p))
        own = _word(int(threading.current_thread().name))
        seen.append((own, ctypes.string_at(params[0], 8)))
        return 0

    entry = driver._ENTRY(slow_launch)
    address = int(ctypes.cast(entry, ctypes.c_void_p).value or 0)
    params, offsets = _params()
    slots = [(0, FROM_ITEM, 0, 0, 0, 8)]
    launch = implementation(address, 1, (1, 1, 1), (32, 1, 1), 0, params, offsets, slots)

    def issue(value: int) -> None:
        for _ in range(20):
            launch.run(0, None, (value,), 0)

    threads = [threading.Thread(target=issue, args=(v,), name=str(v)) for v in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 40 and all(a == b for a, b in seen)
    assert {a for a, _ in seen} == {_word(1), _word(2)}


_CONTEXT_ENTRY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))


@pytest.mark.parametrize(
    ("code", "context", "read"), [(0, 0x7F12345000, 0x7F12345000), (0, 0, 0), (201, 0xABC, 0)]
)
def test_the_current_context_is_read_through_the_given_entry(
    code: int, context: int, read: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """driver.current_context through the C launcher: cuCtxGetCurrent (a stand-in here) at
    the address it is given; 0 where the driver returns an error, as the ctypes path."""

    def stand_in(out: Any) -> int:
        out[0] = context
        return code

    entry = _CONTEXT_ENTRY(stand_in)
    address = int(ctypes.cast(entry, ctypes.c_void_p).value or 0)
    assert native.launcher() is not None, native.unavailable()
    monkeypatch.setattr(driver, "context_entry", lambda: address)
    assert driver.current_context() == read


class _Context:
    """cuCtxGetCurrent's stand-in, its context settable; ``address`` for the C launcher."""

    def __init__(self, context: int) -> None:
        self.context = context
        self.entry = _CONTEXT_ENTRY(self._read)
        self.address = int(ctypes.cast(self.entry, ctypes.c_void_p).value or 0)

    def _read(self, out: Any) -> int:
        out[0] = self.context
        return 0


class _Hook:
    """A Triton launch hook's chain: set where ``calls`` is not empty."""

    def __init__(self) -> None:
        self.calls: list[Any] = []


def _replay_parts(recorder: _Recorder) -> tuple[Any, Any, Any]:
    """Two launches: the first reads input q and allocation 0, the second allocation 1 and
    the base plus 64; allocation 0 made on each call, allocation 1 kept."""
    module = native.launcher()
    assert module is not None, native.unavailable()
    params, offsets = _params()
    first = module.Launch(
        recorder.address, 0x10, (1, 1, 1), (32, 1, 1), 0, params, offsets,
        [(0, FROM_INPUT, "q", 0, 0, 8), (8, FROM_ITEM, 0, 0, 0, 8)],
    )  # fmt: skip
    second = module.Launch(
        recorder.address, 0x20, (2, 1, 1), (64, 1, 1), 0, params, offsets,
        [(0, FROM_ITEM, 1, 0, 0, 8), (8, FROM_BASE, None, 0, 64, 8)],
    )  # fmt: skip
    return module, first, second


def test_a_replay_allocates_launches_in_order_and_returns_its_outputs() -> None:
    """A Replay called with a call's tensors: a fresh allocation from each allocator, the
    kept buffer as it is, the scratch block's pointer as the base; each launch on the
    stream the callable gives, in order; the outputs by allocation index."""
    recorder = _Recorder([8, 8])
    module, first, second = _replay_parts(recorder)
    context, kept, blocks = _Context(0xC0), torch.empty(3), []

    def scratch() -> torch.Tensor:
        blocks.append(torch.empty(16))
        return blocks[-1]

    replay = module.Replay(
        context.address, 0xC0, lambda: 55, (lambda: torch.zeros(2), kept), scratch,
        (first, second), (1, 0), (), None, driver.check,
    )  # fmt: skip
    q = torch.empty(4)
    kept_again, made = replay({"q": q})
    _, made_again = replay({"q": q})
    assert kept_again is kept and made.shape == (2,) and made_again is not made
    (f1, d1, s1, v1), (f2, _, s2, v2) = recorder.launches[:2]
    assert (f1, d1[:3], s1, f2, s2) == (0x10, (1, 1, 1), 55, 0x20, 55)
    assert v1 == [_word(q.data_ptr()), _word(made.data_ptr())]
    assert v2 == [_word(kept.data_ptr()), _word(blocks[0].data_ptr() + 64)]
    assert len(recorder.launches) == 4 and len(blocks) == 2


def test_a_replay_given_a_scratch_block_rather_than_an_allocator_keeps_it() -> None:
    """A scratch that is not callable is the block itself (a plan bound to one stream):
    every call's base is its pointer."""
    recorder = _Recorder([8, 8])
    module, _, second = _replay_parts(recorder)
    block = torch.empty(16)
    replay = module.Replay(
        0, 0, 7, (torch.zeros(2), torch.empty(3)), block, (second,), (0,), (), None,
        driver.check,
    )  # fmt: skip
    replay({"q": torch.empty(4)})
    replay({"q": torch.empty(4)})
    bases = [values[1] for _, _, _, values in recorder.launches]
    assert bases == [_word(block.data_ptr() + 64)] * 2


def test_a_replay_refuses_in_another_context_under_a_hook_or_a_changed_guard() -> None:
    """None, nothing launched: the calling thread's context not the replay's, a launch hook
    set (a profiler wants Triton's own launches), the guard's value changed (PyTorch's TF32
    setting for an fp32 plan)."""
    recorder = _Recorder([8, 8])
    module, first, _ = _replay_parts(recorder)
    context, hook, setting = _Context(0xC0), _Hook(), ["tf32x3"]
    owner = type("Knobs", (), {"launch_enter_hook": hook})()
    replay = module.Replay(
        context.address, 0xC0, 7, (lambda: torch.zeros(2),), None, (first,), (0,),
        ((owner, "launch_enter_hook"),), (lambda: setting[0], "tf32x3"), driver.check,
    )  # fmt: skip
    q = torch.empty(4)
    assert replay({"q": q}) is not None and len(recorder.launches) == 1
    context.context = 0xC1
    assert replay({"q": q}) is None
    context.context = 0xC0
    hook.calls.append(print)
    assert replay({"q": q}) is None
    hook.calls.clear()
    setting[0] = "tf32"
    assert replay({"q": q}) is None
    setting[0] = "tf32x3"
    assert replay({"q": q}) is not None and len(recorder.launches) == 2


def test_a_replays_failed_launch_raises_through_its_check() -> None:
    recorder = _Recorder([8, 8])
    recorder.code = 700
    module, first, second = _replay_parts(recorder)
    seen: list[int] = []

    def check(code: int) -> None:
        seen.append(code)
        raise RuntimeError(f"launch failed: {code}")

    replay = module.Replay(
        0, 0, 7, (lambda: torch.zeros(2), torch.empty(3)), None, (first, second), (0,), (),
        None, check,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="launch failed: 700"):
        replay({"q": torch.empty(4)})
    assert seen == [700] and len(recorder.launches) == 1  # the second never issued


def test_replay_looks_a_call_up_by_its_plan_key_with_the_stream() -> None:
    """launcher.replay: plan_key's key of the call plus the stream of the last tensor's
    device, looked up in the table; None without an entry, for a call no plan may take, or
    for tensors off CUDA (CPU tensors here: their calls never reach the stream)."""
    recorder = _Recorder([8, 8])
    module, first, _ = _replay_parts(recorder)
    replay = module.Replay(
        0, 0, 7, (lambda: torch.zeros(2),), None, (first,), (0,), (), None, driver.check
    )
    q = torch.empty(4)
    streams: list[Any] = []

    def stream_of(index: Any) -> int:
        streams.append(index)
        return 3

    key = module.plan_key((False, False), {"q": q}, {"scale": 0.5}, torch.Tensor)
    table = {(*key, 3): replay}
    args = ((False, False), {"q": q}, {"scale": 0.5}, torch.Tensor, stream_of)
    assert module.replay(table, *args) is None  # a CPU tensor
    assert module.replay({}, *args) is None
    unkeyed = ((False, False), {"q": q}, {"scale": torch.tensor(0.5)}, torch.Tensor, stream_of)
    assert module.replay(table, *unkeyed) is None
    assert streams == [] and recorder.launches == []
