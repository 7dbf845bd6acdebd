"""Symbolic derivatives of IR expressions: how a score modification's output moves with the
score it reads and with each float tensor element it loads.

``derivative(expr, wrt)`` is d(expr)/d(wrt) as an IR expression, for ``wrt`` the score
(``ir.Score()``) or one float ``ir.Load`` (every occurrence of that same load counts).
The backward kernels render these next to the recomputed scores (the chain rule through the
modifications, ``score_chain``).

Rules: the usual ones for + - * /, neg, exp, log, sqrt, tanh, sin, cos, tan, sigmoid, erf,
pow (``b * a^(b-1) * a'`` plus ``a^b * log(a) * b'`` when the exponent varies); abs, min
and max take the derivative of the branch they pick (abs: sign of ``a``, +1 at 0; min/max:
the left operand on a tie) and ``where`` that of the branch its condition picks; floor and
ceil are flat (0). Integer and boolean subexpressions (indices, masks, integer arithmetic,
comparisons) have no derivative: 0. Zeros and ones are folded, so a modification that does
not read ``wrt`` gives the constant 0.

``NoDerivative`` names a function without a rule; it is raised when a rule is missing, never
silently treated as 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from attncc.ir import nodes as ir
from attncc.ir.verify import subexprs

__all__ = ["NoDerivative", "derivative", "reads", "score_chain"]

ZERO = ir.Const(0.0, "float")
ONE = ir.Const(1.0, "float")


class NoDerivative(ValueError):
    """An expression the derivative rules do not cover (the message names what)."""


def reads(expr: ir.Expr, wrt: ir.Expr) -> bool:
    return any(e == wrt for e in subexprs(expr))


def _is(e: ir.Expr, value: float) -> bool:
    return isinstance(e, ir.Const) and e.type == "float" and float(e.value) == value


def _float(e: ir.Expr) -> ir.Expr:
    """``e`` as a float operand (an int constant becomes a float literal)."""
    if isinstance(e, ir.Const) and e.type == "int":
        return ir.Const(float(e.value), "float")
    return e


def add(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if _is(a, 0.0):
        return b
    if _is(b, 0.0):
        return a
    return ir.BinOp("+", a, b, "float")


def sub(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if _is(b, 0.0):
        return a
    if _is(a, 0.0):
        return neg(b)
    return ir.BinOp("-", a, b, "float")


def mul(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if _is(a, 0.0) or _is(b, 0.0):
        return ZERO
    if _is(a, 1.0):
        return _float(b) if b.type != "float" else b
    if _is(b, 1.0):
        return _float(a) if a.type != "float" else a
    return ir.BinOp("*", _float(a), _float(b), "float")


def div(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if _is(a, 0.0):
        return ZERO
    if _is(b, 1.0):
        return a
    return ir.BinOp("/", _float(a), _float(b), "float")


def neg(a: ir.Expr) -> ir.Expr:
    if _is(a, 0.0):
        return ZERO
    return ir.Unary("neg", a, "float")


def call(func: str, *args: ir.Expr) -> ir.Expr:
    return ir.Call(func, args, "float")


def _where(cond: ir.Expr, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if a == b:
        return a
    return ir.Call("where", (cond, _float(a), _float(b)), "float")


def derivative(expr: ir.Expr, wrt: ir.Score | ir.Load) -> ir.Expr:
    """d(expr)/d(wrt), simplified; ``ZERO`` when ``expr`` does not depend on ``wrt``."""
    if expr.type != "float" or not reads(expr, wrt):
        return ZERO
    if expr == wrt:
        return ONE

    def d(e: ir.Expr) -> ir.Expr:
        return derivative(e, wrt)

    match expr:
        case ir.Unary(op="neg", operand=a):
            return neg(d(a))
        case ir.BinOp(op="+", left=a, right=b):
            return add(d(a), d(b))
        case ir.BinOp(op="-", left=a, right=b):
            return sub(d(a), d(b))
        case ir.BinOp(op="*", left=a, right=b):
            return add(mul(d(a), b), mul(a, d(b)))
        case ir.BinOp(op="/", left=a, right=b):
            # (a' b - a b') / b^2, as a'/b - (a/b) b'/b
            return sub(div(d(a), b), mul(div(expr, b), d(b)))
        case ir.Call(func=func, args=args):
            return _call(expr, func, args, d)
    raise NoDerivative(f"no derivative rule for {type(expr).__name__} {getattr(expr, 'op', '')}")


def _call(
    expr: ir.Call, func: str, args: tuple[ir.Expr, ...], d: Callable[[ir.Expr], ir.Expr]
) -> ir.Expr:
    a = args[0]
    match func:
        case "exp":
            return mul(expr, d(a))
        case "log":
            return div(d(a), a)
        case "sqrt":
            return div(d(a), mul(ir.Const(2.0, "float"), expr))
        case "tanh":
            return mul(sub(ONE, mul(expr, expr)), d(a))
        case "sin":
            return mul(call("cos", a), d(a))
        case "cos":
            return neg(mul(call("sin", a), d(a)))
        case "tan":
            return mul(add(ONE, mul(expr, expr)), d(a))
        case "sigmoid":
            return mul(mul(expr, sub(ONE, expr)), d(a))
        case "erf":
            scale = ir.Const(2.0 / math.sqrt(math.pi), "float")
            return mul(mul(scale, call("exp", neg(mul(a, a)))), d(a))
        case "floor" | "ceil":
            return ZERO
        case "pow":
            b = args[1]
            base = mul(mul(b, call("pow", a, sub(_float(b), ONE))), d(a))
            db = d(b)
            if _is(db, 0.0):
                return base
            return add(base, mul(mul(expr, call("log", a)), db))
        case "abs":
            negative = ir.BinOp("<", a, ir.Const(0.0, "float"), "bool")
            return _where(negative, neg(d(a)), d(a))
        case "min" | "max":
            b = args[1]
            op = "<=" if func == "min" else ">="
            return _where(ir.BinOp(op, a, b, "bool"), d(a), d(b))
        case "where":
            return _where(args[0], d(args[1]), d(args[2]))
    raise NoDerivative(f"no derivative rule for the function {func}()")


def score_chain(mods: tuple[ir.Expr, ...]) -> list[tuple[ir.Expr, dict[ir.Load, ir.Expr]]]:
    """For each score modification, in order: d(mod)/d(score) and d(mod)/d(load) for every
    float load it reads (each in terms of the score the modification reads)."""
    chain = []
    for mod in mods:
        loads = {
            e: derivative(mod, e)
            for e in subexprs(mod)
            if isinstance(e, ir.Load) and e.type == "float"
        }
        chain.append((derivative(mod, ir.Score()), loads))
    return chain
