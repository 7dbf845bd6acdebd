"""No spec text changes the meaning of generated Python or CUDA: names that are keywords,
builtins, imports or generated helpers; unicode; very long names; huge and tiny literals;
deep nesting; comments with line breaks Python or C++ see and spec lines do not. Each is a
SpecError with its position, or generates code that compiles and computes the right answer.
"""

from __future__ import annotations

import ast as pyast
import io
import re
import tokenize

import numpy as np
import pytest
import torch

import attncc
from attncc.api import build
from attncc.checking import Case, run_case
from attncc.spec import SpecError, load
from attncc.spec.parser import MAX_EXPRESSION_DEPTH, MAX_NAME_LENGTH

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)

BASE = """\
attention causal
dims  B, H, M, N, D
in    q[B, H, M, D]
in    k[B, H, N, D]
in    v[B, H, N, D]
in    slopes[H]
param scale: f32 = 1 / sqrt(D)
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] * scale
s = s - slopes[h] * (m - n)
mask m >= n
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""


def edit(*replacements: tuple[str, str], base: str = BASE) -> str:
    text = base
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    return text


def spec_error(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load(text)
    return info.value


def build_all(text: str) -> dict[str, attncc.api.Built]:
    """Both targets' code for ``text``; every Python module compiles."""
    checked = load(text)
    built = {}
    for target in ("triton", "cuda"):
        built[target] = build(checked, target=target)
        compile(built[target].host, f"<{target}>", "exec")
    return built


def top_level_bindings(source: str) -> list[str]:
    """Names bound by the module's top-level statements (defs, imports, assignments)."""
    names: list[str] = []
    for stmt in pyast.parse(source).body:
        if isinstance(stmt, pyast.FunctionDef | pyast.ClassDef):
            names.append(stmt.name)
        elif isinstance(stmt, pyast.Import | pyast.ImportFrom):
            names += [(a.asname or a.name).split(".")[0] for a in stmt.names]
        elif isinstance(stmt, pyast.Assign):
            names += [t.id for t in stmt.targets if isinstance(t, pyast.Name)]
    return names


def run_on_cpu(text: str, sizes: dict[str, int]) -> None:
    """Compile for Triton and compare with the float64 reference on the interpreter."""
    kernel = attncc.compile(text, target="triton")
    kernel.poison_outputs(True)
    try:
        result = run_case(
            kernel, Case(sizes, torch.float32, "contiguous"), "cpu", np.random.default_rng(0)
        )
    finally:
        kernel.poison_outputs(False)
    assert result.ok, result


# ----------------------------------------------------------------------------- names

MODULE_WORDS = [
    # imports and module helpers of the generated Python
    *("torch", "tl", "triton", "math", "os", "functools", "numpy", "TensorDescriptor"),
    *("_forward", "_bind", "_check", "_launch", "_fail", "_INPUTS", "_POISON", "_idiv"),
    *("_nvrtc", "_CUDA_SOURCE", "_param_defaults", "_tanh"),
    # Python keywords, soft keywords and builtins the module uses
    *("def", "class", "lambda", "None", "True", "return", "import", "match", "case", "_"),
    *("len", "int", "float", "range", "isinstance", "dict", "__import__", "__class__"),
    # C++ words
    *("main", "auto", "template", "float4", "threadIdx", "int4", "elem_t", "bf16_t"),
]


@pytest.mark.parametrize("name", MODULE_WORDS)
def test_kernel_name_never_rebinds_a_module_name(name: str) -> None:
    """The entry point is named after the spec, with a prefix: ``attention torch`` must not
    define a function ``torch`` over the module's ``import torch``, nor ``def def``."""
    built = build_all(edit(("attention causal", f"attention {name}")))
    for target, result in built.items():
        bound = top_level_bindings(result.host)
        repeated = sorted({n for n in bound if bound.count(n) > 1})
        assert not repeated, f"{target}: {repeated} bound twice"
        assert result.entry in bound
        used = {
            node.id for node in pyast.walk(pyast.parse(result.host)) if isinstance(node, pyast.Name)
        }
        assert result.entry not in used, f"{target}: the entry point shadows {result.entry}"


HOSTILE_SPEC = """\
attention torch
dims  int, float, tl, pid, acc
in    def[int, float, tl, acc]
in    lambda[int, float, pid, acc]
in    None[int, float, pid, acc]
in    offs_m[float]
param _forward: f32 = 1 / sqrt(acc)
param return: i32 = 0
let __class__ = main - offs_n + return
template[class, _, main, offs_n] = def[class, _, main, qk] * lambda[class, _, offs_n, qk] * _forward
template = template - offs_m[_] * abs(__class__)
mask __class__ >= 0
auto = softmax(template, offs_n)
threadIdx[class, _, main, qk] = auto[class, _, main, offs_n] * None[class, _, offs_n, qk]
out threadIdx
"""


@pytest.mark.parametrize(
    "sizes",
    [
        {"int": 2, "float": 3, "tl": 19, "pid": 21, "acc": 16},  # fused
        {"int": 1, "float": 2, "tl": 3, "pid": 33, "acc": 16},  # split-KV at run time
    ],
)
def test_names_of_generated_code_everywhere_compute_the_right_answer(
    sizes: dict[str, int],
) -> None:
    """Every name of the spec is a Python or C++ keyword, an import or a local of the
    generated kernels: the kernel still matches the reference."""
    build_all(HOSTILE_SPEC)
    run_on_cpu(HOSTILE_SPEC, sizes)


@pytest.mark.parametrize(
    ("old", "new", "column"),
    [
        ("attention causal", "attention café", 14),
        ("s[b, h, m, n]", "s[b, h, μ, n]", 9),
        ("mask m >= n", "mask m >= n\u200b", 12),  # zero-width space
        ("param scale", "param ｓcale", 7),  # fullwidth s
        ("in    slopes[H]", "in    slopes\u202e[H]", 13),  # right-to-left override
    ],
)
def test_non_ascii_names_are_refused_with_their_position(old: str, new: str, column: int) -> None:
    text = edit((old, new))
    err = spec_error(text)
    assert err.span is not None
    line = next(i for i, t in enumerate(text.splitlines(), 1) if new in t)
    assert (err.span.line, err.span.column) == (line, column)
    assert err.message.startswith("unexpected character")


def test_names_past_the_length_limit_are_refused_with_their_position() -> None:
    long = "x" * 10_000
    text = edit(("slopes", long))
    err = spec_error(text)
    assert err.span is not None and (err.span.line, err.span.column) == (6, 7)
    assert f"{MAX_NAME_LENGTH}" in err.message
    assert len(str(err).splitlines()[0]) < 200  # the message does not repeat the name


def test_names_at_the_length_limit_work() -> None:
    longest = "k" * (MAX_NAME_LENGTH - 1)
    text = edit(
        ("attention causal", f"attention a{longest}"),
        ("slopes", f"s{longest}"),
        ("[b, h, m, n]", f"[b, h, m, n{longest}]"),
        ("n, d]", f"n{longest}, d]"),
        ("softmax(s, n)", f"softmax(s, n{longest})"),
        ("(m - n)", f"(m - n{longest})"),
        ("mask m >= n", f"mask m >= n{longest}"),
    )
    build_all(text)
    run_on_cpu(text, {"B": 1, "H": 2, "M": 5, "N": 7, "D": 16})


# ----------------------------------------------------------------------------- comments

# Characters Python or C++ read as a line break, or that end a comment or string there.
COMMENT_TEXTS = [
    "a\rb = 1",
    "a\x0cb",
    "a\x0bb",
    "a\x85b",
    "a\u2028b",
    "a\u2029b",
    "a\x00b",
    "ends in a backslash \\",
    "*/ int x; /*",
    '""" x',
    "{{ name }} {% if %}",
    "é ∑ 🙂",
]


def _python_code(source: str) -> list[tuple[int, str]]:
    """Python tokens other than comments and line structure."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(t.type, t.string) for t in tokens if t.type not in skip]


def _cpp_code(source: str) -> list[str]:
    """The words of C++ source after translation phase 2 (line splicing), without comments."""
    spliced = re.sub(r"\\[ \t]*\n", "", source)
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", spliced, flags=re.S).split()


@pytest.mark.parametrize("comment", COMMENT_TEXTS, ids=ascii)
def test_comments_never_reach_generated_code(comment: str) -> None:
    """The spec's text is quoted in the generated files' headers, as comments: no character
    of a spec comment may end the comment early or continue it over generated code."""
    plain = build_all(BASE)
    commented_text = edit(
        ("mask m >= n\n", f"mask m >= n  # {comment}\n"),
        ("out o\n", f"out o # {comment}"),
    )
    commented = build_all(commented_text)
    assert _python_code(commented["triton"].source) == _python_code(plain["triton"].source)
    assert _python_code(commented["cuda"].host) != []
    assert _cpp_code(commented["cuda"].source) == _cpp_code(plain["cuda"].source)
    for built in commented.values():
        assert "\x00" not in built.source and "\x00" not in built.host


# ----------------------------------------------------------------------------- literals


@pytest.mark.parametrize(
    "literal",
    ["2147483648", "9223372036854775808", "99999999999999999999999", "1" + "0" * 5000],
)
def test_integer_literals_past_32_bits_are_refused(literal: str) -> None:
    """Kernels compute integers in int32: a larger literal would wrap there, not in the
    float64 reference."""
    err = spec_error(edit(("(m - n)", f"(m - {literal})")))
    assert err.span is not None and (err.span.line, err.span.column) == (9, 26)
    assert "32 bits" in err.message


@pytest.mark.parametrize("literal", ["1e400", "1e39", "3.5e38", "1" + "0" * 400 + ".0"])
def test_float_literals_past_float32_are_refused(literal: str) -> None:
    """Kernels compute in float32: a literal that would be infinite there (or, past float64,
    render as the undefined Python name ``inf``) is an error, not a different number."""
    err = spec_error(edit(("(m - n)", f"(m - {literal})")))
    assert err.span is not None and (err.span.line, err.span.column) == (9, 26)
    assert "float32" in err.message


@pytest.mark.parametrize(
    "literal", ["1e-400", "1e-46", "0.000000000000000000000000000000000000000000000000001"]
)
def test_float_literals_that_vanish_in_float32_are_refused(literal: str) -> None:
    err = spec_error(edit(("(m - n)", f"(m - {literal})")))
    assert err.span is not None and (err.span.line, err.span.column) == (9, 26)
    assert "float32" in err.message


@pytest.mark.parametrize(
    "literal",
    ["0.1", "3.4e38", "1.5e-45", "0.0", "0e999", "1e-38", "123456789.123456789", "2.", ".5"],
)
def test_float_literals_reach_both_targets_exactly(literal: str) -> None:
    """The literal's float64 value is what the generated code spells (Python repr, and the
    same digits with an ``f`` in CUDA), and what the reference uses."""
    value = float(literal)
    text = edit(("(m - n)", f"(m - n) * {literal}"), ("= 1 / sqrt(D)", f"= {literal}"))
    built = build_all(text)
    assert f"params['scale'] = {value!r}" in built["triton"].host
    assert f" * {value!r})" in built["triton"].source
    assert f"{value!r}f" in built["cuda"].source


def test_largest_integer_literal_reaches_both_targets_exactly() -> None:
    text = edit(("mask m >= n", "mask m >= n and n < 2147483647"))
    built = build_all(text)
    assert "< 2147483647)" in built["triton"].source
    assert "2147483647" in " ".join(_cpp_code(built["cuda"].source))


# ----------------------------------------------------------------------------- nesting


def _nest(kind: str, levels: int) -> tuple[str, str]:
    """An edit of BASE whose expression is ``levels`` deep in the parse tree (about)."""
    expr = "m"
    if kind == "sum":  # left-nested: ((m + 1) + 1) ...
        for _ in range(levels):
            expr = f"({expr} + 1)"
        return ("mask m >= n", f"mask {expr} >= n")
    if kind == "neg":
        return ("mask m >= n", f"mask {'-' * levels}m <= n")
    if kind == "not":
        return ("mask m >= n", f"mask {'not ' * levels}m >= n")
    if kind == "and":
        return ("mask m >= n", "mask " + " and ".join(["m >= n"] * levels))
    if kind == "calls":
        expr = "s"
        for _ in range(levels // 2):
            expr = f"tanh({expr})"
        return ("s = s - slopes[h] * (m - n)", f"s = {expr}")
    if kind == "subscripts":
        expr = "h"
        for _ in range(levels // 2):
            expr = f"min({expr}, H - 1)"
        return ("slopes[h]", f"slopes[{expr}]")
    if kind == "parens":
        return ("(m - n)", "(" * levels + "m - n" + ")" * levels)
    raise ValueError(kind)


NESTING = ["sum", "neg", "not", "and", "calls", "subscripts", "parens"]


@pytest.mark.parametrize("kind", NESTING)
def test_deepest_accepted_expressions_generate_code_that_compiles(kind: str) -> None:
    """Python's parser takes at most 200 nested parentheses; generated code nests about as
    deep as the spec, plus its own few levels: the spec's limit leaves room for them."""
    for levels in (MAX_EXPRESSION_DEPTH - 2, MAX_EXPRESSION_DEPTH - 1, MAX_EXPRESSION_DEPTH):
        try:
            text = edit(_nest(kind, levels))
            checked = load(text)
        except SpecError as err:
            assert "nested more than" in err.message
            continue
        for target in ("triton", "cuda"):
            compile(build(checked, target=target).host, target, "exec")


@pytest.mark.parametrize("kind", ["sum", "neg", "not", "and", "calls", "subscripts"])
def test_expressions_past_the_depth_limit_are_refused(kind: str) -> None:
    err = spec_error(edit(_nest(kind, 3 * MAX_EXPRESSION_DEPTH)))
    assert err.span is not None and "nested more than" in err.message


def test_redundant_parentheses_are_not_nesting() -> None:
    build_all(edit(_nest("parens", 3 * MAX_EXPRESSION_DEPTH)))


def test_long_lines_work() -> None:
    """A 100 000-character line (a long comment) and a long flat mask."""
    text = edit(("mask m >= n", "mask m >= n  # " + "x" * 100_000))
    build_all(text)
