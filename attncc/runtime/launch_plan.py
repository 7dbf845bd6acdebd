"""Launch plans: a CUDA host module's work for one call geometry, done once.

Everything a fused call decides on the host (checks, tiles, copies, grid, shared memory,
compiled kernels, packed parameters) follows from what ``Plans.key`` reads: each input's
shape, strides, dtype, device and 16-byte alignment, the params, ``return_lse``, whether an
auto kernel may fall back to Triton, and PyTorch's current stream. A later call with the same
key only allocates its outputs, writes its data pointers (and tensor maps) into the
prepared launches and issues them: tens of microseconds of host time instead of 150-250,
which a short kernel (a 2k document mask: 150 us of GPU time) otherwise waits for.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attncc.runtime import driver, native, tensor_map
from attncc.runtime.nvrtc import current_stream

Result = tuple[torch.Tensor, torch.Tensor]
# an input's encoded maps: (input name, tensor_map.encode's arguments after the pointer)
MapSpec = tuple[str, tensor_map.MapLayout]

# params that may enter a key: their value and type say all (a tensor's value could change)
_PLAIN_PARAMS = (int, float, bool)


def convert(
    tensors: dict[str, Any], conversions: Sequence[tuple[str, torch.dtype]]
) -> dict[str, Any]:
    """``tensors`` with each (input, dtype) of ``conversions`` converted (integer inputs to
    their declared width)."""
    if not conversions:
        return tensors
    return {**tensors, **{name: tensors[name].to(dtype) for name, dtype in conversions}}


def allocator(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device | str | int,
    zeros: bool = False,
) -> Callable[[], torch.Tensor]:
    """A new contiguous tensor of this shape, dtype and device on each call (zero-filled
    where ``zeros``), for a plan's repeated allocations: ``torch.empty_like`` of a
    one-element template expanded to the shape, whose call parses no shape, dtype or device
    (1.33 against 2.44 us of CPU for ``torch.empty(shape, dtype=, device=)``, this
    repository's CPU machine)."""
    shape = tuple(shape)
    if not shape:
        factory = torch.zeros if zeros else torch.empty
        return functools.partial(factory, (), dtype=dtype, device=device)
    template = torch.empty(1, dtype=dtype, device=device).expand(shape)
    like = torch.zeros_like if zeros else torch.empty_like
    return functools.partial(like, template, memory_format=torch.contiguous_format)


# an output of a plan's call: a prepared allocator (``allocator``), or a tensor every call
# shares (the data-free log-sum-exp of calls that do not ask for it)
Output = Callable[[], torch.Tensor] | torch.Tensor


class Outputs:
    """A fused plan's outputs, (out, lse), made on each call from ``parts`` (each an
    ``Output``), filled with NaN while ``poisoned()`` (checks: a kernel that leaves an
    element unwritten shows it)."""

    def __init__(self, out: Output, lse: Output, poisoned: Callable[[], bool]) -> None:
        self.parts = (out, lse)
        self.poisoned = poisoned

    def __call__(self) -> Result:
        out, lse = (p if isinstance(p, torch.Tensor) else p() for p in self.parts)
        if self.poisoned():
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
        return out, lse


class Plans:
    """A host module's plans by key, at most ``limit`` (the oldest dropped first: a model
    with a new sequence length every call must not grow it without bound)."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._plans: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(
        tensors: dict[str, Any],
        params: dict[str, Any],
        return_lse: bool,
        falls_back: bool,
        stream: bool = True,
    ) -> tuple[Any, ...] | None:
        """What a plan depends on besides the data pointers (the module's docstring); None
        for a call no plan may take: an input that is not a plain tensor (a subclass, a
        fake tensor while tracing), or a param that is not a plain number. ``stream``: the
        current stream is part of it (CUDA plans hold launches bound to one; the Triton
        target's cached geometry is stream-free). Built by the C launcher's plan_key where
        it is built: the same tuple, in 1.67 against 2.43 us for five tensors (this
        repository's CPU machine; most of the rest is torch's own shape, stride, dtype,
        device and data_ptr getters, about 55 ns each)."""
        launcher = native.built()
        if launcher is not None:
            head = (return_lse, falls_back)
            built = launcher.plan_key(head, tensors, params, torch.Tensor)
            if built is None or not stream or not tensors:
                return built  # type: ignore[no-any-return]
            last = built[len(head) + 6 * len(tensors) - 2]  # the last tensor's device
            return (*built, current_stream(last.index)) if last.type == "cuda" else built
        key: list[Any] = [return_lse, falls_back]
        device = None
        for name, t in tensors.items():
            if type(t) is not torch.Tensor:
                return None
            device = t.device
            key += (name, t.shape, t.stride(), t.dtype, device, t.data_ptr() % 16)
        for name, value in params.items():
            if type(value) not in _PLAIN_PARAMS:
                return None
            key += (name, type(value), value)
        if stream and device is not None and device.type == "cuda":
            key.append(current_stream(device.index))
        return tuple(key)

    @property
    def table(self) -> dict[tuple[Any, ...], Any]:
        """The plans by key, as a dict (the C launcher's replay looks keys up in it)."""
        return self._plans

    def get(self, key: tuple[Any, ...] | None) -> Any:
        return self._plans.get(key) if key is not None else None

    def remember(self, key: tuple[Any, ...] | None, plan: Any) -> None:
        if key is None:
            return
        with self._lock:
            while len(self._plans) >= self.limit:
                del self._plans[next(iter(self._plans))]
            self._plans[key] = plan

    def clear(self) -> None:
        """Forget every plan (after changing a module table the plans were made from)."""
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


class FusedPlan:
    """A call's launches for one key: the attention kernel's and, where there is one, a
    launch before it (a tile index's builder; split-KV's chunks before their combination),
    prepared (attncc.runtime.driver.Launch) with their pointer parameters (and K's and V's
    tensor maps) left as slots. Calling it with a call's inputs allocates the outputs
    (``allocate``; its first call also the ``buffers``, shape and dtype each: a tile index,
    partial results, kept for later calls), converts integer inputs to their declared width
    (``conversions``), fills the slots and issues the launches: each takes the call's
    ``pointers`` then the buffers' (the attention kernel then its maps); it returns None,
    having launched nothing, where the calling thread's CUDA context is not the plan's or a
    map cannot be encoded: the caller then takes the full path."""

    def __init__(
        self,
        allocate: Callable[[], Result],
        pointers: Callable[[dict[str, Any], torch.Tensor, torch.Tensor], tuple[int, ...]],
        attend: driver.Launch,
        *,
        first: driver.Launch | None = None,
        buffers: Sequence[tuple[Sequence[int], torch.dtype]] = (),
        maps: Sequence[MapSpec] = (),
        conversions: Sequence[tuple[str, torch.dtype]] = (),
        keep: Sequence[Any] = (),
        sources: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.context = driver.current_context()
        self.allocate = allocate
        self.pointers = pointers
        self.sources = tuple(sources)  # each pointer's ("input", name) or ("output", index)
        self.attend = attend
        self.first = first
        self.buffers = tuple((tuple(shape), dtype) for shape, dtype in buffers)
        self.maps = tuple(maps)
        self.conversions = tuple(conversions)
        self.keep = tuple(keep)  # the kernels (their loaded cubin) and buffers launches point at
        # where each map holds its address (tensor_map.AddressField), found on the first
        # call: None until then, () where a map has none (each call encodes its maps)
        self.fields: tuple[tensor_map.AddressField, ...] | None = None if maps else ()
        # the buffers, made by the first call on its device (None until then) and kept: the
        # launches are bound to one stream, on which calls run one after the other (an
        # allocation a buffer cost 1.3-2 us of CPU a call, H200: benchmarks/call_parts.py)
        self._buffers: tuple[torch.Tensor, ...] | None = None
        self._replay: Any = None  # native_replay's, once made (False: none)
        self._lock = threading.Lock()

    def __call__(self, tensors: dict[str, Any]) -> Result | None:
        if driver.current_context() != self.context:
            return None
        tensors = convert(tensors, self.conversions)
        if self.fields is None:
            self._find_fields(tensors)
        maps: list[Any]
        if self.fields:
            # the maps packed in the launch move to this call's tensors (one word each)
            maps = [tensors[n].data_ptr() for n, _ in self.maps]
        else:
            try:
                maps = [tensor_map.encode(tensors[n].data_ptr(), *lay) for n, lay in self.maps]
            except tensor_map.TensorMapRefused:
                return None
        out, lse = self.allocate()
        pointers = self.pointers(tensors, out, lse)
        if self._buffers is None:
            self._buffers = tuple(
                torch.empty(shape, dtype=dtype, device=out.device) for shape, dtype in self.buffers
            )
        own = [b.data_ptr() for b in self._buffers]
        if self.first is not None:
            self.first(*pointers, *own)
        self.attend(*pointers, *own, *maps)
        return out, lse

    def native_replay(self) -> Any:
        """This plan as the C launcher's Replay (launcher.c: the same allocations and
        launches without a Python frame), or None where it has none: no C launcher, no
        pointer ``sources``, integer inputs to convert, outputs not made by ``Outputs``,
        maps encoded on each call, or no call yet. Made once."""
        if self._replay is None:
            self._replay = self._native_replay()
        return self._replay or None

    def _native_replay(self) -> Any:
        """The Replay; False where this plan never has one, None where it may after a call
        (the C launcher still building, or no call yet: where K's maps move, the buffers'
        device)."""
        launcher = native.built()
        if launcher is None:
            return None
        if not self.sources or self.conversions or not isinstance(self.allocate, Outputs):
            return False
        buffers = self._buffers
        if self.fields is None or buffers is None:  # no call yet
            return None
        if self.maps and not self.fields:
            return False
        n_pointers = len(self.sources)
        after = n_pointers + len(buffers)  # the first map's value

        def source(n: int) -> tuple[int, Any]:
            if n < n_pointers:
                kind, key = self.sources[n]
                return (driver.FROM_INPUT, key) if kind == "input" else (driver.FROM_ITEM, key)
            if n < after:  # the allocations: out, lse, then the buffers
                return driver.FROM_ITEM, 2 + n - n_pointers
            return driver.FROM_INPUT, self.maps[n - after][0]

        launches = [self.attend.native_rebound(source)]
        if self.first is not None:
            launches.insert(0, self.first.native_rebound(source))
        if any(launch is None for launch in launches):
            return False
        return launcher.Replay(
            driver.context_entry(),
            self.context,
            self.attend.stream,
            (*self.allocate.parts, *buffers),
            None,
            tuple(launches),
            (0, 1),
            (),
            None,
            driver.check,
        )

    def _find_fields(self, tensors: dict[str, Any]) -> None:
        with self._lock:
            if self.fields is not None:
                return
            found = [
                tensor_map.layout_address_field(layout, tensors[name].data_ptr())
                for name, layout in self.maps
            ]
            if any(f is None for f in found):
                self.fields = ()
                return
            fields = tuple(f for f in found if f is not None)
            self.attend.address_slots(fields)  # the maps are the launch's last slots
            self.fields = fields


def empty(out: torch.Tensor, lse: torch.Tensor) -> Result:
    """The result of a call with no rows or no keys: a zero output and a -inf log-sum-exp."""
    out.zero_()
    lse.fill_(float("-inf"))
    return out, lse


class EmptyPlan:
    """A call with no rows or no keys (``empty``)."""

    def __init__(self, allocate: Callable[[], Result]) -> None:
        self.allocate = allocate

    def __call__(self, tensors: dict[str, Any]) -> Result:
        return empty(*self.allocate())


# one launch of a BackwardPlan: the prepared launch, whether the call's input pointers fill
# its first slots, and the buffers whose pointers fill the rest, by name
BackwardLaunch = tuple[driver.Launch, bool, tuple[str, ...]]


class BackwardPlan:
    """The sm_90a backward's launches for one call geometry (the CUDA host module's
    _backward_hopper), prepared with their pointer parameters as slots: each a kernel's 40
    or so parameters packed once, not on every backward (the packing took a quarter of the
    backward's host time). Calling it with a call's inputs, output, log-sum-exp and the
    gradients of both (``dout``, ``dlse``) allocates the buffers (``allocate``: by name),
    fills the slots and issues the launches in order; it returns the buffers named by
    ``result``, or None, having launched nothing, where the calling thread's CUDA context is
    not the plan's."""

    def __init__(
        self,
        allocate: Callable[[], dict[str, torch.Tensor]],
        pointers: Callable[[dict[str, Any], torch.Tensor, torch.Tensor], tuple[int, ...]],
        launches: Sequence[BackwardLaunch],
        result: Sequence[str],
        conversions: Sequence[tuple[str, torch.dtype]] = (),
        keep: Sequence[Any] = (),
    ) -> None:
        self.context = driver.current_context()
        self.allocate = allocate
        self.pointers = pointers
        self.launches = tuple(launches)
        self.result = tuple(result)
        self.conversions = tuple(conversions)
        self.keep = tuple(keep)  # the kernels whose loaded cubin the launches point at

    def __call__(
        self,
        tensors: dict[str, Any],
        out: torch.Tensor,
        lse: torch.Tensor,
        dout: torch.Tensor,
        dlse: torch.Tensor,
    ) -> tuple[torch.Tensor, ...] | None:
        if driver.current_context() != self.context:
            return None
        tensors = convert(tensors, self.conversions)
        inputs = self.pointers(tensors, out, lse)
        buffers = {"dout": dout, "dlse": dlse, **self.allocate()}
        for launch, with_inputs, names in self.launches:
            own = [buffers[name].data_ptr() for name in names]
            if with_inputs:
                launch(*inputs, *own)
            else:
                launch(*own)
        return tuple(buffers[name] for name in self.result)
