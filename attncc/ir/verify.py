"""Invariants of an ``AttentionKernel``; tests run the verifier after every pass."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from attncc.ir import nodes as ir


class IRError(Exception):
    """An IR invariant does not hold: a compiler bug, not a user error."""


def subexprs(expr: ir.Expr) -> Iterator[ir.Expr]:
    yield expr
    match expr:
        case ir.Load(indices=children) | ir.Call(args=children):
            for child in children:
                yield from subexprs(child)
        case ir.Unary(operand=x):
            yield from subexprs(x)
        case ir.BinOp(left=a, right=b):
            yield from subexprs(a)
            yield from subexprs(b)
        case _:
            pass


def replaced(expr: ir.Expr, old: ir.Expr, new: ir.Expr) -> ir.Expr:
    """``expr`` with every occurrence of the subexpression ``old`` replaced by ``new``."""
    if expr == old:
        return new
    match expr:
        case ir.Load(indices=children):
            return replace(expr, indices=tuple(replaced(c, old, new) for c in children))
        case ir.Call(args=children):
            return replace(expr, args=tuple(replaced(c, old, new) for c in children))
        case ir.Unary(operand=x):
            return replace(expr, operand=replaced(x, old, new))
        case ir.BinOp(left=a, right=b):
            return replace(expr, left=replaced(a, old, new), right=replaced(b, old, new))
        case _:
            return expr


def indices_of(expr: ir.Expr) -> set[str]:
    return {e.name for e in subexprs(expr) if isinstance(e, ir.Index)}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise IRError(message)


def verify(kernel: ir.AttentionKernel) -> ir.AttentionKernel:
    """Check every invariant; returns the kernel so passes can be chained."""
    axes = {a.index for a in kernel.axes}
    tensors = {t.name: t for t in kernel.tensors}
    params = {p.name for p in kernel.params}
    dims = set(kernel.dims)

    def check_expr(expr: ir.Expr, where: str, allow_score: bool, allowed: set[str]) -> None:
        for e in subexprs(expr):
            match e:
                case ir.Index(name=name):
                    _require(name in allowed, f"{where}: index '{name}' is not allowed here")
                case ir.Dim(name=name):
                    _require(name in dims, f"{where}: unknown dim '{name}'")
                case ir.Param(name=name):
                    _require(name in params, f"{where}: unknown param '{name}'")
                case ir.Score():
                    _require(allow_score, f"{where}: the score is not readable here")
                case ir.Load(tensor=name, indices=indices):
                    _require(name in tensors, f"{where}: unknown tensor '{name}'")
                    _require(
                        len(indices) == len(tensors[name].dims),
                        f"{where}: {name} indexed with {len(indices)} subscripts",
                    )
                    _require(tensors[name].role == "aux", f"{where}: loads read aux inputs only")
                case _:
                    pass

    batch = {a.index for a in kernel.batch_axes}
    row = {kernel.query_axis.index} if kernel.query_axis else set()
    score_indices = batch | row | {kernel.key_axis.index}
    for operand in (kernel.query, kernel.key, kernel.value):
        _require(operand.tensor in tensors, f"operand '{operand.tensor}' is not an input")
        _require(
            len(operand.indices) == len(tensors[operand.tensor].dims),
            f"operand '{operand.tensor}' has the wrong number of subscripts",
        )
        for sub in operand.indices:
            check_expr(sub, f"operand {operand.tensor}", False, axes)
    check_expr(kernel.score_scale, "score scale", False, set())
    _require(kernel.score_scale.type != "bool", "the score scale must be a number")
    for mod in kernel.score_mods:
        check_expr(mod, "score modification", True, score_indices)
        _require(mod.type == "float", "a score modification must be float")
    for mask in kernel.masks:
        check_expr(mask, "mask", False, score_indices)
        _require(mask.type == "bool", "a mask must be boolean")
    _require(
        set(kernel.output.indices) == batch | row | {kernel.value_axis.index}, "output indices"
    )
    for dim, value in kernel.derived_dims:
        _require(dim in dims, f"derived dim '{dim}' is not a dim")
        check_expr(value, f"derived dim {dim}", False, set())
    for param in kernel.params:
        if param.default is not None:
            check_expr(param.default, f"default of {param.name}", False, set())
    if kernel.tiling is not None:
        rules = kernel.tiling.rules
        _require(bool(rules) and rules[-1][0] == 0, "the last tiling rule must cover any head dim")
        for _, t in rules:
            for size in (t.block_m, t.block_n):
                _require(
                    size >= 16 and size & (size - 1) == 0,
                    f"block size {size} not a power of 2 >= 16",
                )
            _require(t.num_warps in (1, 2, 4, 8, 16), f"num_warps {t.num_warps}")
            _require(t.num_stages >= 1, f"num_stages {t.num_stages}")
    if kernel.mask_plan is not None:
        plan = kernel.mask_plan
        for bound in (*plan.lower, *plan.upper):
            check_expr(bound.expr, "key bound", False, batch | row)
            _require(bound.slope in (-1, 0, 1), "key bound slope must be -1, 0 or +1")
            _require(bound.expr.type == "int", "key bounds are integers")
        for mask in plan.residual:
            check_expr(mask, "residual mask", False, score_indices)
        key_side = batch | {kernel.key_axis.index}
        for sep in plan.separable:
            check_expr(sep.row, "separable mask row side", False, batch | row)
            check_expr(sep.key, "separable mask key side", False, key_side)
    if kernel.group is not None:
        _require(kernel.group.head in kernel.batch_axes, "the GQA head axis must be a batch axis")
    if kernel.tile_index is not None:
        _verify_tile_index(kernel, kernel.tile_index)
    return kernel


def _verify_tile_index(kernel: ir.AttentionKernel, index: ir.TileIndex) -> None:
    plan = kernel.mask_plan
    _require(plan is not None, "a tile index needs a mask plan")
    assert plan is not None
    _require(kernel.schedule == "fused", "only fused kernels walk a tile index")
    _require(kernel.query_axis is not None, "a tile index needs query tiles")
    _require(bool(index.masks), "a tile index tests at least one separable mask")
    for sep in index.masks:
        _require(sep in plan.separable, "a tile index tests separable masks of the mask plan")
    _require(
        list(index.axes) == [a for a in kernel.batch_axes if a in index.axes],
        "tile index axes must be batch axes, in batch order",
    )
    # programs that differ in an axis outside the index share its lists: nothing that
    # classifies a tile may read such an axis
    read: set[str] = set()
    for bound in (*plan.lower, *plan.upper):
        read |= indices_of(bound.expr)
    for sep in index.masks:
        read |= indices_of(sep.row) | indices_of(sep.key)
    shared = {a.index for a in kernel.batch_axes} - {a.index for a in index.axes}
    _require(
        not read & shared,
        f"the tile index is shared across '{', '.join(sorted(read & shared))}' but its "
        "classification reads it",
    )
    if index.full:
        for mask in plan.residual:
            _require(
                any(sep.is_form_of(mask) for sep in index.masks),
                "a tile index with full tiles must test every residual mask",
            )
