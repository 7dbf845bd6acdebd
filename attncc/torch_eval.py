"""Evaluate IR expressions with torch ops: the FlexAttention score_mod / mask_mod of a spec.

The benchmark compares every spec against ``torch.compile(flex_attention)`` running the
same math; these callbacks are built from the IR (no source text, no ``eval``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from attncc.ir import nodes as ir
from attncc.spec.functions import require_all, widened

_FUNCS: dict[str, Callable[..., Any]] = {
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "tanh": torch.tanh,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "pow": torch.pow,
    "abs": torch.abs,
    "min": torch.minimum,
    "max": torch.maximum,
    "where": torch.where,
}
require_all(_FUNCS, "the torch evaluator")


def _tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.tensor(x)


def _binary(op: str, a: Any, b: Any, integer: bool) -> Any:
    if op == "/" and integer:
        if isinstance(a, int) and isinstance(b, int):
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        return torch.div(_tensor(a), _tensor(b), rounding_mode="trunc")
    if op == "%" and integer:
        return a - _binary("/", a, b, True) * b
    if op == "and":
        return a & b
    if op == "or":
        return a | b
    return {
        "+": lambda: a + b,
        "-": lambda: a - b,
        "*": lambda: a * b,
        "/": lambda: a / b,
        "==": lambda: a == b,
        "!=": lambda: a != b,
        "<": lambda: a < b,
        "<=": lambda: a <= b,
        ">": lambda: a > b,
        ">=": lambda: a >= b,
    }[op]()


def evaluate(
    expr: ir.Expr,
    indices: Mapping[str, Any],
    sizes: Mapping[str, int],
    params: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    score: Any = None,
    float_dtype: torch.dtype = torch.float32,
    funcs: Mapping[str, Callable[..., Any]] | None = None,
) -> Any:
    """``expr`` with torch ops; int operands of float functions become ``float_dtype``
    (float32, as in the kernels; float64 for the gradient reference). ``funcs``: built-in
    functions computed otherwise (by name; the benchmark's Flex anchor: an approximate
    tanh)."""
    table = _FUNCS if funcs is None else {**_FUNCS, **funcs}
    return _Evaluation(indices, sizes, params, tensors, score, float_dtype, table).ev(expr)


class _Evaluation:
    """One ``evaluate`` call's bindings. A method recursing through ``self``, not a nested
    function calling itself: that closure referenced its own cell, a reference cycle that
    held the tensors (a training step's inputs) until Python's garbage collector ran."""

    def __init__(
        self,
        indices: Mapping[str, Any],
        sizes: Mapping[str, int],
        params: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        score: Any,
        float_dtype: torch.dtype,
        funcs: Mapping[str, Callable[..., Any]],
    ) -> None:
        self.indices, self.sizes, self.params, self.tensors = indices, sizes, params, tensors
        self.score, self.float_dtype, self.funcs = score, float_dtype, funcs

    def ev(self, e: ir.Expr) -> Any:
        ev = self.ev
        match e:
            case ir.Const(value=value):
                return value
            case ir.Index(name=name):
                return self.indices[name]
            case ir.Dim(name=name):
                return self.sizes[name]
            case ir.Param(name=name):
                return self.params[name]
            case ir.Score():
                return self.score
            case ir.Load(tensor=name, indices=subs):
                return self.tensors[name][tuple(ev(s) for s in subs)]
            case ir.Unary(op="neg", operand=x):
                return -ev(x)
            case ir.Unary(op="not", operand=x):
                value = ev(x)
                return ~value if isinstance(value, torch.Tensor) else not value
            case ir.BinOp(op=op, left=a, right=b):
                integer = a.type == "int" and b.type == "int"
                return _binary(op, ev(a), ev(b), integer)
            case ir.Call(func=func, args=args):
                values = [_tensor(ev(a)) if func != "where" else ev(a) for a in args]
                values = [
                    _tensor(v).to(self.float_dtype) if widen else v
                    for v, widen in zip(values, widened(func, [a.type for a in args]), strict=True)
                ]
                return self.funcs[func](*values)
        raise AssertionError(e)
