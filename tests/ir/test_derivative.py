"""The symbolic derivative rules, each checked against torch autograd at random points."""

from __future__ import annotations

import pytest
import torch

from attncc.ir import nodes as ir
from attncc.ir.derivative import ZERO, NoDerivative, derivative, score_chain
from attncc.torch_eval import evaluate

S = ir.Score()
BIAS = ir.Load("bias", (ir.Index("h"),), "float")
M, N = ir.Index("m"), ir.Index("n")
CAP = ir.Param("cap", "float")


def f(func: str, *args: ir.Expr) -> ir.Expr:
    return ir.Call(func, args, "float")


def b(op: str, x: ir.Expr, y: ir.Expr) -> ir.Expr:
    kind = "int" if x.type == y.type == "int" else "float"
    return ir.BinOp(op, x, y, kind)


def c(value: float) -> ir.Expr:
    return ir.Const(value, "float")


CASES = {
    "add": b("+", S, BIAS),
    "sub": b("-", S, b("*", BIAS, b("-", M, N))),  # ALiBi
    "mul": b("*", S, BIAS),
    "div": b("/", S, b("+", BIAS, c(3.0))),
    "neg": ir.Unary("neg", b("*", S, BIAS), "float"),
    "softcap": b("*", CAP, f("tanh", b("/", S, CAP))),
    "exp": f("exp", b("*", S, BIAS)),
    "log": f("log", b("+", b("*", S, S), BIAS)),
    "sqrt": f("sqrt", b("+", b("*", S, S), b("*", BIAS, BIAS))),
    "sin": f("sin", b("*", S, BIAS)),
    "cos": f("cos", b("+", S, BIAS)),
    "tan": f("tan", b("*", c(0.3), b("+", S, BIAS))),
    "sigmoid": f("sigmoid", b("-", S, BIAS)),
    "erf": f("erf", b("*", S, BIAS)),
    "pow_const": f("pow", b("+", b("*", S, S), c(1.0)), c(1.5)),
    "pow_var": f("pow", b("+", b("*", S, S), c(1.0)), b("*", BIAS, BIAS)),
    "pow_int": f("pow", S, ir.Const(3, "int")),
    "abs": f("abs", b("-", S, BIAS)),
    "min": f("min", S, BIAS),
    "max": f("max", b("*", S, c(2.0)), BIAS),
    "where": f("where", b(">", M, N), b("*", S, BIAS), b("-", S, BIAS)),
    "floor": b("+", S, f("floor", b("*", S, BIAS))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_matches_autograd(name: str) -> None:
    expr = CASES[name]
    gen = torch.Generator().manual_seed(hash(name) % 1000)
    score = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64).requires_grad_(True)
    bias = (torch.rand(3, generator=gen, dtype=torch.float64) + 0.5).requires_grad_(True)
    indices = {
        "h": torch.arange(3).reshape(3, 1, 1),
        "m": torch.arange(4).reshape(1, 4, 1),
        "n": torch.arange(5).reshape(1, 1, 5),
    }
    params = {"cap": 2.5}

    def ev(e: ir.Expr, s: torch.Tensor) -> torch.Tensor:
        value = evaluate(e, indices, {}, params, {"bias": bias}, s, torch.float64)
        return torch.broadcast_to(torch.as_tensor(value, dtype=torch.float64), score.shape)

    out = ev(expr, score)
    d_score, d_bias = torch.autograd.grad(out.sum(), [score, bias], allow_unused=True)
    d_bias = torch.zeros_like(bias) if d_bias is None else d_bias
    with torch.no_grad():
        symbolic_score = ev(derivative(expr, S), score)
        # d(out)/d(bias[h]) per element, summed over the elements that load it
        symbolic_bias = ev(derivative(expr, BIAS), score).sum((1, 2))
    torch.testing.assert_close(symbolic_score, d_score, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(symbolic_bias, d_bias, rtol=1e-10, atol=1e-10)


def test_integer_and_unread_parts_have_no_derivative() -> None:
    assert derivative(b("-", M, N), S) == ZERO
    assert derivative(b("*", c(2.0), BIAS), S) == ZERO
    # the ALiBi modification: score passes through unchanged
    chain = score_chain((CASES["sub"],))
    d_score, d_loads = chain[0]
    assert d_score == ir.Const(1.0, "float")
    assert set(d_loads) == {BIAS}


def test_missing_rule_is_named() -> None:
    with pytest.raises(NoDerivative, match="rem"):
        derivative(ir.Call("rem", (S,), "float"), S)
