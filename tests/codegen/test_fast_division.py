"""Integer division of index expressions by a dim: a multiply-high by magic numbers the host
computes, in both backends; anything that may be negative keeps the plain operator."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import attncc
from attncc.codegen import plan
from attncc.codegen.exprs import TritonEnv, fast_division, triton_expr
from attncc.ir import nodes as ir

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
n, m, page = ir.Index("n"), ir.Index("m"), ir.Dim("PAGE")


def div(left: ir.Expr, right: ir.Expr, op: str = "/") -> ir.BinOp:
    return ir.BinOp(op, left, right, "int")


@pytest.mark.parametrize(
    ("expr", "fast"),
    [
        (div(n, page), True),
        (div(n, page, "%"), True),
        (div(ir.BinOp("+", n, ir.Const(3, "int"), "int"), page), True),
        (div(div(n, page), ir.Dim("G")), True),  # a fast quotient is non-negative too
        (div(ir.BinOp("-", m, n, "int"), page), False),  # may be negative
        (div(n, ir.Const(4, "int")), False),  # a constant divisor: the compiler's own
        (div(ir.Dim("H"), ir.Dim("KVH")), False),  # one scalar a program: not worth it
        (div(ir.Load("doc", (n,), "int"), page), False),  # a loaded value may be negative
        (ir.BinOp("/", n, page, "float"), False),
    ],
)
def test_which_divisions_are_fast(expr: ir.BinOp, fast: bool) -> None:
    assert fast_division(expr) == fast


def test_triton_renders_fast_divisions_through_the_helpers() -> None:
    env = TritonEnv({"n": "offs_n", "m": "offs_m"}, {})
    assert triton_expr(div(n, page), env) == "_udiv(offs_n, dmul_PAGE, dshift_PAGE)"
    assert triton_expr(div(n, page, "%"), env) == "_umod(offs_n, d_PAGE, dmul_PAGE, dshift_PAGE)"
    assert (
        triton_expr(div(ir.BinOp("-", m, n, "int"), page), env) == "((offs_m - offs_n) // d_PAGE)"
    )


def test_only_the_paged_example_passes_magic_numbers() -> None:
    for path in sorted(EXAMPLES.glob("*.attn")):
        kernel = attncc.optimise(path)[1]
        expected = ("PAGE",) if path.stem == "paged_decode" else ()
        assert plan.divisor_dims(kernel) == expected, path.stem
    args = [a.var for a in plan.launch_args(attncc.optimise(EXAMPLES / "paged_decode.attn")[1])]
    assert args[-3:-1] == ["dmul_PAGE", "dshift_PAGE"]  # after the dims, before the params


@pytest.fixture(scope="module")
def divisor_magic() -> object:
    """The host helper as the generated module defines it."""
    return attncc.compile(EXAMPLES / "paged_decode.attn").module(False)._divisor_magic


def kernel_quotient(value: int, magic: int, shift: int) -> int:
    """What the kernels compute, in 32-bit unsigned arithmetic."""
    u = value & 0xFFFFFFFF
    high = (u * (magic & 0xFFFFFFFF)) >> 32
    return ((high + u) & 0xFFFFFFFF) >> shift


def test_magic_numbers_divide_every_dividend_below_2_31(divisor_magic: object) -> None:
    rng = random.Random(0)
    divisors = [*range(1, 300), *(1 << k for k in range(31)), (1 << 31) - 1, 12345, 65537]
    divisors += [rng.randrange(1, 1 << 31) for _ in range(300)]
    for d in divisors:
        magic, shift = divisor_magic(d)  # type: ignore[operator]
        assert -(1 << 31) <= magic < (1 << 31) and 0 <= shift <= 31  # 32-bit kernel ints
        edges = [0, 1, d - 1, d, d + 1, 2 * d - 1, (1 << 31) - 1, (1 << 31) - 1 - d]
        for value in edges + [rng.randrange(0, 1 << 31) for _ in range(50)]:
            if 0 <= value < (1 << 31):
                assert kernel_quotient(value, magic, shift) == value // d, (d, value)
