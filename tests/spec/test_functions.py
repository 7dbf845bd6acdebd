"""The built-in function table: every entry is typed by the checker, evaluated by the reference,
rendered by both backends and the host, with the int-to-float rule applied the same way."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from attncc.api import build
from attncc.codegen import cuda as cuda_backend
from attncc.codegen.cuda_exprs import CudaEnv, cuda_expr
from attncc.codegen.exprs import TritonEnv, host_expr, triton_expr
from attncc.ir import lower
from attncc.ir import nodes as ir
from attncc.ir.verify import subexprs
from attncc.reference import reference
from attncc.spec import SpecError, check, parse
from attncc.spec.functions import BUILTINS, FUNCTION_NAMES, RESERVED_NAMES

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc")

# arguments in the domain of every function, as spec text: ints, then floats
INT_ARGS = {1: ("(n + 1)",), 2: ("(n + 1)", "2"), 3: ("m >= n", "(n + 1)", "2")}
FLOAT_ARGS = {1: ("0.25",), 2: ("1.5", "2.5"), 3: ("m >= n", "0.25", "1.5")}

SPEC = """attention t
dims B, H, M, N, D
in q[B, H, M, D]
in k[B, H, N, D]
in v[B, H, N, D]
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d]
s = s + {term}
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""

# what each function is, in float64, for the reference check
MATH = {
    "exp": math.exp,
    "log": math.log,
    "sqrt": math.sqrt,
    "tanh": math.tanh,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)),
    "erf": math.erf,
    "floor": math.floor,
    "ceil": math.ceil,
    "pow": math.pow,
    "abs": abs,
    "min": min,
    "max": max,
    "where": lambda c, a, b: a if c else b,
}


def call(name: str, args: tuple[str, ...]) -> str:
    return f"{name}({', '.join(args)})"


def test_the_table_names_the_functions_of_the_issue() -> None:
    for name in ("sin", "cos", "tan", "sigmoid", "erf", "pow", "floor", "ceil", "where"):
        assert name in FUNCTION_NAMES
    assert set(MATH) == set(FUNCTION_NAMES)
    assert (*FUNCTION_NAMES, "softmax") == RESERVED_NAMES


def test_docs_list_every_function() -> None:
    doc = (ROOT / "docs" / "language.md").read_text()
    listed = re.findall(r"^\| `(\w+)\(", doc, re.MULTILINE)
    assert listed == [*FUNCTION_NAMES, "softmax", "softmax"]  # with and without a sink
    reserved = re.search(r"The built-in functions \(`([^`]*)`\)", doc)
    assert reserved is not None and reserved.group(1).split() == list(RESERVED_NAMES)


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_every_function_is_reserved(name: str) -> None:
    text = (
        SPEC.format(term="0.0")
        .replace("dims B,", f"dims {name}, B,")
        .replace("in q[B,", f"in q[{name}, B,")
    )
    with pytest.raises(SpecError, match=f"'{name}' is a built-in function"):
        check(parse(text))


@pytest.mark.parametrize("name", FUNCTION_NAMES)
@pytest.mark.parametrize("operands", ["int", "float"])
def test_every_function_types_and_evaluates_in_the_reference(name: str, operands: str) -> None:
    """The call's type follows its rule (int only for abs/min/max/where of ints), and the
    reference computes the function in float64 on ints converted first."""
    arity = BUILTINS[name].arity
    args = (INT_ARGS if operands == "int" else FLOAT_ARGS)[arity]
    typing = BUILTINS[name].typing
    is_int = operands == "int" and typing != "float"
    # an int result needs a float factor to be a score term; a float one stands alone
    term = f"{call(name, args)} * 0.5" if is_int else call(name, args)
    checked = check(parse(SPEC.format(term=term)))
    (mod,) = lower(checked).score_mods
    found = [e for e in subexprs(mod) if isinstance(e, ir.Call)]
    assert [c.type for c in found] == ["int" if is_int else "float"]
    # with q = k = 0 every score is the term; v[n, :] = n, so o[m, :] = sum_n p[m, n] * n
    zero = np.zeros((1, 1, 3, 4))
    keys = np.broadcast_to(np.arange(3.0)[:, None], (1, 1, 3, 4))
    out = reference(checked)(zero, zero, keys)
    values = np.empty((3, 3))
    for i in range(3):
        for j in range(3):
            py = [eval(a, {}, {"m": i, "n": j}) for a in args]
            if typing == "float":
                py = [float(x) for x in py]
            values[i, j] = float(MATH[name](*py)) * (0.5 if is_int else 1.0)
    weights = np.exp(values - values.max(axis=1, keepdims=True))
    expected = (weights / weights.sum(axis=1, keepdims=True)) @ np.arange(3.0)
    np.testing.assert_allclose(out[0, 0, :, 0], expected, rtol=1e-12)


def _call_ir(name: str, arg_type: ir.Type) -> ir.Call:
    arity = BUILTINS[name].arity
    value: ir.Expr = ir.Index("n") if arg_type == "int" else ir.Score()
    args: list[ir.Expr] = [value] * arity
    if BUILTINS[name].typing == "select":
        args[0] = ir.BinOp(">=", ir.Index("m"), ir.Index("n"), "bool")
    result: ir.Type = "float" if BUILTINS[name].typing == "float" else arg_type
    return ir.Call(name, tuple(args), result)


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_every_function_renders_with_the_int_to_float_rule(name: str) -> None:
    """Float functions of ints cast them in both backends; int calls do not."""
    triton_env = TritonEnv({"m": "i_m", "n": "i_n"}, {})
    cuda_env = CudaEnv({"m": "i_m", "n": "i_n"}, {})
    on_ints, on_floats = _call_ir(name, "int"), _call_ir(name, "float")
    promotes = BUILTINS[name].typing == "float"
    assert ("tl.cast(i_n, tl.float32)" in triton_expr(on_ints, triton_env)) == promotes
    assert ("((float)i_n)" in cuda_expr(on_ints, cuda_env)) == promotes
    for text in (triton_expr(on_floats, triton_env), cuda_expr(on_floats, cuda_env)):
        assert "cast" not in text and "(float)" not in text
    # an int literal becomes a float literal, never a cast of a Python int
    literal = ir.Call(name, tuple(ir.Const(2, "int") for _ in on_ints.args), on_ints.type)
    if BUILTINS[name].typing == "select":
        literal = ir.Call(name, (ir.Const(True, "bool"), *literal.args[1:]), literal.type)
    assert "tl.cast" not in triton_expr(literal, triton_env)
    # the host (param defaults) computes the same function on the same converted values
    host = host_expr(ir.Call(name, literal.args, literal.type), "dims", "params")
    value = eval(host, {"math": math, "_where": lambda c, a, b: a if c else b})
    py_args = [True if isinstance(a.value, bool) else 2 for a in literal.args]  # type: ignore[union-attr]
    expected = MATH[name](*[float(a) if promotes and a is not True else a for a in py_args])
    assert value == expected and type(value) is (float if promotes else int)


def test_mixed_int_and_float_arguments_promote_in_both_backends() -> None:
    mixed = ir.Call("max", (ir.Score(), ir.Index("n")), "float")
    assert triton_expr(mixed, TritonEnv({"n": "i_n"}, {})) == (
        "tl.maximum(s, tl.cast(i_n, tl.float32))"
    )
    assert cuda_expr(mixed, CudaEnv({"n": "i_n"}, {})) == "fmaxf(s, ((float)i_n))"
    ints = ir.Call("max", (ir.Index("m"), ir.Index("n")), "int")
    assert triton_expr(ints, TritonEnv({"m": "i_m", "n": "i_n"}, {})) == "tl.maximum(i_m, i_n)"
    assert cuda_expr(ints, CudaEnv({"m": "i_m", "n": "i_n"}, {})) == "max(i_m, i_n)"


def all_functions_spec() -> str:
    terms = []
    for name in FUNCTION_NAMES:
        arity = BUILTINS[name].arity
        for args in (INT_ARGS[arity], FLOAT_ARGS[arity]):
            terms.append(f"{call(name, args)} * 0.01")
    return SPEC.format(term=" + ".join(terms)).replace(
        "* k[b, h, n, d]\n", "* k[b, h, n, d] / sqrt(D)\n"
    )


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA sources are rendered, not compiled")
def test_every_function_compiles_with_nvcc(tmp_path: Path) -> None:
    built = build(all_functions_spec(), target="cuda", schedule="fused")
    for function in ("sinf(", "tanf(", "erff(", "floorf(", "ceilf(", "powf(", "((float)"):
        assert function in built.source
    source = tmp_path / "functions.cu"
    # with the shipped headers inlined, as `attncc compile -o` writes it
    source.write_text(cuda_backend.render(built.ir, built.spec.spec).standalone())
    cmd = [NVCC or "nvcc", "-arch=sm_90", "-std=c++17", "--ptx", str(source)]
    done = subprocess.run(
        [*cmd, "-o", str(tmp_path / "functions.ptx")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
