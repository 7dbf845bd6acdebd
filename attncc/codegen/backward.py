"""Triton backward of a fused prefill kernel: a render context for backward.py.jinja.

FlashAttention-2's schedule, deterministic by construction (no float atomics):
- ``dq`` kernel, one program per (query tile, batch program): computes
  ``delta = rowsum(dO * O)`` for its rows, then walks the key tiles its rows see (the
  forward's key bounds), recomputing P from the saved log-sum-exp, and accumulates dQ and
  the side inputs' partial derivatives (per score, or summed over the keys);
- ``dkdv`` kernel, one program per (key tile, batch program): walks the query tiles, skipping
  those whose visible key range misses its tile, and accumulates dK, dV and the partial
  derivatives of side inputs read by the key index alone (summed over the rows) in
  registers.
With a tile index (separable masks such as document ids), both kernels also skip the
(query tile, key tile) pairs it leaves out: the forward's builder runs per call with the
backward's tiles, and the host spreads its lists into a dense live map.

Each program writes its own rows of float32 buffers indexed by batch program (every batch
axis, query heads included); the host (``attncc.runtime.autograd``) sums them into the
inputs' shapes through the operands' subscripts, so GQA's kv heads sum their query heads,
with no atomics. The chain rule through the score modifications comes from
``attncc.ir.derivative``. ``BackwardUnsupported`` names what a spec needs that this
backward lacks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from attncc.codegen import exprs as cx
from attncc.codegen import plan
from attncc.codegen.triton import LOG2E, _Context, environment, score_tile
from attncc.ir import nodes as ir
from attncc.ir.derivative import NoDerivative, derivative, score_chain
from attncc.ir.printer import expr_str
from attncc.ir.verify import indices_of, subexprs
from attncc.spec import ast


class BackwardUnsupported(ValueError):
    """A spec whose backward cannot be generated; the message says why."""


Carries = Literal["rows_keys", "rows", "keys", "none"]


@dataclass(frozen=True)
class SideGrad:
    """The partial derivative of the scores through one float load of a side input.

    ``carries``: which of the query and key index the load's subscripts read (through any
    integer expression: ``rel[h, m - n + N - 1]`` reads both). "rows_keys": one value per
    score, kept per (row, key) (a bias [B, H, M, N]; a relative table, whose gathered
    positions the host scatter-adds); "rows": summed over the keys per row (a per-query
    bias [B, H, M]); "keys": summed over the rows per key, in the dkdv kernel (a key-padding
    bias [B, N]); "none": summed over the keys per row, the host sums the rows (ALiBi slopes
    [H])."""

    load: ir.Load
    carries: Carries


@dataclass(frozen=True)
class SinkGrad:
    """d(sink)/d(load) for one float load the softmax sink reads (``sinks[h]``: 1). The
    sink's own gradient needs no kernel: the host forms it from the log-sum-exp and delta."""

    load: ir.Load
    derivative: ir.Expr


@dataclass(frozen=True)
class RenderedBackward:
    source: str
    side_grads: tuple[SideGrad, ...]
    sink_grads: tuple[SinkGrad, ...] = ()


def _refuse(k: ir.AttentionKernel, why: str) -> BackwardUnsupported:
    return BackwardUnsupported(f"attncc {k.name}: no backward for this spec: {why}")


def side_grads(k: ir.AttentionKernel) -> tuple[SideGrad, ...]:
    """Every float load the score modifications read, with what its subscripts carry."""
    query = k.query_axis.index if k.query_axis else None
    key = k.key_axis.index
    batch = {a.index for a in k.batch_axes}
    found: list[SideGrad] = []
    for mod in k.score_mods:
        for e in subexprs(mod):
            if not isinstance(e, ir.Load) or e.type != "float":
                continue
            if any(g.load == e for g in found):
                continue
            read = set().union(*(indices_of(sub) for sub in e.indices))
            if not read <= batch | {query, key}:
                # the verifier keeps score modifications to the scores' indices
                raise _refuse(
                    k,
                    f"the gradient of '{expr_str(e)}' reads indices the scores do not carry: "
                    + ", ".join(sorted(i for i in read - batch - {query, key} if i)),
                )
            rows, keys = query in read, key in read
            carries: Carries = (
                "rows_keys" if rows and keys else "rows" if rows else "keys" if keys else "none"
            )
            found.append(SideGrad(e, carries))
    return tuple(found)


def check_supported(k: ir.AttentionKernel) -> None:
    """Raise ``BackwardUnsupported`` naming the first thing this backward lacks."""
    if k.query_axis is None:
        raise _refuse(k, "decode (no query axis) has no backward: only prefill kernels do")
    if k.fp8 or k.value_scale is not None:
        raise _refuse(k, "FP8 inputs and value scales have no backward (inference only, for now)")
    if k.schedule != "fused":
        raise _refuse(
            k, f"only the fused prefill schedule has a backward (this kernel is {k.schedule})"
        )
    ctx = _Context(k, "")
    if ctx.gathered or plan.divisor_dims(k):
        raise _refuse(k, "keys read through other tensors (a paged cache) have no backward yet")
    if any(isinstance(e, ir.Load) and e.type == "float" for e in subexprs(k.score_scale)):
        raise _refuse(k, "a score scale read from a tensor has no gradient yet")
    try:
        score_chain(k.score_mods)
    except NoDerivative as err:
        raise _refuse(k, str(err)) from None
    side_grads(k)
    sink_grads(k)


def sink_grads(k: ir.AttentionKernel) -> tuple[SinkGrad, ...]:
    """Every float load the softmax sink reads, with the sink's derivative by it (the sink
    reads batch indices only, so its loads' subscripts are evaluated per batch program)."""
    if k.sink is None:
        return ()
    found: list[SinkGrad] = []
    for e in subexprs(k.sink):
        if isinstance(e, ir.Load) and e.type == "float" and all(g.load != e for g in found):
            try:
                found.append(SinkGrad(e, derivative(k.sink, e)))
            except NoDerivative as err:
                raise _refuse(k, f"the softmax sink: {err}") from None
    return tuple(found)


def render(kernel: ir.AttentionKernel, spec: ast.Spec | str = "") -> RenderedBackward:
    """The backward module's source for ``kernel`` (fused, with a query axis)."""
    check_supported(kernel)
    k = kernel
    ctx = _Context(k, spec, tanh_approx=False)  # the exact tanh: plan.TANH_APPROX_DTYPES
    assert k.query_axis is not None
    sides = side_grads(k)
    scalars = ctx.env(vector=False)
    k_parts = ctx.kv_operand(k.key, k.head_axis.index, scalars)
    v_parts = ctx.kv_operand(k.value, k.value_axis.index, scalars)
    env = ctx.env()
    names, host = ctx.kernel_params()
    args = plan.launch_args(k)
    o, lse = ctx.output()

    # recomputed scores: s_0 the scaled product, s_i+1 = mod_i(s_i), s2 the last in base 2
    if k.score_mods:
        score_lines = ["s_0 = qk * qk_scale"]
        for i, mod in enumerate(k.score_mods):
            text = cx.triton_expr(mod, replace(env, score=f"s_{i}"))
            score_lines.append(f"s_{i + 1} = {score_tile(mod, text)}")
        score_lines.append(f"s2 = s_{len(k.score_mods)} * {LOG2E!r}")
    else:
        # log2(e) folds into the scale: one multiply per score, as in the forward
        score_lines = ["s2 = qk * qk_scale2"]
    # the chain rule, last modification first: g is d(loss)/d(s_i+1) on entry. Masked
    # tiles zero the terms of masked scores (a derivative may be inf or NaN there); tiles
    # every score of which is live take the terms as they are (``chain_free``)
    chain_lines: list[str] = []
    chain_free: list[str] = []
    side_index = {g.load: j for j, g in enumerate(sides)}
    for i, (d_score, d_loads) in reversed(list(enumerate(score_chain(k.score_mods)))):
        mod_env = replace(env, score=f"s_{i}")
        for load, d_load in d_loads.items():
            j = side_index[load]
            term = f"g * ({cx.triton_expr(d_load, mod_env)})"
            chain_lines.append(f"side_{j} = side_{j} + tl.where(live, {term}, 0.0)")
            chain_free.append(f"side_{j} = side_{j} + {term}")
        if d_score != ir.Const(1.0, "float"):
            term = f"g * ({cx.triton_expr(d_score, mod_env)})"
            chain_lines.append(f"g = tl.where(live, {term}, 0.0)")
            chain_free.append(f"g = {term}")
    masks = [cx.triton_expr(m, env) for m in k.masks]
    assert k.mask_plan is not None
    residual = [cx.triton_expr(m, env) for m in k.mask_plan.residual]
    values = {
        "header": ctx.header(),
        "name": cx.safe_name(k.name),
        "dq_fn": f"_attncc_{cx.safe_name(k.name)}_bwd_dq",
        "dkdv_fn": f"_attncc_{cx.safe_name(k.name)}_bwd_dkdv",
        "dkdv_rows_fn": f"_attncc_{cx.safe_name(k.name)}_bwd_dkdv_rows",
        "delta_fn": f"_attncc_{cx.safe_name(k.name)}_bwd_delta",
        "kernel_param_lines": plan.arg_lines(args, names),
        "launch_arg_lines": plan.arg_lines(args, host),
        "runtime_ints": ctx.runtime_ints(),
        "batch_lines": ctx.batch_lines(),
        "batch_programs": " * ".join(f"sizes[{a.dim!r}]" for a in k.batch_axes) or "1",
        "rows": cx.dim_var(k.query_axis.dim),
        "keys": cx.dim_var(k.key_axis.dim),
        "rows_host": f"sizes[{k.query_axis.dim!r}]",
        "keys_host": f"sizes[{k.key_axis.dim!r}]",
        "head_dim": k.head_axis.dim,
        "value_dim": k.value_axis.dim,
        "query_var": cx.index_var(k.query_axis.index),
        "key_var": cx.index_var(k.key_axis.index),
        "q_name": k.query.tensor,
        "k_name": k.key.tensor,
        "v_name": k.value.tensor,
        "o_name": k.output.name,
        "q": ctx.operand(k.query, ctx.query, k.head_axis.index),
        "k": k_parts,
        "v": v_parts,
        "o": o,
        "lse": lse,
        "scale": cx.triton_expr(k.score_scale, env),
        "score_lines": score_lines,
        "log2e": repr(LOG2E),
        "mask_all": " & ".join(f"({m})" for m in masks) or "True",
        # the masks the key bounds do not imply: they apply in the whole tiles too
        "residual_mask": " & ".join(f"({m})" for m in residual) or None,
        "bounds": ctx.bounds(),
        "chain_lines": chain_lines,
        "chain_free": chain_free,
        "sides": [
            {
                "index": j,
                "per_score": g.carries == "rows_keys",
                "per_row": g.carries in ("rows", "none"),
                "per_key": g.carries == "keys",
            }
            for j, g in enumerate(sides)
        ],
        "uses_tanh": "tanh" in plan.functions_used(k),
        "tanh_approx": None,
        "uses_pow": "pow" in plan.functions_used(k),  # derivatives of pow call pow too
        "row_lse": False,  # the backward reads the forward's
        "weights_as": False,  # nor takes a fixed softmax reference
        # the forward's tile index, built with the backward's tiles: dead pairs skipped,
        # and where every mask is separable, its full pairs run without masks
        "tile_index": ctx.tile_index(),
        "full_pairs": k.tile_index is not None and k.tile_index.full,
        "host_key_size": f"sizes[{k.key_axis.dim!r}]",
        "fast_division": False,
        "spec_lines": ctx.spec_lines,
    }
    source = environment().get_template("backward.py.jinja").render(**values)
    return RenderedBackward(source, sides, sink_grads(k))


def describe(sides: tuple[SideGrad, ...]) -> list[dict[str, Any]]:
    return [{"load": expr_str(g.load), "carries": g.carries} for g in sides]
