"""The CUDA target's cubin loads and kernel launches through the CUDA driver API (libcuda
through ctypes): every parameter of a launch packed once into one buffer, so a call that
repeats a launch rewrites only its pointers (and tensor maps) there and issues it.

cuda.core's launcher passes scalars and pointers only, and it converts each of them on every
launch; a tensor map (a 128-byte ``__grid_constant__`` parameter, attncc.runtime.tensor_map)
and a launch at a few microseconds of host time both need the driver API directly.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attncc.runtime import native

# cuFuncSetAttribute's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_MAX_DYNAMIC_SHARED = 8
# cuFuncGetAttribute's CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
_MAX_THREADS = 0
# cuFuncSetCacheConfig's CU_FUNC_CACHE_PREFER_SHARED
_PREFER_SHARED = 1


@functools.lru_cache(maxsize=1)
def lib() -> Any:
    """libcuda with the signatures attncc calls."""
    cuda = ctypes.CDLL("libcuda.so.1")
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    cuda.cuTensorMapEncodeTiled.restype = ctypes.c_int
    cuda.cuTensorMapEncodeTiled.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
        u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ]  # fmt: skip
    cuda.cuLaunchKernel.restype = ctypes.c_int
    cuda.cuLaunchKernel.argtypes = [
        ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
    ]  # fmt: skip
    cuda.cuKernelGetFunction.restype = ctypes.c_int
    cuda.cuKernelGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    cuda.cuFuncSetAttribute.restype = ctypes.c_int
    cuda.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    cuda.cuFuncGetAttribute.restype = ctypes.c_int
    cuda.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p]
    cuda.cuFuncSetCacheConfig.restype = ctypes.c_int
    cuda.cuFuncSetCacheConfig.argtypes = [ctypes.c_void_p, ctypes.c_int]
    cuda.cuCtxGetCurrent.restype = ctypes.c_int
    cuda.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    cuda.cuGetErrorName.restype = ctypes.c_int
    cuda.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    cuda.cuLibraryLoadData.restype = ctypes.c_int
    cuda.cuLibraryLoadData.argtypes = [
        ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint,
    ]  # fmt: skip
    cuda.cuLibraryGetKernel.restype = ctypes.c_int
    cuda.cuLibraryGetKernel.argtypes = [
        ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p,
    ]  # fmt: skip
    cuda.cuDeviceGet.restype = ctypes.c_int
    cuda.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    cuda.cuDevicePrimaryCtxRetain.restype = ctypes.c_int
    cuda.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    cuda.cuCtxSetCurrent.restype = ctypes.c_int
    cuda.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor.restype = ctypes.c_int
    cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [
        ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
    ]  # fmt: skip
    if hasattr(cuda, "cuFuncGetParamInfo"):  # CUDA 12.4
        cuda.cuFuncGetParamInfo.restype = ctypes.c_int
        cuda.cuFuncGetParamInfo.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(ctypes.c_size_t),
        ]  # fmt: skip
    cuda.cuInit(0)  # a no-op once PyTorch initialised CUDA
    return cuda


def error_name(code: int) -> str:
    name = ctypes.c_char_p()
    lib().cuGetErrorName(code, ctypes.byref(name))
    return (name.value or b"").decode() or f"CUresult {code}"


def _check(code: int, call: str) -> None:
    if code != 0:
        raise RuntimeError(f"attncc: {call}: {error_name(code)}")


@dataclass(frozen=True)
class Kernel:
    """A kernel of a loaded cubin: its CUkernel handle (context-independent: the driver
    loads it into a context on first use there) and its name."""

    handle: int
    name: str


def load_kernels(cubin: bytes, names: Sequence[str]) -> tuple[Kernel, ...]:
    """The kernels ``names`` of ``cubin``, loaded as a library (cuLibraryLoadData, as
    cuda.core loads them; never unloaded: a process keeps what it compiled)."""
    cuda = lib()
    library = ctypes.c_void_p()
    code = cuda.cuLibraryLoadData(ctypes.byref(library), cubin, None, None, 0, None, None, 0)
    _check(code, "cuLibraryLoadData")
    kernels = []
    for name in names:
        handle = ctypes.c_void_p()
        _check(cuda.cuLibraryGetKernel(ctypes.byref(handle), library, name.encode()), name)
        kernels.append(Kernel(int(handle.value or 0), name))
    return tuple(kernels)


# device index -> its primary context (the one PyTorch's runtime uses)
_PRIMARY: dict[int, int] = {}


def make_current(index: int) -> None:
    """Make device ``index``'s primary context the calling thread's current one."""
    context = _PRIMARY.get(index)
    cuda = lib()
    if context is None:
        device = ctypes.c_int()
        _check(cuda.cuDeviceGet(ctypes.byref(device), index), "cuDeviceGet")
        handle = ctypes.c_void_p()
        _check(
            cuda.cuDevicePrimaryCtxRetain(ctypes.byref(handle), device), "cuDevicePrimaryCtxRetain"
        )
        context = _PRIMARY[index] = int(handle.value or 0)
    _check(cuda.cuCtxSetCurrent(ctypes.c_void_p(context)), "cuCtxSetCurrent")


def resident_blocks(kernel: Kernel, device_index: int, threads: int) -> int:
    """Blocks of ``threads`` threads (static shared memory only) of ``kernel`` one
    multiprocessor holds at once (the driver's occupancy calculator; 0 if it refuses)."""
    blocks = ctypes.c_int()
    handle = ctypes.c_void_p(function(kernel, device_index, 0))
    code = lib().cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(blocks), handle, threads, 0
    )
    return int(blocks.value) if code == 0 else 0


# cuFuncGetParamInfo's answer past a function's last parameter
_INVALID_VALUE = 1


# parameter_sizes' answers by function handle: a launch prepared for each new call geometry
# asked the driver once a parameter (32 calls through ctypes for a split-KV kernel). The
# functions stay loaded for the process (triton_launch keeps them), so a handle never comes
# to name another function
_PARAMETER_SIZES: dict[int, list[int] | None] = {}


def parameter_sizes(function: int) -> list[int] | None:
    """The byte size of each of a loaded function's parameters, in order; None where the
    driver cannot list them (before CUDA 12.4)."""
    if function not in _PARAMETER_SIZES:
        _PARAMETER_SIZES[function] = _listed_parameter_sizes(function)
    return _PARAMETER_SIZES[function]


def _listed_parameter_sizes(function: int) -> list[int] | None:
    cuda = lib()
    if not hasattr(cuda, "cuFuncGetParamInfo"):
        return None
    sizes: list[int] = []
    offset, size = ctypes.c_size_t(), ctypes.c_size_t()
    while True:
        code = cuda.cuFuncGetParamInfo(
            ctypes.c_void_p(function), len(sizes), ctypes.byref(offset), ctypes.byref(size)
        )
        if code == _INVALID_VALUE:
            return sizes
        if code != 0:
            return None
        sizes.append(size.value)


def current_context() -> int:
    """The calling thread's current CUDA context (0: none), which a function handle and a
    launch belong to; through attncc's C launcher where it is built (0.7 us of ctypes less
    a launch plan's call)."""
    launcher = native.built()
    if launcher is not None:
        return int(launcher.current_context(context_entry()))
    context = ctypes.c_void_p()
    code = lib().cuCtxGetCurrent(ctypes.byref(context))
    return int(context.value or 0) if code == 0 else 0


# (CUkernel handle, device index) -> [its CUfunction, the dynamic shared memory it may use]
_FUNCTIONS: dict[tuple[int, int], list[int]] = {}


def function(kernel: Kernel, device_index: int, shared_bytes: int) -> int:
    """The CUfunction of ``kernel`` in the current context, allowed ``shared_bytes`` of
    dynamic shared memory (raised once per size: not on every launch)."""
    key = (kernel.handle, device_index)
    found = _FUNCTIONS.get(key)
    cuda = lib()
    if found is None:
        handle = ctypes.c_void_p()
        _check(
            cuda.cuKernelGetFunction(ctypes.byref(handle), ctypes.c_void_p(key[0])),
            "cuKernelGetFunction",
        )
        found = _FUNCTIONS[key] = [int(handle.value or 0), 0]
    if found[1] < shared_bytes:
        code = cuda.cuFuncSetAttribute(ctypes.c_void_p(found[0]), _MAX_DYNAMIC_SHARED, shared_bytes)
        if code != 0:
            raise RuntimeError(
                f"attncc: cannot give a CUDA kernel {shared_bytes} bytes of shared memory "
                f"({error_name(code)})"
            )
        found[1] = shared_bytes
    return found[0]


def max_threads(function: int) -> int:
    """The most threads a block of ``function`` may have (its registers decide)."""
    threads = ctypes.c_int()
    code = lib().cuFuncGetAttribute(ctypes.byref(threads), _MAX_THREADS, ctypes.c_void_p(function))
    _check(code, "cuFuncGetAttribute")
    return int(threads.value)


def prefer_shared(function: int) -> None:
    """Ask for the largest shared memory carveout for ``function`` (a hint, as Triton's
    loader gives kernels using more than 48 KB)."""
    code = lib().cuFuncSetCacheConfig(ctypes.c_void_p(function), _PREFER_SHARED)
    _check(code, "cuFuncSetCacheConfig")


# struct codes of the numpy scalars a launch passes (pointers, ints, floats)
_CODES = {
    np.uint64: "Q", np.int64: "q", np.uint32: "I", np.int32: "i", np.float32: "f",
    np.float64: "d", np.uint16: "H", np.int16: "h", np.uint8: "B", np.int8: "b",
}  # fmt: skip
_POINTER = struct.Struct("<Q")
_WORD = 2**64 - 1
# a parameter list's kinds (a scalar's type, an encoded map's length) -> its packing
_LAYOUTS: dict[tuple[Any, ...], tuple[struct.Struct, tuple[int, ...]]] = {}


def packing(kinds: tuple[Any, ...]) -> tuple[struct.Struct, tuple[int, ...]]:
    """One struct for a parameter list (each parameter's numpy scalar type, or an encoded
    map's length): each value at an 8-byte boundary, and the offsets."""
    found = _LAYOUTS.get(kinds)
    if found is not None:
        return found
    fmt, offsets, at = "<", [], 0
    for kind in kinds:
        offsets.append(at)
        if isinstance(kind, int):  # an encoded map's bytes
            fmt += f"{kind}s{-kind % 8}x"
            at += kind + -kind % 8
        else:
            code = _CODES[kind]
            fmt += f"{code}{8 - struct.calcsize(code)}x"
            at += 8
    found = _LAYOUTS[kinds] = (struct.Struct(fmt), tuple(offsets))
    return found


def _length(kind: Any) -> int:
    """A parameter's bytes where it is an encoded map, else 0."""
    return kind if isinstance(kind, int) else 0


# cuLaunchKernel's signature, for the Python launch path's calls through an entry address
_ENTRY = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
    ctypes.c_void_p,
)  # fmt: skip

# where a slot's value comes from at a call (attncc.runtime.launcher.c): the call's inputs
# by name, its items by position, its base
FROM_INPUT, FROM_ITEM, FROM_BASE = 0, 1, 2
# a slot: (byte offset in the parameters, source kind, key, shift, bias, length)
Slot = tuple[int, int, Any, int, int, int]


@functools.cache
def context_entry() -> int:
    """libcuda's cuCtxGetCurrent, as an address the C launcher calls."""
    return int(ctypes.cast(lib().cuCtxGetCurrent, ctypes.c_void_p).value or 0)


def entry_address() -> int:
    """libcuda's cuLaunchKernel, as an address both launch paths call."""
    return int(ctypes.cast(lib().cuLaunchKernel, ctypes.c_void_p).value or 0)


def _native() -> Any:
    return native.launcher()


def _launch_type() -> Any:
    """The C launcher's Launch where it builds, else ``PythonLaunch``."""
    built = _native()
    return built.Launch if built is not None else PythonLaunch


class Launch:
    """One kernel launch, prepared: its function, grid, block, dynamic shared memory and
    every parameter packed at an 8-byte boundary of one buffer (numpy scalars: pointers,
    ints, floats; bytes: encoded maps), as cuLaunchKernel reads them. ``run`` issues it on
    a stream with the call's values in its slots (``Slot``: the word at an offset set to
    ``bias + (pointer >> shift)`` of a value's data pointer, or a whole encoded map); the
    driver copies the parameters during the call, so the buffer is reused.

    The work is done by attncc.runtime.native's C object where it builds (one call, a lock
    per launch held to the end of the driver call, the GIL released around that call), else
    by ``PythonLaunch``, the same steps through ctypes.

    ``stream`` and ``slots`` (parameter positions) give the positional form: calling the
    launch issues it on ``stream`` with one value per slot, in order (pointers as ints,
    maps as bytes of their length, or addresses once ``address_slots`` gave them fields).
    ``kinds`` (each parameter's numpy scalar type, or a map's length) lets ``args`` be plain
    Python ints, floats and bytes, packed as those kinds."""

    def __init__(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: int,
        args: Sequence[Any],
        slots: Sequence[int] = (),
        kinds: tuple[Any, ...] | None = None,
    ) -> None:
        if kinds is None:
            kinds = tuple(len(a) if isinstance(a, bytes) else type(a) for a in args)
        packer, offsets = packing(kinds)
        self.offsets = offsets
        lengths = tuple(_length(kind) for kind in kinds)
        self._config = (function, grid, block, shared_bytes, packer.pack(*args), offsets)
        self._stream = stream
        positional = [
            (offsets[i], FROM_ITEM, n, 0, 0, lengths[i] or 8) for n, i in enumerate(slots)
        ]
        self._positional = len(positional)
        self._map_slots = tuple(n for n, i in enumerate(slots) if lengths[i])
        self.slots: tuple[Slot, ...] = ()
        self.with_slots(positional)

    def with_slots(self, slots: Sequence[Slot]) -> None:
        """Prepare the launch with these slots (``run``'s form)."""
        self.slots = tuple(slots)
        # (the C launcher's Launch has PythonLaunch's interface)
        self._issue: PythonLaunch = _launch_type()(entry_address(), *self._config, self.slots)

    def fixed(self, values: dict[str, int]) -> Launch:
        """A copy of this launch whose word slots that take an input named in ``values``
        have that value written into its parameters instead (a length family's plan made a
        plan of one call geometry: attncc.runtime.triton_plan)."""
        function, grid, block, shared_bytes, params, offsets = self._config
        buffer = bytearray(params)
        left: list[Slot] = []
        for slot in self.slots:
            at, kind, key, shift, bias, length = slot
            if kind == FROM_INPUT and length == 8 and key in values:
                _POINTER.pack_into(buffer, at, (bias + (values[key] >> shift)) & _WORD)
            else:
                left.append(slot)
        launch = copy.copy(self)
        launch._config = (function, grid, block, shared_bytes, bytes(buffer), offsets)
        launch.with_slots(left)
        return launch

    def address_slots(self, fields: Sequence[Any]) -> None:
        """From now on the last ``len(fields)`` positional slots (encoded maps) each take
        the address their map moves to, not a whole map: the call writes
        ``field.word(address)`` at ``field.offset`` of the map packed first
        (attncc.runtime.tensor_map.AddressField)."""
        first = self._positional - len(fields)
        if any(n not in self._map_slots for n in range(first, self._positional)):
            raise ValueError("address fields name encoded maps' slots only")
        moved = [
            (at + field.offset, kind, key, field.shift, field.bias, 8)
            for (at, kind, key, _, _, _), field in zip(self.slots[first:], fields, strict=True)
        ]
        self.with_slots([*self.slots[:first], *moved])

    def __call__(self, *values: int | bytes) -> None:
        if len(values) != self._positional:
            raise TypeError(f"a launch with {self._positional} slots, given {len(values)} values")
        code = self._issue.run(self._stream, None, values, 0)  # one Python frame less
        if code:
            check(code)

    def run(self, stream: int, inputs: Any, items: Sequence[Any], base: int) -> None:
        """Issue the launch on ``stream``, its slots filled from ``inputs`` (a dict by
        name), ``items`` (by position) and ``base``."""
        code = self._issue.run(stream, inputs, items, base)
        if code:
            check(code)

    @property
    def stream(self) -> int:
        """The stream the positional form launches on."""
        return self._stream

    @property
    def native(self) -> Any:
        """The C launcher's object behind this launch (launcher.c's Launch), or None where
        it launches through ``PythonLaunch``."""
        built = native.built()
        return self._issue if built is not None and isinstance(self._issue, built.Launch) else None

    def native_rebound(self, source: Callable[[int], tuple[int, Any]]) -> Any:
        """A C launcher Launch of this launch (its own copy of the parameters) whose slots
        that take positional value ``n`` read ``source(n)``, a (kind, key) pair, instead:
        a call's inputs by name or its allocations by position (launch_plan's replays).
        None without the C launcher."""
        if self.native is None:
            return None
        slots = []
        for at, kind, key, shift, bias, length in self.slots:
            if kind == FROM_ITEM:
                kind, key = source(key)
            slots.append((at, kind, key, shift, bias, length))
        return type(self.native)(entry_address(), *self._config, slots)

    @property
    def issue(self) -> Callable[[int, Any, Sequence[Any], int], int]:
        """``run`` without its check: the driver's result code, for a caller that checks
        it (``check``) and saves a Python frame a launch."""
        return self._issue.run

    def buffer(self) -> bytes:
        """The parameters as last passed."""
        return bytes(self._issue.buffer())


def launch_once(
    function: int,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_bytes: int,
    params: bytes,
    offsets: Sequence[int],
    stream: int,
) -> int:
    """Issue one launch of ``function`` with its parameters already packed (``params``, each
    parameter at its offset), keeping nothing: the driver's result code."""
    head = (entry_address(), function, grid, block, shared_bytes)
    launch = _launch_type()(*head, params, offsets, ())
    return int(launch.run(stream, None, (), 0))


def check(code: int) -> None:
    """Raise for a launch's result code (``Launch.issue``) other than success."""
    _check(code, "cuLaunchKernel")


class PythonLaunch:
    """launcher.c's Launch in Python (ctypes), where the C one cannot be built."""

    def __init__(
        self,
        entry: int,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        params: bytes,
        offsets: Sequence[int],
        slots: Sequence[Slot],
    ) -> None:
        self._buffer = ctypes.create_string_buffer(params, len(params))
        self._bytes = memoryview(self._buffer).cast("B")
        base = ctypes.addressof(self._buffer)
        pointers = (ctypes.c_void_p * len(offsets))(*[base + at for at in offsets])
        self._slots = tuple(slots)
        self._lock = threading.Lock()
        self._entry = _ENTRY(entry)
        self._head = (function, *grid, *block, shared_bytes)
        self._pointers = pointers

    def run(self, stream: int, inputs: Any, items: Sequence[Any], base: int) -> int:
        with self._lock:
            for at, kind, key, shift, bias, length in self._slots:
                if kind == FROM_INPUT:
                    value = inputs[key]
                elif kind == FROM_ITEM:
                    value = items[key]
                else:
                    value = base
                if length != 8:
                    if len(value) != length:
                        raise ValueError(
                            f"attncc launch: a {length}-byte slot given {len(value)} bytes"
                        )
                    self._bytes[at : at + length] = value
                    continue
                if value is None:
                    pointer = 0
                elif isinstance(value, int):
                    pointer = value
                else:
                    pointer = value.data_ptr()
                _POINTER.pack_into(self._bytes, at, (bias + (pointer >> shift)) & _WORD)
            return int(self._entry(*self._head, stream, self._pointers, None))

    def buffer(self) -> bytes:
        return self._bytes.tobytes()
