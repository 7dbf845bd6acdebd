"""Frozen AST of a spec, every node carrying the source span it came from.

Lark types never leave ``attncc.spec``: the parser converts its tree into these nodes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """1-based line and column of the first character, and of one past the last."""

    line: int
    column: int
    end_line: int
    end_column: int


@dataclass(frozen=True, slots=True)
class Ident:
    name: str
    span: Span


# ----------------------------------------------------------------------------- expressions


@dataclass(frozen=True, slots=True)
class Number:
    value: int | float
    span: Span


@dataclass(frozen=True, slots=True)
class Name:
    """A bare name: an index, let, dim size, param, or defined tensor at the current indices."""

    name: str
    span: Span


@dataclass(frozen=True, slots=True)
class Access:
    """``tensor[i, j, ...]``: each subscript is an integer index expression."""

    tensor: Ident
    indices: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Call:
    func: Ident
    args: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Binary:
    """Arithmetic: ``+ - * / %``; ``/`` on two integers truncates toward zero."""

    op: str
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Compare:
    op: str
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Logical:
    """``and`` / ``or`` on booleans."""

    op: str
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr
    span: Span


Expr = Number | Name | Access | Call | Neg | Binary | Compare | Logical | Not


# ----------------------------------------------------------------------------- statements


@dataclass(frozen=True, slots=True)
class DimsStmt:
    """``dims B, H, N = NP * PAGE``: a dim is bound from input shapes, or derived from others."""

    names: tuple[Ident, ...]
    values: tuple[Expr | None, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class InputStmt:
    """``in name[D0, D1, ...] [: dtype]``: the order of dims is the memory layout."""

    name: Ident
    dims: tuple[Ident, ...]
    dtype: Ident | None
    span: Span


@dataclass(frozen=True, slots=True)
class ParamStmt:
    name: Ident
    dtype: Ident
    default: Expr | None
    span: Span


@dataclass(frozen=True, slots=True)
class LetStmt:
    """``let g = <integer index expression>``: a derived index."""

    name: Ident
    value: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class ViewStmt:
    """``view kc[b: B, n: N, j: KVH, d: D] = k_pages[page_table[b, n / PAGE], n % PAGE, j, d]``:
    a gather view, read like a tensor of dims ``dims``; ``indices`` are local to the view."""

    name: Ident
    indices: tuple[Ident, ...]
    dims: tuple[Ident, ...]
    value: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class AssignStmt:
    """``t[i, j] = expr``; indices of ``expr`` missing from the left are summed.

    ``indices`` is None for a bare ``t = expr``, which keeps the indices of the earlier ``t``.
    """

    target: Ident
    indices: tuple[Ident, ...] | None
    value: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class MaskStmt:
    condition: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class OutStmt:
    name: Ident
    span: Span


@dataclass(frozen=True, slots=True)
class ScheduleStmt:
    name: Ident
    span: Span


Stmt = (
    DimsStmt
    | InputStmt
    | ParamStmt
    | LetStmt
    | ViewStmt
    | AssignStmt
    | MaskStmt
    | OutStmt
    | ScheduleStmt
)


@dataclass(frozen=True, slots=True)
class Spec:
    name: Ident
    statements: tuple[Stmt, ...]
    source: str
    filename: str
