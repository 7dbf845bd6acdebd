"""The CUDA target's NVRTC calls, on CPU: what attncc hands NVRTC and what it makes of the
answers, against a fake of cuda-python's ``cuda.bindings.nvrtc`` (real compiles need NVRTC
and run in the GPU suite: tests/gpu/test_gpu_cuda.py, every kernel compiled cold)."""

from __future__ import annotations

import builtins
import ctypes
import enum
from typing import Any

import pytest

from attncc.runtime import nvrtc


class _Result(enum.IntEnum):
    NVRTC_SUCCESS = 0
    NVRTC_ERROR_COMPILATION = 6


def _fill(buffer: bytes, data: bytes) -> None:
    """Write into a bytes object in place, as the bindings' char* parameters do (CPython:
    the characters start one byte before the end of the object's header)."""
    assert len(buffer) == len(data)
    ctypes.memmove(id(buffer) + bytes.__basicsize__ - 1, data, len(data))


class _FakeNvrtc:
    """The bindings' calling convention: results first, output buffers filled in place."""

    nvrtcResult = _Result

    def __init__(self, log: bytes = b"", fails: bool = False) -> None:
        self.log, self.fails = log, fails
        self.source = b""
        self.options: list[bytes] = []
        self.destroyed = 0

    def nvrtcCreateProgram(self, source: bytes, name: bytes, *headers: Any) -> tuple[Any, ...]:
        self.source = source
        return _Result.NVRTC_SUCCESS, "program"

    def nvrtcCompileProgram(self, program: str, count: int, options: list[bytes]) -> tuple[Any]:
        assert count == len(options)
        self.options = options
        return (_Result.NVRTC_ERROR_COMPILATION if self.fails else _Result.NVRTC_SUCCESS,)

    def nvrtcGetCUBINSize(self, program: str) -> tuple[Any, int]:
        return _Result.NVRTC_SUCCESS, 5

    def nvrtcGetCUBIN(self, program: str, buffer: bytes) -> tuple[Any]:
        _fill(buffer, b"CUBIN")
        return (_Result.NVRTC_SUCCESS,)

    def nvrtcGetProgramLogSize(self, program: str) -> tuple[Any, int]:
        return _Result.NVRTC_SUCCESS, len(self.log) + 1

    def nvrtcGetProgramLog(self, program: str, buffer: bytes) -> tuple[Any]:
        _fill(buffer, self.log + b"\0")
        return (_Result.NVRTC_SUCCESS,)

    def nvrtcDestroyProgram(self, program: str) -> tuple[Any]:
        self.destroyed += 1
        return (_Result.NVRTC_SUCCESS,)


def test_the_defines_lead_the_source_and_the_cubin_comes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeNvrtc()
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda: fake)
    cubin = nvrtc.compile_cubin("kernel text", [("ATTNCC_WARPS", 8), ("ATTNCC_TMA", 1)], "sm_90a")
    assert cubin == b"CUBIN"
    assert fake.source == b"#define ATTNCC_WARPS 8\n#define ATTNCC_TMA 1\nkernel text"
    assert fake.options == [b"--std=c++17", b"--gpu-architecture=sm_90a"]
    assert fake.destroyed == 1


def test_a_failed_compile_raises_with_nvrtcs_log(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvrtc(log=b'attncc.cu(12): error: identifier "x" is undefined', fails=True)
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda: fake)
    with pytest.raises(RuntimeError) as caught:
        nvrtc.compile_cubin("kernel text", [], "sm_90a")
    message = str(caught.value)
    assert "nvrtcCompileProgram" in message and "NVRTC_ERROR_COMPILATION" in message
    assert 'attncc.cu(12): error: identifier "x" is undefined' in message
    assert "\0" not in message and "attncc bug" in message
    assert fake.destroyed == 1  # the program is freed on the way out too


def test_without_cuda_python_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = builtins.__import__

    def no_cuda(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("cuda"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cuda)
    with pytest.raises(nvrtc.CudaUnavailable, match="pip install cuda-python"):
        nvrtc.compile_cubin("kernel text", [], "sm_90a")
