"""Calls of a new key length launched as a recorded call of the same length bucket.

A cache that grows by a token a call (a transformers DynamicCache, most decode loops) makes
every decoding step a call geometry attncc has not seen: no exact launch plan
(attncc.runtime.triton_plan) serves it, and each step paid the module's checks, its
configuration choice and Triton's argument binding: 3.7-4.6x FA2's CPU a call (H200,
benchmarks/growing_cache.py), against 0.54-0.88x replayed through a family.

A generated module whose split-KV launches follow the key length only through its
power-of-two bucket (templates/triton/split_kernels.py.jinja: the split count from the
bucket, each program's chunk cut in the kernel) names the kernel arguments a call may
differ in (``_KEY_LENGTH_ARGS``: the length, the strides of the inputs holding it, and int
params the host reads nowhere else). A *family* is the calls alike but for those: the same
inputs, dtypes, devices, alignment, other params and sizes, the length in the same bucket,
and each of those arguments in the same class (32 bits, and 1 or a multiple of 16 where
Triton specializes on it: each class compiles a kernel of its own). The family's first two
calls of different lengths are recorded and compared: every launch's grid, compiled
kernel, allocations and other arguments must agree, and the recorded arguments must be the
calls' values. A family that agrees replays its first recording at every later length with
those arguments rewritten from the call; one that does not is never replayed (its calls
take the full path).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

# a kernel argument's reading at a call: ("size", "stride" or "param", input or param name,
# axis), and whether Triton specializes on the argument (a 1, a multiple of 16)
Reading = tuple[str, str, int, bool]
# the name a length value goes by among a replay's inputs (no spec input is named so)
VALUE_NAME = "#{}"


def bucket(n: int) -> int:
    """The power-of-two bucket of a length: the least power of two at or above it (as the
    split kernels' triton.next_power_of_2; the tuner keys its entries by it too, so a
    family's configuration holds for each of its lengths)."""
    return 1 << max(0, (max(n, 1) - 1).bit_length())


@dataclass(frozen=True)
class Found:
    """A call's family: its key, and the values of the kernel arguments its plan takes
    from the call, by the names they go by beside the tensors (``KeyLength.names``)."""

    key: tuple[Any, ...]
    values: dict[str, int]


@dataclass(frozen=True)
class KeyLength:
    """A module's ``_KEY_LENGTH_ARGS``: the name each kernel argument's value goes by beside
    the tensors (``names``), the length's ``dim``, each input holding it with its axis
    (``carriers``), and the readings grouped for ``find``: by input, each input's axis of
    the length, its rank and its (name, whether a size, axis) reads; the params', (param,
    name)."""

    names: dict[str, str]  # kernel argument -> the name its value goes by
    dim: str
    carriers: dict[str, int]
    params: dict[str, str]  # a param read -> its kernel argument
    tensor_reads: tuple[tuple[str, int, int, tuple[tuple[str, bool, int], ...]], ...]
    param_reads: tuple[tuple[str, str], ...]
    specialized: frozenset[str]  # the names of the values Triton specializes on
    # (the calls' input order, their params) -> where their keys hold the carriers' shapes
    # and the params' values read (found once an order: key positions depend on it)
    _positions: dict[tuple[Any, ...], tuple[tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=dict, compare=False
    )

    @staticmethod
    def of(module: ModuleType) -> KeyLength | None:
        args: dict[str, Reading] | None = getattr(module, "_KEY_LENGTH_ARGS", None)
        if not args:
            return None
        names = {name: VALUE_NAME.format(j) for j, name in enumerate(args)}
        dims = {entry[0]: entry[1] for entry in module._INPUTS}
        ((holder, axis),) = [(t, axis) for what, t, axis, _ in args.values() if what == "size"]
        dim = dims[holder][axis]
        carriers = {t: list(d).index(dim) for t, d in dims.items() if dim in d}
        params = {where: arg for arg, (what, where, _, _) in args.items() if what == "param"}
        reads = tuple(
            (t, held, len(dims[t]), tuple(
                (names[arg], what == "size", axis)
                for arg, (what, where, axis, _) in args.items()
                if where == t and what != "param"
            ))
            for t, held in carriers.items()
        )  # fmt: skip
        param_reads = tuple((where, names[arg]) for where, arg in params.items())
        specialized = frozenset(names[arg] for arg, reading in args.items() if reading[3])
        return KeyLength(names, dim, carriers, params, reads, param_reads, specialized)

    def find(
        self, key: tuple[Any, ...], tensors: dict[str, Any], params: dict[str, Any]
    ) -> Found | None:
        """The family of a call with stream-free plan key ``key`` (launch_plan.Plans.key),
        or None where the full path's checks refuse it: a carrier of another rank or of
        2**31 elements or more (the kernels' offsets are 32-bit), carriers that disagree on
        the length.
        The key: ``key`` with each carrier's length by its bucket and its strides left out,
        the read params' values left out, and each value's class (32 bits, and for those
        Triton specializes on 1 or a multiple of 16: each class compiles a kernel of its
        own)."""
        values: dict[str, int] = {}
        length = -1
        for t, held, rank, reads in self.tensor_reads:
            tensor = tensors[t]
            shape, strides = tensor.shape, tensor.stride()
            if len(shape) != rank or tensor.numel() >= 2**31:
                return None  # (the full path's checks say what is wrong)
            if length != shape[held]:
                if length != -1:
                    return None
                length = shape[held]
            for name, size, axis in reads:
                values[name] = shape[axis] if size else strides[axis]
        given = []
        for param, name in self.param_reads:
            value = params.get(param)
            if value is not None:  # (absent: its default, the host's, as recorded)
                values[name] = value
                given.append(name)
        order = (tuple(tensors), tuple(params))
        positions = self._positions.get(order)
        if positions is None:
            positions = self._positions[order] = self._where(key, len(tensors))
        family = list(key)
        for at in positions[0]:
            shape = family[at]
            held = self.carriers[family[at - 1]]
            family[at] = (*shape[:held], bucket(length), *shape[held + 1 :])
            family[at + 1] = None
        for at in positions[1]:
            family[at] = None
        specialized = self.specialized
        classes = tuple(
            4 * (-(2**31) <= v < 2**31) + ((v == 1) + 2 * (v % 16 == 0) if n in specialized else 0)
            for n, v in values.items()
        )
        return Found((*family, tuple(given), classes), values)

    def lengths(self, found: Found) -> dict[str, str]:
        """The kernel arguments a plan of ``found``'s family takes from each call, each with
        the name its value goes by beside the tensors (a param left to its default: none)."""
        return {arg: name for arg, name in self.names.items() if name in found.values}

    def _where(self, key: tuple[Any, ...], inputs: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Where ``key`` (of ``inputs`` tensors) holds each carrier's shape, and each read
        param's value: after (return_lse, falls_back), six items an input, its name first,
        then three a param (name, type, value)."""
        starts = range(2, 2 + 6 * inputs, 6)
        shapes = tuple(at + 1 for at in starts if key[at] in self.carriers)
        params = range(2 + 6 * inputs, len(key), 3)
        return shapes, tuple(at + 2 for at in params if key[at] in self.params)


@dataclass
class Family:
    """A family's recorded call (``plan``, its length arguments as slots), what the
    comparison reads of it (``signature``), and its state: "candidate" (recorded once),
    "agreed" (a second recording agreed: ``plan`` replays) or "refused" (``refusal``)."""

    plan: Any  # attncc.runtime.triton_plan.TritonPlan
    geometry: Any  # what the recorded call's checks and configuration decided (kernel.py)
    signature: tuple[Any, ...]
    values: dict[str, int]
    dtype: Any  # the call's torch dtype
    precision: str | None  # how fp32 calls multiplied when recorded (Kernel._fp32_precision)
    state: str = "candidate"
    refusal: str | None = None


@dataclass
class Families:
    """A kernel's families by key, at most ``limit`` (the oldest dropped first)."""

    length: KeyLength | None
    limit: int = 64
    _families: dict[tuple[Any, ...], Family] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def find(
        self, key: tuple[Any, ...] | None, tensors: dict[str, Any], params: dict[str, Any]
    ) -> Found | None:
        if self.length is None or key is None:
            return None
        return self.length.find(key, tensors, params)

    def agreed(self, found: Found) -> Family | None:
        """The family that replays ``found``'s calls, if any."""
        family = self._families.get(found.key)
        return family if family is not None and family.state == "agreed" else None

    def wants(self, found: Found | None) -> bool:
        """Whether a call of ``found``'s family is to be recorded for it: its first two."""
        if found is None:
            return False
        family = self._families.get(found.key)
        return family is None or family.state == "candidate"

    def recorded(
        self,
        found: Found,
        plan: Any,
        geometry: Any,
        signature: tuple[Any, ...] | None,
        refusal: str | None,
        dtype: Any,
        precision: str | None,
    ) -> None:
        """A call of ``found``'s family (of ``dtype``, fp32 multiplying as ``precision``
        says) recorded with its length slots: ``plan``, the call's ``geometry`` and the
        plan's ``signature`` (None, and why not: ``refusal``)."""
        with self._lock:
            family = self._families.get(found.key)
            if plan is None or signature is None:
                why = refusal or "not recorded"
                refused = Family(None, None, (), found.values, dtype, precision, "refused", why)
                self._remember(found.key, refused)
            elif family is None:
                first = Family(plan, geometry, signature, found.values, dtype, precision)
                self._remember(found.key, first)
            elif family.state == "candidate" and family.values != found.values:
                if family.precision != precision:
                    family.state, family.refusal = "refused", "recorded under two precisions"
                elif family.signature != signature:
                    family.state = "refused"
                    family.refusal = "two lengths of the bucket launched differently"
                else:
                    family.state = "agreed"

    def _remember(self, key: tuple[Any, ...], family: Family) -> None:
        while len(self._families) >= self.limit:
            del self._families[next(iter(self._families))]
        self._families[key] = family

    def clear(self) -> None:
        with self._lock:
            self._families.clear()


def replay_inputs(tensors: dict[str, Any], found: Found) -> dict[str, Any]:
    """A call's tensors with its length values beside them, as a family's plan reads them."""
    return {**tensors, **found.values}
