"""Triton launch plans: a generated module's work for one call geometry, recorded once.

A Triton target call spends most of its host time outside the GPU: the module's checks, the
launch configuration, and Triton's own launcher (``kernel[grid](...)`` binds and specializes
every argument and builds launch metadata: 95-172 us of CPU a call on an H200, against
7-74 us of GPU). Everything those steps decide follows from the call geometry
(``attncc.runtime.launch_plan.Plans.key``: shapes, strides, dtypes, device, alignment,
params, ``return_lse``). So the first call of a geometry runs the module's ``_launch`` while
``record`` watches it: which tensors it allocates (``torch.empty`` and friends, with their
shapes), which kernels it launches with which grid and arguments, and where each tensor
argument comes from (an input, an allocation of this call, or a buffer the module keeps).
A later call of the same geometry replays that: it allocates, fills in the data pointers and
calls each compiled kernel's launcher directly. A kernel taking TMA tensor descriptors gets
them expanded once, their maps moved to each call's tensors (attncc.runtime.tensor_descriptors).

Recording refuses (the geometry keeps the full path) where the module does anything the
replay could not repeat exactly: a torch operation other than allocating, filling a fresh
allocation or reading tensor metadata (a view, a conversion, reading a value), a tensor
argument of unknown origin, a grid computed by a callable, a launch hook installed (a
profiler: it gets Triton's own launches).
"""

from __future__ import annotations

import copy
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from attncc.runtime import driver, launch_plan, native, tensor_descriptors, triton_launch

Result = tuple[torch.Tensor, ...]  # the module's outputs: (out, lse); a backward's gradients

# torch functions that create a tensor from sizes alone (no tensor argument)
_FACTORIES = frozenset({"empty", "zeros", "ones", "full"})
# ... or shaped like another tensor
_LIKE_FACTORIES = frozenset({"empty_like", "zeros_like", "ones_like", "full_like"})
# in-place fills a module may apply to a fresh allocation (an empty call's zero output,
# NaN poisoning for checks)
_FILLS = frozenset({"zero_", "fill_"})
# reads of tensor metadata: fixed for a geometry (the key holds shapes, strides, dtype,
# device and the data pointers' alignment), or the data pointer the replay fills in
_QUERIES = frozenset(
    {"data_ptr", "dim", "element_size", "numel", "stride", "size", "storage_offset",
     "is_contiguous", "get_device", "shape", "dtype", "device", "is_cuda", "ndim",
     "requires_grad", "itemsize", "layout", "is_floating_point"}
)  # fmt: skip

# what a module's host code may do ahead of its launches and still be replayed (or have its
# kernels compiled ahead: attncc.runtime.compile_ahead)
HOST_WORK = _FACTORIES | _LIKE_FACTORIES | _FILLS | _QUERIES

# where a kernel argument comes from at a call: ("input", name), ("alloc", index), or a
# tensor descriptor over one of those: ("desc", source, shape, strides, block, padding)
Source = tuple[Any, ...]


def _length_slots(step: _Step, lengths: dict[str, str]) -> tuple[tuple[int, Source], ...]:
    """Slots at a step's arguments named in ``lengths``, each filled from the input named
    there (its recorded value stays where a launch is packed first)."""
    if not lengths:
        return ()
    return tuple(
        (at, ("input", lengths[name]))
        for at, name in enumerate(argument_names(step))
        if name in lengths
    )


def _fixed_step(step: _Step, values: dict[str, int]) -> _Step:
    """``step`` with its slots taking an input named in ``values`` given that value."""
    fixed = {at: values[s[1]] for at, s in step.slots if s[0] == "input" and s[1] in values}
    if not fixed:
        return step
    return replace(
        step,
        values=[fixed.get(at, value) for at, value in enumerate(step.values)],
        slots=tuple((at, s) for at, s in step.slots if at not in fixed),
    )


def argument_names(step: _Step) -> tuple[str, ...]:
    """The kernel argument each of a step's values is: positional ones by the kernel's
    argument order, the keyword tail by its names."""
    positional = len(step.values) - len(step.names)
    return (*step.kernel.arg_names[:positional], *step.names)


def signature(
    recorder: _Recorder, outputs: tuple[int, ...], lengths: dict[str, str]
) -> tuple[Any, ...]:
    """What two recorded calls of a length family must agree on
    (attncc.runtime.length_family), read after a plan marked the buffers the module keeps:
    each launch's kernel, compiled kernel, grid and arguments (the length ones left out; a
    tensor by where it comes from, a kept buffer by its shape and dtype, which another
    stream's or a call that first made it share), the other allocations' shapes and dtypes,
    the fills and the outputs."""
    kept = {i for i, a in enumerate(recorder.allocations) if a.kept is not None}
    fresh = [i for i in range(len(recorder.tensors)) if i not in kept]
    number = {index: n for n, index in enumerate(fresh)}

    def allocation(index: int) -> Any:
        if index in kept:
            return ("kept", tuple(recorder.tensors[index].shape), recorder.tensors[index].dtype)
        return ("alloc", number[index])

    steps = []
    for step in recorder.steps:
        slots = dict(step.slots)
        values: list[Any] = []
        for at, (name, value) in enumerate(zip(argument_names(step), step.values, strict=True)):
            source = slots.get(at)
            if name in lengths:
                values.append("length")
            elif source is not None:
                values.append(allocation(source[1]) if source[0] == "alloc" else source)
            elif isinstance(value, torch.Tensor):
                values.append(("kept", tuple(value.shape), value.dtype))
            else:
                values.append(value)
        steps.append((id(step.kernel), id(step.compiled), step.grid, tuple(values)))
    tensors = tuple((tuple(recorder.tensors[i].shape), recorder.tensors[i].dtype) for i in fresh)
    fills = tuple(
        (allocation(index), function_name(fill), args) for index, fill, args in recorder.fills
    )
    return (tuple(steps), tensors, fills, tuple(allocation(i) for i in outputs))


def length_mismatch(
    recorder: _Recorder, lengths: dict[str, str], values: dict[str, int]
) -> str | None:
    """Where a recorded call's length arguments are not the length ``values`` its inputs
    give (a module whose table misnames them), or None."""
    for step in recorder.steps:
        for name, value in zip(argument_names(step), step.values, strict=True):
            if name in lengths and value != values[lengths[name]]:
                return f"argument {name} of {step.kernel.__name__} is {value}, not its length value"
    return None


class _Refused(Exception):
    """The call did something a replay could not repeat (the message says what)."""


def function_name(func: Any) -> str:
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property read: Tensor.shape.__get__
        return getattr(getattr(func, "__self__", None), "__name__", name)
    return str(name)


@dataclass
class _Allocation:
    factory: Callable[..., torch.Tensor]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    like: Source | None  # a like-factory's tensor argument
    # the tensor itself where the module kept it (a cached buffer such as split-KV's arrival
    # counters, made by the call that was recorded): later calls of the full path reuse it
    # rather than allocate, and so does the replay
    kept: torch.Tensor | None = None


@dataclass
class _Step:
    """One kernel launch: ``values`` with the tensor arguments at ``slots`` left to fill."""

    kernel: Any  # the JIT (or interpreted) function
    compiled: Any  # its CompiledKernel (None in the interpreter)
    grid: tuple[int, int, int]
    values: list[Any]
    names: tuple[str, ...]  # the keyword arguments' names, the tail of ``values``
    slots: tuple[tuple[int, Source], ...]


class _Recorder(TorchFunctionMode):
    """Watches the torch functions a module's host code calls (not those of the kernels,
    which run with the mode suspended)."""

    def __init__(self, inputs: dict[str, Any]) -> None:
        super().__init__()
        self.sources: dict[int, Source] = {id(t): ("input", n) for n, t in inputs.items()}
        self.input_pointers = {n: t.data_ptr() for n, t in inputs.items()}
        self.tensors: list[torch.Tensor] = []  # keeps ids alive while recording
        self.allocations: list[_Allocation] = []
        self.fills: list[tuple[int, Callable[..., Any], tuple[Any, ...]]] = []
        self.steps: list[_Step] = []
        self.refusal: str | None = None

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if self.refusal is None:
            try:
                self._note(func, args, kwargs, result)
            except _Refused as refused:
                self.refusal = str(refused)
        return result

    def _note(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        name = function_name(func)
        if name in _QUERIES:
            return
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if name in _FACTORIES and not tensors:
            self._allocated(result, _Allocation(func, args, kwargs, None))
        elif name in _LIKE_FACTORIES and len(tensors) == 1 and args and args[0] is tensors[0]:
            like = self.source(args[0])
            self._allocated(result, _Allocation(func, args[1:], kwargs, like))
        elif name in _FILLS and args and len(tensors) == 1:
            source = self.sources.get(id(args[0]))
            if source is None or source[0] != "alloc":
                raise _Refused(f"{name} on a tensor that is not a fresh allocation")
            self.fills.append((source[1], func, args[1:]))
        else:
            raise _Refused(f"torch.{name}")

    def _allocated(self, tensor: Any, allocation: _Allocation) -> None:
        if type(tensor) is not torch.Tensor:
            raise _Refused("an allocation that is not a plain tensor")
        self.sources[id(tensor)] = ("alloc", len(self.allocations))
        self.tensors.append(tensor)
        self.allocations.append(allocation)

    def source(self, value: torch.Tensor) -> Source | None:
        """Where a tensor comes from; None: a buffer the module keeps (made before the call)."""
        return self.sources.get(id(value))

    def launched(
        self, kernel: Any, compiled: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self.refusal is not None:
            return
        try:
            self.steps.append(self._step(kernel, compiled, grid, args, kwargs))
        except _Refused as refused:
            self.refusal = str(refused)

    def _step(
        self, kernel: Any, compiled: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> _Step:
        if not isinstance(grid, tuple) or not all(type(g) is int for g in grid):
            raise _Refused("a grid that is not a tuple of ints")
        full_grid = (*grid, 1, 1)[:3]
        if compiled is not None:
            # the compiled launcher takes every argument in declaration order
            names = tuple(kernel.arg_names)
            if len(args) > len(names) or any(n not in kwargs for n in names[len(args) :]):
                raise _Refused(f"a launch of {kernel.__name__} with arguments left to defaults")
            values = [*args, *(kwargs[n] for n in names[len(args) :])]
            tail: tuple[str, ...] = ()
        else:
            values, tail = [*args, *kwargs.values()], tuple(kwargs)
        slots = []
        for at, value in enumerate(values):
            source = self._argument(value)
            if source is not None:
                slots.append((at, source))
                values[at] = None  # filled at each call; holding it would count as keeping it
        return _Step(kernel, compiled, full_grid, values, tail, tuple(slots))

    def _argument(self, value: Any) -> Source | None:
        """The source of a tensor argument (None: a value the replay passes unchanged)."""
        if isinstance(value, torch.Tensor):
            if type(value) is not torch.Tensor:
                raise _Refused("a tensor subclass argument")
            return self.source(value)  # None: a kept buffer, passed as it is
        if type(value).__name__ == "TensorDescriptor":
            base = self.source(value.base)
            if base is None:
                return None
            shape, strides = tuple(value.shape), tuple(value.strides)
            return ("desc", base, shape, strides, tuple(value.block_shape), value.padding)
        return None


class TritonPlan:
    """A recorded call, replayed on a later call of the same geometry (see the module).

    Compiled replays pass data pointers, so the call's scratch (allocations only kernels
    read, such as split-KV's partial results) comes from one allocation at offsets: an
    allocation costs 2-4 us of host time, more than a split-KV launch's share."""

    def __init__(
        self,
        recorder: _Recorder,
        outputs: tuple[int, ...],
        device: int | None,
        lengths: dict[str, str] | None = None,
    ) -> None:
        """``lengths``: the kernel arguments (by name) each replay takes from its inputs
        (by the name there) rather than as recorded: a length family's plan
        (attncc.runtime.length_family), whose replays pass the length values beside the
        tensors."""
        # an output without elements (the log-sum-exp a call does not ask for) has no data:
        # the recorded one serves every replay, one allocation less a call (1.5-3.5 us of
        # CPU each, H200: benchmarks/call_parts.py); Kernel.__call__ drops it
        unasked = {o for o in outputs if recorder.tensors[o].numel() == 0}
        kept = _kept(recorder, outputs) | unasked
        for index in kept:
            recorder.allocations[index].kept = recorder.tensors[index]
        self.fills = tuple(f for f in recorder.fills if f[0] not in kept)
        self.outputs = outputs
        self.device = device  # the current CUDA device the kernels were loaded on
        scratch, self.scratch_bytes = (
            _scratch(recorder, {*outputs, *kept}) if device is not None else ({}, 0)
        )
        self.allocations = tuple(
            None if index in scratch else _prepared_allocation(a, recorder.tensors[index])
            for index, a in enumerate(recorder.allocations)
        )
        # a plan holding buffers the module keeps per stream (split-KV's arrival counters:
        # two calls at once must not share them) serves the stream it was recorded on
        # alone, and keeps its scratch block too (that stream's calls run one after the
        # other): None where it holds none
        holds = any(recorder.tensors[i].numel() for i in kept) or any(
            isinstance(value, torch.Tensor) for step in recorder.steps for value in step.values
        )
        self.stream = _current_stream(device) if device is not None and holds else None
        self._new_scratch = None
        self._scratch_block: torch.Tensor | None = None
        if device is not None and self.scratch_bytes:
            cuda = torch.device("cuda", device)
            self._new_scratch = launch_plan.allocator((self.scratch_bytes,), torch.uint8, cuda)
            if self.stream is not None:
                self._scratch_block = self._new_scratch()
        self.steps = tuple(
            replace(
                step,
                slots=tuple(
                    (at, ("scratch", scratch[s[1]]) if s[0] == "alloc" and s[1] in scratch else s)
                    for at, s in step.slots
                )
                + _length_slots(step, lengths or {}),
            )
            for step in recorder.steps
        )

        def pointer(source: Source) -> int:  # a tensor's pointer in the recorded call
            if source[0] == "input":
                return int(recorder.input_pointers[source[1]])
            return recorder.tensors[source[1]].data_ptr()

        prepared = [_prepared(s, pointer, device) for s in self.steps] if device is not None else []
        # every step issued through attncc's launcher (triton_launch; a step with an empty
        # grid launches nothing): each one's driver.Launch.issue; or None, and why a step
        # keeps Triton's launcher
        direct = [launch for _, launch, _ in prepared]
        refusals = [launch for launch in direct if isinstance(launch, str)]
        self.launcher_refusal = refusals[0] if refusals else None
        self._direct = tuple(launch for launch in direct if isinstance(launch, driver.Launch))
        self.issues = (
            tuple(launch.issue for launch in self._direct)
            if device is not None and not refusals
            else None
        )
        # the CUDA context the kernels were loaded in (the device's, current while recording)
        self.context = driver.current_context() if device is not None else 0
        self._replay: Any = None  # native_replay's, once made (False: none)
        # Triton's launchers, built only where a step needs one (a C compiler run each on an
        # empty Triton cache)
        self.launches = tuple(triton() for triton, _, _ in prepared) if self.issues is None else ()
        # whether a step keeps a descriptor's map and moves it to each call's tensor (rather
        # than encode it again)
        self.moves_maps = any(moves for _, _, moves in prepared)
        # launches that rewrite tensor maps they keep (descriptor patches) hold this while
        # patching and launching: two threads replaying the plan share those maps
        self.patched = any(launch[6] for launch in self.launches)
        self._lock = threading.Lock()

    def __call__(self, tensors: dict[str, Any]) -> Result | None:
        """The call's outputs, or None where it cannot replay here (another current
        device, a launch hook installed): the caller then takes the full path."""
        compiled = self.device is not None
        if compiled:
            if torch._C._cuda_getDevice() != self.device or _launch_hooks():
                return None
            stream = _current_stream(self.device)
            if self.stream is not None and stream != self.stream:
                return None
        allocs: list[Any] = []
        for a in self.allocations:
            if a is None:
                allocs.append(None)  # scratch, at an offset of `base`
            elif a.kept is not None:
                allocs.append(a.kept)
            elif a.like is None:
                allocs.append(a.factory(*a.args, **a.kwargs))
            else:
                allocs.append(a.factory(_resolve(a.like, tensors, allocs), *a.args, **a.kwargs))
        for filled, fill, fill_args in self.fills:
            fill(allocs[filled], *fill_args)
        base = 0
        if self._scratch_block is not None:
            base = self._scratch_block.data_ptr()
        elif self._new_scratch is not None:
            # keeps the block allocated until the launches are queued (stream order after)
            block = self._new_scratch()
            base = block.data_ptr()
        if compiled:
            if self.issues is not None:
                for issue in self.issues:
                    code = issue(stream, tensors, allocs, base)
                    if code:
                        driver.check(code)
            elif self.patched:
                with self._lock:
                    self._launch(stream, tensors, allocs, base)
            else:
                self._launch(stream, tensors, allocs, base)
            return tuple(allocs[i] for i in self.outputs)
        for step in self.steps:
            values = list(step.values)
            for at, source in step.slots:
                values[at] = _resolve(source, tensors, allocs)
            positional = len(values) - len(step.names)
            keywords = dict(zip(step.names, values[positional:], strict=True))
            step.kernel.run(*values[:positional], grid=step.grid, warmup=False, **keywords)
        return tuple(allocs[i] for i in self.outputs)

    def fixed(self, values: dict[str, int]) -> TritonPlan:
        """This plan with the inputs named in ``values`` (a length family's values, read by
        slots of ``lengths``) written into its launches: the plan of one call geometry,
        sharing this one's kept buffers and scratch, which the C launcher replays."""
        plan = copy.copy(self)
        plan.steps = tuple(_fixed_step(step, values) for step in self.steps)
        plan._direct = tuple(launch.fixed(values) for launch in self._direct)
        if self.issues is not None:
            plan.issues = tuple(launch.issue for launch in plan._direct)
        plan._replay = None
        plan._lock = threading.Lock()
        return plan

    def serves(self, stream: int) -> bool:
        """Whether the plan may launch on ``stream`` (a raw stream of its device)."""
        return self.stream is None or stream == self.stream

    def native_replay(self, guard: tuple[Callable[[], Any], Any] | None = None) -> Any:
        """This plan as the C launcher's Replay (launcher.c: the same allocations and
        launches without a Python frame), refusing where ``guard`` (callable, expected)
        calls to another value, or on another stream than the one a plan holding kept
        buffers serves; None where it has none: no C launcher, a step on Triton's
        launcher, fills, or an allocation other than a prepared one or a kept buffer. Made
        once (with the first guard asked for)."""
        if self._replay is None:
            self._replay = self._native_replay(guard)
        return self._replay or None

    def _native_replay(self, guard: tuple[Callable[[], Any], Any] | None) -> Any:
        """The Replay; False where this plan never has one, None while the C launcher
        builds."""
        launcher = native.built()
        if launcher is None:
            return None
        if self.device is None or self.issues is None or self.fills:
            return False
        allocations: list[Any] = []
        for a in self.allocations:
            if a is None or a.kept is not None:
                allocations.append(a.kept if a is not None else None)
            elif a.like is None and not a.args and not a.kwargs:
                allocations.append(a.factory)
            else:
                return False
        launches = [launch.native for launch in self._direct]
        if any(launch is None for launch in launches):
            return False
        runtime = _TRITON_RUNTIME_KNOBS or _triton_runtime_knobs()
        current = functools.partial(_current_stream, self.device)
        if self.stream is not None:
            guard = _with_stream(guard, current, self.stream)
        return launcher.Replay(
            driver.context_entry(),
            self.context,
            current,
            tuple(allocations),
            self._scratch_block if self._scratch_block is not None else self._new_scratch,
            tuple(launches),
            self.outputs,
            ((runtime, "launch_enter_hook"), (runtime, "launch_exit_hook")),
            guard,
            driver.check,
        )

    def _launch(self, stream: int, tensors: dict[str, Any], allocs: list[Any], base: int) -> None:
        for launch, template, inputs, allocated, offsets, descriptors, patches in self.launches:
            args = template.copy()
            args[3] = stream
            for at, name in inputs:
                args[at] = tensors[name].data_ptr()
            for at, allocation in allocated:
                args[at] = allocs[allocation].data_ptr()
            for at, offset in offsets:
                args[at] = base + offset
            for at, source in descriptors:
                args[at] = _resolve(source, tensors, allocs)
            for move, source in patches:
                move(_resolve(source, tensors, allocs).data_ptr())
            launch(*args)


# a compiled step's launch: the function, its arguments with the stream (at 3) and the
# call's pointers left to fill, and where each pointer goes: (position, input name),
# (position, allocation index), (position, scratch offset), (position, descriptor source);
# last the tensor maps it keeps in its arguments, each moved to its base's pointer before
# the launch: (move, base source)
_Launch = tuple[
    Callable[..., Any],
    list[Any],
    tuple[tuple[int, str], ...],
    tuple[tuple[int, int], ...],
    tuple[tuple[int, int], ...],
    tuple[tuple[int, Source], ...],
    tuple[tuple[Callable[[int], None], Source], ...],
]


def _prepared(
    step: _Step, pointer: Callable[[Source], int], device: int
) -> tuple[Callable[[], _Launch], driver.Launch | str | None, bool]:
    """A compiled step's launch through Triton's launcher (a function building it), through
    attncc's (attncc.runtime.triton_launch: None for an empty grid; a str says why not),
    and whether it moves descriptor maps kept from this call."""
    values, slots = step.values, list(step.slots)
    types = triton_launch.signature_types(step.compiled)
    metas = tensor_descriptors.metas(step.compiled)
    expanded = tensor_descriptors.expand(metas, values, dict(slots), pointer, types)
    direct: driver.Launch | str | None = None
    if 0 not in step.grid:  # Triton's launcher launches nothing on an empty grid
        direct = _direct(step.compiled, device, step.grid, values, types, slots, expanded)

    def triton() -> _Launch:
        launch, middle = _launcher(step.compiled)
        head = [*step.grid, None, *middle]
        raw = tensor_descriptors.raw_launch(launch) if expanded is not None else None
        if expanded is None or raw is None:
            return _triton_launch(launch, head, values, slots, ())
        # Triton's descriptor wrapper left out: its maps are kept and moved, not encoded
        # again each call (an encoding costs 5.7-11.7 us of CPU from Python, H200:
        # benchmarks/call_parts.py); no descriptor slot is left
        return _triton_launch(raw, head, expanded.values, expanded.slots, expanded.patches)

    moves = expanded is not None and bool(expanded.maps)
    return triton, direct, moves


def _direct(
    compiled: Any,
    device: int,
    grid: tuple[int, int, int],
    values: list[Any],
    types: list[str],
    slots: list[tuple[int, Source]],
    expanded: tensor_descriptors.Expanded | None,
) -> driver.Launch | str:
    """The launch through attncc's launcher (triton_launch), or why it keeps Triton's."""
    function = triton_launch.loaded_function(compiled, device)
    if isinstance(function, str):
        return function
    if expanded is None:
        return triton_launch.prepare(compiled, function, grid, values, types, slots)
    return triton_launch.prepare(
        compiled, function, grid, expanded.values, expanded.types, expanded.slots, expanded.maps
    )


def _triton_launch(
    launch: Callable[..., Any],
    head: list[Any],
    values: list[Any],
    slots: list[tuple[int, Source]],
    patches: tuple[tuple[Callable[[int], None], Source], ...],
) -> _Launch:
    """The step through Triton's launch function: its arguments are ``head`` (grid, stream,
    launcher flags) then ``values``, the slots' positions shifted past the head."""
    shift = len(head)

    def at_kind(kind: str) -> tuple[tuple[int, Any], ...]:
        return tuple((shift + at, s[1]) for at, s in slots if s[0] == kind)

    descriptors = tuple((shift + at, s) for at, s in slots if s[0] == "desc")
    template = [*head, *values]
    return (
        launch,
        template,
        at_kind("input"),
        at_kind("alloc"),
        at_kind("scratch"),
        descriptors,
        patches,
    )


def _launcher(compiled: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """How a compiled kernel is launched: the function taking (grid x, y, z, stream, *middle,
    *arguments), and ``middle``. Where the kernel needs no global or profiling scratch,
    that is Triton's compiled launch function itself, as its launcher object would call it
    (one Python frame less a launch); otherwise the launcher object, as Triton calls it."""
    runner = compiled.run
    metadata = (compiled.packed_metadata, None, None, None)  # no launch metadata or hooks
    direct = getattr(runner, "launch", None)
    plain = all(
        getattr(runner, name, 1) == 0 for name in ("global_scratch_size", "profile_scratch_size")
    )
    if direct is not None and plain and hasattr(runner, "launch_cooperative_grid"):
        flags = (runner.launch_cooperative_grid, runner.launch_pdl, None, None)
        return direct, (compiled.function, *flags, *metadata)
    return runner, (compiled.function, *metadata)


# a scratch tensor's offset in the call's one scratch allocation is a multiple of this: the
# caching allocator's own alignment, so Triton's divisibility specialization still holds
_SCRATCH_ALIGN = 512


def _prepared_allocation(allocation: _Allocation, recorded: torch.Tensor) -> _Allocation:
    """``allocation`` as a replay makes it: a plain ``torch.empty`` or ``torch.zeros`` of a
    GPU tensor through ``launch_plan.allocator`` (its shape, dtype and device the recorded
    tensor's), which parses none of them again each call."""
    name = function_name(allocation.factory)
    plain = set(allocation.kwargs) <= {"dtype", "device"} and allocation.like is None
    if allocation.kept is not None or name not in ("empty", "zeros") or not plain:
        return allocation
    if recorded.device.type != "cuda" or not recorded.is_contiguous():
        return allocation
    zeros = name == "zeros"
    new = launch_plan.allocator(recorded.shape, recorded.dtype, recorded.device, zeros)
    return replace(allocation, factory=new, args=(), kwargs={})


def _scratch(recorder: _Recorder, excluded: set[int]) -> tuple[dict[int, int], int]:
    """Allocation index -> byte offset, for the allocations that only kernels read through a
    plain pointer argument (not outputs, kept buffers, filled, shaped-like or a descriptor's
    base), and the bytes of the one allocation holding them."""
    other = {i for i, _, _ in recorder.fills}
    other |= {a.like[1] for a in recorder.allocations if a.like and a.like[0] == "alloc"}
    for step in recorder.steps:
        other |= {s[1][1] for _, s in step.slots if s[0] == "desc" and s[1][0] == "alloc"}
    offsets, at = {}, 0
    for index, tensor in enumerate(recorder.tensors):
        if index in excluded or index in other or tensor.device.type != "cuda":
            continue
        offsets[index] = at
        at += -(-tensor.numel() * tensor.element_size() // _SCRATCH_ALIGN) * _SCRATCH_ALIGN
    return offsets, at


# PyTorch's current raw stream of a device index (CUDA builds)
_current_stream: Any = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _with_stream(
    guard: tuple[Callable[[], Any], Any] | None, current: Callable[[], int], stream: int
) -> tuple[Callable[[], Any], Any]:
    """``guard`` (callable, expected; or None) with the current stream checked too."""
    if guard is None:
        return current, stream
    check, expected = guard
    return (lambda: (check(), current())), (expected, stream)


def _kept(recorder: _Recorder, outputs: tuple[int, ...]) -> set[int]:
    """The allocations the module still holds after the recorded call (besides its outputs):
    a reference beyond the recorder's list and ``getrefcount``'s own argument."""
    return {
        index
        for index in range(len(recorder.tensors))
        if index not in outputs and sys.getrefcount(recorder.tensors[index]) > 2
    }


def _resolve(source: Source, tensors: dict[str, Any], allocs: list[torch.Tensor]) -> Any:
    kind = source[0]
    if kind == "input":
        return tensors[source[1]]
    if kind == "alloc":
        return allocs[source[1]]
    from triton.tools.tensor_descriptor import TensorDescriptor

    _, base, shape, strides, block, padding = source
    return TensorDescriptor(_resolve(base, tensors, allocs), shape, strides, block, padding)


def _launch_hooks() -> bool:
    """Whether a launch hook is installed (a profiler such as proton): Triton's own launch
    path calls it, so such calls take that path."""
    runtime = _TRITON_RUNTIME_KNOBS or _triton_runtime_knobs()
    return bool(runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls)


_TRITON_RUNTIME_KNOBS: Any = None


def _triton_runtime_knobs() -> Any:
    global _TRITON_RUNTIME_KNOBS
    from triton import knobs

    _TRITON_RUNTIME_KNOBS = knobs.runtime
    return _TRITON_RUNTIME_KNOBS


LOCK = threading.RLock()
_RECORDING = threading.local()


@contextmanager
def _watching(kernels: list[Any], recorder: _Recorder, device: int | None) -> Iterator[None]:
    """Route ``kernels``' launches through ``recorder`` for this thread, with the torch
    function mode suspended while they run (the interpreter's own torch calls are not the
    module's). Compiled kernels (on ``device``; None: the interpreter) launch through
    attncc's launcher where ``_launched_directly`` can: Triton's launcher for a kernel is a
    C compiler run on an empty Triton cache (0.39 s on an H200 machine), and a first call
    that never needs one never builds one."""

    def watch(kernel: Any) -> Callable[..., Any]:
        original = kernel.run  # its own, not yet routed

        def run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            if getattr(_RECORDING, "recorder", None) is not recorder or warmup:
                return original(*args, grid=grid, warmup=warmup, **kwargs)
            with torch._C.DisableTorchFunction():
                if device is None:
                    compiled = original(*args, grid=grid, warmup=False, **kwargs)
                else:
                    compiled = _compiled_and_launched(kernel, original, device, grid, args, kwargs)
            recorder.launched(kernel, compiled, grid, args, kwargs)
            return compiled

        return run

    with routed_runs(kernels, watch):
        _RECORDING.recorder = recorder
        try:
            yield
        finally:
            _RECORDING.recorder = None


@contextmanager
def routed_runs(kernels: list[Any], route: Callable[[Any], Callable[..., Any]]) -> Iterator[None]:
    """Each of ``kernels``' ``run`` replaced by ``route(kernel)`` (which reads the kernel's
    own ``run`` first) while the block runs, under LOCK: one router at a time, each sending
    other threads' launches to the kernel's own ``run``. A kernel listed twice (an alias)
    is routed once."""
    kernels = list({id(k): k for k in kernels}.values())
    with LOCK:
        for kernel in kernels:
            kernel.run = route(kernel)
        try:
            yield
        finally:
            for kernel in kernels:
                del kernel.run  # the class's own run again


def _compiled_and_launched(
    kernel: Any,
    original: Callable[..., Any],
    device: int,
    grid: Any,
    args: tuple[Any, ...],
    kwargs: Any,
) -> Any:
    """``kernel``'s launch compiled (its own ``run``, ``original``, without launching) and
    issued through attncc's launcher where ``_launched_directly`` can, else through
    Triton's; the compiled kernel."""
    compiled = original(*args, grid=grid, warmup=True, **kwargs)
    if not _launched_directly(kernel, compiled, device, grid, args, kwargs):
        original(*args, grid=grid, warmup=False, **kwargs)
    return compiled


def _launched_directly(
    kernel: Any, compiled: Any, device: int, grid: Any, args: tuple[Any, ...], kwargs: Any
) -> bool:
    """Issue a recorded call's launch of ``compiled`` through attncc's launcher, as Triton's
    would issue it; False where it cannot (the caller then launches through Triton)."""
    if compiled is None or hasattr(compiled, "result") or _launch_hooks():
        return False  # compiling elsewhere (Triton's async mode), or a profiler's launches
    if not isinstance(grid, tuple) or not all(type(g) is int for g in grid):
        return False
    names = tuple(kernel.arg_names)
    if len(args) > len(names) or any(n not in kwargs for n in names[len(args) :]):
        return False
    full_grid = (*grid, 1, 1)[:3]
    if 0 in full_grid:
        return True  # Triton's launcher launches nothing either
    values = [*args, *(kwargs[n] for n in names[len(args) :])]
    stream = torch._C._cuda_getCurrentRawStream(device)
    fast = triton_launch.direct_launch(compiled, device)
    if not isinstance(fast, str) and fast.issue(full_grid, values, stream):
        return True
    types = triton_launch.signature_types(compiled)
    metas = tensor_descriptors.metas(compiled)
    expanded = tensor_descriptors.expand(metas, values, {}, lambda source: 0, types)
    if metas and expanded is None:
        return False
    launch = _direct(compiled, device, full_grid, values, types, [], expanded)
    if isinstance(launch, str):
        return False
    launch.run(stream, {}, (), 0)
    return True


@contextmanager
def launching_directly(module: Any, device: int) -> Iterator[None]:
    """The block's launches of ``module``'s kernels (compiled, on ``device``) issued
    through attncc's launcher where ``_launched_directly`` can, unrecorded: a call whose
    geometry is not recorded (Kernel._records) pays neither a recording nor the C build of
    Triton's own launcher."""

    def direct(kernel: Any) -> Callable[..., Any]:
        original = kernel.run

        def run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            if getattr(_RECORDING, "direct", None) is not module or warmup:
                return original(*args, grid=grid, warmup=warmup, **kwargs)
            with torch._C.DisableTorchFunction():
                return _compiled_and_launched(kernel, original, device, grid, args, kwargs)

        return run

    with routed_runs(module_kernels(module), direct):
        _RECORDING.direct = module
        try:
            yield
        finally:
            _RECORDING.direct = None


def module_kernels(module: Any) -> list[Any]:
    """A generated module's Triton kernels, each once (found once a module: a generated
    module's kernels are its own from its import on)."""
    found = _MODULE_KERNELS.get(id(module))
    if found is None or found[0] is not module:
        from triton.runtime.jit import KernelInterface

        kernels = [v for v in vars(module).values() if isinstance(v, KernelInterface)]
        found = _MODULE_KERNELS[id(module)] = (module, list({id(k): k for k in kernels}.values()))
    return list(found[1])


# id of a generated module -> the module (keeping the id taken) and its kernels
_MODULE_KERNELS: dict[int, tuple[Any, list[Any]]] = {}


def record(
    module: Any, launch: Callable[[], Result], tensors: dict[str, Any], compiled: bool
) -> tuple[Result, TritonPlan | None, str | None]:
    """Run ``launch`` (the module's ``_launch`` for this call, or a backward's launches)
    once, watching it: its result (a tuple of tensors), the plan that replays it (None
    where it cannot), and why not."""
    result, recorder, outputs, refusal = _recorded(module, launch, tensors, compiled)
    if outputs is None:
        return result, None, refusal
    return result, TritonPlan(recorder, outputs, _device(compiled)), None


@dataclass
class FamilyRecording:
    """A call recorded for its length family (attncc.runtime.length_family): the plan
    replaying it at another length (its length arguments as slots) and its ``signature``;
    both None where it has none (``refusal``)."""

    plan: TritonPlan | None
    signature: tuple[Any, ...] | None
    refusal: str | None


def record_family(
    module: Any,
    launch: Callable[[], Result],
    tensors: dict[str, Any],
    compiled: bool,
    lengths: dict[str, str],
    values: dict[str, int],
) -> tuple[Result, TritonPlan | None, str | None, FamilyRecording]:
    """``record``, and the call's plan for its length family: ``lengths`` names the kernel
    arguments that follow the key length (each with the name its value takes beside the
    tensors), ``values`` this call's values of them."""
    result, recorder, outputs, refusal = _recorded(module, launch, tensors, compiled)
    if outputs is None:
        return result, None, refusal, FamilyRecording(None, None, refusal)
    device = _device(compiled)
    plan = TritonPlan(recorder, outputs, device)
    why = length_mismatch(recorder, lengths, values)
    if why is not None:
        return result, plan, None, FamilyRecording(None, None, why)
    family = TritonPlan(recorder, outputs, device, lengths)
    if compiled and family.issues is None:
        why = f"a launch on Triton's launcher ({family.launcher_refusal})"
        return result, plan, None, FamilyRecording(None, None, why)
    return result, plan, None, FamilyRecording(family, signature(recorder, outputs, lengths), None)


def _device(compiled: bool) -> int | None:
    return torch.cuda.current_device() if compiled else None


def _recorded(
    module: Any, launch: Callable[[], Result], tensors: dict[str, Any], compiled: bool
) -> tuple[Result, _Recorder, tuple[int, ...] | None, str | None]:
    """``launch`` run once under a recorder: its result, the recorder, the outputs'
    allocation indexes (None where no plan may replay it) and why not."""
    from attncc.runtime import compile_ahead

    kernels = module_kernels(module)
    if compiled:
        # the kernels it launches compiled side by side first, not one after the other
        compile_ahead.FIRST_CALLS.ahead(module, kernels, launch)
    recorder = _Recorder(tensors)
    with _watching(kernels, recorder, _device(compiled)), recorder:
        result = launch()
    outputs = tuple(recorder.source(t) for t in result)
    refusal = recorder.refusal
    if refusal is None and not recorder.steps:
        refusal = "no kernel launched"
    if refusal is None and any(s is None or s[0] != "alloc" for s in outputs):
        refusal = "an output that is not an allocation of the call"
    if refusal is None and compiled and any(s.compiled is None for s in recorder.steps):
        refusal = "a launch without a compiled kernel"
    if refusal is not None:
        return result, recorder, None, refusal
    return result, recorder, tuple(source[1] for source in outputs), None  # type: ignore[index]
