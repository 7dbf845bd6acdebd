"""Bad specs: every kind of error is pinned to its line and column, message, hint and rendering.

Each case edits one valid spec (``BASE``, the gqa_causal example without comments, so that the
line numbers below stay put) and checks where the error points and what it says.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from attncc.spec import SpecError, check, parse
from attncc.spec.parser import MAX_EXPRESSION_DEPTH

FILENAME = "t.attn"

BASE = """\
attention gqa
dims B, H, KVH, M, N, D
in q[B, H, M, D]
in k[B, KVH, N, D]
in v[B, KVH, N, D]
param scale: f32 = 1 / sqrt(D)
let g = h / (H / KVH)
s[b, h, m, n] = q[b, h, m, d] * k[b, g, n, d] * scale
mask m >= n
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, g, n, d]
out o
"""
# Columns on line 8, the scores:
#   s[b, h, m, n] = q[b, h, m, d] * k[b, g, n, d] * scale
#   1        10        20        30        40        50


def edit(*replacements: tuple[str, str], base: str = BASE) -> str:
    text = base
    for old, new in replacements:
        assert text.count(old) == 1, f"{old!r} must occur exactly once"
        text = text.replace(old, new)
    return text


def spec_error(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        check(parse(text, FILENAME))
    return info.value


def assert_rendered(err: SpecError, text: str) -> None:
    """``file:line:col: error: message``, the source line, a caret under the column, a hint."""
    assert err.span is not None
    line, column = err.span.line, err.span.column
    rendered = str(err).splitlines()
    assert rendered[0] == f"{FILENAME}:{line}:{column}: error: {err.message}"
    source_line = text.splitlines()[line - 1]
    assert rendered[1] == f"    {source_line}"
    caret = rendered[2]
    assert caret.startswith("    ")
    assert caret.index("^") == 4 + column - 1
    assert caret[4 : 4 + column - 1].strip() == ""
    assert set(caret[caret.index("^") + 1 :]) <= {"~"}
    if err.hint is None:
        assert len(rendered) == 3
    else:
        assert rendered[3:] == [f"  hint: {err.hint}"]


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    at: str  # "line:column" of the error
    message: str  # a phrase of the message
    hint: str | None = None  # a phrase of the hint; None: there is no hint


SYNTAX = [
    Case(
        "missing-bracket-in-input",
        edit(("in q[B, H, M, D]", "in q[B, H, M, D")),
        "3:16",
        "missing ']' in an index list",
        "close the bracket",
    ),
    Case(
        "missing-bracket-in-expression",
        edit(("k[b, g, n, d] * scale", "k[b, g, n, d * scale")),
        "8:53",
        "missing ']' in an index list",
        "close the bracket",
    ),
    Case(
        # the caret goes after the code, not after the comment
        "missing-bracket-before-comment",
        edit(("in q[B, H, M, D]", "in q[B, H, M, D      # queries")),
        "3:16",
        "missing ']' in an index list",
        "close the bracket",
    ),
    Case(
        "missing-paren",
        edit(("1 / sqrt(D)", "1 / sqrt(D")),
        "6:30",
        "missing ')'",
        "close the parenthesis",
    ),
    Case(
        "missing-paren-in-call",
        edit(("* v[b, g, n, d]", "* max(v[b, g, n, d], 0.0")),
        "11:55",
        "missing ')'",
        "close the parenthesis",
    ),
    Case(
        # lark's match_examples crashed on these two (formatting its parser state with %d)
        "missing-paren-in-first-statement",
        "attention a\no[b] = f(b, d\n",
        "2:14",
        "missing ')'",
        "close the parenthesis",
    ),
    Case(
        "missing-comma-after-a-blank-first-line",
        "\nattention a\ndims B, H M\n",
        "3:11",
        "unexpected 'M'",
        "expected ',', '=', end of line",
    ),
    Case(
        "param-without-type",
        edit(("param scale: f32 = 1 / sqrt(D)", "param scale = 1 / sqrt(D)")),
        "6:13",
        "a param needs a type",
        "param name: f32 = default",
    ),
    Case(
        "param-without-type-or-default",
        edit(("param scale: f32 = 1 / sqrt(D)", "param scale")),
        "6:12",
        "a param needs a type",
        "param name: f32 = default",
    ),
    Case(
        "input-without-dims",
        edit(("in v[B, KVH, N, D]", "in v: f32")),
        "5:5",
        "an input needs its dims in brackets",
        "the order of dims is the memory layout",
    ),
    Case(
        "missing-expression-after-equals",
        edit(("s[b, h, m, n] = q[b, h, m, d] * k[b, g, n, d] * scale", "s[b, h, m, n] =   # x")),
        "8:16",
        "expected an expression",
        "a number, a name",
    ),
    Case(
        "missing-expression-after-operator",
        edit(("mask m >= n", "mask m >=")),
        "9:10",
        "expected an expression",
        "a number, a name",
    ),
    Case(
        "missing-expression-after-mask",
        edit(("mask m >= n", "mask")),
        "9:5",
        "expected an expression",
        "a number, a name",
    ),
    Case(
        "unexpected-character",
        edit(("mask m >= n", "mask m >= n $")),
        "9:13",
        "unexpected character '$'",
        None,
    ),
    Case(
        "unicode-comparison",
        edit(("mask m >= n", "mask m ≥ n")),
        "9:8",
        "unexpected character '≥'",
        "write >=",
    ),
    Case(
        "unexpected-token",
        edit(("mask m >= n", "mask m >= n n")),
        "9:13",
        "unexpected 'n'",
        "expected '(', '*', '/' or '%', '+' or '-'",
    ),
    Case(
        "equals-in-a-condition",
        edit(("mask m >= n", "mask m = n")),
        "9:8",
        "unexpected '=' in an expression",
        "compare with ==",
    ),
    Case(
        "no-attention-header",
        edit(("attention gqa", "attn gqa")),
        "1:1",
        "a spec starts with `attention NAME`",
        "attention my_kernel",
    ),
    Case(
        "header-missing-entirely",
        edit(("attention gqa\n", "# a comment first\n\n")),
        "3:1",
        "a spec starts with `attention NAME`",
        "attention my_kernel",
    ),
    Case("empty-spec", "", "1:1", "a spec starts with `attention NAME`", "attention my_kernel"),
    Case(
        "attention-without-name",
        edit(("attention gqa", "attention")),
        "1:10",
        "unexpected end of line",
        "expected a name",
    ),
    Case(
        "keyword-as-name",
        edit(("let g = h / (H / KVH)", "let not = h / (H / KVH)")),
        "7:5",
        "'not' is a keyword and cannot be used as a name",
        "not_",
    ),
    Case(
        "keyword-as-index",
        edit(("k[b, g, n, d] * scale", "k[b, and, n, d] * scale")),
        "8:38",
        "'and' is a keyword",
        "and_",
    ),
    Case(
        "keyword-as-tensor",
        edit(("p = softmax(s, n)", "mask = softmax(s, n)")),
        "10:1",
        "'mask' is a keyword and cannot name a tensor",
        "mask_",
    ),
    Case(
        "integer-too-large",
        edit(("* scale", "* 123456789012345678901234")),
        "8:49",
        "integer literal does not fit in 32 bits",
        "1e23",
    ),
    Case(
        "integer-past-int32",
        edit(("mask m >= n", "mask m + 2147483648 >= n")),
        "9:10",
        "integer literal does not fit in 32 bits",
        "2e9",
    ),
]

NAMES = [
    Case(
        "unknown-index-on-left",
        edit(("o[b, h, m, d] =", "o[b, h, m, x] =")),
        "11:12",
        "unknown index 'x'",
        "every index on the left must be a subscript",
    ),
    Case(
        "unknown-name",
        edit(("* scale", "* scal")),
        "8:49",
        "unknown name 'scal'",
        "declare dims, params and lets before use",
    ),
    Case(
        "unknown-tensor",
        edit(("* v[b, g, n, d]", "* w[b, g, n, d]")),
        "11:33",
        "unknown tensor 'w'",
        "declare it with `in`",
    ),
    Case(
        "unknown-dim-in-input",
        edit(("in k[B, KVH, N, D]", "in k[B, KV, N, D]")),
        "4:9",
        "unknown dim 'KV'",
        "dims KV",
    ),
    Case(
        "unknown-dtype",
        edit(("in v[B, KVH, N, D]", "in v[B, KVH, N, D]: f8")),
        "5:21",
        "unknown dtype 'f8'",
        "float, f16, bf16, f32, f8e4m3, i32, i64, bool",
    ),
    Case(
        # no kernel takes float64 tensors: the declaration could never be satisfied
        "f64-input",
        edit(("in v[B, KVH, N, D]", "in v[B, KVH, N, D]: f64")),
        "5:21",
        "f64 inputs are not supported",
        "declare it `float`",
    ),
    Case(
        "unknown-param-dtype",
        edit(("scale: f32", "scale: f16")),
        "6:14",
        "unknown param dtype 'f16'",
        "f32, i32",
    ),
    Case(
        "input-not-indexed",
        edit(("* scale", "* v")),
        "8:49",
        "input 'v' must be indexed",
        "v[b, kvh, n, d]",
    ),
    Case(
        "let-indexed",
        edit(("* scale", "* g[b]")),
        "8:49",
        "'g' is not a tensor and cannot be indexed",
        None,
    ),
    Case(
        "duplicate-input",
        edit(("in v[B, KVH, N, D]", "in k[B, KVH, N, D]")),
        "5:4",
        "duplicate name 'k' (input)",
        "already declared at line 4",
    ),
    Case(
        "param-named-like-dim",
        edit(("param scale: f32 = 1 / sqrt(D)", "param D: f32 = 1.0")),
        "6:7",
        "duplicate name 'D' (param)",
        "already declared at line 2",
    ),
    Case(
        "duplicate-dim",
        edit(("dims B, H, KVH, M, N, D", "dims B, H, KVH, M, N, D, H")),
        "2:26",
        "duplicate name 'H' (dim)",
        "already declared at line 2",
    ),
    Case(
        "builtin-as-dim",
        edit(("dims B, H, KVH, M, N, D", "dims B, H, KVH, M, N, D, exp")),
        "2:26",
        "'exp' is a built-in function and cannot name a dim",
        None,
    ),
    Case(
        "assign-to-input",
        edit(("o[b, h, m, d] =", "q[b, h, m, d] =")),
        "11:1",
        "'q' is declared as an input and cannot be assigned",
        "its own name",
    ),
    Case(
        "let-used-as-index",
        edit(("let g = h / (H / KVH)", "let n = h / (H / KVH)")),
        "8:12",
        "'n' is a let, not an index",
        "rename one of them",
    ),
    Case(
        "index-named-like-tensor",
        edit(("= q[b, h, m, d]", "= q[b, h, m, p]")),
        "8:28",
        "'p' names a computed tensor and cannot also be an index",
        "'p' is assigned at line 10",
    ),
    Case(
        "let-uses-itself",
        edit(("let g = h / (H / KVH)", "let g = g + 1")),
        "7:9",
        "let 'g' uses itself",
        "the lets above it",
    ),
    Case(
        "let-forward-reference",
        edit(("let g = h / (H / KVH)", "let g = f\nlet f = h / (H / KVH)")),
        "7:9",
        "let 'g' uses 'f' before it is defined",
        "the lets above it",
    ),
    Case(
        "param-default-reads-index",
        edit(("1 / sqrt(D)", "1 / sqrt(d)")),
        "6:29",
        "a param default can use dims and earlier params only, not 'd'",
        "computed once per call",
    ),
]

SHAPES = [
    Case(
        # n is bound to N by k first, so q's use of it for M is the error
        "index-used-for-wrong-dim",
        edit(("= q[b, h, m, d] * k[b, g, n, d]", "= k[b, g, n, d] * q[b, h, n, d]")),
        "8:41",
        "index 'n' is used for dim M of 'q', but it ranges over dim N",
        "'n' was bound to N at line 8, column 25",
    ),
    Case(
        # first binding wins: here q binds n to M, and k's use of it is reported
        "index-used-for-wrong-dim-first-binding-wins",
        edit(("= q[b, h, m, d]", "= q[b, h, n, d]")),
        "8:41",
        "index 'n' is used for dim N of 'k', but it ranges over dim M",
        "'n' was bound to M at line 8, column 25",
    ),
    Case(
        "wrong-number-of-subscripts",
        edit(("= q[b, h, m, d]", "= q[b, h, d]")),
        "8:17",
        "'q' has 4 dims [B, H, M, D] but is indexed with 3",
        "q[b, h, m, d]",
    ),
    Case(
        "repeated-index-on-left",
        edit(("o[b, h, m, d] =", "o[b, h, m, m] =")),
        "11:12",
        "index 'm' repeated on the left",
        None,
    ),
    Case(
        "redefinition-with-other-indices",
        edit(("mask m >= n", "s[b, h, m, d] = q[b, h, m, d]\nmask m >= n")),
        "9:1",
        "'s' was defined with indices [b, h, m, n]",
        "write it bare: s = ...",
    ),
    Case(
        "first-definition-without-indices",
        edit(("o[b, h, m, d] =", "o =")),
        "11:1",
        "'o' needs indices on its first definition",
        "the others are summed",
    ),
    Case(
        "bare-name-out-of-scope",
        edit(("* v[b, g, n, d]", "* v[b, g, n, d] * s")),
        "11:49",
        "bare 's' means s[b, h, m, n], but index 'n' is not in scope here",
        "write the indices explicitly",
    ),
    Case(
        "softmax-over-missing-index",
        edit(("softmax(s, n)", "softmax(s, d)")),
        "10:16",
        "softmax over an index the scores do not have: s has [b, h, m, n]",
        "softmax(s, n)",
    ),
    Case(
        "softmax-of-input",
        edit(("softmax(s, n)", "softmax(q, n)")),
        "10:13",
        "the first argument of softmax must name computed scores",
        "define the scores",
    ),
    Case(
        "softmax-changes-indices",
        edit(("p = softmax(s, n)", "p[b, h, m] = softmax(s, n)")),
        "10:1",
        "softmax keeps the indices of 's' [b, h, m, n]",
        None,
    ),
    Case(
        "missing-out",
        edit(("out o\n", "")),
        "1:11",
        "missing `out` statement",
        "out o",
    ),
    Case(
        "out-names-input",
        edit(("out o", "out q")),
        "12:5",
        "out names 'q', which is not a computed tensor",
        "output contraction",
    ),
    Case(
        "duplicate-out",
        edit(("out o", "out o\nout p")),
        "13:1",
        "duplicate out statement",
        "exactly one output",
    ),
    Case(
        "dim-used-by-no-input",
        edit(("dims B, H, KVH, M, N, D", "dims B, H, KVH, M, N, D, E")),
        "2:26",
        "dim 'E' is not used by any input",
        "use it in an `in` declaration",
    ),
    Case(
        "view-index-without-dim",
        edit(("let g = h / (H / KVH)", "view kc[b, n, g, d] = k[b, g, n, d]")),
        "7:10",
        "unexpected ','",
        "expected ':'",
    ),
    Case(
        "view-index-shadows-a-let",
        edit(("out o", "view kc[b: B, g: KVH, n: N, d: D] = k[b, g, n, d]\nout o")),
        "12:15",
        "view index 'g' is already a name in this spec",
        "view indices are local",
    ),
    Case(
        "view-reads-a-computed-tensor",
        edit(("out o", "view kc[b: B, j: H, x: M, d: D] = o[b, j, x, d]\nout o")),
        "12:35",
        "a view reads one float input tensor",
        "k_pages[page_table[b, n / PAGE], n % PAGE, j, d]",
    ),
    Case(
        "derived-dim-from-unknown-name",
        edit(("dims B, H, KVH, M, N, D", "dims B, H, KVH, M, N, D, T = X * 2")),
        "2:30",
        "a derived dim can use dims declared before it only, not 'X'",
        "dims NP, PAGE, N = NP * PAGE",
    ),
]

TYPES = [
    Case(
        "integer-mask",
        edit(("mask m >= n", "mask m - n")),
        "9:6",
        "a mask must be a boolean expression, got int",
        "mask m >= n",
    ),
    Case(
        "float-mask",
        edit(("mask m >= n", "mask scale * (m - n)")),
        "9:6",
        "a mask must be a boolean expression, got float",
        "mask m >= n",
    ),
    Case(
        "integer-tensor-in-contraction",
        edit(
            ("in v[B, KVH, N, D]", "in v[B, KVH, N, D]\nin doc[B, N]: i32"),
            ("* scale", "* doc[b, n]"),
        ),
        "9:49",
        "integer tensor 'doc' in a contraction over d",
        "integer tensors belong in masks",
    ),
    Case(
        "float-subscript",
        edit(("k[b, g, n, d]", "k[b, g, n, d * 0.5]")),
        "8:44",
        "a subscript must be an integer, got float",
        "subscripts are",
    ),
    Case(
        "bool-subscript",
        edit(("k[b, g, n, d]", "k[b, g, n, d > 0]")),
        "8:44",
        "a subscript must be an integer, got bool",
        "subscripts are",
    ),
    Case(
        "and-on-numbers",
        edit(("mask m >= n", "mask m and n")),
        "9:6",
        "'and' needs boolean operands",
        "compare first",
    ),
    Case(
        "not-on-number",
        edit(("mask m >= n", "mask not m")),
        "9:10",
        "'not' needs a boolean operand",
        None,
    ),
    Case(
        "arithmetic-on-bool",
        edit(("mask m >= n", "mask (m >= n) + 1 > 0")),
        "9:7",
        "arithmetic '+' on a boolean",
        "where",
    ),
    Case(
        "negated-bool",
        edit(("mask m >= n", "mask -(m >= n)")),
        "9:6",
        "cannot negate a boolean",
        "use `not`",
    ),
    Case(
        "compared-bool",
        edit(("mask m >= n", "mask (m >= n) == (n >= m)")),
        "9:7",
        "cannot compare a boolean",
        "and",
    ),
    Case(
        "remainder-of-float",
        edit(("* scale", "* (scale % 2)")),
        "8:50",
        "'%' needs integers",
        None,
    ),
    Case(
        "let-not-integer",
        edit(("let g = h / (H / KVH)", "let g = h / 2.0")),
        "7:9",
        "let 'g' must be an integer index expression",
        "let g = h / (H / KVH)",
    ),
    Case(
        "param-i32-with-float-default",
        edit(("param scale: f32 = 1 / sqrt(D)", "param scale: i32 = 1 / sqrt(D)")),
        "6:20",
        "the default of 'scale' is float, but the param is i32",
        None,
    ),
    Case(
        "integer-assignment",
        edit(("mask m >= n", "mask m >= n\nr[m, n] = m - n")),
        "10:11",
        "'r' must be a float expression, got int",
        "numbers need a float factor",
    ),
    Case(
        "where-condition-not-bool",
        edit(("* scale", "* where(scale, 1.0, 2.0)")),
        "8:55",
        "the condition of where must be boolean",
        None,
    ),
    Case(
        "function-of-bool",
        edit(("* scale", "* exp(m > n)")),
        "8:53",
        "exp needs a number, got a boolean",
        None,
    ),
    Case(
        "softmax-inside-expression",
        edit(("p = softmax(s, n)", "p = 2 * softmax(s, n)")),
        "10:9",
        "softmax must be the whole right-hand side of an assignment",
        "on its own line",
    ),
    Case(
        "softmax-in-mask",
        edit(("mask m >= n", "mask softmax(s, n) > 0")),
        "9:6",
        "softmax must be the whole right-hand side of an assignment",
        "on its own line",
    ),
    Case(
        "mask-index-not-in-scores",
        edit(("mask m >= n", "mask d < 3")),
        "9:6",
        "mask uses index 'd', which the scores 's' do not have",
        "[b, h, m, n]",
    ),
    Case(
        "mask-reads-computed-values",
        edit(("mask m >= n", "mask s > 0")),
        "9:6",
        "a mask cannot read computed values",
        "where(...)",
    ),
    Case(
        "mask-without-softmax",
        edit(("p = softmax(s, n)", "p[b, h, m, n] = s * 2.0")),
        "9:1",
        "a mask without a softmax has nothing to mask",
        None,
    ),
    Case(
        "unknown-schedule",
        edit(("attention gqa\n", "attention gqa\nschedule turbo\n")),
        "2:10",
        "unknown schedule 'turbo'",
        "naive, fused, split_kv",
    ),
    Case(
        "duplicate-schedule",
        edit(("attention gqa\n", "attention gqa\nschedule naive\nschedule fused\n")),
        "3:1",
        "duplicate schedule statement",
        None,
    ),
    Case(
        "unknown-function",
        edit(("* scale", "* foo(scale)")),
        "8:49",
        "unknown function 'foo'",
        "exp, log, sqrt, tanh, sin, cos, tan, sigmoid, erf, floor, ceil, pow, abs, min, max, "
        "where, softmax",
    ),
    Case(
        "too-many-arguments",
        edit(("* scale", "* exp(scale, 2)")),
        "8:49",
        "exp takes 1 argument, got 2",
        None,
    ),
    Case(
        "too-few-arguments",
        edit(("* scale", "* min(scale)")),
        "8:49",
        "min takes 2 arguments, got 1",
        None,
    ),
    Case(
        "softmax-arity",
        edit(("softmax(s, n)", "softmax(s)")),
        "10:5",
        "softmax takes 2 or 3 arguments, got 1",
        "softmax(s, n), or softmax(s, n, sinks[h])",
    ),
]

CASES = SYNTAX + NAMES + SHAPES + TYPES


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_error(case: Case) -> None:
    err = spec_error(case.text)
    assert err.span is not None
    assert f"{err.span.line}:{err.span.column}" == case.at, str(err)
    assert case.message in err.message, str(err)
    if case.hint is None:
        assert err.hint is None, str(err)
    else:
        assert err.hint is not None and case.hint in err.hint, str(err)
    assert err.filename == FILENAME
    source = case.text if case.text.endswith("\n") else case.text + "\n"
    assert_rendered(err, source)


def test_case_ids_are_unique() -> None:
    assert len({c.id for c in CASES}) == len(CASES)


def test_base_is_valid() -> None:
    checked = check(parse(BASE, FILENAME))
    assert checked.output == "o"


def test_rendering_in_full() -> None:
    err = spec_error(edit(("in v[B, KVH, N, D]", "in v[B, KVH, N, D]: f8")))
    assert str(err) == (
        "t.attn:5:21: error: unknown dtype 'f8'\n"
        "    in v[B, KVH, N, D]: f8\n"
        "                        ^~\n"
        "  hint: choose one of float, f16, bf16, f32, f8e4m3, i32, i64, bool"
    )


def test_rendering_without_hint_and_with_a_wide_span() -> None:
    err = spec_error(edit(("* scale", "* exp(scale, 2)")))
    assert str(err) == (
        "t.attn:8:49: error: exp takes 1 argument, got 2\n"
        "    s[b, h, m, n] = q[b, h, m, d] * k[b, g, n, d] * exp(scale, 2)\n"
        "                                                    ^~~~~~~~~~~~~"
    )


def test_caret_lines_up_under_tabs() -> None:
    text = edit(("mask m >= n", "mask\tm >=\tzz"))
    err = spec_error(text)
    assert err.span is not None and (err.span.line, err.span.column) == (9, 11)
    _, source_line, caret, _ = str(err).splitlines()
    assert source_line == "    mask\tm >=\tzz"
    assert caret == "        \t    \t^~"


def test_error_without_source_renders_position_only() -> None:
    err = spec_error(edit(("out o", "out q")))
    bare = SpecError(err.message, err.span, err.hint)
    assert str(bare) == (
        "<spec>:12:5: error: out names 'q', which is not a computed tensor\n"
        "  hint: name the left-hand side of the output contraction"
    )
    assert str(bare.with_source(BASE, "x.attn")).startswith("x.attn:12:5: error: ")


def test_expression_nested_too_deeply() -> None:
    text = edit(("* scale", "* scale" + " + 1.0" * 300))
    err = spec_error(text)
    assert err.span is not None and (err.span.line, err.span.column) == (8, 1)
    assert f"nested more than {MAX_EXPRESSION_DEPTH} levels" in err.message
    assert_rendered(err, text)


def test_deep_but_reasonable_expression_is_fine() -> None:
    check(parse(edit(("* scale", "* scale" + " + 1.0" * (MAX_EXPRESSION_DEPTH - 10)))))
    check(parse(edit(("* scale", "* " + "(" * 500 + "scale" + ")" * 500))))


def test_syntax_error_in_a_later_statement_still_gets_its_named_message() -> None:
    # the example matching depends on the parser state, not on how many statements came before
    for line in ("in extra[B", "in extra[B, H"):
        text = edit(("in v[B, KVH, N, D]", f"in v[B, KVH, N, D]\n{line}"))
        err = spec_error(text)
        assert err.message == "missing ']' in an index list"
        assert err.span is not None and (err.span.line, err.span.column) == (6, len(line) + 1)


def test_parse_errors_raise_before_checking() -> None:
    # a syntax error comes from parse(), with the filename given to it
    with pytest.raises(SpecError) as info:
        parse(edit(("mask m >= n", "mask m >=")), "other.attn")
    assert str(info.value).startswith("other.attn:9:10: error: expected an expression")
