"""``Kernel``: a compiled spec, callable on torch tensors (CPU through the Triton interpreter).

Both targets generate a Python host module with the same entry points (``_bind``, ``_check``,
``_param_defaults``, ``_forward``); for Triton it also holds the kernels, for CUDA it holds
the CUDA source and compiles it with NVRTC (``attncc.runtime.nvrtc``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from attncc.ir.nodes import AttentionKernel
from attncc.passes.tiling import Tile
from attncc.runtime import autograd, length_family, native, triton_plan, triton_warm
from attncc.runtime import op as op_registry
from attncc.runtime.autotune import Tuner
from attncc.runtime.eager import EagerAttention
from attncc.runtime.jit import interpreter, load_module, module_path, require_interpreter
from attncc.runtime.launch_plan import Plans
from attncc.runtime.nvrtc import current_stream
from attncc.spec import CheckedSpec, ast


@dataclass
class Kernel:
    """Call as ``kernel(q, k, v, ..., scale=..., return_lse=False)``.

    Inputs go by position (declaration order) or by name, params by name. CUDA tensors run
    the compiled kernel, CPU tensors the same kernel in the Triton interpreter (target
    "triton"; target "cuda" needs CUDA tensors). ``source`` is the target's kernel source,
    ``host_source`` the Python module loaded (empty: ``source`` itself, as for Triton).
    ``fallback`` (target "auto" resolved to "cuda") builds the spec's Triton kernel, which
    runs the calls the CUDA target has no sm_90a kernel for (CPU tensors, fp32, head dims
    past 128, unaligned layouts, few queries or fewer query tiles than multiprocessors),
    compiled on the first such call.
    """

    name: str
    spec: CheckedSpec
    ir: AttentionKernel
    source: str
    entry: str
    target: str = "triton"
    host_source: str = ""
    fallback: Callable[[], Kernel] | None = field(default=None, repr=False)
    path: Path = field(init=False)
    tuner: Tuner = field(init=False, repr=False)
    _host: ModuleType = field(init=False, repr=False)
    _op: Any = field(init=False, repr=False)
    _fallback_kernel: Kernel | None = field(init=False, default=None, repr=False)
    _param_sites: dict[str, str] = field(init=False, repr=False)
    _backward: autograd.Backward | str = field(init=False, repr=False)
    # Triton target: per call geometry (Plans.key), what the checks and the configuration
    # choice decided (sizes, dtype, device, params with defaults, config), so a repeated
    # call skips both and goes straight to the module's _launch
    _geometries: Plans = field(init=False, repr=False)
    # target "auto": the call geometries (stream-free Plans.key) its host module handed to the
    # Triton fallback, which later calls of them go to directly (the host's own plan lookup
    # cost 4-5 us of CPU a call more, H200: benchmarks/calls.py auto against triton rows);
    # once there is one, calls that stay on the CUDA kernels compute that key too (~2 us),
    # which their GPU time (a query tile on every multiprocessor) covers
    _falls_back: Plans = field(init=False, repr=False)
    # plain eager calls on CUDA tensors: the C launcher's replays of the plans that served
    # earlier calls, by Plans.key with the stream (head: return_lse, False), so a repeated
    # call goes from its bound inputs to its launches in one C call (launcher.c's replay):
    # 1-9 us of CPU less a repeated prefill call than through the plans' Python, 11.9-13.9
    # us a call (H200, pinned alternating processes: benchmarks/results/host_replay_ab_h200.txt)
    _replays: Plans = field(init=False, repr=False)
    # Triton target: calls over a key length not seen before, launched as a recorded call of
    # the same length bucket (attncc.runtime.length_family): a cache growing a token a call
    _families: length_family.Families = field(init=False, repr=False)
    # target "auto": the length families (their keys) the host module hands to the Triton
    # fallback at every length (its split-KV calls), which later calls go to directly
    _families_falling_back: dict[tuple[Any, ...], None] = field(init=False, repr=False)
    _poisoned: bool = field(init=False, default=False, repr=False)
    # the inputs' and the params' names (the op's argument order)
    _names: tuple[tuple[str, ...], tuple[str, ...]] = field(init=False, repr=False)
    _pinned: bool = field(init=False, repr=False)
    # how a returned log-sum-exp is permuted into the scores' order (None: as written)
    _lse_permutation: tuple[int, ...] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.path = module_path(self.name, self.host_source or self.source)
        self.tuner = Tuner(self.ir, self.path.stem)
        self._geometries = Plans()
        self._falls_back = Plans()
        self._replays = Plans()
        # geometries recorded so far, and (past _FIRST_SIGHT_RECORDS) the keys of those seen
        # once and launched unrecorded (_records)
        self._recorded = 0
        self._seen_once: dict[tuple[Any, ...], None] = {}
        self._names = (self.input_names, self.param_names)
        # tiling options given to attncc.compile (block_n=32, ...) pin the IR's default
        # tiles: those calls keep the module's defaults, never the table or a tuned entry
        self._pinned = self.ir.tiling is not None and self.ir.tiling != Tile().run(self.ir).tiling
        self._param_sites = _param_sites(self.spec)
        # loaded now, not on first call: torch.compile cannot trace a module import
        self._host = self.module(interpreted=False)
        length = length_family.KeyLength.of(self._host) if self.target == "triton" else None
        self._families = length_family.Families(length)
        self._families_falling_back = {}
        if torch.cuda.is_available():  # GPU launches go through attncc's C launcher
            native.build_in_background()
        permutation = tuple(self._host._LSE_PERMUTATION)
        identity = permutation == tuple(range(len(permutation)))
        self._lse_permutation = None if identity else permutation
        key = self.path.stem.rsplit("_", 1)[-1][:12]
        self._backward = autograd.prepare(self.ir, self.spec.spec)
        backward: op_registry.BackwardOps | str = self._backward  # type: ignore[assignment]
        if isinstance(self._backward, autograd.Backward):
            floats = self._backward.floats
            backward = op_registry.BackwardOps(self._backward_run, self._backward_fake, floats)
        self._op = op_registry.register(self.ir, key, self._run, self._fake, backward)

    def module(self, interpreted: bool) -> ModuleType:
        # a CUDA host module has no interpreted variant: it refuses CPU tensors itself
        module = load_module(self.path, interpreted and self.target == "triton")
        # the module's errors name a param's declaration (file:line), which its source,
        # shared by every file with the same spec text, does not hold
        if getattr(module, "_PARAM_SITES", None) is not self._param_sites:
            setattr(module, "_PARAM_SITES", self._param_sites)  # noqa: B010 - generated module
        return module

    def param_defaults(self, sizes: dict[str, int]) -> dict[str, Any]:
        """The value of every param with a default, for these dim sizes."""
        return dict(self.module(False)._param_defaults(sizes, {}))

    def poison_outputs(self, enabled: bool) -> None:
        """Fill outputs with NaN before each launch (checks), in every loaded variant."""
        self._geometries.clear()  # recorded plans fill (or not) as the module did then
        self._replays.clear()  # nor do replays
        self._families.clear()
        self._poisoned = enabled
        for interpreted in (False, True) if self.target == "triton" else (False,):
            setattr(self.module(interpreted), "_POISON", enabled)  # noqa: B010 - generated module

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.ir.tensors)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.ir.params)

    def __call__(self, *args: Any, return_lse: bool = False, **kwargs: Any) -> Any:
        if type(return_lse) is not bool:  # "no" would be truthy
            raise TypeError(
                f"attncc {self.name}: return_lse must be True or False, got {return_lse!r}"
            )
        tensors, params = self._host._bind(args, kwargs)
        eager = _eager(tensors.values())
        if eager == "plain":
            # the torch op's dispatch costs ~50 us a call (measured on an H200,
            # benchmarks/host_overhead.py), more than a decode kernel's GPU time; in plain
            # eager mode nothing needs it, and _forward checks the inputs itself
            out, lse = self._replayed(tensors, params, return_lse)
            return (out, self._returned_lse(lse)) if return_lse else out
        if eager == "grad" and isinstance(self._backward, autograd.Backward):
            # inputs requiring grad, eagerly: the op's autograd without the op (eager.py)
            inputs = [tensors[name] for name in self.input_names]
            out, lse = EagerAttention.apply(self, params, *inputs)  # type: ignore[no-untyped-call]
            return (out, self._returned_lse(lse)) if return_lse else out
        # the generated checks name the spec input; the op's schema would only say "Tensor".
        # Under torch.compile the op's fake kernel runs them on the traced sizes instead
        if not _is_compiling():
            self._host._check(tensors, params)
        inputs = [tensors[name] for name in self.input_names]
        values = [params.get(name) for name in self.param_names]
        # the backward recomputes probabilities from the forward's log-sum-exp
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
        out, lse = self._op(*inputs, *values, return_lse=return_lse or grad)
        return (out, self._returned_lse(lse)) if return_lse else out

    def _returned_lse(self, lse: torch.Tensor) -> torch.Tensor:
        """The log-sum-exp in the scores' index order (a view of what the kernels wrote)."""
        return lse if self._lse_permutation is None else lse.permute(self._lse_permutation)

    def backend_for(self, *args: Any, **kwargs: Any) -> str:
        """The backend a call with these inputs runs: the target, or "triton" for the calls
        of an auto CUDA kernel that fall back (see ``fallback``)."""
        if self.fallback is None:
            return self.target
        tensors, params = self._host._bind(args, kwargs)
        sizes, dtype, device = self._host._check(tensors, params)
        full = self._host._param_defaults(sizes, dict(params))
        takes = self._host._auto_takes_cuda(tensors, full, sizes, dtype, device)
        return "cuda" if takes else "triton"

    def warm(self, *args: Any, **kwargs: Any) -> int:
        """Compile, without timing, every launch configuration autotuning would try for
        inputs like these (Triton target, GPU tensors), so that tuning in a later process
        only times them; returns how many compiled and ran."""
        tensors, params = self._host._bind(args, kwargs)
        self._host._check(tensors, params)
        if self.target != "triton":
            self(*args, **kwargs)
            return 1
        triton_warm.wait()
        return self.tuner.warm(self.module(False), tensors, params, False)

    def _split(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], bool]:
        """Undo the op's flat argument list: inputs, params (None: default), return_lse."""
        names, param_names = self._names
        n, p = len(names), len(param_names)
        tensors = dict(zip(names, args[:n], strict=True))
        # the dispatcher may drop trailing arguments left at their defaults (None, False)
        params = {}
        for name, value in zip(param_names, args[n : n + p], strict=False):
            if value is not None:
                params[name] = value
        return_lse = bool(kwargs.get("return_lse", args[n + p] if len(args) > n + p else False))
        return tensors, params, return_lse

    def _run(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # the op's kernel (torch.compile'd callers, autograd): real tensors, below autograd
        return self._replayed(*self._split(args, kwargs))

    def _replayed(
        self, tensors: dict[str, Any], params: dict[str, Any], return_lse: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A call's (out, lse): replayed from C where an earlier call like it left a replay
        (``_replays``), else through ``_launch``, after which its replay is kept."""
        launcher = native.built() if _RAW_STREAM is not None else None
        if launcher is not None:
            head = (return_lse, False)
            table = self._replays.table
            replayed = launcher.replay(table, head, tensors, params, torch.Tensor, _RAW_STREAM)
            if replayed is not None:
                return replayed  # type: ignore[no-any-return]
        result = self._launch(tensors, params, return_lse)
        # (a first call's launches build the launcher where it was not built yet)
        if _RAW_STREAM is not None and native.built() is not None:
            self._remember_replay(tensors, params, return_lse)
        return result

    def _launch(
        self, tensors: dict[str, Any], params: dict[str, Any], return_lse: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.target == "triton":
            key = Plans.key(tensors, params, return_lse, False, stream=False)
            return self._launch_keyed(tensors, params, return_lse, key)
        if self.fallback is None:
            return self._host._forward(tensors, params, return_lse)  # type: ignore[no-any-return]
        fallback = self._fallback_kernel
        if len(self._falls_back) and fallback is not None:
            key = Plans.key(tensors, params, return_lse, False, stream=False)
            if self._falls_back.get(key):
                return fallback._launch_keyed(tensors, params, return_lse, key)
            if self._families_falling_back:
                found = fallback._families.find(key, tensors, params)
                if found is not None and found.key in self._families_falling_back:
                    result = fallback._launch_keyed(tensors, params, return_lse, key, found)
                    if fallback._geometries.get(key) is not None:
                        # a geometry of its own by now (its second sight): replayed from C
                        self._falls_back.remember(key, True)
                    return result
        forward = self._host._forward
        return forward(tensors, params, return_lse, None, self._fallback_launch)  # type: ignore[no-any-return]

    def _launch_keyed(
        self,
        tensors: dict[str, Any],
        params: dict[str, Any],
        return_lse: bool,
        key: tuple[Any, ...] | None,
        found: length_family.Found | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A Triton target call's (out, lse); ``key``: its stream-free Plans.key;
        ``found``: its length family where the caller found it."""
        geometry = self._geometry(key)
        plan = None
        if geometry is None:
            found = found or self._families.find(key, tensors, params)
            by_family = self._family_replayed(tensors, params, key, found)
            if by_family is not None:
                return by_family
        if geometry is not None:
            plan = geometry.serving()
            if plan is not None:
                if geometry.device.type == "cpu":  # the key holds the device
                    with interpreter(True):
                        replayed = plan(tensors)
                else:
                    replayed = plan(tensors)
                if replayed is not None:
                    return replayed  # type: ignore[return-value]  # (out, lse): two outputs
        on_cpu = next(iter(tensors.values())).device.type == "cpu"
        if on_cpu:
            require_interpreter()
        else:
            triton_warm.wait()  # before anything launches a Triton kernel
        module = self.module(interpreted=on_cpu)
        if geometry is None:
            sizes, dtype, device = checked = module._check(tensors, params)
            if device.type not in ("cuda", "cpu"):  # the module's own error names the device
                return module._forward(tensors, params, return_lse)  # type: ignore[no-any-return]
            config = self._config(module, tensors, params, return_lse, checked)
            full_params = module._param_defaults(sizes, dict(params))
            geometry = _Geometry(sizes, dtype, device, full_params, config)
            geometry.precision = self._fp32_precision(dtype)
            if self._families.wants(found) and module._splits_keys(sizes):
                assert found is not None and self._families.length is not None
                lengths = self._families.length.lengths(found)
                result, geometry.plan, geometry.refusal, recording = geometry.record_family(
                    module, tensors, return_lse, on_cpu, lengths, found.values
                )
                self._families.recorded(
                    found,
                    recording.plan,
                    geometry,
                    recording.signature,
                    recording.refusal,
                    dtype,
                    geometry.precision,
                )
                self._geometries.remember(key, geometry)
                return result  # type: ignore[no-any-return]  # (out, lse)
            if key is not None and self._records(key):
                # a recorded geometry's later calls replay its plan
                result, geometry.plan, geometry.refusal = geometry.record(
                    module, tensors, return_lse, on_cpu
                )
                self._geometries.remember(key, geometry)
                return result  # type: ignore[no-any-return]  # (out, lse)
            if key is not None and not on_cpu:
                with triton_plan.launching_directly(module, device.index):
                    return geometry.launch(module, tensors, return_lse)
        other_stream = plan is None and geometry.plan is not None and not on_cpu
        if other_stream and not torch.cuda.is_current_stream_capturing():
            # the plan serves another stream: this stream's first call is recorded too
            result, stream_plan, _ = geometry.record(module, tensors, return_lse, False)
            if stream_plan is not None:
                geometry.remember_stream_plan(stream_plan)
            return result  # type: ignore[no-any-return]  # (out, lse)
        with interpreter(on_cpu):
            return geometry.launch(module, tensors, return_lse)

    def _family_replayed(
        self,
        tensors: dict[str, Any],
        params: dict[str, Any],
        key: tuple[Any, ...] | None,
        found: length_family.Found | None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A call replayed by its length family's plan, or None where it has none that
        serves it (not agreed yet, another TF32 setting, another stream or device). At a
        geometry's second sight the family's plan, its values written in, becomes that
        geometry's own (``_geometries``), which later calls replay from C: a model's layers
        call each length once a layer."""
        family = self._serving_family(found)
        if key is None or found is None or family is None:
            return None
        inputs = length_family.replay_inputs(tensors, found)
        plan = family.plan
        if plan.device is None:  # recorded in the interpreter (the key holds the device)
            with interpreter(True):
                result = plan(inputs)
        else:
            # the C launcher's replay of it where built (its launches read the length values
            # beside the tensors as they read the tensors), else the plan's Python: 0.77-0.90x
            # FA2's CPU a growing decode call against 0.80-1.16x (H200, alternating pinned
            # processes: benchmarks/results/growing_cache_family_replay_ab_h200.txt)
            replay = plan.native_replay()
            result = replay(inputs) if replay is not None else plan(inputs)
        if result is None:
            return None
        if key not in self._seen_once:
            self._seen_once[key] = None
            while len(self._seen_once) > _SEEN_ONCE_KEPT:
                del self._seen_once[next(iter(self._seen_once))]
        else:
            del self._seen_once[key]
            self._geometries.remember(key, self._family_geometry(family, tensors, params, found))
        return result  # type: ignore[no-any-return]  # (out, lse)

    def _serving_family(self, found: length_family.Found | None) -> length_family.Family | None:
        """The length family that replays ``found``'s calls: agreed, and recorded under
        PyTorch's TF32 setting as it stands."""
        family = self._families.agreed(found) if found is not None else None
        if family is None or family.precision != self._fp32_precision(family.dtype):
            return None
        return family

    def _family_geometry(
        self,
        family: length_family.Family,
        tensors: dict[str, Any],
        params: dict[str, Any],
        found: length_family.Found,
    ) -> _Geometry:
        """The geometry of a call its length family serves: the recorded call's, with the
        call's length and the params the family reads, and the family's plan fixed at the
        call's values."""
        length = self._families.length
        assert length is not None
        recorded: _Geometry = family.geometry
        holder, axis = next(iter(length.carriers.items()))
        sizes = {**recorded.sizes, length.dim: tensors[holder].shape[axis]}
        read = {name: params[name] for name in length.params if params.get(name) is not None}
        geometry = replace(recorded, sizes=sizes, params={**recorded.params, **read})
        geometry.plan, geometry.stream_plans = family.plan.fixed(found.values), {}
        return geometry

    def _records(self, key: tuple[Any, ...]) -> bool:
        """Whether a geometry's first call (``key``, Plans.key's) is recorded: the first
        _FIRST_SIGHT_RECORDS geometries' are; later ones on their second call. A cache that
        grows a token a call makes a geometry a call that never comes back, and recording
        one took 600 of such a call's 800 us of CPU (decode 1,32:8,4096,128, H200,
        benchmarks/growing_cache.py); launched unrecorded it costs its checks and launch."""
        if self._recorded < _FIRST_SIGHT_RECORDS or key in self._seen_once:
            self._recorded += 1
            self._seen_once.pop(key, None)
            return True
        self._seen_once[key] = None
        while len(self._seen_once) > _SEEN_ONCE_KEPT:
            del self._seen_once[next(iter(self._seen_once))]
        return False

    def _remember_replay(
        self, tensors: dict[str, Any], params: dict[str, Any], return_lse: bool
    ) -> None:
        """After a plain eager call took the full path: the C replay of the plan that served
        it, for later calls like it (``_replays``), where the plan has one."""
        if self._poisoned:
            return
        if not tensors:
            return
        device = next(reversed(tensors.values())).device
        if device.type != "cuda":
            return  # (the replays' key reads the last tensor's device)
        free = Plans.key(tensors, params, return_lse, False, stream=False)
        if free is None:
            return
        if self.target == "triton" and self._geometries.get(free) is None:
            return  # a geometry launched unrecorded (_records): no plan to replay
        replay = self._served_replay(tensors, params, return_lse, free)
        if replay is not None:
            self._replays.remember((*free, current_stream(device.index)), replay)

    def _served_replay(
        self,
        tensors: dict[str, Any],
        params: dict[str, Any],
        return_lse: bool,
        free: tuple[Any, ...] | None,
    ) -> Any:
        """The C replay (or None) of the plan a call like this one took: the Triton
        target's recorded plan (its TF32 setting guarded for fp32), the CUDA host module's
        launch plan, or the Triton fallback's plan for the calls an auto kernel hands it.
        ``free``: the call's stream-free Plans.key."""
        if self.target == "triton":
            geometry = self._geometry(free)
            plan = geometry.serving() if geometry is not None else None
            if geometry is None or plan is None:
                return None
            guard = None
            if geometry.precision is not None:  # fp32: the TF32 setting it was recorded under
                precision = functools.partial(self._host._dot_precision, geometry.dtype)
                guard = (precision, geometry.precision)
            return plan.native_replay(guard)
        falls_back = self.fallback is not None
        if falls_back and self._fallback_kernel is not None and self._falls_back.get(free):
            return self._fallback_kernel._served_replay(tensors, params, return_lse, free)
        plan = self._host._PLANS.get(Plans.key(tensors, params, return_lse, falls_back))
        replay = getattr(plan, "native_replay", None)
        return replay() if replay is not None else None

    def _geometry(self, key: tuple[Any, ...] | None) -> _Geometry | None:
        """What an earlier call of this geometry decided, unless PyTorch's TF32 setting
        changed since (the kernels' DOT_PRECISION with it)."""
        geometry: _Geometry | None = self._geometries.get(key)
        if geometry is not None and geometry.precision != self._fp32_precision(geometry.dtype):
            return None
        return geometry

    def _fp32_precision(self, dtype: torch.dtype) -> str | None:
        """How an fp32 call's kernels multiply (PyTorch's TF32 setting decides it, and no
        call geometry holds it); None for other dtypes."""
        return self._host._dot_precision(dtype) if dtype == torch.float32 else None

    def launch_path(self, *args: Any, return_lse: bool = False, **kwargs: Any) -> str:
        """How a repeated call with these inputs launches (Triton target, after a first
        call of the same geometry): "replay" (a recorded launch plan, no checks or Triton
        launcher in the way), "replay: its length family" (the plan of a call of another
        key length in its bucket: attncc.runtime.length_family), or "full: WHY"."""
        tensors, params = self._host._bind(args, kwargs)
        if self.target != "triton":
            return "full: the CUDA target keeps its own launch plans"
        key = Plans.key(tensors, params, return_lse, False, stream=False)
        geometry = self._geometry(key)
        if geometry is None:
            if self._serving_family(self._families.find(key, tensors, params)) is not None:
                return "replay: its length family"
            return "full: no call of this geometry yet"
        return "replay" if geometry.serving() is not None else f"full: {geometry.refusal}"

    def launch_config(self, *args: Any, **kwargs: Any) -> dict[str, int]:
        """The launch configuration a call with these inputs runs with (Triton target): a
        tuned entry, the heuristic table's, or the module's defaults (pinned tiling)."""
        tensors, params = self._host._bind(args, kwargs)
        checked = self._host._check(tensors, params)
        return dict(self._config(self._host, tensors, params, False, checked))

    def _config(
        self,
        module: ModuleType,
        tensors: dict[str, Any],
        params: dict[str, Any],
        return_lse: bool,
        checked: tuple[dict[str, int], torch.dtype, torch.device],
    ) -> dict[str, int]:
        """A call's launch configuration: the module's defaults where tiling options pinned
        them, else a tuned entry or the heuristic table's (``Tuner.choose``)."""
        sizes, dtype, device = checked
        if self._pinned:
            head, value = sizes[self.ir.head_axis.dim], sizes[self.ir.value_axis.dim]
            return module._default_config(head, value, dtype, device)  # type: ignore[no-any-return]
        return self.tuner.choose(module, tensors, params, return_lse, checked)

    def _backward_args(
        self, args: tuple[Any, ...]
    ) -> tuple[
        dict[str, Any],
        dict[str, Any],
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        list[bool],
    ]:
        n, p = len(self.input_names), len(self.param_names)
        tensors = dict(zip(self.input_names, args[:n], strict=True))
        params = {
            k: v for k, v in zip(self.param_names, args[n : n + p], strict=True) if v is not None
        }
        out, lse, grad_out, grad_lse, needs = args[n + p :]
        return tensors, params, out, lse, grad_out, grad_lse, list(needs)

    def _backward_run(self, *args: Any) -> list[torch.Tensor]:
        assert isinstance(self._backward, autograd.Backward)
        tensors, params, out, lse, grad_out, grad_lse, needs = self._backward_args(args)
        return self._backward.run(
            self._host, tensors, params, out, lse, grad_out, grad_lse, needs=needs
        )

    def _backward_fake(self, *args: Any) -> list[torch.Tensor]:
        assert isinstance(self._backward, autograd.Backward)
        tensors, *_, needs = self._backward_args(args)
        return [
            torch.empty_like(tensors[name]) if need else tensors[name].new_empty(0)
            for name, need in zip(self._backward.floats, needs, strict=True)
        ]

    def _fallback_launch(
        self, tensors: dict[str, Any], params: dict[str, Any], return_lse: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._fallback_kernel is None:
            assert self.fallback is not None
            self._fallback_kernel = self.fallback()
        key = Plans.key(tensors, params, return_lse, False, stream=False)
        self._falls_back.remember(key, True)
        fallback = self._fallback_kernel
        found = fallback._families.find(key, tensors, params)
        new = found is not None and found.key not in self._families_falling_back
        # the host module hands every split-KV call to Triton, whatever its key length
        if new and self._host._splits_keys(self._host._check(tensors, params)[0]):
            assert found is not None
            self._families_falling_back[found.key] = None
            while len(self._families_falling_back) > _FAMILIES_KEPT:
                del self._families_falling_back[next(iter(self._families_falling_back))]
        return fallback._launch_keyed(tensors, params, return_lse, key, found)

    def _fake(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        tensors, params, return_lse = self._split(args, kwargs)
        module = self.module(False)
        sizes, dtype, device = module._check(tensors, params)
        out_dims = [sizes[d] for d in self.ir.output.dims]
        lse_dims = [sizes[a.dim] for a in self.ir.batch_axes]
        if self.ir.query_axis is not None:
            lse_dims.append(sizes[self.ir.query_axis.dim])
        if not return_lse:
            lse_dims = [0] * len(lse_dims)
        return (
            torch.empty(out_dims, dtype=dtype, device=device),
            torch.empty(lse_dims, dtype=torch.float32, device=device),
        )


@dataclass
class _Geometry:
    """What a Triton call's checks and configuration choice decided for one geometry
    (``Plans.key``), and the plan recorded from its first call (None: why not)."""

    sizes: dict[str, int]
    dtype: torch.dtype
    device: torch.device
    params: dict[str, Any]
    config: dict[str, int]
    plan: triton_plan.TritonPlan | None = None
    refusal: str | None = None
    precision: str | None = None  # _fp32_precision when recorded
    # where ``plan`` serves one stream alone (it holds buffers kept per stream): the plans
    # recorded on other streams, by raw stream (the latest _STREAM_PLANS of them)
    stream_plans: dict[int, triton_plan.TritonPlan] = field(default_factory=dict)

    def serving(self) -> triton_plan.TritonPlan | None:
        """The plan for a call on the current stream: ``plan`` where it serves it, else the
        one recorded on this stream; None where there is none (yet)."""
        plan = self.plan
        if plan is None or plan.stream is None:
            return plan
        stream = _RAW_STREAM(self.device.index) if _RAW_STREAM is not None else 0
        return plan if plan.serves(stream) else self.stream_plans.get(stream)

    def remember_stream_plan(self, plan: triton_plan.TritonPlan) -> None:
        if plan.stream is None:  # (it holds no per-stream buffers: it serves every stream)
            return
        self.stream_plans[plan.stream] = plan
        while len(self.stream_plans) > _STREAM_PLANS:
            del self.stream_plans[next(iter(self.stream_plans))]

    def launch(
        self, module: ModuleType, tensors: dict[str, Any], return_lse: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        launch: Callable[..., tuple[torch.Tensor, torch.Tensor]] = module._launch
        args = (dict(self.params), return_lse, self.sizes, self.dtype, self.device, self.config)
        return launch(tensors, *args)

    def record_family(
        self,
        module: ModuleType,
        tensors: dict[str, Any],
        return_lse: bool,
        on_cpu: bool,
        lengths: dict[str, str],
        values: dict[str, int],
    ) -> tuple[Any, triton_plan.TritonPlan | None, str | None, triton_plan.FamilyRecording]:
        """``record``, with the call's plan for its length family too
        (triton_plan.record_family)."""
        with interpreter(on_cpu):
            return triton_plan.record_family(
                module,
                lambda: self.launch(module, tensors, return_lse),
                tensors,
                not on_cpu,
                lengths,
                values,
            )

    def record(
        self, module: ModuleType, tensors: dict[str, Any], return_lse: bool, on_cpu: bool
    ) -> tuple[Any, triton_plan.TritonPlan | None, str | None]:
        """A call through ``launch``, recorded: its result, its plan (or None) and why not."""
        with interpreter(on_cpu):
            return triton_plan.record(
                module, lambda: self.launch(module, tensors, return_lse), tensors, not on_cpu
            )


def _param_sites(spec: CheckedSpec) -> dict[str, str]:
    """Each param's declaration as " (file.attn:line)", for the generated module's errors."""
    return {
        stmt.name.name: f" ({spec.spec.filename}:{stmt.span.line})"
        for stmt in spec.spec.statements
        if isinstance(stmt, ast.ParamStmt)
    }


def _eager(tensors: Iterable[Any]) -> str | None:
    """How a call may skip the torch op: "plain" where nothing is traced (torch.compile,
    export), no dispatch mode (FakeTensorMode, ...) is active, the tensors are plain (no
    subclasses, fake or functional tensors) and autograd has nothing to record; "grad"
    where an input requires grad (grad mode on) and no functorch transform is active
    either (attncc.runtime.eager's Function records it); None: through the op."""
    if _is_compiling() or _current_dispatch_mode() is not None:
        return None
    grad = torch.is_grad_enabled()
    recorded = False
    # a loop, not all() over a generator: 0.77 against 1.26 us for 3 inputs (this
    # repository's CPU machine)
    for t in tensors:
        if type(t) is not torch.Tensor:
            return None
        recorded = recorded or (grad and t.requires_grad)
    if not recorded:
        return "plain"
    return None if torch._C._are_functorch_transforms_active() else "grad"


# the streams besides its recording one a geometry keeps plans for (each holds a scratch
# block): a process making a stream a request would otherwise grow them without bound
_STREAM_PLANS = 8
# geometries a kernel records at their first call; later ones at their second (_records),
# of the latest _SEEN_ONCE_KEPT seen once
_FIRST_SIGHT_RECORDS = 16
_SEEN_ONCE_KEPT = 256
# the length families an auto kernel remembers handing to its fallback
_FAMILIES_KEPT = 64
_is_compiling = torch.compiler.is_compiling
# PyTorch's current raw stream by device index (a private API, as Triton uses; CUDA builds)
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
