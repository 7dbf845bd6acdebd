"""Render IR expressions as CUDA C++ (device code of the CUDA backend).

Names get the prefixes of ``attncc.codegen.exprs`` (``i_`` index, ``d_`` dim, ``p_`` param,
``t_`` tensor pointer, ``s_`` stride), re-checked by ``safe_name``, so no spec name can
collide with a template local or a C++ keyword.

Types follow the IR: ``int`` expressions are C ``int`` (32-bit offsets, as in the Triton
backend; ``i64`` tensor elements stay ``long long``), ``float`` expressions are ``float``
(ints are cast first, so ``1 / D`` never divides integers), ``bool`` is ``bool``. C's
integer ``/`` and ``%`` truncate toward zero, the IR's semantics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from attncc.codegen.exprs import (
    dim_var,
    divisor_vars,
    fast_division,
    float_args,
    param_var,
    stride_var,
    tensor_var,
)
from attncc.ir import nodes as ir
from attncc.ir.verify import indices_of
from attncc.spec.functions import require_all

# C++ element type of each spec dtype; "float" inputs share the kernel's float type ``elem_t``
ELEMENT_TYPES = {
    "float": "elem_t",
    "f16": "f16_t",
    "bf16": "bf16_t",
    "f8e4m3": "f8e4m3_t",
    "f32": "float",
    "i32": "int",
    "i64": "long long",
    "bool": "bool",
}

# Each built-in's CUDA rendering from its rendered arguments (``float`` ones already cast), for
# float results, and for int results of the ``numeric`` functions.
_FLOAT_FUNCS: dict[str, Callable[..., str]] = {
    "exp": lambda x: f"expf({x})",
    "log": lambda x: f"logf({x})",
    "sqrt": lambda x: f"sqrtf({x})",
    # by the kernel's element type: tanh.approx.f32 for some (plan.TANH_APPROX_DTYPES)
    "tanh": lambda x: f"attncc_tanh_as<elem_t>({x})",
    "sin": lambda x: f"sinf({x})",
    "cos": lambda x: f"cosf({x})",
    "tan": lambda x: f"tanf({x})",
    # the division as Triton's tl.sigmoid does it (div.full, attncc_div)
    "sigmoid": lambda x: f"attncc_div(1.0f, 1.0f + expf(-({x})))",
    "erf": lambda x: f"erff({x})",
    "floor": lambda x: f"floorf({x})",
    "ceil": lambda x: f"ceilf({x})",
    "pow": lambda a, b: f"powf({a}, {b})",
    "abs": lambda x: f"fabsf({x})",
    "min": lambda a, b: f"fminf({a}, {b})",
    "max": lambda a, b: f"fmaxf({a}, {b})",
    "where": lambda c, a, b: f"(({c}) ? {a} : {b})",
}
require_all(_FLOAT_FUNCS, "CUDA expressions")
_INT_FUNCS: dict[str, Callable[..., str]] = {
    "abs": lambda x: f"abs({x})",
    "min": lambda a, b: f"min({a}, {b})",
    "max": lambda a, b: f"max({a}, {b})",
    "where": lambda c, a, b: f"(({c}) ? {a} : {b})",
}


@dataclass(frozen=True)
class CudaEnv:
    """How names read in device code: each index is a C++ variable (or expression).

    ``bounded`` indices may run past their dim (padded query rows, keys past the end):
    loads through them are guarded, as in the Triton backend. ``values`` are subexpressions
    the kernel has already computed into variables (read by name, not recomputed).
    """

    indices: Mapping[str, str]
    tensors: Mapping[str, ir.TensorArg]
    bounded: frozenset[str] = frozenset()
    score: str = "s"
    values: Mapping[ir.Expr, str] = field(default_factory=dict)


def float_literal(value: float) -> str:
    if math.isnan(value):
        return "__int_as_float(0x7fc00000)"
    if math.isinf(value):
        return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
    text = repr(float(value))
    return f"{text}f"


def cuda_expr(expr: ir.Expr, env: CudaEnv) -> str:
    if expr in env.values:
        return env.values[expr]
    match expr:
        case ir.Const(value=value, type=t):
            if isinstance(value, bool) or t == "bool":
                return "true" if value else "false"
            return float_literal(float(value)) if t == "float" else repr(int(value))
        case ir.Index(name=name):
            return env.indices[name]
        case ir.Dim(name=name):
            return dim_var(name)
        case ir.Param(name=name):
            return param_var(name)
        case ir.Score():
            return env.score
        case ir.Load(tensor=name, indices=subs):
            return _load(expr, name, subs, env)
        case ir.Unary(op="neg", operand=x):
            return f"(-{cuda_expr(x, env)})"
        case ir.Unary(op="not", operand=x):
            return f"(!({cuda_expr(x, env)}))"
        case ir.BinOp(op=op, left=a, right=b) if fast_division(expr):
            magic, shift = divisor_vars(b.name)  # type: ignore[union-attr]
            left = cuda_expr(a, env)
            if op == "/":
                return f"attncc_udiv({left}, {magic}, {shift})"
            return f"attncc_umod({left}, {cuda_expr(b, env)}, {magic}, {shift})"
        case ir.BinOp(op=op, left=a, right=b):
            left, right = cuda_expr(a, env), cuda_expr(b, env)
            if op == "and":
                return f"(({left}) && ({right}))"
            if op == "or":
                return f"(({left}) || ({right}))"
            if expr.type == "float" or (op in ir.COMPARE_OPS and "float" in (a.type, b.type)):
                left, right = _as_float(a, left), _as_float(b, right)
                if op == "%":
                    return f"fmodf({left}, {right})"
                if op == "/" and expr.type == "float":
                    return f"attncc_div({left}, {right})"  # Triton's division (div.full)
            return f"({left} {op} {right})"
        case ir.Call(func=func, args=args):
            rendered = [
                _as_float(x, cuda_expr(x, env)) if widen else cuda_expr(x, env)
                for x, widen in zip(args, float_args(expr), strict=True)
            ]
            table = _INT_FUNCS if expr.type == "int" else _FLOAT_FUNCS
            return table[func](*rendered)
    raise AssertionError(expr)


def _as_float(expr: ir.Expr, text: str) -> str:
    return text if expr.type == "float" else f"((float){text})"


def _load(expr: ir.Load, name: str, subs: tuple[ir.Expr, ...], env: CudaEnv) -> str:
    arg = env.tensors[name]
    rendered = [cuda_expr(sub, env) for sub in subs]
    offset = " + ".join(
        f"({text}) * {stride_var(name, axis)}" for axis, text in enumerate(rendered)
    )
    read = f"{tensor_var(name)}[{offset}]"
    if expr.type == "float":
        read = f"to_float({read})"
    bounds = [
        f"({text}) >= 0 && ({text}) < {dim_var(dim)}"
        for sub, text, dim in zip(subs, rendered, arg.dims, strict=True)
        if _needs_bounds(sub, env)
    ]
    if not bounds:
        return f"({read})"
    zero = {"float": "0.0f", "bool": "false"}.get(expr.type, "0")
    return f"(({' && '.join(bounds)}) ? {read} : {zero})"


def _needs_bounds(sub: ir.Expr, env: CudaEnv) -> bool:
    """Plain batch indices are in range by construction; anything else is checked."""
    if isinstance(sub, ir.Index) and sub.name not in env.bounded:
        return False
    return bool(indices_of(sub) & env.bounded) or not isinstance(sub, ir.Index)


def pointer_type(arg: ir.TensorArg) -> str:
    return f"const {ELEMENT_TYPES[arg.dtype]}* __restrict__"
