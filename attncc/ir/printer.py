"""Text form of the IR, for `attncc compile --print-ir` and golden tests."""

from __future__ import annotations

from attncc.ir import nodes as ir

_PRECEDENCE = {
    "or": 1,
    "and": 2,
    "==": 4,
    "!=": 4,
    "<": 4,
    "<=": 4,
    ">": 4,
    ">=": 4,
    "+": 5,
    "-": 5,
    "*": 6,
    "/": 6,
    "%": 6,
}


def expr_str(expr: ir.Expr, parent: int = 0) -> str:
    match expr:
        case ir.Const(value=value):
            if isinstance(value, bool):
                return "true" if value else "false"
            return repr(value)
        case ir.Index(name=name) | ir.Dim(name=name) | ir.Param(name=name):
            return name
        case ir.Score():
            return "s"
        case ir.Load(tensor=tensor, indices=indices):
            return f"{tensor}[{', '.join(expr_str(i) for i in indices)}]"
        case ir.Unary(op="neg", operand=x):
            return f"-{expr_str(x, 7)}"
        case ir.Unary(op="not", operand=x):
            text = f"not {expr_str(x, 3)}"
            return f"({text})" if parent > 3 else text
        case ir.BinOp(op=op, left=a, right=b):
            prec = _PRECEDENCE[op]
            text = f"{expr_str(a, prec)} {op} {expr_str(b, prec + 1)}"
            return f"({text})" if prec < parent else text
        case ir.Call(func=func, args=args):
            return f"{func}({', '.join(expr_str(a) for a in args)})"
    raise AssertionError(expr)


def _bound_str(bound: ir.KeyBound) -> str:
    return f"{expr_str(bound.expr)} [slope {bound.slope:+d}]"


def kernel_str(kernel: ir.AttentionKernel) -> str:
    """A readable, stable listing of every field of the kernel."""
    lines = [f"kernel {kernel.name}"]
    split = (
        f" (split-KV for <= {kernel.split_max_queries} queries)"
        if kernel.schedule == "fused" and kernel.split_max_queries
        else ""
    )
    lines.append(f"  schedule {kernel.schedule or '(unset)'}{split}")
    lines.append(f"  dims {', '.join(kernel.dims)}")
    for dim, value in kernel.derived_dims:
        lines.append(f"  dim {dim} = {expr_str(value)}")
    for t in kernel.tensors:
        lines.append(f"  in {t.name}[{', '.join(t.dims)}]: {t.dtype}  # {t.role}")
    for p in kernel.params:
        default = f" = {expr_str(p.default)}" if p.default is not None else ""
        lines.append(f"  param {p.name}: {p.dtype}{default}")
    batch = ", ".join(f"{a.index}:{a.dim}" for a in kernel.batch_axes)
    query = f"{kernel.query_axis.index}:{kernel.query_axis.dim}" if kernel.query_axis else "-"
    lines.append(
        f"  axes batch=({batch}) query={query} key={kernel.key_axis.index}:{kernel.key_axis.dim}"
        f" head={kernel.head_axis.index}:{kernel.head_axis.dim}"
        f" value={kernel.value_axis.index}:{kernel.value_axis.dim}"
    )
    for label, op in (("query", kernel.query), ("key", kernel.key), ("value", kernel.value)):
        lines.append(f"  {label:<5} {op.tensor}[{', '.join(expr_str(i) for i in op.indices)}]")
    lines.append(f"  scores = dot(query, key) * {expr_str(kernel.score_scale)}")
    for mod in kernel.score_mods:
        lines.append(f"  modify s = {expr_str(mod)}")
    for mask in kernel.masks:
        lines.append(f"  mask   {expr_str(mask)}")
    if kernel.sink is not None:
        lines.append(f"  sink   {expr_str(kernel.sink)}")
    if kernel.value_scale is not None:
        lines.append(f"  vscale {expr_str(kernel.value_scale)}")
    out = kernel.output
    lines.append(f"  out {out.name}[{', '.join(out.indices)}]  # dims [{', '.join(out.dims)}]")
    if kernel.group is not None:
        lines.append(
            f"  group {kernel.group.head.index}:{kernel.group.head.dim} -> {kernel.group.kv_dim}"
        )
    if kernel.tiling is not None:
        for max_head_dim, c in kernel.tiling.rules:
            bucket = f"head dim <= {max_head_dim}" if max_head_dim else "any head dim"
            lines.append(
                f"  tiling ({bucket}) block_m={c.block_m} block_n={c.block_n}"
                f" num_warps={c.num_warps} num_stages={c.num_stages}" + (" tma" if c.tma else "")
            )
    if kernel.mask_plan is not None:
        plan = kernel.mask_plan
        lower = ", ".join(_bound_str(b) for b in plan.lower) or "0"
        upper = ", ".join(_bound_str(b) for b in plan.upper) or kernel.key_axis.dim
        lines.append(f"  keys   from max({lower}) to min({upper})")
        for mask in plan.residual:
            lines.append(f"  per-element mask {expr_str(mask)}")
        for sep in plan.separable:
            lines.append(
                f"  tile skip unless some {expr_str(sep.row)} {sep.op} some {expr_str(sep.key)}"
            )
    if kernel.tile_index is not None:
        lines += _tile_index_lines(kernel.tile_index, kernel.query_axis)
    return "\n".join(lines) + "\n"


def _tile_index_lines(index: ir.TileIndex, query: ir.Axis | None) -> list[str]:
    axes = [a.index for a in index.axes] + [f"{query.index if query else '-'} tile"]
    some = " or ".join(f"no {expr_str(s.row)} {s.op} any {expr_str(s.key)}" for s in index.masks)
    every = " and ".join(
        f"every {expr_str(s.row)} {s.op} every {expr_str(s.key)}" for s in index.masks
    )
    full = (
        f"in every row's keys and {every}: no mask arithmetic"
        if index.full
        else "none (a residual mask is not separable)"
    )
    return [
        f"  tile index per ({', '.join(axes)}) of key tiles",
        f"    dead:    outside every row's keys, or {some}",
        f"    full:    {full}",
        "    partial: the others, every mask per element",
    ]
