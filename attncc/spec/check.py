"""Semantic analysis: names, index-to-dim binding, types and shapes of a parsed spec.

Produces a ``CheckedSpec``: the AST plus the symbol tables every later stage reads
(the reference evaluates it directly; ``attncc.ir.lower`` recognises attention in it).
Every problem is a ``SpecError`` pinned to the offending span.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

from attncc.spec import ast
from attncc.spec.errors import SpecError
from attncc.spec.functions import (
    BUILTINS,
    FUNCTION_NAMES,
    RESERVED_NAMES,
    numeric_args,
    result_type,
)

Type = Literal["int", "float", "bool"]

FLOAT_DTYPES = ("float", "f16", "bf16", "f32", "f8e4m3")
# FP8 e4m3 (torch.float8_e4m3fn) is for the query, key and value only, all three (checked by
# attncc.ir.lower, which knows the roles); e5m2 is not taken yet
FP8_DTYPES = ("f8e4m3",)
INT_DTYPES = ("i32", "i64")
TENSOR_DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
PARAM_DTYPES = ("f32", "i32")
SCHEDULES = ("naive", "fused", "split_kv")
# The built-in functions (name, arity, typing): attncc.spec.functions is the one table.
FUNCTIONS = FUNCTION_NAMES


def dtype_type(dtype: str) -> Type:
    if dtype in FLOAT_DTYPES:
        return "float"
    if dtype in INT_DTYPES:
        return "int"
    return "bool"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """An input tensor: its dims in memory order and its element dtype (``float`` = any float)."""

    name: str
    dims: tuple[str, ...]
    dtype: str
    span: ast.Span

    @property
    def type(self) -> Type:
        return dtype_type(self.dtype)


@dataclass(frozen=True, slots=True)
class ParamInfo:
    name: str
    dtype: str
    default: ast.Expr | None
    span: ast.Span


@dataclass(frozen=True, slots=True)
class Definition:
    """``target[indices] = value``; ``summed`` are the indices of value missing on the left."""

    target: str
    indices: tuple[str, ...]
    value: ast.Expr
    summed: tuple[str, ...]
    stmt: ast.AssignStmt


@dataclass(frozen=True, slots=True)
class Softmax:
    """``target = softmax(source, axis[, sink])``: masks apply to ``source`` before
    normalisation; ``sink`` is an extra logit in the normaliser of each row (it has no value)."""

    target: str
    source: str
    axis: str
    indices: tuple[str, ...]
    stmt: ast.AssignStmt
    sink: ast.Expr | None = None


Step = Definition | Softmax


@dataclass(frozen=True, slots=True)
class ViewInfo:
    """``view name[i: I, ...] = input[...]``: reading ``name[e, ...]`` reads ``value`` with each
    local index ``indices[k]`` replaced by the subscript ``e``."""

    name: str
    indices: tuple[str, ...]
    dims: tuple[str, ...]
    value: ast.Access
    span: ast.Span

    def read(self, subscripts: tuple[ast.Expr, ...]) -> ast.Access:
        """The input access that ``name[subscripts]`` stands for."""
        return substitute(self.value, dict(zip(self.indices, subscripts, strict=True)))  # type: ignore[return-value]


def substitute(expr: ast.Expr, names: dict[str, ast.Expr]) -> ast.Expr:
    """``expr`` with each bare name in ``names`` replaced by its expression."""
    match expr:
        case ast.Name(name=name) if name in names:
            return names[name]
        case ast.Access(indices=indices):
            return replace(expr, indices=tuple(substitute(i, names) for i in indices))
        case ast.Call(args=args):
            return replace(expr, args=tuple(substitute(a, names) for a in args))
        case ast.Neg(operand=x) | ast.Not(operand=x):
            return replace(expr, operand=substitute(x, names))
        case (
            ast.Binary(left=a, right=b)
            | ast.Compare(left=a, right=b)
            | ast.Logical(left=a, right=b)
        ):
            return replace(expr, left=substitute(a, names), right=substitute(b, names))
    return expr


@dataclass(frozen=True, slots=True)
class CheckedSpec:
    spec: ast.Spec
    name: str
    dims: tuple[str, ...]
    inputs: dict[str, TensorInfo]
    params: dict[str, ParamInfo]
    lets: dict[str, ast.Expr]
    index_dims: dict[str, str]
    steps: tuple[Step, ...]
    masks: tuple[ast.MaskStmt, ...]
    output: str
    output_indices: tuple[str, ...]
    schedule: str | None
    views: dict[str, ViewInfo] = field(default_factory=dict)
    derived_dims: dict[str, ast.Expr] = field(default_factory=dict)

    def defined_indices(self, name: str) -> tuple[str, ...]:
        for step in reversed(self.steps):
            if step.target == name:
                return step.indices
        raise KeyError(name)


def walk(expr: ast.Expr) -> Iterator[ast.Expr]:
    """Pre-order walk over an expression tree."""
    yield expr
    match expr:
        case ast.Access(indices=indices):
            for sub in indices:
                yield from walk(sub)
        case ast.Call(args=args):
            for sub in args:
                yield from walk(sub)
        case ast.Neg(operand=x) | ast.Not(operand=x):
            yield from walk(x)
        case (
            ast.Binary(left=a, right=b)
            | ast.Compare(left=a, right=b)
            | ast.Logical(left=a, right=b)
        ):
            yield from walk(a)
            yield from walk(b)
        case _:
            pass


class _Checker:
    def __init__(self, spec: ast.Spec) -> None:
        self.spec = spec
        self.dims: dict[str, ast.Ident] = {}
        self.inputs: dict[str, TensorInfo] = {}
        self.views: dict[str, ViewInfo] = {}
        self.derived_dims: dict[str, ast.Expr] = {}
        self.params: dict[str, ParamInfo] = {}
        self.lets: dict[str, ast.Expr] = {}
        self.index_dims: dict[str, str] = {}
        self.index_spans: dict[str, ast.Span] = {}
        self.defined: dict[str, tuple[str, ...]] = {}
        self.steps: list[Step] = []
        self.masks: list[ast.MaskStmt] = []
        self.outputs: list[ast.OutStmt] = []
        self.schedule: str | None = None
        self.symbol_spans: dict[str, ast.Span] = {}
        self.symbol_kinds: dict[str, str] = {}
        # every computed tensor, so that no index takes the name of one defined further down
        self.targets: dict[str, ast.Span] = {}
        for stmt in spec.statements:
            if isinstance(stmt, ast.AssignStmt):
                self.targets.setdefault(stmt.target.name, stmt.target.span)

    def error(self, message: str, span: ast.Span | None, hint: str | None = None) -> SpecError:
        return SpecError(message, span, hint, source=self.spec.source, filename=self.spec.filename)

    # ------------------------------------------------------------------ declarations

    def declare(self, ident: ast.Ident, what: str) -> None:
        if ident.name in self.symbol_spans:
            first = self.symbol_spans[ident.name]
            raise self.error(
                f"duplicate name '{ident.name}' ({what})",
                ident.span,
                f"'{ident.name}' is already declared at line {first.line}; choose another name",
            )
        if ident.name in RESERVED_NAMES:
            raise self.error(
                f"'{ident.name}' is a built-in function and cannot name a {what}", ident.span
            )
        self.symbol_spans[ident.name] = ident.span
        self.symbol_kinds[ident.name] = what

    def declarations(self) -> None:
        for stmt in self.spec.statements:
            match stmt:
                case ast.DimsStmt(names=names, values=values):
                    for ident, value in zip(names, values, strict=True):
                        if value is not None:
                            self.derived_dim(ident, value)
                        self.declare(ident, "dim")
                        self.dims[ident.name] = ident
                case ast.InputStmt():
                    self.input_decl(stmt)
                case ast.ParamStmt():
                    self.param_decl(stmt)
                case ast.LetStmt(name=name, value=value):
                    self.declare(name, "let")
                    self.lets[name.name] = value
                case ast.ViewStmt():
                    self.view_decl(stmt)
                case ast.ScheduleStmt(name=name):
                    if self.schedule is not None:
                        raise self.error("duplicate schedule statement", stmt.span)
                    if name.name not in SCHEDULES:
                        raise self.error(
                            f"unknown schedule '{name.name}'",
                            name.span,
                            f"choose one of {', '.join(SCHEDULES)}",
                        )
                    self.schedule = name.name
                case ast.OutStmt():
                    if self.outputs:
                        raise self.error(
                            "duplicate out statement", stmt.span, "a spec has exactly one output"
                        )
                    self.outputs.append(stmt)
                case _:
                    pass
        used = {d.name for info in self.inputs.values() for d in self._input_stmt(info.name).dims}
        for dim, ident in self.dims.items():
            if dim not in used and dim not in self.derived_dims:
                raise self.error(
                    f"dim '{dim}' is not used by any input, so its size cannot be bound",
                    ident.span,
                    "use it in an `in` declaration or remove it",
                )

    def derived_dim(self, ident: ast.Ident, value: ast.Expr) -> None:
        """``dims N = NP * PAGE``: a size computed from dims declared before it."""
        for node in walk(value):
            if isinstance(node, ast.Name) and node.name not in self.dims:
                raise self.error(
                    f"a derived dim can use dims declared before it only, not '{node.name}'",
                    node.span,
                    "e.g. dims NP, PAGE, N = NP * PAGE",
                )
            if isinstance(node, ast.Access | ast.Call):
                raise self.error(
                    "a derived dim is integer arithmetic on dims", node.span, "N = NP * PAGE"
                )
        if self.type_of(value, frozenset()) != "int":
            raise self.error(f"dim '{ident.name}' must be an integer", value.span)
        self.derived_dims[ident.name] = value

    def view_decl(self, stmt: ast.ViewStmt) -> None:
        for ident in stmt.dims:
            if ident.name not in self.dims:
                raise self.error(
                    f"unknown dim '{ident.name}'", ident.span, f"declare it: dims {ident.name}"
                )
        value = stmt.value
        if (
            not isinstance(value, ast.Access)
            or value.tensor.name not in self.inputs
            or self.inputs[value.tensor.name].type != "float"
        ):
            raise self.error(
                "a view reads one float input tensor",
                value.span,
                "view kc[b: B, n: N, j: KVH, d: D] = "
                "k_pages[page_table[b, n / PAGE], n % PAGE, j, d]",
            )
        self.declare(stmt.name, "view")
        self.views[stmt.name.name] = ViewInfo(
            stmt.name.name,
            tuple(i.name for i in stmt.indices),
            tuple(d.name for d in stmt.dims),
            value,
            stmt.span,
        )

    def view_body(self, stmt: ast.ViewStmt) -> None:
        """Check a view's right-hand side with its indices as the only indices in scope."""
        seen: set[str] = set()
        for ident in stmt.indices:
            if ident.name in self.symbol_spans or ident.name in seen:
                raise self.error(
                    f"view index '{ident.name}' is already a name in this spec",
                    ident.span,
                    "view indices are local: pick a name no dim, input, param or let has",
                )
            seen.add(ident.name)
        for node in walk(stmt.value):
            if isinstance(node, ast.Name) and not (
                node.name in seen or node.name in self.dims or node.name in self.params
            ):
                raise self.error(
                    f"a view reads its own indices, dims and params only, not '{node.name}'",
                    node.span,
                )
        outer = self.index_dims, self.index_spans
        self.index_dims = {i.name: d.name for i, d in zip(stmt.indices, stmt.dims, strict=True)}
        self.index_spans = {i.name: i.span for i in stmt.indices}
        try:
            self.bind_accesses(stmt.value, {})
            self.type_of(stmt.value, frozenset())
        finally:
            self.index_dims, self.index_spans = outer

    def _input_stmt(self, name: str) -> ast.InputStmt:
        for stmt in self.spec.statements:
            if isinstance(stmt, ast.InputStmt) and stmt.name.name == name:
                return stmt
        raise KeyError(name)

    def input_decl(self, stmt: ast.InputStmt) -> None:
        for ident in stmt.dims:
            if ident.name not in self.dims:
                raise self.error(
                    f"unknown dim '{ident.name}'",
                    ident.span,
                    f"declare it first: dims {ident.name}, ...",
                )
        dtype = "float"
        if stmt.dtype is not None:
            dtype = stmt.dtype.name
            if dtype == "f64":
                # no kernel takes float64 tensors, so no call could satisfy the declaration
                raise self.error(
                    "f64 inputs are not supported: the kernels take 16- and 32-bit floats",
                    stmt.dtype.span,
                    "declare it `float` (f16, bf16 or f32, chosen at call time) or `f32`; "
                    "the reference evaluates in float64 whatever the inputs",
                )
            if dtype == "f8e5m2":
                raise self.error(
                    "f8e5m2 inputs are not supported yet",
                    stmt.dtype.span,
                    "declare the query, key and value f8e4m3 (torch.float8_e4m3fn)",
                )
            if dtype not in TENSOR_DTYPES:
                raise self.error(
                    f"unknown dtype '{dtype}'",
                    stmt.dtype.span,
                    f"choose one of {', '.join(TENSOR_DTYPES)}",
                )
        self.declare(stmt.name, "input")
        self.inputs[stmt.name.name] = TensorInfo(
            stmt.name.name, tuple(d.name for d in stmt.dims), dtype, stmt.span
        )

    def param_decl(self, stmt: ast.ParamStmt) -> None:
        if stmt.dtype.name not in PARAM_DTYPES:
            raise self.error(
                f"unknown param dtype '{stmt.dtype.name}'",
                stmt.dtype.span,
                f"a param is a scalar: choose one of {', '.join(PARAM_DTYPES)}",
            )
        if stmt.default is not None:
            for node in walk(stmt.default):
                if isinstance(node, ast.Name) and not (
                    node.name in self.dims or node.name in self.params
                ):
                    raise self.error(
                        f"a param default can use dims and earlier params only, not '{node.name}'",
                        node.span,
                        "defaults are computed once per call from tensor sizes",
                    )
                if isinstance(node, ast.Access):
                    raise self.error(
                        "a param default cannot read a tensor", node.span, "pass it as an input"
                    )
            value_type = self.type_of(stmt.default, frozenset())
            want = dtype_type(stmt.dtype.name)
            if value_type == "bool" or (want == "int" and value_type == "float"):
                raise self.error(
                    f"the default of '{stmt.name.name}' is {value_type}, "
                    f"but the param is {stmt.dtype.name}",
                    stmt.default.span,
                )
        self.declare(stmt.name, "param")
        self.params[stmt.name.name] = ParamInfo(
            stmt.name.name, stmt.dtype.name, stmt.default, stmt.span
        )

    # ------------------------------------------------------------------ indices

    def is_symbol(self, name: str) -> bool:
        return name in self.symbol_spans or name in self.defined

    def bind(self, index: ast.Name, dim: str, tensor: str) -> None:
        if index.name in self.targets:
            target = self.targets[index.name]
            raise self.error(
                f"'{index.name}' names a computed tensor and cannot also be an index",
                index.span,
                f"'{index.name}' is assigned at line {target.line}; rename the index",
            )
        bound = self.index_dims.get(index.name)
        if bound is None:
            self.index_dims[index.name] = dim
            self.index_spans[index.name] = index.span
        elif bound != dim:
            first = self.index_spans[index.name]
            raise self.error(
                f"index '{index.name}' is used for dim {dim} of '{tensor}', "
                f"but it ranges over dim {bound}",
                index.span,
                f"'{index.name}' was bound to {bound} at line {first.line}, column "
                f"{first.column}; use an index that ranges over {dim} here. If {bound} and "
                f"{dim} are one size (self-attention), declare one dim for both; if not, read "
                f"a tensor declared over {bound} (e.g. a second input)",
            )

    def bind_accesses(self, expr: ast.Expr, defined_dims: dict[str, tuple[str, ...]]) -> None:
        for node in walk(expr):
            if not isinstance(node, ast.Access):
                continue
            name = node.tensor.name
            if name in self.inputs:
                dims = self.inputs[name].dims
            elif name in self.views:
                dims = self.views[name].dims
            elif name in defined_dims:
                dims = defined_dims[name]
            else:
                continue  # reported by type_of
            if len(node.indices) != len(dims):
                raise self.error(
                    f"'{name}' has {len(dims)} dims [{', '.join(dims)}] "
                    f"but is indexed with {len(node.indices)}",
                    node.span,
                    f"write {name}[{', '.join(d.lower() for d in dims)}] with one index per dim",
                )
            for sub, dim in zip(node.indices, dims, strict=True):
                if isinstance(sub, ast.Name) and not self.is_symbol(sub.name):
                    self.bind(sub, dim, name)

    def free_indices(self, expr: ast.Expr) -> list[str]:
        """Indices an expression ranges over, in order of first appearance (lets expanded)."""
        found: list[str] = []

        def add(name: str) -> None:
            if name not in found:
                found.append(name)

        for node in walk(expr):
            if isinstance(node, ast.Name):
                if node.name in self.lets:
                    for sub in self.free_indices(self.lets[node.name]):
                        add(sub)
                elif node.name in self.defined:
                    for sub in self.defined[node.name]:
                        add(sub)
                elif node.name in self.index_dims:
                    add(node.name)
            elif isinstance(node, ast.Access) and node.tensor.name in self.defined:
                pass  # its subscripts are walked as names
        return found

    # ------------------------------------------------------------------ types

    def type_of(self, expr: ast.Expr, current: frozenset[str]) -> Type:
        """Type of ``expr``; ``current`` are the indices bare defined tensors are read at."""
        match expr:
            case ast.Number(value=value):
                return "int" if isinstance(value, int) else "float"
            case ast.Name(name=name, span=span):
                if name in self.params:
                    return dtype_type(self.params[name].dtype)
                if name in self.dims or name in self.lets or name in self.index_dims:
                    return "int"
                if name in self.defined:
                    missing = [i for i in self.defined[name] if i not in current]
                    if missing:
                        raise self.error(
                            f"bare '{name}' means {name}[{', '.join(self.defined[name])}], "
                            f"but index {missing[0]!r} is not in scope here",
                            span,
                            f"write the indices explicitly: {name}[...]",
                        )
                    return "float"
                if name in self.views:
                    raise self.error(f"view '{name}' must be indexed", span)
                if name in self.inputs:
                    raise self.error(
                        f"input '{name}' must be indexed",
                        span,
                        f"write {name}[{', '.join(d.lower() for d in self.inputs[name].dims)}]",
                    )
                raise self.error(
                    f"unknown name '{name}'",
                    span,
                    "an index must appear as a subscript of a tensor; "
                    "declare dims, params and lets before use",
                )
            case ast.Access(tensor=tensor, indices=indices):
                if tensor.name in self.inputs:
                    result = self.inputs[tensor.name].type
                elif tensor.name in self.defined or tensor.name in self.views:
                    result = "float"
                elif (
                    tensor.name in self.lets
                    or tensor.name in self.params
                    or tensor.name in self.dims
                ):
                    raise self.error(
                        f"'{tensor.name}' is not a tensor and cannot be indexed", tensor.span
                    )
                else:
                    raise self.error(
                        f"unknown tensor '{tensor.name}'",
                        tensor.span,
                        "declare it with `in` or define it with an assignment before this line",
                    )
                for sub in indices:
                    sub_type = self.type_of(sub, current)
                    if sub_type != "int":
                        raise self.error(
                            f"a subscript must be an integer, got {sub_type}",
                            sub.span,
                            "subscripts are indices, dims, lets and integer arithmetic on them",
                        )
                return result
            case ast.Call(func=func, args=args, span=span):
                return self.call_type(func, args, span, current)
            case ast.Neg(operand=x):
                t = self.type_of(x, current)
                if t == "bool":
                    raise self.error("cannot negate a boolean", expr.span, "use `not`")
                return t
            case ast.Binary(op=op, left=a, right=b):
                ta, tb = self.type_of(a, current), self.type_of(b, current)
                for t, side in ((ta, a), (tb, b)):
                    if t == "bool":
                        raise self.error(
                            f"arithmetic '{op}' on a boolean", side.span, "use `and`/`or`/`where`"
                        )
                if op == "%" and (ta != "int" or tb != "int"):
                    raise self.error("'%' needs integers", expr.span)
                return "int" if ta == tb == "int" else "float"
            case ast.Compare(left=a, right=b):
                for side in (a, b):
                    if self.type_of(side, current) == "bool":
                        raise self.error(
                            "cannot compare a boolean", side.span, "use `and`/`or`/`not`"
                        )
                return "bool"
            case ast.Logical(op=op, left=a, right=b):
                for side in (a, b):
                    if self.type_of(side, current) != "bool":
                        raise self.error(
                            f"'{op}' needs boolean operands", side.span, "compare first: m >= n"
                        )
                return "bool"
            case ast.Not(operand=x):
                if self.type_of(x, current) != "bool":
                    raise self.error("'not' needs a boolean operand", x.span)
                return "bool"
        raise AssertionError(expr)

    def call_type(
        self, func: ast.Ident, args: tuple[ast.Expr, ...], span: ast.Span, current: frozenset[str]
    ) -> Type:
        name = func.name
        if name == "softmax":
            raise self.error(
                "softmax must be the whole right-hand side of an assignment",
                span,
                "write it on its own line: p = softmax(s, n)",
            )
        if name not in BUILTINS:
            raise self.error(
                f"unknown function '{name}'",
                func.span,
                f"available: {', '.join(FUNCTION_NAMES)}, softmax",
            )
        arity = BUILTINS[name].arity
        if len(args) != arity:
            raise self.error(
                f"{name} takes {arity} argument{'s' if arity > 1 else ''}, got {len(args)}",
                span,
            )
        types = [self.type_of(a, current) for a in args]
        numeric = numeric_args(name, len(args))
        if numeric.start == 1 and types[0] != "bool":
            raise self.error(f"the condition of {name} must be boolean", args[0].span)
        for i in numeric:
            if types[i] == "bool":
                raise self.error(f"{name} needs a number, got a boolean", args[i].span)
        return result_type(name, types)

    # ------------------------------------------------------------------ statements

    def bind_all(self) -> None:
        """First binding pass: accesses to inputs and views fix each plain index's dim."""
        for stmt in self.spec.statements:
            if isinstance(stmt, ast.ViewStmt):
                self.view_body(stmt)
        for stmt in self.spec.statements:
            match stmt:
                case (
                    ast.AssignStmt(value=value)
                    | ast.MaskStmt(condition=value)
                    | ast.LetStmt(value=value)
                ):
                    self.bind_accesses(value, {})
                case _:
                    pass

    def statements(self) -> None:
        defined_dims: dict[str, tuple[str, ...]] = {}
        for stmt in self.spec.statements:
            match stmt:
                case ast.LetStmt(name=name, value=value):
                    self.let_order(name, value)
                    if self.type_of(value, frozenset(self.index_dims)) != "int":
                        raise self.error(
                            f"let '{name.name}' must be an integer index expression",
                            value.span,
                            "lets derive indices, e.g. let g = h / (H / KVH)",
                        )
                case ast.AssignStmt():
                    self.assignment(stmt, defined_dims)
                case ast.MaskStmt(condition=cond):
                    self.reject_nested_softmax(cond)
                    self.bind_accesses(cond, defined_dims)
                    for node in walk(cond):
                        if isinstance(node, ast.Name | ast.Access) and (
                            (isinstance(node, ast.Name) and node.name in self.defined)
                            or (isinstance(node, ast.Access) and node.tensor.name in self.defined)
                        ):
                            raise self.error(
                                "a mask cannot read computed values",
                                node.span,
                                "masks use indices, dims, params and input tensors; "
                                "use where(...) in a score modification instead",
                            )
                    t = self.type_of(cond, frozenset(self.index_dims))
                    if t != "bool":
                        raise self.error(
                            f"a mask must be a boolean expression, got {t}",
                            cond.span,
                            "compare indices: mask m >= n",
                        )
                    self.masks.append(stmt)
                case _:
                    pass

    def let_order(self, name: ast.Ident, value: ast.Expr) -> None:
        """A let may use lets declared above it only, which rules out cycles."""
        earlier = list(self.lets)[: list(self.lets).index(name.name)]
        for node in walk(value):
            if isinstance(node, ast.Name) and node.name in self.lets and node.name not in earlier:
                where = (
                    "itself" if node.name == name.name else f"'{node.name}' before it is defined"
                )
                raise self.error(
                    f"let '{name.name}' uses {where}",
                    node.span,
                    "a let may use indices, dims, params and the lets above it",
                )

    def reject_nested_softmax(self, expr: ast.Expr) -> None:
        for node in walk(expr):
            if _is_softmax(node):
                raise self.error(
                    "softmax must be the whole right-hand side of an assignment",
                    node.span,
                    "write it on its own line: p = softmax(s, n)",
                )

    def assignment(self, stmt: ast.AssignStmt, defined_dims: dict[str, tuple[str, ...]]) -> None:
        target = stmt.target
        if _is_softmax(stmt.value):
            assert isinstance(stmt.value, ast.Call)
            for arg in stmt.value.args:
                self.reject_nested_softmax(arg)
        else:
            self.reject_nested_softmax(stmt.value)
        if target.name in self.symbol_spans:
            raise self.error(
                f"'{target.name}' is declared as {_a(self.symbol_kinds[target.name])} "
                "and cannot be assigned",
                target.span,
                "give the computed tensor its own name",
            )
        if stmt.indices is None:
            if target.name not in self.defined and not _is_softmax(stmt.value):
                raise self.error(
                    f"'{target.name}' needs indices on its first definition",
                    target.span,
                    f"write {target.name}[i, j, ...] = ... with the indices it keeps; "
                    "the others are summed",
                )
            lhs = self.defined.get(target.name, ())
        else:
            lhs = tuple(i.name for i in stmt.indices)
            seen: set[str] = set()
            for ident in stmt.indices:
                if ident.name in seen:
                    raise self.error(f"index '{ident.name}' repeated on the left", ident.span)
                seen.add(ident.name)
                if self.is_symbol(ident.name) and ident.name not in self.index_dims:
                    kind = self.symbol_kinds.get(ident.name, "computed tensor")
                    raise self.error(
                        f"'{ident.name}' is {_a(kind)}, not an index",
                        ident.span,
                        "an index name must not also name a dim, input, param, let or tensor; "
                        "rename one of them",
                    )
            if target.name in self.defined and self.defined[target.name] != lhs:
                raise self.error(
                    f"'{target.name}' was defined with indices "
                    f"[{', '.join(self.defined[target.name])}]",
                    stmt.span,
                    f"a redefinition keeps the indices; write it bare: {target.name} = ...",
                )
        if _is_softmax(stmt.value):
            self.softmax(stmt, lhs, defined_dims)
            return
        self.bind_accesses(stmt.value, defined_dims)
        value_type = self.type_of(stmt.value, frozenset(lhs))
        if value_type != "float":
            raise self.error(
                f"'{target.name}' must be a float expression, got {value_type}",
                stmt.value.span,
                "masks go in `mask` statements; numbers need a float factor",
            )
        for ident in stmt.indices or ():
            if ident.name not in self.index_dims:
                raise self.error(
                    f"unknown index '{ident.name}'",
                    ident.span,
                    "every index on the left must be a subscript of a tensor on the right",
                )
        free = self.free_indices(stmt.value)
        summed = tuple(i for i in free if i not in lhs)
        if summed:
            for node in walk(stmt.value):
                if (
                    isinstance(node, ast.Access)
                    and node.tensor.name in self.inputs
                    and self.inputs[node.tensor.name].type != "float"
                ):
                    raise self.error(
                        f"integer tensor '{node.tensor.name}' in a contraction over "
                        f"{', '.join(summed)}",
                        node.span,
                        "contractions multiply float tensors; integer tensors belong in masks",
                    )
        self.defined[target.name] = lhs
        defined_dims[target.name] = tuple(self.index_dims[i] for i in lhs)
        self.steps.append(Definition(target.name, lhs, stmt.value, summed, stmt))

    def softmax(
        self, stmt: ast.AssignStmt, lhs: tuple[str, ...], defined_dims: dict[str, tuple[str, ...]]
    ) -> None:
        call = stmt.value
        assert isinstance(call, ast.Call)
        if len(call.args) not in (2, 3):
            raise self.error(
                f"softmax takes 2 or 3 arguments, got {len(call.args)}",
                call.span,
                "softmax(s, n), or softmax(s, n, sinks[h]) with a sink logit per row",
            )
        source, axis = call.args[:2]
        sink = call.args[2] if len(call.args) == 3 else None
        if not isinstance(source, ast.Name) or source.name not in self.defined:
            raise self.error(
                "the first argument of softmax must name computed scores",
                source.span,
                "define the scores first: s[b, h, m, n] = q[...] * k[...]",
            )
        indices = self.defined[source.name]
        if not isinstance(axis, ast.Name) or axis.name not in indices:
            raise self.error(
                f"softmax over an index the scores do not have: "
                f"{source.name} has [{', '.join(indices)}]",
                axis.span,
                "normalise over the key index, e.g. softmax(s, n)",
            )
        if stmt.indices is not None and lhs != indices:
            raise self.error(
                f"softmax keeps the indices of '{source.name}' [{', '.join(indices)}]", stmt.span
            )
        if sink is not None:
            self.sink(sink, indices, axis.name, defined_dims)
        self.defined[stmt.target.name] = indices
        defined_dims[stmt.target.name] = tuple(self.index_dims[i] for i in indices)
        self.steps.append(Softmax(stmt.target.name, source.name, axis.name, indices, stmt, sink))

    def sink(
        self,
        sink: ast.Expr,
        indices: tuple[str, ...],
        axis: str,
        defined_dims: dict[str, tuple[str, ...]],
    ) -> None:
        """A sink is one logit per row: no key index, no computed values."""
        self.bind_accesses(sink, defined_dims)
        for node in walk(sink):
            name = (
                node.name
                if isinstance(node, ast.Name)
                else node.tensor.name
                if isinstance(node, ast.Access)
                else None
            )
            if name is not None and name in self.defined:
                raise self.error(
                    "a softmax sink cannot read computed values",
                    node.span,
                    "read the sink logits from an input: softmax(s, n, sinks[h])",
                )
        for index in self.free_indices(sink):
            if index == axis or index not in indices:
                raise self.error(
                    f"a softmax sink is one logit per row and cannot use index '{index}'",
                    sink.span,
                    f"the rows are [{', '.join(i for i in indices if i != axis)}]",
                )
        if self.type_of(sink, frozenset(indices)) == "bool":
            raise self.error("a softmax sink must be a number, got a boolean", sink.span)

    def finish(self) -> CheckedSpec:
        if not self.outputs:
            raise self.error(
                "missing `out` statement",
                self.spec.name.span,
                "add a last line naming the result, e.g. `out o`",
            )
        out = self.outputs[0]
        if out.name.name not in self.defined:
            raise self.error(
                f"out names '{out.name.name}', which is not a computed tensor",
                out.name.span,
                "name the left-hand side of the output contraction",
            )
        softmaxes = [s for s in self.steps if isinstance(s, Softmax)]
        if self.masks and not softmaxes:
            raise self.error("a mask without a softmax has nothing to mask", self.masks[0].span)
        if softmaxes:
            score_indices = set(softmaxes[0].indices)
            for mask in self.masks:
                for index in self.free_indices(mask.condition):
                    if index not in score_indices:
                        raise self.error(
                            f"mask uses index '{index}', which the scores "
                            f"'{softmaxes[0].source}' do not have",
                            mask.condition.span,
                            f"the scores range over [{', '.join(softmaxes[0].indices)}]",
                        )
        return CheckedSpec(
            spec=self.spec,
            name=self.spec.name.name,
            dims=tuple(self.dims),
            inputs=dict(self.inputs),
            params=dict(self.params),
            lets=dict(self.lets),
            index_dims=dict(self.index_dims),
            steps=tuple(self.steps),
            masks=tuple(self.masks),
            output=out.name.name,
            output_indices=self.defined[out.name.name],
            schedule=self.schedule,
            views=dict(self.views),
            derived_dims=dict(self.derived_dims),
        )


def _a(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def _is_softmax(expr: ast.Expr) -> bool:
    return isinstance(expr, ast.Call) and expr.func.name == "softmax"


def check(spec: ast.Spec) -> CheckedSpec:
    """Check a parsed spec; raises ``SpecError`` with the position of the first problem."""
    checker = _Checker(spec)
    checker.declarations()
    checker.bind_all()
    checker.statements()
    return checker.finish()
