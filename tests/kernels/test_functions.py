"""Every built-in function in a Triton kernel (compiled on a GPU, else the interpreter) against
the float64 reference, on int operands (an index, an i32 param, a dim, an i32 input: converted
to float first) and on float ones (the scores), by the tolerance rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attncc
from attncc.spec.functions import BUILTINS, FUNCTION_NAMES

from ._support import DEVICE, evaluate

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)

ROOT = Path(__file__).resolve().parents[2]

SPEC = """attention t
dims B, H, M, N, D
in q[B, H, M, D]
in k[B, H, N, D]
in v[B, H, N, D]
in len[B]: i32
param w: i32 = 1
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] / sqrt(D)
s = s + {term}
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""

# an int operand reading an index, an i32 param, a dim and an i32 input
INT = "(n % 4 + w + D / 8 + len[b])"
# float operands in each function's domain, from the scores
FLOAT = {
    "log": ("(abs(s) + 0.5)",),
    "sqrt": ("(abs(s) + 0.5)",),
    "tan": ("(s * 0.5)",),
    "floor": ("(s * 2.0)",),
    "ceil": ("(s * 2.0)",),
    # a positive base with a fractional exponent, and a negative one with an odd integer one
    "pow": ("(abs(s) + 0.5)", "1.5"),
}


def terms(name: str) -> str:
    arity = BUILTINS[name].arity
    if BUILTINS[name].typing == "select":
        on_ints = f"{name}(m >= n, {INT}, 2)"
        on_floats = f"{name}(m >= n, s, 0.5 * s)"
    else:
        on_ints = f"{name}({', '.join([INT] * arity)})" if name != "pow" else f"pow({INT}, 2)"
        if name == "exp":
            # compiled, exp is exp2 of x * log2(e) (ex2.approx): relative error ~|x| * 2^-23,
            # which at INT's 9 (e^9 * 0.1 = 810 added to the scores) is 8x numpy's float32 exp
            # on an H200. The test is of the int-to-float conversion, so smaller ints.
            on_ints = "exp(n % 3 - w)"
        on_floats = f"{name}({', '.join(FLOAT.get(name, ('s',) * arity))})"
    extra = " + pow(s, 3) * 0.1" if name == "pow" else ""
    return f"{on_ints} * 0.1 + {on_floats}{extra}"


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_function_in_a_kernel_matches_the_reference(name: str) -> None:
    kernel = attncc.compile(SPEC.format(term=terms(name)), schedule="fused")
    g = torch.Generator().manual_seed(FUNCTION_NAMES.index(name))
    q, k, v = (torch.randn(2, 1, 8, 16, generator=g) for _ in range(3))
    lengths = torch.tensor([0, 3], dtype=torch.int32)
    inputs = {n: t.to(DEVICE) for n, t in {"q": q, "k": k, "v": v, "len": lengths}.items()}
    out, lse, _, _ = evaluate(kernel, inputs, {}, torch.float32)
    assert out.ok, (name, out)
    assert lse.ok, (name, lse)


def test_the_docs_scale_runs_in_a_kernel() -> None:
    """docs/language.md's `q * k / sqrt(D)`: sqrt of an int32 dim crashed the Triton kernel."""
    text = SPEC.format(term="0.0").replace("s = s + 0.0\n", "")
    kernel = attncc.compile(text)
    assert "tl.sqrt(tl.cast(d_D, tl.float32))" in kernel.source
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g) for _ in range(3))
    inputs = {"q": q, "k": k, "v": v, "len": torch.tensor([1], dtype=torch.int32)}
    inputs = {n: t.to(DEVICE) for n, t in inputs.items()}
    out, _, _, _ = evaluate(kernel, inputs, {}, torch.float32)
    assert out.ok, out


def test_cross_attention_example_of_the_docs_runs() -> None:
    """The two-tensor form docs/language.md shows for queries and keys of different lengths."""
    doc = (ROOT / "docs" / "language.md").read_text()
    section = doc.split("### Queries and keys of different lengths", 1)[1]
    text = section.split("```\n", 2)[1]
    kernel = attncc.compile(text)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2, 5, 16, generator=g)
    k, v = (torch.randn(2, 2, 9, 16, generator=g) for _ in range(2))
    inputs = {
        "q": q,
        "k": k,
        "v": v,
        "q_doc": torch.tensor([[0, 0, 1, 1, 2], [0, 1, 1, 1, 1]], dtype=torch.int32),
        "k_doc": torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2], [1] * 9], dtype=torch.int32),
        "bias": torch.randn(5, 9, generator=g),
    }
    inputs = {n: t.to(DEVICE) for n, t in inputs.items()}
    out, lse, _, _ = evaluate(kernel, inputs, {}, torch.float32)
    assert out.ok and lse.ok, (out, lse)


def test_nested_pow_source_grows_linearly_and_runs() -> None:
    """pow's special cases read each argument several times: written inline, five nested
    calls rendered 8^5 copies of the innermost score. A device helper keeps one copy."""
    term = "pow(2.0, 0.5)"
    for _ in range(5):
        term = f"pow(abs(s) * 0.1 + {term}, 1.1)"
    kernel = attncc.compile(SPEC.format(term=term), schedule="fused")
    assert max(len(line) for line in kernel.source.splitlines()) < 1000
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g) for _ in range(3))
    inputs = {"q": q, "k": k, "v": v, "len": torch.tensor([2], dtype=torch.int32)}
    inputs = {n: t.to(DEVICE) for n, t in inputs.items()}
    out, lse, _, _ = evaluate(kernel, inputs, {}, torch.float32)
    assert out.ok and lse.ok, (out, lse)
