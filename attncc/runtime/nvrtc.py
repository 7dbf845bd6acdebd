"""Compile CUDA sources with NVRTC (through cuda-python's ``cuda.bindings.nvrtc``), cache the
cubins on disk, launch kernels on PyTorch's current stream (through the driver API:
attncc.runtime.driver).

The bindings are imported only to compile, so machines without cuda-python (CPU-only CI)
still import attncc and render CUDA sources, and a warm start (every cubin cached) never
imports them: cubins load and kernels launch through the driver API. The NVRTC module alone,
not ``cuda.core``: importing cuda.core loads every binding (driver, runtime, NVRTC, ...),
0.33-0.45 s of a cold compile's first call on an H100 machine (docs/performance.md). A cubin
is keyed by the source and the headers it may include (a host module holds one source per
kernel family, all including the same shipped headers, handed to NVRTC by name), the ATTNCC_*
macros selecting the variant, the GPU architecture and the attncc version; it is written
atomically under ``<cache>/cubin`` and loaded from there by later processes.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attncc.cache import atomic_write_bytes, cache_dir, content_key
from attncc.runtime import driver
from attncc.version import __version__

_LOCK = threading.Lock()
# (source key, defines, device index, kernel names, arch features) -> kernels
_KernelKey = tuple[str, tuple[tuple[str, Any], ...], int, tuple[str, ...], str]
# (include name, text) of the headers a source may include
Headers = Sequence[tuple[str, str]]
_KERNELS: dict[_KernelKey, tuple[driver.Kernel, ...]] = {}


class CudaUnavailable(RuntimeError):
    """cuda-python (cuda.bindings) is missing: the CUDA target cannot compile its kernels."""


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError as err:
        raise CudaUnavailable(
            "target 'cuda' needs cuda-python's NVRTC bindings (pip install cuda-python); "
            "use target='triton' otherwise"
        ) from err
    return nvrtc


def available() -> bool:
    """Whether cuda-python's bindings are installed, for ``target="auto"`` to ask before
    choosing the CUDA target: found, not imported (only NVRTC compiles need them; kernels
    load and launch through the driver, attncc.runtime.driver)."""
    return _find_bindings()


def _find_bindings() -> bool:
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except (ImportError, ValueError):  # no `cuda` package at all, or a broken one
        return False


def pointer(t: torch.Tensor) -> np.uint64:
    return np.uint64(t.data_ptr())


def null_pointer() -> np.uint64:
    """A pointer parameter a launch passes but the kernel does not read."""
    return np.uint64(0)


def int32(x: int) -> np.int32:
    return np.int32(int(x))


def float32(x: float) -> np.float32:
    return np.float32(float(x))


def arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def source_key(source: str, headers: Headers = ()) -> str:
    """The content key of a CUDA source and the headers it may include (host modules compute
    it once, at import)."""
    return content_key(source, *(part for header in headers for part in header))


def cubin_path(source_key: str, defines: Sequence[tuple[str, Any]], target: str) -> Path:
    text = "".join(f"#define {k} {v}\n" for k, v in defines)
    key = content_key(source_key, text, target, __version__)
    return cache_dir() / "cubin" / f"{key[:32]}.cubin"


def compile_cubin(
    source: str, defines: Sequence[tuple[str, Any]], target: str, headers: Headers = ()
) -> bytes:
    """NVRTC: the source with ``#define`` lines for ``defines`` in front, to a cubin;
    ``headers`` are what its ``#include "<name>"`` lines read."""
    nvrtc = _nvrtc()
    text = "".join(f"#define {k} {v}\n" for k, v in defines) + source
    options = [b"--std=c++17", f"--gpu-architecture={target}".encode()]
    texts = [body.encode() for _, body in headers]
    names = [name.encode() for name, _ in headers]
    err, program = nvrtc.nvrtcCreateProgram(text.encode(), b"attncc.cu", len(texts), texts, names)
    _check_nvrtc(nvrtc, err, "nvrtcCreateProgram", None, target)
    try:
        (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        _check_nvrtc(nvrtc, err, "nvrtcCompileProgram", program, target)
        err, size = nvrtc.nvrtcGetCUBINSize(program)
        _check_nvrtc(nvrtc, err, "nvrtcGetCUBINSize", program, target)
        # a new buffer the bindings write into: bytes(n), never b" " * n, which for n == 1
        # returns the shared constant b" " itself
        cubin = bytes(size)
        (err,) = nvrtc.nvrtcGetCUBIN(program, cubin)
        _check_nvrtc(nvrtc, err, "nvrtcGetCUBIN", program, target)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return cubin


def _check_nvrtc(nvrtc: Any, err: Any, call: str, program: Any, target: str) -> None:
    if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return
    log = ""
    if program is not None:
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        text = bytes(size)
        nvrtc.nvrtcGetProgramLog(program, text)
        log = text.rstrip(b"\0").decode(errors="replace")
    raise RuntimeError(
        f"attncc: NVRTC failed to compile a generated CUDA kernel ({target}): {call}: "
        f"{getattr(err, 'name', err)}; this is an attncc bug, please report "
        f"it with the spec.\n{log}"
    )


def _index(device: torch.device) -> int:
    """``device``'s index (PyTorch's current device for a bare "cuda")."""
    return device.index if device.index is not None else torch.cuda.current_device()


def _device(device: torch.device) -> int:
    """Make ``device``'s primary context (PyTorch's) current on this thread; its index."""
    index = _index(device)
    driver.make_current(index)
    return index


def kernels(
    source: str,
    key_of_source: str,
    defines: tuple[tuple[str, Any], ...],
    names: tuple[str, ...],
    device: torch.device,
    arch_features: str = "",
    headers: Headers = (),
) -> tuple[driver.Kernel, ...]:
    """The kernels ``names`` of ``source`` compiled with ``defines`` for ``device``'s GPU
    (``arch_features`` "a": its architecture-specific features, as sm_90a's wgmma): from this
    process's table, else the disk cache, else NVRTC. ``headers``: what the source's
    ``#include "<name>"`` lines read; ``key_of_source`` is ``source_key(source, headers)``."""
    key = (key_of_source, defines, _index(device), names, arch_features)
    found = _KERNELS.get(key)
    if found is not None:
        return found
    with _LOCK:
        found = _KERNELS.get(key)
        if found is not None:
            return found
        _device(device)
        target = arch(device) + arch_features
        path = cubin_path(key_of_source, defines, target)
        try:
            data = path.read_bytes()
        except OSError:
            data = compile_cubin(source, defines, target, headers)
            atomic_write_bytes(path, data)
        found = driver.load_kernels(data, names)
        _KERNELS[key] = found
        return found


def resident_blocks(kernel: driver.Kernel, device: torch.device, threads: int) -> int:
    """Blocks of ``threads`` threads (static shared memory only) of ``kernel`` that one
    multiprocessor of ``device`` holds at once, from the driver's occupancy calculator; 0
    where it refuses (the caller estimates)."""
    return driver.resident_blocks(kernel, _device(device), threads)


def launch(*args: Any, **kwargs: Any) -> None:
    """``prepare``'s launch (kernel, grid, block, args, device, shared_bytes, maps), issued at
    once on PyTorch's current stream of ``device``."""
    prepare(*args, **kwargs)()


def prepare(
    kernel: driver.Kernel,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    args: Sequence[Any],
    device: torch.device,
    shared_bytes: int = 0,
    maps: Sequence[bytes] = (),
    slots: Sequence[int] = (),
) -> driver.Launch:
    """A launch of ``kernel`` on PyTorch's current stream of ``device`` with ``shared_bytes``
    of dynamic shared memory (``extern __shared__``) and ``maps``, encoded tensor maps, as
    parameters after ``args``, with everything done but the launch itself: calling the
    result issues it, with new values for the parameters at ``slots`` if given
    (attncc.runtime.driver). Two dependent launches prepared first go out back to back, so
    the GPU does not idle between them for the host's work on the second (a short first
    kernel, as a tile index builder, would)."""
    index = _device(device)  # the stream's context must be current (the NULL stream uses it)
    function = driver.function(kernel, index, shared_bytes)
    stream = int(torch.cuda.current_stream(device).cuda_stream)
    return driver.Launch(function, grid, block, shared_bytes, stream, (*args, *maps), slots)


# PyTorch's raw stream query, where this build has it (a private API, as Triton uses)
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(index: int) -> int:
    """PyTorch's current stream on device ``index``, as a handle: without building a
    torch.cuda.Stream (a few microseconds of a launch plan's lookup)."""
    if _RAW_STREAM is not None:
        return int(_RAW_STREAM(index))
    return int(torch.cuda.current_stream(index).cuda_stream)
