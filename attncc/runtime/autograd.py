"""The backward of a compiled kernel: runs the CUDA target's sm_90a backward (its host
module's ``_backward_hopper``) where the call allows it, else the generated Triton backward
module (``attncc.codegen.backward``), and forms the inputs' gradients from their buffers
(``attncc.runtime.gradients``). A backward like an earlier one replays what that one decided
(``_Repeat``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from attncc.codegen import backward as codegen
from attncc.ir import nodes as ir
from attncc.runtime import triton_plan
from attncc.runtime.gradients import Recipe, Scatter
from attncc.runtime.jit import interpreter, load_module, module_path
from attncc.runtime.launch_plan import Plans
from attncc.spec import ast
from attncc.spec.check import dtype_type
from attncc.torch_eval import evaluate

__all__ = ["Backward", "last_backend", "prepare"]

# the Triton backward's tiles, (block_m, block_n, num_warps, num_stages) of both kernels, from
# the module's default down, each tried where the one before does not fit the GPU's shared
# memory: float32 at head dim 128 asks 256 KiB at the default, 512 at head dims 192 and 256
# (H200: 227 KiB; triton.runtime.errors.OutOfResources)
SMALLER_TILES = ((64, 64, 4, 1), (32, 32, 4, 1), (16, 16, 4, 1))
# float32's first tiles by padded head dim, from what Triton 3.6 allocates for sm_90
# (compiled for GPUTarget("cuda", 90, 32) without a GPU): 64 x 64 at two stages takes 128 /
# 256 / 512 KiB at head dims 64 / 128 / 256, at one stage 96 / 192 / 384, 32 x 32 at one
# stage 44 / 82 / 162; 16-bit inputs take at most 128 at the default. A GPU with less
# shared memory still walks SMALLER_TILES from there.
FLOAT32_FIRST_TILES = {128: SMALLER_TILES[0], 256: SMALLER_TILES[1]}

# the backend the last backward of this process took ("cuda" or "triton: WHY"), kept here
# rather than on a Backward: a kernel's torch op may be another Kernel's of the same spec
# (the op registry keeps the first one's)
_LAST = [""]


def last_backend() -> str:
    return _LAST[0]


def prepare(kernel: ir.AttentionKernel, spec: ast.Spec | str) -> Backward | str:
    """The kernel's backward, or the reason it has none (one line, for the error a call
    requiring grad gets)."""
    try:
        rendered = codegen.render(kernel, spec)
    except codegen.BackwardUnsupported as err:
        return str(err)
    return Backward(kernel, rendered)


class Backward:
    def __init__(self, kernel: ir.AttentionKernel, rendered: codegen.RenderedBackward) -> None:
        self.ir = kernel
        self.sides = rendered.side_grads
        self.sink_grads = rendered.sink_grads
        self.path: Path = module_path(f"{kernel.name}_bwd", rendered.source)
        # the inputs with gradients: integer and bool inputs index or mask
        self.floats = tuple(t.name for t in kernel.tensors if dtype_type(t.dtype) == "float")
        # recorded launches by call geometry, and why a geometry could not be recorded
        self._plans = Plans()
        # by call geometry (Plans.key): the checked sizes, dtype and device, the params with
        # their defaults, the host module's verdicts on the sm_90a backward
        self._checked = Plans()
        self.refusals: dict[tuple[Any, ...], str] = {}
        # by call geometry, needed gradients and backend: a backward to repeat with nothing
        # decided again (_Repeat)
        self._repeats = Plans()
        # by (dtype, head dim, value dim, device): the Triton backward's tiles where its
        # default did not fit (SMALLER_TILES)
        self._fitted: dict[tuple[Any, ...], tuple[int, int, int, int]] = {}

    def module(self, interpreted: bool) -> ModuleType:
        return load_module(self.path, interpreted)

    def one_pass(self) -> bool:
        """Whether the backward runs one pass over the scores (dQ added with float atomics)
        rather than two: for specs whose tile index reads tables (document masks), unless
        ``torch.use_deterministic_algorithms`` asks for bit-identical gradients. Their query
        tiles see few live key tiles, and the dq pass reloaded Q, dO and the tile list for
        each: a backward took 1443 / 1326 / 1279 us in one pass against 1645 / 1683 / 1261 in
        two with 4 / 8 / 32 documents (4,16,4096,128 bf16, H200, alternating rounds); causal
        took 3928 against 2123 (benchmarks/backward_sweep.py --one-pass), so others keep two."""
        index = self.ir.tile_index
        tables = index is not None and bool(index.masks)
        return tables and not torch.are_deterministic_algorithms_enabled()

    def run(
        self,
        host: ModuleType,
        tensors: dict[str, torch.Tensor],
        params: dict[str, Any],
        out: torch.Tensor,
        lse: torch.Tensor,
        dout: torch.Tensor,
        dlse: torch.Tensor,
        config: dict[str, Any] | None = None,
        needs: list[bool] | None = None,
    ) -> list[torch.Tensor]:
        """The gradient of every float input (``self.floats`` order), in its dtype, or of
        those ``needs`` names (the others empty: a side input without one lets the sm_90a
        backward take the call, which has no side gradients); ``dlse``
        is the gradient of the log-sum-exp the forward wrote (batch axes, then rows);
        ``config`` picks the backend (``backend``, default the ATTNCC_BACKWARD environment
        variable, else "auto": the CUDA target's sm_90a backward where its host module takes
        the call by default (head dims 64 and 128, from 1024 keys), else the Triton backward;
        "cuda": the sm_90a kernel wherever it can run; "triton"; deterministic algorithms
        always take Triton's), and for Triton overrides the kernels' tiles (``dq_config``,
        ``dkdv_config``: (block_m, block_n, num_warps, num_stages)), picks the dkdv kernel
        (``dkdv_keys_major``) and the schedule (``dq_atomic``; default: ``one_pass``).
        Without ``config`` or deterministic algorithms, a call like a recorded one replays
        it (``_Repeat``)."""
        # a call like an earlier one (Plans.key: every input's geometry, dtype, device and
        # alignment, the params, the stream) skips the checks, as the forward's plans do
        key = Plans.key(tensors, params, True, False)
        backend = os.environ.get("ATTNCC_BACKWARD", "auto")
        repeat_key = None
        if config is None and key is not None and not torch.are_deterministic_algorithms_enabled():
            repeat_key = (key, backend, None if needs is None else tuple(needs))
            recorded = self._repeats.get(repeat_key)
            repeated: list[torch.Tensor] | None = None
            if recorded is not None:
                repeated = recorded(tensors, out, lse, dout, dlse)
            if repeated is not None:
                _LAST[0] = recorded.backend
                return repeated
        checked = self._checked.get(key)
        if checked is None:
            sizes, dtype, device = host._check(tensors, params)
            checked = (sizes, dtype, device, host._param_defaults(sizes, dict(params)), {})
            self._checked.remember(key, checked)
        sizes, dtype, device, params, verdicts = checked
        config = {"dq_atomic": self.one_pass(), "backend": backend, **(config or {})}
        known = {"dq_config", "dkdv_config", "dkdv_keys_major", "dq_atomic", "backend"}
        unknown = set(config) - known
        if unknown:
            raise TypeError(f"unknown backward config keys: {', '.join(sorted(unknown))}")
        if config["backend"] not in ("auto", "cuda", "triton"):
            backend = config["backend"]
            raise ValueError(
                f"backward backend (ATTNCC_BACKWARD) must be auto, cuda or triton, not {backend!r}"
            )

        on_cpu = device.type == "cpu"
        k = self.ir
        assert k.query_axis is not None
        rows, keys = k.query_axis.index, k.key_axis.index
        head, value = k.head_axis.index, k.value_axis.index
        reads = [k.query.tensor, k.key.tensor, k.value.tensor]
        reads += [s.load.tensor for s in self.sides] + [s.load.tensor for s in self.sink_grads]
        scatter = Scatter(k, sizes, params, tensors, self.floats, reads)
        operands = ((k.query, (rows, head)), (k.key, (keys, head)), (k.value, (keys, value)))
        # a buffer that is its input's whole gradient, untouched but for a permutation, is
        # written in the input's dtype by the kernels (no float32 copy and conversion)
        grad_dtypes = tuple(
            tensors[o.tensor].dtype if scatter.whole(o, inner) else torch.float32
            for o, inner in operands
        )
        # GQA: the query heads a kv head serves, which the sm_90a backward may sum in its
        # blocks (dK and dV then each group's, in the inputs' dtype where that is whole)
        kv_group = scatter.kv_group(operands[1], operands[2])
        walked_dtypes = grad_dtypes[1:]
        if kv_group > 1:
            walked_dtypes = tuple(
                tensors[o.tensor].dtype
                if scatter.whole(o, inner, kernel_groups=True)
                else torch.float32
                for o, inner in operands[1:]
            )
        with interpreter(on_cpu):
            programs_rows = (lse.shape[:-1].numel(), lse.shape[-1])
            flat_dlse = dlse.to(torch.float32).reshape(programs_rows).contiguous()
            schedule = (
                config.get("dq_config"),
                config.get("dkdv_config"),
                config.get("dkdv_keys_major", True),
                grad_dtypes,
                config["dq_atomic"],
            )
            needs = [True] * len(self.floats) if needs is None else needs
            hopper = None
            deterministic = torch.are_deterministic_algorithms_enabled()
            if config["backend"] != "triton" and not deterministic:
                forced = config["backend"] == "cuda"
                call = (sizes, dtype, device)
                side_needs = any(needs[self.floats.index(s.load.tensor)] for s in self.sides)
                hopper = self._hopper(
                    host,
                    tensors,
                    params,
                    out,
                    lse,
                    dout,
                    flat_dlse,
                    call,
                    grad_dtypes,
                    (kv_group, walked_dtypes),
                    forced,
                    side_needs,
                    verdicts,
                )
            sides: list[tuple[Any, torch.Tensor]] = []  # (side, its buffer): Triton's alone
            if hopper is None and config["backend"] == "triton":
                _LAST[0] = "triton: asked for"
            elif hopper is None and deterministic:
                _LAST[0] = "triton: deterministic algorithms asked for"
            walked = 1  # the query heads the kernel summed dK and dV over
            if hopper is not None:
                dq, dk, dv, launch, walked = hopper
            else:
                # the Triton module (Triton's import and JIT objects) loaded where Triton's
                # backward runs alone: the sm_90a backward needs none of it
                dq, dk, dv, buffers, launch = self._fitting_buffers(
                    self.module(on_cpu),
                    (tensors, params, out, lse, dout, flat_dlse, sizes, dtype, device),
                    schedule,
                    explicit=schedule[0] is not None or schedule[1] is not None,
                )
                sides = list(zip(self.sides, buffers, strict=True))
        grads: dict[str, torch.Tensor] = {}
        # each buffer's operand, axes after the batch programs, whether it sums its rows and
        # whether the kernel summed its groups
        parts: list[tuple[ir.Operand, tuple[str, ...], bool, bool]] = [
            (operand, inner, False, walked > 1 and i > 0)
            for i, (operand, inner) in enumerate(operands)
        ]
        for (operand, inner, _, summed), buffer in zip(parts, (dq, dk, dv), strict=True):
            scatter.add(grads, operand, buffer, inner, summed)
        for side, buffer in sides:
            side_operand = ir.Operand(side.load.tensor, side.load.indices)
            side_inner, by_row = _side_frame(side.carries, rows, keys)
            scatter.add(grads, side_operand, buffer.sum(-1) if by_row else buffer, side_inner)
            parts.append((side_operand, side_inner, by_row, False))
        if self.sink_grads:
            d_sink = self._d_sink(sizes, params, tensors, out, lse, dout, flat_dlse)
            for sink in self.sink_grads:
                factor = self._per_program(sink.derivative, sizes, params, tensors, device)
                operand = ir.Operand(sink.load.tensor, sink.load.indices)
                scatter.add(grads, operand, d_sink * factor, ())
        result = [
            tensors[name].new_empty(0)
            if not need
            else grads[name].to(tensors[name].dtype)
            if name in grads
            else torch.zeros_like(tensors[name])
            for name, need in zip(self.floats, needs, strict=True)
        ]
        if launch is not None and repeat_key is not None and not self.sink_grads:
            recipes = [
                (o.tensor, scatter.recipe(o, inner, summed), by_row)
                for o, inner, by_row, summed in parts
            ]
            taken = tuple((name, r, by_row) for name, r, by_row in recipes if r is not None)
            if len(taken) == len(recipes):
                offsets = (out.data_ptr() % 16, dout.data_ptr() % 16)
                frame = (programs_rows, out.shape, out.stride(), offsets)
                kept = _Repeat(launch, frame, taken, self.floats, tuple(needs), _LAST[0])
                self._repeats.remember(repeat_key, kept)
        return result

    def _hopper(
        self,
        host: ModuleType,
        tensors: dict[str, torch.Tensor],
        params: dict[str, Any],
        out: torch.Tensor,
        lse: torch.Tensor,
        dout: torch.Tensor,
        dlse: torch.Tensor,
        call: tuple[dict[str, int], torch.dtype, torch.device],
        grad_dtypes: tuple[torch.dtype, ...],
        kv_groups: tuple[int, tuple[torch.dtype, ...]],
        forced: bool,
        side_needs: bool,
        verdicts: dict[tuple[Any, ...], str | None],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any, int] | None:
        """(dq, dk, dv, its launch plan or None, the query heads each of dk's and dv's
        programs sums) from the CUDA target's sm_90a backward (its dQ added up in float32 by
        bulk reductions in any order: not bit-identical between runs); ``kv_groups``: the GQA
        group (``Scatter.kv_group``) and dk's and dv's types where the kernel sums it. None
        where the host module refuses the call (``_backward_refusal``, unless
        ``forced`` the Triton backward where it is as fast) or a side input's gradient is
        needed (``side_needs``) or the spec has sinks; ``last_backend()`` says which and
        why. ``verdicts``: the host module's answers for this call geometry so far, by the
        output's and dO's layout and ``forced``."""
        refusal = getattr(host, "_backward_refusal", None)
        if refusal is None or self.sink_grads:
            _LAST[0] = "triton: the spec's module has no sm_90a backward"
            return None
        if side_needs:
            _LAST[0] = "triton: a side input's gradient is needed (the sm_90a backward has none)"
            return None
        sizes, dtype, device = call  # the checked call's
        dout = dout.to(out.dtype)
        if dout.stride() != out.stride():
            dout = torch.empty_like(out).copy_(dout)
        layout = (forced, out.shape, out.stride(), out.data_ptr() % 16, dout.data_ptr() % 16)
        if layout in verdicts:
            why = verdicts[layout]
        else:
            why = verdicts[layout] = refusal(tensors, out, dout, sizes, dtype, device, forced)
        if why is not None:
            _LAST[0] = f"triton: {why}"
            return None
        group, walked_dtypes = kv_groups
        walked = host._backward_group(group)
        kv_dtypes = walked_dtypes if walked > 1 else grad_dtypes[1:]
        dq_float, dkv_float = grad_dtypes[0] != dtype, kv_dtypes != (dtype, dtype)
        lse = lse.contiguous()
        args = (
            tensors,
            params,
            out,
            lse,
            dout,
            dlse,
            sizes,
            dtype,
            device,
            dq_float,
            dkv_float,
            walked,
        )
        plan = host._backward_hopper_plan(*args)
        with torch.cuda.device(device):
            done = plan(tensors, out, lse, dout, dlse)
        if done is None:  # another CUDA context than the plan's: the host's own path
            plan, done = None, host._backward_hopper(*args)
        _LAST[0] = "cuda"
        dq, dk, dv = done
        return dq, dk, dv, plan, walked  # plan: a BackwardPlan, called as _Repeat's launch

    def _fitting_buffers(
        self,
        module: ModuleType,
        call: tuple[Any, ...],
        schedule: tuple[Any, ...],
        explicit: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor], Any]:
        """``_buffers`` of ``call`` (its arguments before the schedule) on the tiles that fit
        the GPU's shared memory: the module's default (float32 at head dims past 64:
        FLOAT32_FIRST_TILES), else the first of SMALLER_TILES after them that fits,
        remembered for the call's dtype, head dims and device (``explicit``: tiles given by
        the caller, tried alone)."""
        from triton.runtime.errors import OutOfResources

        tensors, params, out, lse, dout, dlse, sizes, dtype, device = call
        k = self.ir
        fit_key = (dtype, sizes[k.head_axis.dim], sizes[k.value_axis.dim], device)
        tiles = self._fitted.get(fit_key)
        if tiles is None and dtype == torch.float32:
            padded = 1 << (max(fit_key[1], fit_key[2], 16) - 1).bit_length()
            tiles = FLOAT32_FIRST_TILES.get(padded)
        if not explicit and tiles is not None:
            schedule = (tiles, tiles, *schedule[2:])
        while True:
            try:
                return self._buffers(
                    module, tensors, params, out, lse, dout, dlse, sizes, dtype, device, schedule
                )
            except OutOfResources as error:
                if explicit:
                    raise
                tried = schedule[0] or module._DQ_CONFIG
                later = (
                    SMALLER_TILES[SMALLER_TILES.index(tried) + 1 :]
                    if tried in SMALLER_TILES
                    else SMALLER_TILES
                )
                if not later:
                    raise ValueError(
                        f"attncc {k.name}: the Triton backward does not fit this GPU's shared "
                        f"memory at head dims {fit_key[1]} / {fit_key[2]} in {dtype} ({error})"
                    ) from None
                tiles = self._fitted[fit_key] = later[0]
                schedule = (tiles, tiles, *schedule[2:])

    def _buffers(
        self,
        module: ModuleType,
        tensors: dict[str, torch.Tensor],
        params: dict[str, Any],
        out: torch.Tensor,
        lse: torch.Tensor,
        dout: torch.Tensor,
        dlse: torch.Tensor,
        sizes: dict[str, int],
        dtype: torch.dtype,
        device: torch.device,
        schedule: tuple[Any, ...],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor], Any]:
        """The backward kernels' buffers (dq, dk, dv, side buffers) and a repeat of the call
        (``_Repeat``'s launch: the same buffers, or None; None where nothing was recorded). The
        launches of the first backward of a call geometry are recorded
        (attncc.runtime.triton_plan), later ones replayed through attncc's launcher:
        Backward.run took 325 against 438 us of CPU a call (document mask) and 105 against
        197 (causal), 4,16,1024,128 bf16, H200, alternating rounds."""
        args = (tensors, params, out, lse, dout, dlse, sizes, dtype, device, *schedule)
        operands = module._backward_operands(*args)
        if operands is None:
            dq, dk, dv, sides = module._empty_gradients(sizes, device, schedule[3])
            return dq, dk, dv, sides, None
        key = Plans.key(operands, params, False, False, stream=False)
        if key is not None:  # the schedule, and the kernels' fp32 product (PyTorch's setting)
            key = (*key, *schedule, module._dot_precision(dtype))
        plan = self._plans.get(key)
        replayed = plan(operands) if plan is not None else None
        if replayed is None:
            launch_args = (operands, params, sizes, dtype, device, *schedule)
            if key is None or plan is not None or key in self.refusals:
                replayed = module._backward_launch(*launch_args)
            else:
                replayed, plan, refusal = triton_plan.record(
                    module,
                    lambda: module._backward_launch(*launch_args),
                    operands,
                    compiled=device.type == "cuda",
                )
                if plan is not None:
                    self._plans.remember(key, plan)
                else:
                    self.refusals[key] = refusal or ""
        dq, dk, dv, *sides = replayed
        launch = None
        if plan is not None:
            precision = module._dot_precision(dtype)

            def launch(
                tensors: dict[str, torch.Tensor],
                out: torch.Tensor,
                lse: torch.Tensor,
                dout: torch.Tensor,
                dlse: torch.Tensor,
            ) -> tuple[torch.Tensor, ...] | None:
                if module._dot_precision(dtype) != precision:
                    return None  # PyTorch's fp32 product setting changed: other kernels
                # the call's operands (dO in the output's layout, a tile index's live tiles
                # from its own data), then the recorded launches
                args = (tensors, params, out, lse, dout, dlse, sizes, dtype, device, *schedule)
                with interpreter(device.type == "cpu"):
                    operands = module._backward_operands(*args)
                    return None if operands is None else plan(operands)

        return dq, dk, dv, list(sides), launch

    def _per_program(
        self,
        expr: ir.Expr,
        sizes: Mapping[str, int],
        params: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        device: torch.device,
    ) -> torch.Tensor:
        """``expr`` (batch indices only) for every batch program, float32 [programs]."""
        shape = [sizes[a.dim] for a in self.ir.batch_axes]
        grid = {}
        for axis, a in enumerate(self.ir.batch_axes):
            view = [1] * len(shape)
            view[axis] = shape[axis]
            grid[a.index] = torch.arange(shape[axis], device=device).reshape(view)
        value = torch.as_tensor(evaluate(expr, grid, sizes, params, tensors), device=device)
        return torch.broadcast_to(value.to(torch.float32), shape).reshape(-1)

    def _d_sink(
        self,
        sizes: Mapping[str, int],
        params: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        out: torch.Tensor,
        lse: torch.Tensor,
        dout: torch.Tensor,
        dlse: torch.Tensor,
    ) -> torch.Tensor:
        """d(loss)/d(sink) per batch program, float32 [programs].

        The sink joins the normaliser only: lse = log(exp(sink) + sum_n exp(s_n)), so
        d lse / d sink = P_sink = exp(sink - lse) and d P_n / d sink = -P_n * P_sink. Through
        the output (sum_n dP_n * P_n = rowsum(dO * O) = delta) and the returned log-sum-exp,
        d(loss)/d(sink) = -sum over rows of P_sink * (delta - dlse): O(programs * rows *
        value) on the host, summed by torch in a fixed order (no atomics)."""
        k = self.ir
        assert k.sink is not None and k.query_axis is not None
        programs, rows = dlse.shape
        # the output in (batch axes, rows, value) order, as the kernels index programs
        frame = [a.index for a in k.batch_axes] + [k.query_axis.index, k.value_axis.index]
        order = [k.output.indices.index(i) for i in frame]
        o = out.permute(order).reshape(programs, rows, -1).to(torch.float32)
        do = dout.permute(order).reshape(programs, rows, -1).to(torch.float32)
        delta = (do * o).sum(-1) - dlse
        sink = self._per_program(k.sink, sizes, params, tensors, out.device)
        lse = lse.reshape(programs, rows).to(torch.float32)
        # a row whose sink and keys are all -inf has no probability to give
        p_sink = torch.where(lse == -torch.inf, 0.0, torch.exp(sink[:, None] - lse))
        return -(p_sink * delta).sum(-1)


def _side_frame(carries: str, rows: str, keys: str) -> tuple[tuple[str, ...], bool]:
    """A side buffer's axes after the batch programs' (which of the query and key indexes
    the side input reads), and whether it is summed over the rows first (it reads neither:
    the buffer holds a value a row)."""
    if carries == "rows_keys":
        return (rows, keys), False
    if carries == "rows":
        return (rows,), False
    if carries == "keys":
        return (keys,), False
    return (), True


class _Repeat:
    """A backward for repeated calls of its geometry (Backward.run's key, the needed
    gradients, the backend asked for): its launches (``launch``: the sm_90a backward's
    BackwardPlan, or the Triton backward's recorded launches behind its operands; either
    returns the dq, dk and dv buffers, or None) and each operand's recipe, so a repeat
    checks the output's and dO's layout, launches and forms the gradients, deciding nothing
    again (Backward.run took 200-230 us of CPU a call before, at causal 1,16,2048,128 and
    2,8,512,128 bf16, H200, benchmarks/backward_host.py). The output's and dO's alignment
    are the recorded call's (a backend's choice and Triton's specialization follow them).
    The Triton backward's side buffers (a side input's gradient) take recipes too, summed
    over the rows first where the side input reads neither rows nor keys (ALiBi's slopes).
    Not recorded: a side input whose subscripts need the general scatter (a relative bias
    gathered by an index expression) and specs with sinks. Returns None, having launched
    nothing, for a call it does not fit: the full path takes it."""

    def __init__(
        self,
        launch: Any,
        frame: tuple[Any, ...],
        operands: tuple[tuple[str, Recipe, bool], ...],
        floats: tuple[str, ...],
        needs: tuple[bool, ...],
        backend: str,
    ) -> None:
        self.launch, self.operands, self.floats, self.needs = launch, operands, floats, needs
        self.backend = backend  # what last_backend() said of the recorded call
        self.rows, self.out_shape, self.out_stride, self.offsets = frame

    def __call__(
        self,
        tensors: dict[str, torch.Tensor],
        out: torch.Tensor,
        lse: torch.Tensor,
        dout: torch.Tensor,
        dlse: torch.Tensor,
    ) -> list[torch.Tensor] | None:
        stride = out.stride()
        fits = (
            out.shape == self.out_shape
            and stride == self.out_stride
            and (out.data_ptr() % 16, dout.data_ptr() % 16) == self.offsets
            and dout.dtype == out.dtype
            and dout.stride() == stride
            and lse.is_contiguous()
        )
        if not fits:
            return None
        flat_dlse = dlse.to(torch.float32).reshape(self.rows).contiguous()
        buffers = self.launch(tensors, out, lse, dout, flat_dlse)
        if buffers is None:
            return None
        grads: dict[str, torch.Tensor] = {}
        for (name, recipe, by_row), buffer in zip(self.operands, buffers, strict=True):
            gradient = recipe(buffer.sum(-1) if by_row else buffer)
            grads[name] = grads[name] + gradient if name in grads else gradient
        return [
            tensors[name].new_empty(0)
            if not need
            else grads[name].to(tensors[name].dtype)
            if name in grads
            else torch.zeros_like(tensors[name])
            for name, need in zip(self.floats, self.needs, strict=True)
        ]
