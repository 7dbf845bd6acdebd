"""The CUDA target's NVRTC calls, on CPU: what attncc hands NVRTC and what it makes of the
answers, against a fake of cuda-python's ``cuda.bindings.nvrtc`` (real compiles need NVRTC
and run in the GPU suite: tests/gpu/test_gpu_cuda.py, every kernel compiled cold)."""

from __future__ import annotations

import builtins
import ctypes
import enum
from typing import Any

import pytest

from attncc.cache import content_key
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
        self.headers: tuple[Any, ...] = ()
        self.options: list[bytes] = []
        self.destroyed = 0

    def nvrtcCreateProgram(self, source: bytes, name: bytes, *headers: Any) -> tuple[Any, ...]:
        self.source = source
        self.headers = headers
        count, texts, names = headers
        assert count == len(texts) == len(names)
        assert all(isinstance(x, bytes) for x in (*texts, *names))
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


def test_headers_go_to_nvrtc_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel family's source includes the shipped headers: NVRTC gets their texts and
    include names, in order, as bytes."""
    fake = _FakeNvrtc()
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda: fake)
    headers = [("attncc_cuda.cuh", "// helpers"), ("attncc_hopper.cuh", "// wgmma")]
    source = '#include "attncc_hopper.cuh"\nkernel text'
    assert nvrtc.compile_cubin(source, [], "sm_90a", headers) == b"CUBIN"
    assert fake.headers == (
        2,
        [b"// helpers", b"// wgmma"],
        [b"attncc_cuda.cuh", b"attncc_hopper.cuh"],
    )
    nvrtc.compile_cubin("kernel text", [], "sm_90a")
    assert fake.headers == (0, [], [])


def test_source_keys_tell_families_and_headers_apart() -> None:
    """A cubin's key covers the source and the headers it may include: two families' sources
    never share one, nor a source compiled against changed headers."""
    headers = [("attncc_cuda.cuh", "// helpers")]
    hopper = nvrtc.source_key("hopper kernel", headers)
    assert hopper != nvrtc.source_key("mma kernel", headers)
    assert hopper != nvrtc.source_key("hopper kernel", [("attncc_cuda.cuh", "// helpers 2")])
    assert hopper != nvrtc.source_key("hopper kernel")
    # a source without headers keys as before (the probes' kernels)
    assert nvrtc.source_key("probe") == content_key("probe")
    defines = (("ATTNCC_WGMMA", 2),)
    assert nvrtc.cubin_path(hopper, defines, "sm_90a") != nvrtc.cubin_path(
        nvrtc.source_key("mma kernel", headers), defines, "sm_90a"
    )


def test_kernels_hand_the_headers_to_a_cold_compile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    compiled: list[tuple[Any, ...]] = []

    def compile_cubin(*args: Any) -> bytes:
        compiled.append(args)
        return b"CUBIN"

    monkeypatch.setenv("ATTNCC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(nvrtc, "compile_cubin", compile_cubin)
    monkeypatch.setattr(nvrtc, "arch", lambda device: "sm_90")
    monkeypatch.setattr(nvrtc, "_device", lambda device: 0)
    monkeypatch.setattr(nvrtc, "_index", lambda device: 0)
    monkeypatch.setattr(nvrtc.driver, "load_kernels", lambda data, names: names)
    monkeypatch.setattr(nvrtc, "_KERNELS", {})
    headers = (("attncc_cuda.cuh", "// helpers"),)
    key = nvrtc.source_key("source", headers)
    found = nvrtc.kernels("source", key, (), ("k",), None, "a", headers)  # type: ignore[arg-type]
    assert found == ("k",)
    assert compiled == [("source", (), "sm_90a", headers)]


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
