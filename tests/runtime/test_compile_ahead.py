"""compile_ahead: a call's kernels compiled side by side, nothing launched. On CPU the
kernels are stand-ins with Triton's ``run`` signature (a compiled kernel needs a GPU
driver); tests/gpu/test_gpu_first_call.py compiles real ones."""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

import pytest
import torch
import triton.runtime
from triton.runtime import _async_compile

from attncc.runtime import compile_ahead


class _Kernel:
    """Notes each run: (name, warmup, whether Triton's asynchronous compile mode is on)."""

    def __init__(self, name: str, runs: list[tuple[str, bool, bool]]) -> None:
        self.name, self.runs = name, runs

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> str:
        self.runs.append((self.name, warmup, _async_compile.active_mode.get() is not None))
        return self.name

    def __getitem__(self, grid: Any) -> Any:  # as a JIT function: kernel[grid](...)
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)


def test_every_launch_of_a_call_becomes_a_compile_request() -> None:
    runs: list[tuple[str, bool, bool]] = []
    first, second = _Kernel("first", runs), _Kernel("second", runs)

    def call() -> None:
        out = torch.empty(8)
        first[(1,)](out, 8)
        torch.zeros(8).zero_()
        second[(2,)](out, out.stride(0), BLOCK=8)

    compile_ahead.ahead([first, second], [call, call])
    assert runs == [("first", True, True), ("second", True, True)] * 2
    assert "run" not in vars(first) and "run" not in vars(second)  # the class's own again
    assert _async_compile.active_mode.get() is None


def test_a_pass_stops_at_a_torch_operation_other_than_host_work() -> None:
    runs: list[tuple[str, bool, bool]] = []
    first, second = _Kernel("first", runs), _Kernel("second", runs)
    done = []

    def reads_a_value() -> None:
        out = torch.ones(4)
        first[(1,)](out)
        if out.sum() > 0:  # a value the launches would have made: not without them
            second[(1,)](out)
        done.append(True)

    def raises() -> None:
        first[(1,)](torch.empty(1))
        raise ValueError("the call itself reports this")

    compile_ahead.ahead([first, second], [reads_a_value, raises, reads_a_value])
    assert runs == [("first", True, True)] * 3 and not done


def test_other_threads_launch_while_a_pass_runs() -> None:
    runs: list[tuple[str, bool, bool]] = []
    kernel = _Kernel("kernel", runs)

    def call() -> None:
        other = threading.Thread(target=lambda: kernel[(1,)](1))
        other.start()
        other.join()
        kernel[(1,)](2)

    compile_ahead.ahead([kernel], [call])
    assert sorted(runs) == [("kernel", False, False), ("kernel", True, True)]


def test_nothing_happens_inside_a_callers_own_compile_mode() -> None:
    runs: list[tuple[str, bool, bool]] = []
    kernel = _Kernel("kernel", runs)
    with _async_compile.AsyncCompileMode(None):  # type: ignore[arg-type]  # never submitted to
        compile_ahead.ahead([kernel], [lambda: kernel[(1,)](1)])
    assert runs == []


class _Compiling(_Kernel):
    """A stand-in whose first warm-up of each key submits a compile, as Triton's JIT does
    under an asynchronous compile mode."""

    def __init__(self, name: str, runs: list[tuple[str, bool, bool]]) -> None:
        super().__init__(name, runs)
        self.compiled: set[int] = set()

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> str:
        super().run(*args, grid=grid, warmup=warmup, **kwargs)
        mode = _async_compile.active_mode.get()
        key = args[0]
        if mode is not None and key not in self.compiled:
            mode.submit((self.name, key), lambda: self.name, lambda _: self.compiled.add(key))
        return self.name


def test_a_module_stops_compiling_ahead_once_a_pass_finds_nothing_to_compile() -> None:
    runs: list[tuple[str, bool, bool]] = []
    kernel = _Compiling("kernel", runs)
    module = types.ModuleType("generated")
    first_calls = compile_ahead.FirstCalls()
    for length in (1, 2, 2, 3):  # a new geometry each call; lengths 1 and 2 compile
        first_calls.ahead(module, [kernel], lambda length=length: kernel[(1,)](length))
    # passes for 1 and 2 compiled (both stay), the second 2 found it compiled (the module
    # leaves), so 3 had no pass: its own launch compiles it
    assert [warmup for _, warmup, _ in runs] == [True, True, True]
    assert kernel.compiled == {1, 2}


def test_a_triton_without_asynchronous_compiles_compiles_nothing_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[tuple[str, bool, bool]] = []
    kernel = _Kernel("kernel", runs)
    # the import fails: neither the package's attribute nor the module is there
    monkeypatch.delattr(triton.runtime, "_async_compile")
    monkeypatch.setitem(sys.modules, "triton.runtime._async_compile", None)
    assert compile_ahead.ahead([kernel], [lambda: kernel[(1,)](1)]) == 0
    assert runs == []
