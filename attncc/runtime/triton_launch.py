"""A recorded Triton launch issued through attncc's own launcher (attncc.runtime.driver).

Triton's compiled launch function parses every argument of the kernel from a Python tuple
on each call (30-40 of them for attncc's kernels, descriptors expanded) and then calls
cuLaunchKernelEx. In a replayed call (attncc.runtime.triton_plan) all of them but the data
pointers are fixed, so ``prepare`` packs them once, in the layout the kernel's parameters
have, into a ``driver.Launch`` whose slots take the pointers of each call: the input tensors
by name, the call's allocations by index, the scratch block's base plus an offset, and the
address words of the tensor maps kept from the descriptors' expansion.

The kernel's function comes from attncc's driver too (``loaded_function``): Triton's own
loading (``CompiledKernel.function``) first builds the kernel's launcher, a C compiler run
of 0.39 s on an H200 machine with an empty Triton cache, which a first call through this
module never needs.

The layout follows Triton's launcher for the kernel's signature: each argument that is not a
constexpr, in order (pointers, integers and floats at their C width, an encoded map's 128
bytes), then the global and profile scratch pointers (both 0 here). The count and size of
every parameter are checked against the driver's own list (cuFuncGetParamInfo, CUDA 12.4).
A launch keeps Triton's launcher where the driver cannot list its parameters, where it
needs more than a plain cuLaunchKernel (thread block clusters, programmatic dependent
launch, cooperative groups, scratch memory), or where it holds a type not listed here.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from attncc.runtime import driver, tensor_descriptors, tensor_map

Source = tuple[Any, ...]

# the C types of Triton's scalar signature types (ty_to_cpp, FLOAT_STORAGE_TYPE)
_SCALARS: dict[str, type[np.generic]] = {
    "i1": np.int8, "i8": np.int8, "u1": np.uint8, "u8": np.uint8, "i16": np.int16,
    "u16": np.uint16, "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64,
    "fp32": np.float32, "f32": np.float32, "fp64": np.float64,
}  # fmt: skip
_MAP_BYTES = 128
# Triton's load_binary: a kernel using more than this much shared memory prefers shared
# memory over L1 (cuFuncSetCacheConfig)
_STATIC_SHARED_LIMIT = 49152
# (id of a CompiledKernel, device index) -> the CompiledKernel (keeping the id taken) and its
# kernel loaded by attncc's driver
_LOADED: dict[tuple[int, int], tuple[Any, driver.Kernel]] = {}


def loaded_function(compiled: Any, device: int) -> int | str:
    """The CUfunction of ``compiled``'s cubin on ``device`` (the current context), loaded
    through attncc's driver with its shared memory allowed, or why not (a launch through
    Triton then raises Triton's own error, such as OutOfResources)."""
    key = (id(compiled), device)
    verdict = _VERDICTS.get(key)
    if verdict is None:
        verdict = _VERDICTS[key] = (compiled, _loaded_function(compiled, device))
    return verdict[1]


# (id of a CompiledKernel, device index) -> the CompiledKernel and loaded_function's answer:
# each new call geometry prepares its launches again, and the function's checks are two
# driver calls through ctypes
_VERDICTS: dict[tuple[int, int], tuple[Any, int | str]] = {}


def _loaded_function(compiled: Any, device: int) -> int | str:
    key = (id(compiled), device)
    found = _LOADED.get(key)
    metadata = compiled.metadata
    try:
        if found is None:
            (kernel,) = driver.load_kernels(compiled.kernel, (compiled.name,))
            found = _LOADED[key] = (compiled, kernel)
        function = driver.function(found[1], device, metadata.shared)
    except (RuntimeError, TypeError, AttributeError) as error:
        return f"the kernel's cubin does not load through attncc's driver ({error})"
    if driver.max_threads(function) < 32 * metadata.num_warps:
        return "more threads than the kernel's registers allow"
    if metadata.shared > _STATIC_SHARED_LIMIT:
        driver.prefer_shared(function)
    return function


class DirectLaunch:
    """A compiled kernel's launches through attncc's launcher with every argument given at
    the call (``issue``): what a call of a geometry no plan recorded needs, whose arguments
    are new each time. What follows from the kernel alone (its loaded function, its
    parameter layout checked against the driver's list, which arguments are pointers) is
    worked out once per kernel and device (``direct_launch``); a call packs its values in one
    struct call. Preparing a launch for each such call (``prepare``: a numpy scalar an
    argument, the function's checks) took 35 of a decode call's 146 us of profiled CPU over
    a cache growing a token a call (H200, benchmarks/growing_cache.py --profile)."""

    def __init__(
        self,
        function: int,
        block: tuple[int, int, int],
        shared_bytes: int,
        packer: struct.Struct,
        offsets: tuple[int, ...],
        arguments: tuple[tuple[int, bool], ...],
    ) -> None:
        self.function = function
        self.block = block
        self.shared_bytes = shared_bytes
        self.packer = packer
        self.offsets = offsets
        self.arguments = arguments  # (position, whether a pointer) of each parameter

    def issue(self, grid: tuple[int, int, int], values: Sequence[Any], stream: int) -> bool:
        """Launch on ``grid`` and ``stream`` with the kernel's arguments ``values`` (in
        declaration order, constexprs included); False, launching nothing, where a value
        does not pack as its parameter (the caller then launches through Triton)."""
        packed: list[Any] = []
        try:
            for at, pointer in self.arguments:
                value = values[at]
                if pointer and not isinstance(value, int):
                    value = 0 if value is None else value.data_ptr()
                packed.append(value)
            params = self.packer.pack(*packed, 0, 0)  # the global and profile scratch
        except (struct.error, AttributeError, TypeError, OverflowError):
            return False
        code = driver.launch_once(
            self.function, grid, self.block, self.shared_bytes, params, self.offsets, stream
        )
        if code:
            driver.check(code)
        return True


# (id of a CompiledKernel, device index) -> the CompiledKernel (keeping the id taken) and its
# DirectLaunch, or why its launches keep the prepared route
_DIRECT: dict[tuple[int, int], tuple[Any, DirectLaunch | str]] = {}


def direct_launch(compiled: Any, device: int) -> DirectLaunch | str:
    """``compiled``'s DirectLaunch on ``device``, made once; a str says why not: a kernel
    taking tensor maps (their descriptors are expanded per call: ``prepare``), or any
    reason ``prepare`` would keep Triton's launcher."""
    key = (id(compiled), device)
    found = _DIRECT.get(key)
    if found is None:
        launch = _direct_launch(compiled, device, signature_types(compiled))
        found = _DIRECT[key] = (compiled, launch)
    return found[1]


def signature_types(compiled: Any) -> list[str]:
    """Each argument's type in a compiled kernel's signature ("": a tuple's)."""
    signature = getattr(getattr(compiled, "src", None), "signature", {})
    return [t if isinstance(t, str) else "" for t in signature.values()]


def _direct_launch(compiled: Any, device: int, types: Sequence[str]) -> DirectLaunch | str:
    metadata = compiled.metadata
    if not _plain(metadata):
        return "a launch needing cuLaunchKernelEx's attributes or scratch memory"
    if tensor_descriptors.metas(compiled):
        return "a kernel taking tensor descriptors"
    kinds: list[type[np.generic]] = []
    arguments: list[tuple[int, bool]] = []
    for at, kind in enumerate(types):
        if kind == "constexpr":
            continue
        pointer = kind.startswith("*")
        scalar = np.uint64 if pointer else _SCALARS.get(kind)
        if scalar is None:
            return f"an argument of type {kind or 'unknown'}"
        kinds.append(scalar)
        arguments.append((at, pointer))
    kinds += [np.uint64, np.uint64]  # the global and profile scratch pointers
    function = loaded_function(compiled, device)
    if isinstance(function, str):
        return function
    mismatch = _checked_layout(function, tuple(kinds))
    if mismatch is not None:
        return mismatch
    packer, offsets = driver.packing(tuple(kinds))
    block = (32 * metadata.num_warps, 1, 1)
    return DirectLaunch(function, block, metadata.shared, packer, offsets, tuple(arguments))


def _plain(metadata: Any) -> bool:
    """Whether a kernel launches with a plain cuLaunchKernel (no clusters, programmatic
    dependent launch, cooperative groups or scratch memory)."""
    return (
        getattr(metadata, "num_ctas", 1) == 1
        and not getattr(metadata, "launch_pdl", False)
        and not getattr(metadata, "launch_cooperative_grid", False)
        and not getattr(metadata, "global_scratch_size", 0)
        and not getattr(metadata, "profile_scratch_size", 0)
    )


def prepare(
    compiled: Any,
    function: int,
    grid: tuple[int, int, int],
    values: Sequence[Any],
    types: Sequence[str],
    slots: Sequence[tuple[int, Source]],
    maps: Sequence[tuple[int, tensor_map.AddressField, Source]] = (),
) -> driver.Launch | str:
    """The launch of ``compiled`` (a Triton CompiledKernel), its ``function`` loaded by
    ``loaded_function``, on ``grid`` with ``values``, the
    launcher's arguments (descriptors expanded) with their signature ``types``: None at the
    ``slots``' positions (filled from their source each call), tensor maps at the ``maps``'
    positions (their address word moved to their base's pointer each call). A str says why
    the launch keeps Triton's launcher."""
    metadata = compiled.metadata
    if not _plain(metadata):
        return "a launch needing cuLaunchKernelEx's attributes or scratch memory"
    if len(types) != len(values):
        return "arguments and signature types differ in number"
    args: list[Any] = []
    kinds: list[Any] = []  # each parameter's numpy scalar type, or a map's length
    parameter: dict[int, int] = {}  # an argument's position -> its parameter's
    for at, (kind, value) in enumerate(zip(types, values, strict=True)):
        if kind == "constexpr":
            continue
        packed = _packed(kind, value)
        if packed is None:
            return f"an argument of type {kind or 'unknown'} ({type(value).__name__})"
        parameter[at] = len(args)
        kinds.append(packed[0])
        args.append(packed[1])
    args += [0, 0]  # the global and profile scratch pointers
    kinds += [np.uint64, np.uint64]
    mismatch = _checked_layout(function, tuple(kinds))
    if mismatch is not None:
        return mismatch
    block = (32 * metadata.num_warps, 1, 1)
    try:
        launch = driver.Launch(function, grid, block, metadata.shared, 0, args, kinds=tuple(kinds))
    except (struct.error, OverflowError) as error:
        return f"an argument that does not fit its parameter ({error})"
    offsets = launch.offsets
    launch_slots: list[driver.Slot] = []
    for at, source in slots:
        if at not in parameter and types[at] == "constexpr" and values[at] is not None:
            # a value the kernel was compiled for (an int of 1): a slot there takes the same
            # value each call, which the call's key holds (a length family's classes)
            continue
        slot = _slot(offsets[parameter[at]], 0, 0, source) if at in parameter else None
        if slot is None:
            return f"a pointer slot from {source[0]} at argument {at}"
        launch_slots.append(slot)
    for at, field, source in maps:
        offset = offsets[parameter[at]] + field.offset
        slot = _slot(offset, field.shift, field.bias, source)
        if slot is None:
            return f"a tensor map over {source[0]}"
        launch_slots.append(slot)
    if launch_slots:  # (the launch was prepared without slots: a direct launch's)
        launch.with_slots(launch_slots)
    return launch


def _packed(kind: str, value: Any) -> tuple[Any, Any] | None:
    """An argument as its parameter's kind (a numpy scalar type of its C type, or a map's
    length) and the value packed into it (an int, a float, a map's bytes)."""
    if kind.startswith("*"):
        if value is None:
            return np.uint64, 0  # a slot, or a null pointer
        if isinstance(value, int):
            return np.uint64, value
        pointer = getattr(value, "data_ptr", None)  # a buffer the module keeps
        return (np.uint64, pointer()) if callable(pointer) else None
    if kind == "nvTmaDesc":
        where = tensor_descriptors.map_address(value)
        return None if where is None else (_MAP_BYTES, ctypes.string_at(where, _MAP_BYTES))
    scalar = _SCALARS.get(kind)
    if scalar is None or not isinstance(value, (int, float, bool, np.generic)):
        return None
    return scalar, value


def _slot(at: int, shift: int, bias: int, source: Source) -> driver.Slot | None:
    """The launch slot at byte ``at`` filled from ``source`` (None: a source it cannot
    read, such as a descriptor left to Triton's wrapper)."""
    kind, key = source[0], source[1]
    if kind == "input":
        return (at, driver.FROM_INPUT, key, shift, bias, 8)
    if kind == "alloc":
        return (at, driver.FROM_ITEM, key, shift, bias, 8)
    if kind == "scratch":  # the scratch block's base plus the tensor's offset in it
        return (at, driver.FROM_BASE, None, shift, bias + key, 8)
    return None


def _checked_layout(function: int, kinds: tuple[Any, ...]) -> str | None:
    """``_layout_mismatch`` of a function and its parameters' kinds (numpy scalar types, or
    a map's length), worked out once each: every new call geometry prepares its launches."""
    key = (function, kinds)
    if key not in _LAYOUT_CHECKS:
        sizes = [k if isinstance(k, int) else np.dtype(k).itemsize for k in kinds]
        _LAYOUT_CHECKS[key] = _layout_mismatch(function, sizes)
    return _LAYOUT_CHECKS[key]


# (function, kinds) -> _layout_mismatch's answer
_LAYOUT_CHECKS: dict[tuple[int, tuple[Any, ...]], str | None] = {}


def _layout_mismatch(function: int, ours: list[int]) -> str | None:
    """How the kernel's parameters, as the driver lists them, differ from ``ours`` (each
    parameter's bytes as packed; None: they agree)."""
    sizes = driver.parameter_sizes(function)
    if sizes is None:
        return "the driver cannot list the kernel's parameters (cuFuncGetParamInfo)"
    if sizes != ours:
        return f"the kernel's parameters ({sizes} bytes) differ from Triton's signature ({ours})"
    return None
