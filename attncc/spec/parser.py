"""Parse spec text into the frozen AST (``attncc.spec.ast``). Lark stays inside this module."""

from __future__ import annotations

import math
import re
import struct
from functools import cache
from pathlib import Path
from typing import Any

import lark
from lark import Lark, Token, Transformer, v_args

from attncc.cache import cache_dir, content_key
from attncc.spec import ast
from attncc.spec.errors import SpecError

# grammars/ sits beside the attncc package (editable install or PYTHONPATH checkout)
GRAMMAR_PATH = Path(__file__).resolve().parents[2] / "grammars" / "attn.lark"


@cache
def _parser() -> Lark:
    # lark keys its table cache by the grammar text and options: a warm start skips building
    # the LALR tables
    tables = cache_dir() / "lark"
    tables.mkdir(parents=True, exist_ok=True)
    return Lark(
        GRAMMAR_PATH.read_text(),
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=True,
        cache=str(tables / f"attn-{content_key(GRAMMAR_PATH.read_text(), lark.__version__)[:16]}"),
    )


# kernels compute integer expressions in int32 (index arithmetic, i32 params and inputs)
_INT32_MAX = 2**31 - 1
# Kernel, file and symbol names are built from the spec's names, and file names stop at 255
# bytes (Triton's cache files are named after the kernel functions, `_attncc_<name>_fwd`).
MAX_NAME_LENGTH = 128


def _span_of_token(tok: Token) -> ast.Span:
    return ast.Span(
        tok.line or 1,
        tok.column or 1,
        tok.end_line or tok.line or 1,
        tok.end_column or (tok.column or 1) + len(tok),
    )


def _span_of_meta(meta: Any) -> ast.Span:
    return ast.Span(meta.line, meta.column, meta.end_line, meta.end_column)


# Words of the grammar. lark's contextual lexer reads one as a NAME where no keyword fits
# (`k[b, and, n, d]`, `let not = 1`), so they are refused as names here.
_STATEMENT_WORDS = ("attention", "dims", "in", "param", "let", "view", "mask", "out", "schedule")
KEYWORDS = frozenset((*_STATEMENT_WORDS, "and", "or", "not"))


def _ident(tok: Token) -> ast.Ident:
    span = _span_of_token(tok)
    if len(tok) > MAX_NAME_LENGTH:
        raise SpecError(
            f"name of {len(tok)} characters; names have at most {MAX_NAME_LENGTH}",
            span,
            "use a shorter name",
        )
    if str(tok) in KEYWORDS:
        raise SpecError(
            f"'{tok}' is a keyword and cannot be used as a name",
            span,
            f"rename it, e.g. {tok}_",
        )
    return ast.Ident(str(tok), span)


def _join(a: ast.Span, b: ast.Span) -> ast.Span:
    return ast.Span(a.line, a.column, b.end_line, b.end_column)


@v_args(meta=True)
class _ToAst(Transformer[Token, Any]):
    def start(self, meta: Any, children: list[Any]) -> tuple[ast.Ident, tuple[ast.Stmt, ...]]:
        return children[0], tuple(children[1:])

    def attention_stmt(self, meta: Any, children: list[Token]) -> ast.Ident:
        return _ident(children[0])

    def name_list(self, meta: Any, children: list[Token]) -> tuple[ast.Ident, ...]:
        return tuple(_ident(t) for t in children)

    def expr_list(self, meta: Any, children: list[ast.Expr]) -> tuple[ast.Expr, ...]:
        return tuple(children)

    def dim_decl(self, meta: Any, children: list[Any]) -> tuple[ast.Ident, ast.Expr | None]:
        return _ident(children[0]), children[1]

    def dims_stmt(self, meta: Any, children: list[Any]) -> ast.DimsStmt:
        return ast.DimsStmt(
            tuple(name for name, _ in children),
            tuple(value for _, value in children),
            _span_of_meta(meta),
        )

    def view_index(self, meta: Any, children: list[Token]) -> tuple[ast.Ident, ast.Ident]:
        return _ident(children[0]), _ident(children[1])

    def in_stmt(self, meta: Any, children: list[Any]) -> ast.InputStmt:
        name, dims, dtype = children
        return ast.InputStmt(
            _ident(name), dims, _ident(dtype) if dtype is not None else None, _span_of_meta(meta)
        )

    def param_stmt(self, meta: Any, children: list[Any]) -> ast.ParamStmt:
        name, dtype, default = children
        return ast.ParamStmt(_ident(name), _ident(dtype), default, _span_of_meta(meta))

    def let_stmt(self, meta: Any, children: list[Any]) -> ast.LetStmt:
        return ast.LetStmt(_ident(children[0]), children[1], _span_of_meta(meta))

    def view_stmt(self, meta: Any, children: list[Any]) -> ast.ViewStmt:
        name, *formals, value = children
        return ast.ViewStmt(
            _ident(name),
            tuple(index for index, _ in formals),
            tuple(dim for _, dim in formals),
            value,
            _span_of_meta(meta),
        )

    def assign_stmt(self, meta: Any, children: list[Any]) -> ast.AssignStmt:
        target, indices, value = children
        return ast.AssignStmt(_ident(target), indices, value, _span_of_meta(meta))

    def mask_stmt(self, meta: Any, children: list[Any]) -> ast.MaskStmt:
        return ast.MaskStmt(children[0], _span_of_meta(meta))

    def out_stmt(self, meta: Any, children: list[Token]) -> ast.OutStmt:
        return ast.OutStmt(_ident(children[0]), _span_of_meta(meta))

    def schedule_stmt(self, meta: Any, children: list[Token]) -> ast.ScheduleStmt:
        return ast.ScheduleStmt(_ident(children[0]), _span_of_meta(meta))

    # expressions
    def number(self, meta: Any, children: list[Token]) -> ast.Number:
        text = str(children[0])
        span = _span_of_token(children[0])
        if any(c in text for c in ".eE"):
            value = float(text)
            # Kernels compute in float32: a literal that is inf or 0 there is not the number
            # written (and inf rendered as the undefined Python name `inf`).
            as_float32 = struct.unpack("f", struct.pack("f", value))[0]
            if math.isinf(as_float32):
                raise SpecError(
                    "float literal is past the float32 range (3.4e38) kernels compute in",
                    span,
                    "use a smaller number; for masking, write a `mask` statement",
                )
            mantissa = re.split("[eE]", text)[0]
            if as_float32 == 0 and mantissa.strip("0.") != "":
                raise SpecError(
                    "float literal is too small for float32 (1.4e-45): kernels would read 0",
                    span,
                    "write 0.0 if zero is meant",
                )
            return ast.Number(value, span)
        digits = text.lstrip("0")
        if len(digits) > 10 or int(text) > _INT32_MAX:
            raise SpecError(
                "integer literal does not fit in 32 bits (2147483647), the kernels' integers",
                span,
                f"write it as a float ({digits[0]}e{len(digits) - 1}) if a float is meant",
            )
        return ast.Number(int(text), span)

    def name(self, meta: Any, children: list[Token]) -> ast.Name:
        ident = _ident(children[0])
        return ast.Name(ident.name, ident.span)

    def access(self, meta: Any, children: list[Any]) -> ast.Access:
        return ast.Access(_ident(children[0]), children[1], _span_of_meta(meta))

    def call(self, meta: Any, children: list[Any]) -> ast.Call:
        args = children[1] if children[1] is not None else ()
        return ast.Call(_ident(children[0]), args, _span_of_meta(meta))

    def neg(self, meta: Any, children: list[Any]) -> ast.Neg:
        return ast.Neg(children[0], _span_of_meta(meta))

    def binary(self, meta: Any, children: list[Any]) -> ast.Binary:
        left, op, right = children
        return ast.Binary(str(op), left, right, _join(_expr_span(left), _expr_span(right)))

    def compare(self, meta: Any, children: list[Any]) -> ast.Compare:
        left, op, right = children
        return ast.Compare(str(op), left, right, _join(_expr_span(left), _expr_span(right)))

    def and_op(self, meta: Any, children: list[Any]) -> ast.Logical:
        return ast.Logical("and", children[0], children[1], _span_of_meta(meta))

    def or_op(self, meta: Any, children: list[Any]) -> ast.Logical:
        return ast.Logical("or", children[0], children[1], _span_of_meta(meta))

    def not_op(self, meta: Any, children: list[Any]) -> ast.Not:
        return ast.Not(children[0], _span_of_meta(meta))


def _expr_span(expr: ast.Expr) -> ast.Span:
    return expr.span


# Common mistakes, each given a named message and hint. A syntax error matches a label when
# one of its examples fails with the same set of acceptable terminals and the same kind of
# unexpected token. (lark's own ``match_examples`` also compares the depth of the parser stack,
# so a mistake in the third statement never matched an example written as the first one, and
# in lark 1.3 it can crash formatting a debug message; we match on the public ``accepts``.)
_EXAMPLES: list[tuple[str, str, list[str]]] = [
    (
        "missing ']' in an index list",
        "close the bracket: q[b, h, m, d]",
        [
            "attention a\ns[b, h = q[b]\n",
            "attention a\nin q[B, H\n",
            "attention a\no[b] = q[b, d\n",
            "attention a\no[b] = q[b, d + 1\n",
            "attention a\no[b] = q[b] * k[b\n",
        ],
    ),
    (
        "missing ')'",
        "close the parenthesis",
        ["attention a\nx = (b\n", "attention a\nx = f(b, d\n", "attention a\nx = (b + 1\n"],
    ),
    (
        "a param needs a type",
        "write `param name: f32 = default`",
        ["attention a\nparam scale = 1\n", "attention a\nparam scale\n"],
    ),
    (
        "an input needs its dims in brackets",
        "write `in q[B, H, M, D]` (the order of dims is the memory layout)",
        ["attention a\nin q\n", "attention a\nin q: f32\n"],
    ),
    (
        "expected an expression",
        "an expression is a number, a name, t[i, ...], f(x, ...) or an operator between two",
        [
            "attention a\nmask\n",
            "attention a\nx = \n",
            "attention a\nx = 1 +\n",
            "attention a\nmask m >=\n",
            "attention a\nx = q[\n",
            "attention a\nx = f(1, )\n",
            "attention a\nx = q[b, ]\n",
            "attention a\nx = 1 * * 2\n",
            "attention a\nx = 1 + * 2\n",
            "attention a\nmask m >= )\n",
            "attention a\nmask not )\n",
        ],
    ),
]

_HEADER_ERROR = (
    "a spec starts with `attention NAME`",
    "add a first line such as `attention my_kernel`",
)

# Characters people reach for that the language spells differently.
_CHARACTER_HINTS = {
    "≥": "write >=",
    "≤": "write <=",
    "≠": "write !=",
    "−": "write an ASCII '-'",
    "×": "write *",
    "·": "write *",
    "&": "write `and`",
    "|": "write `or`",
    "!": "write `not` (or != for inequality)",
    "^": "there is no power operator: multiply, or use exp and log",
    ";": "write one statement per line",
}

# Python's parser refuses more than 200 nested parentheses ("too many nested parentheses"),
# and generated code nests up to twice as deep as the spec (`not x` is `(~(x))`, `a and b`
# is `((a) & (b))`), plus a few levels of its own: a mask of 100 nested `not`s (or 198
# nested sums) generated a Triton module that did not compile. Deeper expressions would also
# exhaust the recursion limit in later stages.
MAX_EXPRESSION_DEPTH = 90


def _signature(err: lark.exceptions.UnexpectedToken) -> tuple[frozenset[str], str]:
    return frozenset(err.accepts or err.expected), err.token.type


@cache
def _example_labels() -> dict[tuple[frozenset[str], str], tuple[str, str]]:
    labels: dict[tuple[frozenset[str], str], tuple[str, str]] = {}
    for message, hint, examples in _EXAMPLES:
        for example in examples:
            try:
                _parser().parse(example)
            except lark.exceptions.UnexpectedToken as err:
                labels.setdefault(_signature(err), (message, hint))
            else:
                raise AssertionError(f"syntax error example parses: {example!r}")
    return labels


def _keyword_as_target(text: str, line: int) -> tuple[str, int] | None:
    """The keyword starting ``line`` as if it were an assignment target (`out[b] = ...`), and
    its column."""
    lines = text.splitlines()
    if not 0 < line <= len(lines):
        return None
    match = re.match(r"\s*([A-Za-z_]\w*)\s*[\[=]", lines[line - 1])
    if match is None or match.group(1) not in _STATEMENT_WORDS:
        return None
    return match.group(1), match.start(1) + 1


def _end_of_code(text: str, line: int) -> int:
    """Column just past the last character of ``line`` that is not a comment or blank."""
    lines = text.splitlines()
    if not 0 < line <= len(lines):
        return 1
    return len(lines[line - 1].split("#", 1)[0].rstrip()) + 1


def _syntax_error(err: lark.exceptions.UnexpectedInput, text: str, filename: str) -> SpecError:
    line = getattr(err, "line", None) or 1
    column = getattr(err, "column", None) or 1
    if line < 0 or column < 0:  # end of input
        lines = text.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
    width = 1
    hint: str | None
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        char = text_at(text, line, column)
        message, hint = f"unexpected character {char!r}", _CHARACTER_HINTS.get(char)
    elif isinstance(err, lark.exceptions.UnexpectedToken):
        tok = err.token
        if tok.type in ("_NL", "$END"):
            # point just past the code, not past a trailing comment
            column = _end_of_code(text, line)
        accepts = err.accepts or err.expected
        label = _example_labels().get(_signature(err))
        keyword = _keyword_as_target(text, line)
        if "ATTENTION" in accepts:
            message, hint = _HEADER_ERROR
        elif keyword is not None:
            word, column = keyword
            width = len(word)
            message = f"'{word}' is a keyword and cannot name a tensor"
            hint = f"rename it, e.g. {word}_"
        elif tok.type == "EQUAL" and "COMPARE" in accepts:
            message, hint = "unexpected '=' in an expression", "compare with =="
        elif label is not None:
            message, hint = label
        else:
            shown = "end of line" if tok.type in ("_NL", "$END") else repr(str(tok))
            message = f"unexpected {shown}"
            expected = sorted({_describe(t) for t in accepts})
            hint = f"expected {', '.join(expected)}" if expected else None
    else:
        message, hint = "unexpected end of spec", None
    span = ast.Span(line, column, line, column + width)
    return SpecError(message, span, hint, source=text, filename=filename)


def text_at(text: str, line: int, column: int) -> str:
    lines = text.splitlines()
    if 0 < line <= len(lines) and 0 < column <= len(lines[line - 1]):
        return lines[line - 1][column - 1]
    return ""


_TERMINAL_NAMES = {
    "NAME": "a name",
    "NUMBER": "a number",
    "_NL": "end of line",
    "$END": "end of line",
    "COMPARE": "a comparison",
    "ADD_OP": "'+' or '-'",
    "MUL_OP": "'*', '/' or '%'",
}


def _describe(terminal: str) -> str:
    if terminal in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[terminal]
    try:
        pattern = _parser().get_terminal(terminal).pattern
    except KeyError:
        return terminal
    return repr(pattern.value) if pattern.type == "str" else terminal.lower()


def _check_depth(tree: lark.Tree[Token], text: str, filename: str) -> None:
    """Reject expressions nested past ``MAX_EXPRESSION_DEPTH`` before recursive passes see them."""
    for stmt in tree.children:
        if not isinstance(stmt, lark.Tree):
            continue
        stack: list[tuple[lark.Tree[Token], int]] = [(stmt, 0)]
        while stack:
            node, depth = stack.pop()
            if depth > MAX_EXPRESSION_DEPTH:
                raise SpecError(
                    f"expression nested more than {MAX_EXPRESSION_DEPTH} levels deep",
                    _span_of_meta(stmt.meta),
                    "split it into several assignments",
                    source=text,
                    filename=filename,
                )
            stack.extend((c, depth + 1) for c in node.children if isinstance(c, lark.Tree))


def parse(text: str, filename: str = "<spec>") -> ast.Spec:
    """Parse spec text; syntax errors raise ``SpecError`` with position and hint."""
    source = text if text.endswith("\n") else text + "\n"
    try:
        tree = _parser().parse(source)
    except lark.exceptions.UnexpectedInput as err:
        raise _syntax_error(err, source, filename) from None
    _check_depth(tree, source, filename)
    try:
        name, statements = _ToAst().transform(tree)
    except lark.exceptions.VisitError as err:
        if isinstance(err.orig_exc, SpecError):
            raise err.orig_exc.with_source(source, filename) from None
        raise
    return ast.Spec(name, statements, source, filename)


def parse_file(path: str | Path) -> ast.Spec:
    path = Path(path)
    return parse(path.read_text(), str(path))
