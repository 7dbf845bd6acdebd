"""Backend-neutral facts both renderers need: how an operand's subscripts split, and which
rows of a query tile give the extremes of its visible key range.

The Triton and CUDA backends render these into their own syntax; neither re-derives them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass
from pathlib import PurePath
from typing import Literal

from attncc.codegen.exprs import (
    dim_var,
    divisor_vars,
    fast_division,
    index_var,
    param_var,
    stride_var,
    tensor_var,
)
from attncc.ir import nodes as ir
from attncc.ir.verify import indices_of, replaced, subexprs
from attncc.spec import ast

PartKind = Literal["row", "col", "key", "replaced", "gather", "base"]


@dataclass(frozen=True)
class Part:
    """One subscript of an operand: its axis (stride ``s_<tensor>_<axis>``) and its role.

    ``row``/``col``: a plain row or column index (a stride step); ``key``: a plain key index
    (keys are a stride step apart); ``gather``: a subscript that reads the key index through
    other tensors or arithmetic (a paged cache's page table); ``replaced``: a subscript the
    caller gives as a scalar variable (split-KV's kv head); ``base``: anything else, constant
    over the program.
    """

    axis: int
    kind: PartKind
    sub: ir.Expr
    var: str = ""


def operand_parts(
    operand: ir.Operand,
    row: str | None,
    col: str,
    key: str | None = None,
    replaced: dict[ir.Expr, str] | None = None,
) -> list[Part]:
    """Classify each subscript of ``operand`` (in axis order)."""
    parts: list[Part] = []
    for axis, sub in enumerate(operand.indices):
        if isinstance(sub, ir.Index) and row is not None and sub.name == row:
            parts.append(Part(axis, "row", sub))
        elif isinstance(sub, ir.Index) and key is not None and sub.name == key:
            parts.append(Part(axis, "key", sub))
        elif isinstance(sub, ir.Index) and sub.name == col:
            parts.append(Part(axis, "col", sub))
        elif replaced and sub in replaced:
            parts.append(Part(axis, "replaced", sub, replaced[sub]))
        elif key is not None and key in indices_of(sub):
            parts.append(Part(axis, "gather", sub))
        else:
            parts.append(Part(axis, "base", sub))
    return parts


Extreme = Literal["min", "max"]


def bound_row(bound: ir.KeyBound, extreme: Extreme) -> Literal["first", "last"]:
    """Which row of a query tile gives the smallest ("min") or largest ("max") value of
    ``bound``: the first row when the bound grows with the query index, else the last."""
    first_is_min = bound.slope >= 0
    return "first" if (extreme == "min") == first_is_min else "last"


def key_range(plan: ir.MaskPlan) -> dict[str, tuple[list[tuple[ir.KeyBound, str]], str]]:
    """The four bounds of a query tile's keys as (bound, row) lists and how they combine:
    ``lo``/``hi`` cover every visible key of the tile, ``full_lo``/``full_hi`` the keys
    every row of the tile sees. Each is clamped into [0, N) by the backend ("max" of the
    lower bounds with 0, "min" of the upper bounds with N)."""
    return {
        "lo": ([(b, bound_row(b, "min")) for b in plan.lower], "max"),
        "hi": ([(b, bound_row(b, "max")) for b in plan.upper], "min"),
        "full_lo": ([(b, bound_row(b, "max")) for b in plan.lower], "max"),
        "full_hi": ([(b, bound_row(b, "min")) for b in plan.upper], "min"),
    }


ArgSource = Literal["tensor", "stride", "output", "lse", "dim", "divisor", "param"]


@dataclass(frozen=True)
class LaunchArg:
    """One kernel argument. Every backend's kernels take the same arguments in the same
    order (``launch_args``); a backend adds only its types and host conversions.

    ``host`` is host Python for the value (over ``tensors``, ``out``, ``lse``, ``sizes``,
    ``params``); ``type`` is "pointer", "int" or "float"; ``tensor`` is the input a
    "tensor" pointer points into."""

    var: str
    host: str
    source: ArgSource
    type: Literal["pointer", "int", "float"]
    tensor: ir.TensorArg | None = None


def launch_args(kernel: ir.AttentionKernel) -> list[LaunchArg]:
    """Inputs with their strides, the output with its strides, the log-sum-exp with its
    strides, every dim, every param."""
    args: list[LaunchArg] = []
    for t in kernel.tensors:
        args.append(LaunchArg(tensor_var(t.name), f"tensors[{t.name!r}]", "tensor", "pointer", t))
        for axis in range(len(t.dims)):
            host = f"tensors[{t.name!r}].stride({axis})"
            args.append(LaunchArg(stride_var(t.name, axis), host, "stride", "int"))
    out = kernel.output
    args.append(LaunchArg(tensor_var(out.name), "out", "output", "pointer"))
    for axis in range(len(out.indices)):
        args.append(LaunchArg(stride_var(out.name, axis), f"out.stride({axis})", "stride", "int"))
    args.append(LaunchArg("lse_ptr", "lse", "lse", "pointer"))
    rank = len(kernel.batch_axes) + (1 if kernel.query_axis else 0)
    for axis in range(rank):
        args.append(LaunchArg(f"lse_stride_{axis}", f"lse.stride({axis})", "stride", "int"))
    for dim in kernel.dims:
        args.append(LaunchArg(dim_var(dim), f"sizes[{dim!r}]", "dim", "int"))
    for dim in divisor_dims(kernel):
        magic, shift = divisor_vars(dim)
        args.append(LaunchArg(magic, f"_divisor_magic(sizes[{dim!r}])[0]", "divisor", "int"))
        args.append(LaunchArg(shift, f"_divisor_magic(sizes[{dim!r}])[1]", "divisor", "int"))
    for p in kernel.params:
        kind: Literal["int", "float"] = "float" if p.type == "float" else "int"
        args.append(LaunchArg(param_var(p.name), f"params[{p.name!r}]", "param", kind))
    return args


def key_length_args(kernel: ir.AttentionKernel) -> dict[str, tuple[str, str, int]] | None:
    """The launch arguments a call of a new key length may differ in from a recorded one of
    its power-of-two bucket (attncc.runtime.length_family), by ``LaunchArg.var``, each with
    where a call's value is read: ("size" or "stride", input, axis), or ("param", name, 0):
    the length, every stride of the inputs holding it, and the int params the host reads
    nowhere else (a cache's length passed as a param: transformers' offset). None where the
    host reads the length elsewhere (the length derived from other dims or deriving one,
    read by a param's default or the query-head grouping, divided by with magic numbers, or
    the queries' or the output's length too; the subscript checks are the caller's to ask).
    """
    dim = kernel.key_axis.dim
    derived = dict(kernel.derived_dims)
    if dim in derived or any(_reads_dims(v, {dim}) for v in derived.values()):
        return None
    if kernel.query_axis is not None and kernel.query_axis.dim == dim:
        return None
    if dim in kernel.output.dims or dim in divisor_dims(kernel):
        return None
    if any(p.default is not None and _reads_dims(p.default, {dim}) for p in kernel.params):
        return None
    if kernel.group is not None and dim in (kernel.group.head.dim, kernel.group.kv_dim):
        return None
    carriers = [t for t in kernel.tensors if dim in t.dims]
    first = carriers[0]
    size = ("size", first.name, first.dims.index(dim))
    found: dict[str, tuple[str, str, int]] = {dim_var(dim): size}
    for t in carriers:
        for axis in range(len(t.dims)):
            found[stride_var(t.name, axis)] = ("stride", t.name, axis)
    read = {e.name for p in kernel.params if p.default is not None for e in _params(p.default)}
    bound = fixed_reference_bound(kernel)
    read |= {e.name for e in _params(bound)} if bound is not None else set()
    for p in kernel.params:
        if p.type == "int" and p.name not in read:
            found[param_var(p.name)] = ("param", p.name, 0)
    return found


def _params(expr: ir.Expr) -> list[ir.Param]:
    return [e for e in subexprs(expr) if isinstance(e, ir.Param)]


def _reads_dims(expr: ir.Expr, dims: set[str]) -> bool:
    return any(isinstance(e, ir.Dim) and e.name in dims for e in subexprs(expr))


def arg_lines(args: list[LaunchArg], texts: list[str]) -> list[str]:
    """``texts`` (one per argument of ``args``) joined a group to a line, for reading: a
    tensor's pointer with its strides, then the dims, the divisors and the params."""
    lines: list[list[str]] = []
    previous: ArgSource | None = None
    for arg, text in zip(args, texts, strict=True):
        starts = arg.type == "pointer" or (arg.source != previous and arg.source != "stride")
        if starts or not lines:
            lines.append([])
        lines[-1].append(text)
        previous = arg.source
    return [", ".join(line) for line in lines]


# The call dtypes (of q, k and v) whose forward kernels compute tanh with the GPU's
# tanh.approx.f32: one MUFU op where the exact formula takes an exp2, a reciprocal and a
# series (soft-capping's MUFU work per score falls from 3 ops to 2, the softmax's exp2
# included). Its relative error is below 2^-10.987 (PTX ISA), so it must pass the tolerance
# rule (attncc.tolerance) on its own. tests/codegen/test_tanh_approx.py models it at that bound
# (every score's tanh off by it, with a random sign or all one way) in float64 evaluations of
# the soft-capping specs on 60 of `attncc check`'s draws each:
#   float32: every output fails (errors 100x the bound and more): the exact formula stays.
#   float16: outputs pass, but 6 and 16 of 60 log-sum-exps fail (1.7x the RMS bound at the
#            default cap, 3.7x with 10x larger logits): an error of one sign shifts a row's
#            scores alike where fp16 roundings average out: the exact formula stays.
#   bfloat16: outputs pass (0.3x the bound at worst); one log-sum-exp of 60 fails per spec, a
#            row of one visible score whose naive bf16 rounding happened to be 20x below its
#            typical size (bound 5.8e-5, the model's error 8.1e-5). Scores of |x| >= 8 must
#            give exactly +-1: modelled with the bound's error there too, rows whose scores all
#            saturate at a small cap (the hf specs draw caps down to 0.1) missed the
#            log-sum-exp's bound by up to 2.6x, the naive error there being one rounding of
#            the cap. tanh.approx.f32 itself returns exactly +-1 for every float of |x| >= 8
#            (tests/gpu/test_gpu_tanh_approx.py, on an H200), so the kernels add no clamp: with
#            one to +-1 from 9 the softcap kernel ran 659.9 against 621.5 us (CUDA) and 785.8
#            against 650.9 (Triton; 4,16,4096,128, H200).
# The real error is below the bound and not all one way: `attncc check --device cuda` of the
# soft-capping specs confirms it on a GPU. The backward keeps the exact formula: its
# derivative 1 - tanh^2 near saturation is a small difference the error would dominate.
TANH_APPROX_DTYPES: tuple[str, ...] = ("bfloat16",)
# |x| from which tanh.approx.f32 returns exactly +-1 (float32's tanh is 1 from 9.01)
TANH_APPROX_SATURATION = 8.0


def functions_used(kernel: ir.AttentionKernel) -> frozenset[str]:
    """The spec functions (``tanh``, ``exp``, ...) the kernel's expressions call: a backend
    emits a device helper only for the functions that need one and are called."""
    return frozenset(e.func for e in _expressions(kernel) if isinstance(e, ir.Call))


def divisor_dims(kernel: ir.AttentionKernel) -> tuple[str, ...]:
    """Dims some expression of the kernel divides by with ``fast_division``: each gets a
    magic multiplier and a shift argument."""
    found: dict[str, None] = {}
    for expr in _expressions(kernel):
        if fast_division(expr):
            found[expr.right.name] = None  # type: ignore[union-attr]
    return tuple(found)


@dataclass(frozen=True, slots=True)
class IndexPrograms:
    """The tile index's programs (one per value of its batch axes, ir.TileIndex.axes): a
    program's number from the index variables (``program``), and their count in the kernel
    (``count``) and on the host (``count_host``, from ``sizes``)."""

    program: str
    count: str
    count_host: str


def index_programs(axes: tuple[ir.Axis, ...]) -> IndexPrograms:
    """Programs of a tile index over ``axes``, the last fastest (both backends' builders)."""
    program, count = "0", "1"
    for axis in axes:
        var, size = index_var(axis.index), dim_var(axis.dim)
        program = var if program == "0" else f"({program}) * {size} + {var}"
        count = size if count == "1" else f"{count} * {size}"
    count_host = " * ".join(f"sizes[{a.dim!r}]" for a in axes) or "1"
    return IndexPrograms(program, count, count_host)


def keys_grow_with_row(kernel: ir.AttentionKernel) -> bool:
    """Whether a query tile's visible keys are a prefix that grows with its rows (causal: no
    lower bound, an upper bound rising with the row) and no tile index lists them: the Triton
    kernel may then take its query tiles in pairs, the most keys with the fewest."""
    masks = kernel.mask_plan
    if masks is None or kernel.tile_index is not None:
        return False
    return not masks.lower and any(bound.slope > 0 for bound in masks.upper)


def bounds_read_tensors(mask_plan: ir.MaskPlan) -> bool:
    """Whether a key bound reads an input tensor (a cache length per sequence): keys outside
    it may then be unwritten cache memory (past a sequence's end, a page's unused slots),
    which partial tiles load as zeros so that no NaN there meets a zero probability in P * V."""
    bounds = (*mask_plan.lower, *mask_plan.upper)
    return any(isinstance(e, ir.Load) for bound in bounds for e in _expressions(bound.expr))


def _expressions(node: object) -> Iterator[ir.Expr]:
    """Every expression node reachable from ``node`` (IR dataclasses, tuples)."""
    if isinstance(node, tuple):
        for item in node:
            yield from _expressions(item)
    elif is_dataclass(node) and not isinstance(node, type):
        if isinstance(node, ir.Expr):
            yield node
        for f in fields(node):
            yield from _expressions(getattr(node, f.name))


# Tile tests of a separable mask ``row <op> key`` from the value ranges [row_lo, row_hi] of a
# query tile's rows and [key_lo, key_hi] of a key tile's keys: Triton's element-wise
# operators by default, C++'s logical ones for the CUDA backend.
TRITON_LOGIC = ("&", "|", "~")
CUDA_LOGIC = ("&&", "||", "!")


def can_meet(
    op: str,
    row_lo: str,
    row_hi: str,
    key_lo: str,
    key_hi: str,
    logic: tuple[str, ...] = TRITON_LOGIC,
) -> str:
    """Whether some row value and some key value of the tile can satisfy ``row <op> key``."""
    and_, _, not_ = logic
    return {
        "==": f"({key_hi} >= {row_lo}) {and_} ({key_lo} <= {row_hi})",
        "!=": f"{not_}({always('==', row_lo, row_hi, key_lo, key_hi, logic)})",
        "<": f"{row_lo} < {key_hi}",
        "<=": f"{row_lo} <= {key_hi}",
        ">": f"{row_hi} > {key_lo}",
        ">=": f"{row_hi} >= {key_lo}",
    }[op]


def always(
    op: str,
    row_lo: str,
    row_hi: str,
    key_lo: str,
    key_hi: str,
    logic: tuple[str, ...] = TRITON_LOGIC,
) -> str:
    """Whether every row value and every key value of the tile satisfy ``row <op> key``."""
    and_, or_, _ = logic
    return {
        "==": f"({row_lo} == {row_hi}) {and_} ({key_lo} == {key_hi}) {and_} ({row_lo} == {key_lo})",
        "!=": f"({row_hi} < {key_lo}) {or_} ({key_hi} < {row_lo})",
        "<": f"{row_hi} < {key_lo}",
        "<=": f"{row_hi} <= {key_lo}",
        ">": f"{row_lo} > {key_hi}",
        ">=": f"{row_lo} >= {key_hi}",
    }[op]


def key_index_range(op: str, row_lo: str, row_hi: str) -> tuple[str | None, str | None]:
    """For a separable mask ``row <op> n`` whose key side is the key index itself
    (``n >= start[seq[m]]``): the keys some row of a query tile may see, [lower, upper) from
    the rows' value range [row_lo, row_hi] (None: that side unbounded). An index builder
    scans only the key tiles that meet it."""
    return {
        "<": (f"{row_lo} + 1", None),
        "<=": (row_lo, None),
        ">": (None, row_hi),
        ">=": (None, f"{row_hi} + 1"),
        "==": (row_lo, f"{row_hi} + 1"),
    }.get(op, (None, None))


# Characters that end a line for Python's or C++'s tokenizer, or for an editor (str.splitlines),
# and the C++ line splice: none of them may reach a one-line comment.
_COMMENT_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\\]")


def comment_text(text: str, collapse: bool = True) -> str:
    """``text`` made safe inside a one-line comment (``# ...`` or ``// ...``) of either
    backend: line breaks and other control characters become spaces, backslashes (a C++
    line splice at a line's end) slashes, ``??`` (the trigraph of a backslash) ``? ?``; runs
    of spaces collapse unless ``collapse`` is false (the spec's listing keeps its layout).
    Spec text reaches generated code only through this."""
    text = _COMMENT_BREAKS.sub(lambda m: "/" if m.group() == "\\" else " ", text)
    text = text.replace("??", "? ?")
    return " ".join(text.split()) if collapse else text.rstrip()


@dataclass(frozen=True, slots=True)
class SpecLines:
    """The spec statements each block of a generated kernel implements, as comment text
    (``causal.attn:9: mask m >= n``, made safe by ``comment_text``): the score definitions
    and modifications, the masks, the softmax, the output contraction, and the ``let`` and
    ``view`` lines that index K and V. Empty lists where the spec has none (or no spec AST
    was given)."""

    scores: tuple[str, ...] = ()
    masks: tuple[str, ...] = ()
    softmax: tuple[str, ...] = ()
    output: tuple[str, ...] = ()
    indexing: tuple[str, ...] = ()


def spec_lines(spec: ast.Spec | None) -> SpecLines:
    """Where each kind of statement of ``spec`` sits, for the comments of generated code."""
    if spec is None:
        return SpecLines()
    # spans count lines as the parser does: at "\n" only (str.splitlines breaks at more)
    lines = spec.source.split("\n")
    # the file's name only: generated code must not depend on where the spec was read from
    filename = comment_text(PurePath(spec.filename).name)
    out_names = {s.name.name for s in spec.statements if isinstance(s, ast.OutStmt)}
    roles = ("scores", "masks", "softmax", "output", "indexing")
    found: dict[str, list[str]] = {role: [] for role in roles}
    for stmt in spec.statements:
        span = stmt.span
        text = " ".join(lines[span.line - 1 : span.end_line])
        if span.line == span.end_line:
            text = lines[span.line - 1][span.column - 1 : span.end_column - 1]
        cited = f"{filename}:{span.line}: {comment_text(text)}"
        if isinstance(stmt, ast.MaskStmt):
            found["masks"].append(cited)
        elif isinstance(stmt, ast.LetStmt | ast.ViewStmt):
            found["indexing"].append(cited)
        elif isinstance(stmt, ast.AssignStmt):
            value = stmt.value
            if isinstance(value, ast.Call) and value.func.name == "softmax":
                found["softmax"].append(cited)
            elif stmt.target.name in out_names:
                found["output"].append(cited)
            else:
                found["scores"].append(cited)
    return SpecLines(**{k: tuple(v) for k, v in found.items()})


def lse_permutation(kernel: ir.AttentionKernel) -> tuple[int, ...]:
    """How the log-sum-exp the kernels write (batch axes, then the query axis) is permuted
    into the layout a call returns (``AttentionKernel.lse_order``: the scores' own order)."""
    written = [a.index for a in kernel.batch_axes]
    written += [kernel.query_axis.index] if kernel.query_axis else []
    order = kernel.lse_order or tuple(written)
    return tuple(written.index(i) for i in order)


def score_factors(mods: tuple[ir.Expr, ...]) -> tuple[list[ir.Expr], tuple[ir.Expr, ...]]:
    """The factors of the leading score mods that only multiply the score (a product with
    the score once among its leaves, ``s * a * b``), and the mods after them."""
    factors: list[ir.Expr] = []
    for i, mod in enumerate(mods):
        leaves = _product_leaves(mod)
        if leaves is None or sum(isinstance(leaf, ir.Score) for leaf in leaves) != 1:
            return factors, mods[i:]
        rest = [leaf for leaf in leaves if not isinstance(leaf, ir.Score)]
        if any(isinstance(e, ir.Score) for leaf in rest for e in subexprs(leaf)):
            return factors, mods[i:]
        factors += rest
    return factors, ()


def uniform(expr: ir.Expr) -> bool:
    """A float every score of a call shares: params, dims and literals (no index, tensor or
    score read)."""
    return expr.type == "float" and not any(
        isinstance(e, ir.Index | ir.Load | ir.Score) for e in subexprs(expr)
    )


def scaled_score_mods(
    scale: ir.Expr, mods: tuple[ir.Expr, ...]
) -> tuple[ir.Expr, tuple[ir.Expr, ...]]:
    """(scale, mods) as kernels compute them: where the first mod reads the score once,
    divided or multiplied by a ``uniform`` float (soft-capping's ``cap * tanh(s / cap)``),
    that factor joins the scale (``qk * (scale / cap)``, then ``cap * tanh(s)``), computed
    once a call: a multiply a score, not a division's. On sm_90a ``div.full`` by a uniform
    divisor left three multiplies a score (its range scaling): the softcap kernel ran 735.6
    against 664.4 us folded (4,16,4096,128, H200, docs/performance.md)."""
    if not mods:
        return scale, mods
    first = mods[0]
    if sum(isinstance(e, ir.Score) for e in subexprs(first)) != 1:
        return scale, mods
    readers = (
        e for e in subexprs(first) if isinstance(e, ir.BinOp) and ir.Score() in (e.left, e.right)
    )
    reader = next(readers, None)
    if reader is None or reader.type != "float":
        return scale, mods
    other = reader.right if reader.left == ir.Score() else reader.left
    divides = reader.op == "/" and reader.left == ir.Score()
    if not (divides or reader.op == "*") or not uniform(other):
        return scale, mods
    folded = ir.BinOp(reader.op, scale, other, "float")
    rest = (replaced(first, reader, ir.Score()), *mods[1:])
    return folded, tuple(mod for mod in rest if mod != ir.Score())  # ``s = s`` does nothing


def score_bound(mods: tuple[ir.Expr, ...]) -> ir.Expr | None:
    """A ``uniform`` expression bounding every final score's magnitude (``|s| <= bound``
    wherever a mask lets it through), or None where nothing bounds it. Only the last score
    mod decides it: a squashed score (tanh, within [-1, 1]) times uniform factors, and sums
    of bounded terms (soft-capping: ``|cap * tanh(s / cap)| <= |cap|``)."""
    return _magnitude_bound(mods[-1]) if mods else None


# A fused kernel taking a fixed softmax reference R for scores bounded by B (log2 units) has
# its weights 2^(s2 - R) in [2^-(B + R), 2^(B - R)]: the smallest must stay a normal float
# whose products with V stay normal too, at least 2^-FIXED_REFERENCE_FLOOR, and the largest
# at most 2^64, so a row's sum over 2^31 keys and its output stay far inside float32's
# range. R = B (weights at most 1) keeps the first up to B = 50; past it R =
# FIXED_REFERENCE_FLOOR - B does, and keeps the second up to B = 82, FIXED_REFERENCE_LIMIT
# (soft-capping's cap 56.8; Gemma-2's 50 is B = 72.1). P rounds to 16 bits as it does
# relative to a row max: bfloat16 has float32's exponent range.
FIXED_REFERENCE_FLOOR = 100.0
FIXED_REFERENCE_LIMIT = 82.0
# log2(e): base-2 exponents of natural-log scores
LOG2E = 1.4426950408889634


def fixed_reference_bound(kernel: ir.AttentionKernel) -> ir.Expr | None:
    """The scores' magnitude bound (``score_bound``) where a fused kernel may take a softmax
    reference fixed from it (FIXED_REFERENCE_FLOOR; Triton's FIXED_REFERENCE, the sm_90a
    kernel's ATTNCC_FIXED_REFERENCE, decided by the host a call): none with a sink (its
    logit has no bound), FP8 inputs (their weights carry an offset of their own,
    FP8_WEIGHT_LOG2) or the naive schedule (no online softmax)."""
    if kernel.sink is not None or kernel.fp8 or kernel.schedule == "naive":
        return None
    return score_bound(kernel.score_mods)


def fixed_reference(kernel: ir.AttentionKernel) -> ir.Expr | None:
    """The fixed softmax reference in log2 units, min(B, FIXED_REFERENCE_FLOOR - B) of the
    bound B (``fixed_reference_bound`` times log2(e)), for both targets' kernels to render;
    None where the spec's scores have no bound a kernel takes."""
    bound = fixed_reference_bound(kernel)
    if bound is None:
        return None
    bound2 = ir.BinOp("*", bound, ir.Const(LOG2E, "float"), "float")
    rest = ir.BinOp("-", ir.Const(FIXED_REFERENCE_FLOOR, "float"), bound2, "float")
    return ir.Call("min", (bound2, rest), "float")


def _magnitude_bound(expr: ir.Expr) -> ir.Expr | None:
    one = ir.Const(1.0, "float")
    match expr:
        case ir.Call(func="tanh"):
            return one
        case ir.Unary(op="neg", operand=x):
            return _magnitude_bound(x)
        case ir.BinOp(op="*" | "+" | "-" as op, left=a, right=b, type="float"):
            bounds = (_magnitude_bound(a), _magnitude_bound(b))
            if bounds[0] is None or bounds[1] is None:
                return None
            if op == "*" and one in bounds:  # a factor within [-1, 1] keeps the other's
                return bounds[1] if bounds[0] == one else bounds[0]
            return ir.BinOp("*" if op == "*" else "+", bounds[0], bounds[1], "float")
    if uniform(expr):
        return ir.Call("abs", (expr,), "float")
    return None


def outer_factors(mod: ir.Expr) -> tuple[list[ir.Expr], list[ir.Expr]] | None:
    """A score mod as (``uniform`` factors, the rest) where it is a product with some
    (``cap * tanh(s)``): the factors join log2(e) in one number a call, so the score's move
    to base 2 adds no multiply. None otherwise."""
    leaves = _product_leaves(mod)
    if leaves is None:
        return None
    factors = [leaf for leaf in leaves if uniform(leaf)]
    rest = [leaf for leaf in leaves if not uniform(leaf)]
    return (factors, rest) if factors and rest else None


def _product_leaves(expr: ir.Expr) -> list[ir.Expr] | None:
    """The operands of a float product tree (None where ``expr`` is not a product)."""
    if not (isinstance(expr, ir.BinOp) and expr.op == "*" and expr.type == "float"):
        return None
    leaves = []
    for side in (expr.left, expr.right):
        inner = _product_leaves(side)
        leaves += inner if inner is not None else [side]
    return leaves


def key_block(expr: ir.Expr, key: str) -> bool:
    """``key / B``, B a positive int literal or an int param (its sign checked on the host)."""
    if not (isinstance(expr, ir.BinOp) and expr.op == "/" and expr.type == "int"):
        return False
    if expr.left != ir.Index(key):
        return False
    match expr.right:
        case ir.Param(type="int"):
            return True
        case ir.Const(value=value, type="int"):
            return not isinstance(value, bool) and int(value) > 0
    return False


def key_blocks(kernel: ir.AttentionKernel) -> dict[ir.Expr, str]:
    """The key loop's block indices ``n / B`` (the key index over a positive int param or
    literal: ``k_descale[b, h, n / block_n]``) in the score mods, masks and value scale,
    each named ``key_block_<i>``: a kernel whose key tiles each lie in one block (B a
    multiple of the tile, which its host checks) computes them once a tile."""
    key = kernel.key_axis.index
    exprs = [*kernel.score_mods, *kernel.masks]
    if kernel.value_scale is not None:
        exprs.append(kernel.value_scale)
    found: dict[ir.Expr, str] = {}
    for expr in exprs:
        for e in subexprs(expr):
            if key_block(e, key) and e not in found:
                found[e] = f"key_block_{len(found)}"
    return found


def reads_index_outside(expr: ir.Expr, index: str, named: Mapping[ir.Expr, str]) -> bool:
    """Whether ``expr`` reads ``index`` other than through the ``named`` subexpressions."""
    if expr in named:
        return False
    match expr:
        case ir.Index(name=name):
            return name == index
        case ir.Load(indices=children) | ir.Call(args=children):
            return any(reads_index_outside(c, index, named) for c in children)
        case ir.Unary(operand=x):
            return reads_index_outside(x, index, named)
        case ir.BinOp(left=a, right=b):
            return reads_index_outside(a, index, named) or reads_index_outside(b, index, named)
    return False
