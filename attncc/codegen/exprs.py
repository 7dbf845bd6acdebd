"""Render IR expressions as Triton device code or as host Python.

Every user name reaches generated code with a prefix (``i_`` index, ``d_`` dim, ``p_`` param,
``t_`` tensor pointer, ``s_`` stride), so no spec name can collide with a template local or a
Python keyword. Names were already checked against the grammar's NAME pattern; ``safe_name``
re-checks before anything is rendered.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from attncc.ir import nodes as ir
from attncc.ir.verify import indices_of
from attncc.spec.functions import require_all, widened

_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*\Z")


def safe_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"refusing to render {name!r}: not a spec identifier")
    return name


def index_var(name: str) -> str:
    return f"i_{safe_name(name)}"


def dim_var(name: str) -> str:
    return f"d_{safe_name(name)}"


def param_var(name: str) -> str:
    return f"p_{safe_name(name)}"


def tensor_var(name: str) -> str:
    return f"t_{safe_name(name)}"


def stride_var(name: str, axis: int) -> str:
    return f"s_{safe_name(name)}_{axis}"


def divisor_vars(dim: str) -> tuple[str, str]:
    """The magic multiplier and shift a kernel divides by ``dim`` with (``fast_division``)."""
    return f"dmul_{safe_name(dim)}", f"dshift_{safe_name(dim)}"


def fast_division(expr: ir.Expr) -> bool:
    """An integer ``/`` or ``%`` of a non-negative index expression by a dim (a paged cache's
    ``n / PAGE``, ``n % PAGE``). Kernels compute it with a multiply-high by host-computed
    magic numbers (``_divisor_magic``) instead of an integer division, which GPUs emulate in
    ~25 instructions: per key of a paged cache, that was half of the gap to a contiguous
    cache at batch 1 (docs/performance.md). Valid for dividends in [0, 2^31)."""
    return (
        isinstance(expr, ir.BinOp)
        and expr.op in ("/", "%")
        and expr.type == "int"
        and isinstance(expr.right, ir.Dim)
        and non_negative(expr.left)
        # per row or key, where a division's cost adds up (one of dims is a scalar a program)
        and bool(indices_of(expr.left))
    )


def non_negative(expr: ir.Expr) -> bool:
    """Provably >= 0 in every kernel: indices, dims, non-negative constants, and sums,
    products and fast divisions of those."""
    match expr:
        case ir.Index() | ir.Dim():
            return True
        case ir.Const(value=value, type="int"):
            return not isinstance(value, bool) and int(value) >= 0
        case ir.BinOp(op="+" | "*", left=a, right=b):
            return non_negative(a) and non_negative(b)
        case ir.BinOp():
            return fast_division(expr)
    return False


# Each built-in's Triton rendering from its rendered arguments (already float32 where the
# function is a float one). Only tl.* functions: the interpreter has no libdevice. Composites
# repeat an argument's text; Triton's compiler computes the common subexpression once.
_TRITON_FUNCS: dict[str, Callable[..., str]] = {
    "exp": lambda x: f"tl.exp({x})",
    "log": lambda x: f"tl.log({x})",
    "sqrt": lambda x: f"tl.sqrt({x})",
    "tanh": lambda x: f"_tanh({x})",
    "sin": lambda x: f"tl.sin({x})",
    "cos": lambda x: f"tl.cos({x})",
    "tan": lambda x: f"(tl.sin({x}) / tl.cos({x}))",
    # tl.sigmoid is a jit function the interpreter cannot call from a generated module
    "sigmoid": lambda x: f"(1.0 / (1.0 + tl.exp(-({x}))))",
    "erf": lambda x: f"tl.erf({x})",
    "floor": lambda x: f"tl.floor({x})",
    "ceil": lambda x: f"tl.ceil({x})",
    "pow": lambda a, b: _triton_pow(a, b),
    "abs": lambda x: f"tl.abs({x})",
    "min": lambda a, b: f"tl.minimum({a}, {b})",
    "max": lambda a, b: f"tl.maximum({a}, {b})",
    "where": lambda c, a, b: f"tl.where({c}, {a}, {b})",
}
require_all(_TRITON_FUNCS, "Triton expressions")


def _triton_pow(a: str, b: str) -> str:
    """C's ``pow`` through the ``_pow`` device helper. A helper, not an inline expression: the
    special cases read each argument eight times, so nested calls grew the source 8x a level.
    A literal argument becomes a float32 scalar tensor: Triton passes a Python float to a
    ``@triton.jit`` callee as a constexpr, which ``tl.floor`` and ``tl.log2`` refuse."""
    return f"_pow({_scalar_tensor(a)}, {_scalar_tensor(b)})"


def _scalar_tensor(text: str) -> str:
    try:
        return f"tl.full((), {float(text)!r}, tl.float32)"
    except ValueError:
        return text


_HOST_FUNCS: dict[str, Callable[..., str]] = {
    "exp": lambda x: f"math.exp({x})",
    "log": lambda x: f"math.log({x})",
    "sqrt": lambda x: f"math.sqrt({x})",
    "tanh": lambda x: f"math.tanh({x})",
    "sin": lambda x: f"math.sin({x})",
    "cos": lambda x: f"math.cos({x})",
    "tan": lambda x: f"math.tan({x})",
    "sigmoid": lambda x: f"(1.0 / (1.0 + math.exp(-({x}))))",
    "erf": lambda x: f"math.erf({x})",
    "floor": lambda x: f"float(math.floor({x}))",
    "ceil": lambda x: f"float(math.ceil({x}))",
    "pow": lambda a, b: f"math.pow({a}, {b})",
    "abs": lambda x: f"abs({x})",
    "min": lambda a, b: f"min({a}, {b})",
    "max": lambda a, b: f"max({a}, {b})",
    "where": lambda c, a, b: f"_where({c}, {a}, {b})",
}
require_all(_HOST_FUNCS, "host expressions")


def float_args(call: ir.Call) -> tuple[bool, ...]:
    """Which arguments of ``call`` are converted from int to float first (``widened``)."""
    return widened(call.func, [a.type for a in call.args])


@dataclass(frozen=True)
class TritonEnv:
    """How names read inside a kernel: index variables may be scalars or tile vectors.

    ``vector_indices`` are indices that vary within a tile (query rows, key columns): loads
    through them are bounds-masked, since padded rows and columns run past the tensor.
    """

    indices: Mapping[str, str]
    tensors: Mapping[str, ir.TensorArg]
    vector_indices: frozenset[str] = frozenset()
    score: str = "s"
    # subexpressions already held in a variable (a key tile's page-table entries)
    named: Mapping[ir.Expr, str] = field(default_factory=dict)
    # the kernel's expression of its call's float element type (a compile-time value), by
    # which tanh picks its implementation (_tanh_as); None: the exact one, whatever the dtype
    float_type: str | None = None


def triton_expr(expr: ir.Expr, env: TritonEnv) -> str:
    if expr in env.named:
        return env.named[expr]
    match expr:
        case ir.Const(value=value, type=t):
            if isinstance(value, bool):
                return "True" if value else "False"
            return repr(float(value)) if t == "float" else repr(int(value))
        case ir.Index(name=name):
            return env.indices[name]
        case ir.Dim(name=name):
            return dim_var(name)
        case ir.Param(name=name):
            return param_var(name)
        case ir.Score():
            return env.score
        case ir.Load(tensor=name, indices=subs):
            arg = env.tensors[name]
            offset = " + ".join(
                f"({triton_expr(sub, env)}) * {stride_var(name, axis)}"
                for axis, sub in enumerate(subs)
            )
            bounds = [
                f"({triton_expr(sub, env)} >= 0) & ({triton_expr(sub, env)} < {dim_var(dim)})"
                for sub, dim in zip(subs, arg.dims, strict=True)
                if _needs_bounds(sub, env)
            ]
            load = f"tl.load({tensor_var(name)} + {offset}"
            load += f", mask={' & '.join(bounds)}, other=0)" if bounds else ")"
            return load if expr.type != "float" else f"{load}.to(tl.float32)"
        case ir.Unary(op="neg", operand=x):
            return f"(-{triton_expr(x, env)})"
        case ir.Unary(op="not", operand=x):
            # not ~x: a comparison of constants is a Python bool when the kernel is traced,
            # and ~True is -2, which tl.where takes as true (`mask not (0 == 0)` masked nothing)
            return f"(({triton_expr(x, env)}) == 0)"
        case ir.BinOp(op=op, left=a, right=b):
            left, right = triton_expr(a, env), triton_expr(b, env)
            if op == "and":
                return f"(({left}) & ({right}))"
            if op == "or":
                return f"(({left}) | ({right}))"
            if fast_division(expr):
                magic, shift = divisor_vars(b.name)  # type: ignore[union-attr]
                if op == "/":
                    return f"_udiv({left}, {magic}, {shift})"
                return f"_umod({left}, {right}, {magic}, {shift})"
            if op == "/" and expr.type == "int":
                return f"({left} // {right})"  # Triton's integer // truncates toward zero
            return f"({left} {op} {right})"
        case ir.Call(func=func, args=args):
            rendered = [
                _triton_float(a, triton_expr(a, env)) if widen else triton_expr(a, env)
                for a, widen in zip(args, float_args(expr), strict=True)
            ]
            if func == "tanh" and env.float_type is not None:
                return f"_tanh_as({rendered[0]}, {env.float_type})"
            return _TRITON_FUNCS[func](*rendered)
    raise AssertionError(expr)


def _triton_float(expr: ir.Expr, text: str) -> str:
    """An int expression as float32: a literal as a float literal, anything else through
    ``tl.cast`` (which also takes the Python ints Triton passes for arguments equal to 1)."""
    if isinstance(expr, ir.Const):
        return repr(float(expr.value))
    return f"tl.cast({text}, tl.float32)"


def _needs_bounds(sub: ir.Expr, env: TritonEnv) -> bool:
    """Plain batch indices are in range by construction; anything else is checked."""
    if isinstance(sub, ir.Index) and sub.name not in env.vector_indices:
        return False
    return bool(indices_of(sub) & env.vector_indices) or not isinstance(sub, ir.Index)


def host_expr(expr: ir.Expr, dims: str = "dims", params: str = "params") -> str:
    """Host Python for a param default or a subscript check: ``dims``/``params`` are dicts."""
    match expr:
        case ir.Const(value=value, type=t):
            return repr(float(value)) if t == "float" else repr(value)
        case ir.Dim(name=name):
            return f"{dims}[{safe_name(name)!r}]"
        case ir.Param(name=name):
            return f"{params}[{safe_name(name)!r}]"
        case ir.Index(name=name):
            return index_var(name)
        case ir.Unary(op="neg", operand=x):
            return f"(-{host_expr(x, dims, params)})"
        case ir.Unary(op="not", operand=x):
            return f"(not {host_expr(x, dims, params)})"
        case ir.BinOp(op=op, left=a, right=b):
            left, right = host_expr(a, dims, params), host_expr(b, dims, params)
            if op == "/" and expr.type == "int":
                return f"_idiv({left}, {right})"
            if op == "%" and expr.type == "int":
                return f"_imod({left}, {right})"
            return f"({left} {op} {right})"
        case ir.Call(func=func, args=args):
            rendered = [
                f"float({host_expr(a, dims, params)})" if widen else host_expr(a, dims, params)
                for a, widen in zip(args, float_args(expr), strict=True)
            ]
            return _HOST_FUNCS[func](*rendered)
        case ir.Score() | ir.Load():
            raise ValueError("host expressions cannot read scores or tensors")
    raise AssertionError(expr)
