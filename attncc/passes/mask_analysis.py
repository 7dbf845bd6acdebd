"""mask-analysis: turn masks into a visible key interval per query row where possible.

A comparison that is linear in the key index n with coefficient +-1 (``m >= n``,
``m - n < window``, ``n < cache_len[b]``, ``m + N - M >= n``) bounds n from one side by an
expression of the query index m and of per-program values. The kernel then loops over the
keys of the interval only (empty tiles are skipped) and runs tiles inside every row's
interval without any mask arithmetic. Masks that are no interval (document ids) remain
per-element ``residual`` masks; those comparing a per-row value with a per-key value
(``doc[b, m] == doc[b, n]``) also let whole tiles be skipped when the tile's row values and
key values cannot meet.

Such an equality between a row value and a key value also makes terms equal: where
``seq[m] == seq[n]`` holds, ``start[seq[m]]`` is ``start[seq[n]]``. So a comparison whose
non-linear terms cancel that way (``m - start[seq[m]] >= n - start[seq[n]]``, causality in
sequence-local positions of packed sequences) is the interval ``n <= m`` wherever the
equality holds, and the equality, a mask of its own, masks every other pair.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from attncc.ir import nodes as ir
from attncc.ir.verify import indices_of, replaced, subexprs


@dataclass(frozen=True)
class _Linear:
    """sum(coeffs[i] * i) + sum(sign * term): a linear form in the query/key indices."""

    coeffs: dict[str, int]
    terms: tuple[tuple[int, ir.Expr], ...]

    def scaled(self, factor: int) -> _Linear:
        return _Linear(
            {k: v * factor for k, v in self.coeffs.items()},
            tuple((s * factor, t) for s, t in self.terms),
        )

    def plus(self, other: _Linear) -> _Linear:
        coeffs = dict(self.coeffs)
        for k, v in other.coeffs.items():
            coeffs[k] = coeffs.get(k, 0) + v
        return _Linear({k: v for k, v in coeffs.items() if v}, self.terms + other.terms)


def _linearize(expr: ir.Expr, variables: set[str]) -> _Linear | None:
    """A linear form of ``expr`` in ``variables``, or None when it is not an integer sum.
    Integer terms that are not linear in ``variables`` (``start[seq[m]]``) are kept as terms
    for ``_cancel``; a form with such a term left is no bound."""
    if not indices_of(expr) & variables:
        return _Linear({}, ((1, expr),)) if expr.type == "int" else None
    match expr:
        case ir.Index(name=name):
            return _Linear({name: 1}, ())
        case ir.Unary(op="neg", operand=x):
            inner = _linearize(x, variables)
            return inner.scaled(-1) if inner else None
        case ir.BinOp(op="+" | "-", left=a, right=b) if expr.type == "int":
            la, lb = _linearize(a, variables), _linearize(b, variables)
            if la is None or lb is None:
                return None
            return la.plus(lb.scaled(-1 if expr.op == "-" else 1))
        case (
            ir.BinOp(op="*", left=ir.Const(value=int() as c), right=x)
            | ir.BinOp(op="*", left=x, right=ir.Const(value=int() as c))
        ) if not isinstance(c, bool):
            inner = _linearize(x, variables)
            return inner.scaled(c) if inner else None
        case _:
            return _Linear({}, ((1, expr),)) if expr.type == "int" else None


# An equality of a row value with a key value, ``row == key``: (row side, key side)
Equality = tuple[ir.Expr, ir.Expr]
_SAME = ir.Index("=")  # stands for the value both sides of an equality share (no real index)


def _equal_under(
    row_term: ir.Expr, key_term: ir.Expr, equalities: tuple[Equality, ...], key: str, query: str
) -> bool:
    """Whether ``row_term`` (reading the query index) equals ``key_term`` (reading the key
    index) wherever one of ``equalities`` holds: both are one function of the two sides."""
    for row, key_side in equalities:
        a, b = replaced(row_term, row, _SAME), replaced(key_term, key_side, _SAME)
        if a == b and not indices_of(a) & {key, query}:
            return True
    return False


def _cancel(
    form: _Linear, equalities: tuple[Equality, ...], key: str, query: str | None
) -> _Linear | None:
    """``form`` without the terms that read the key or query index: equal terms of opposite
    signs cancel, and so do a row term and a key term equal under an equality; None when
    such a term is left."""
    variables = {key} | ({query} if query else set())
    if not any(indices_of(t) & variables for _, t in form.terms):
        return form  # the common case, kept as it was written
    terms: list[ir.Expr] = []  # distinct terms, and the sum of each one's signs
    signs: list[int] = []
    for sign, term in form.terms:
        if term in terms:
            signs[terms.index(term)] += sign
        else:
            terms.append(term)
            signs.append(sign)
    reads = [indices_of(t) & variables for t in terms]
    for i in range(len(terms)):
        for j in range(len(terms)):
            if (
                query is not None
                and signs[i] * signs[j] < 0
                and reads[i] == {query}
                and reads[j] == {key}
                and _equal_under(terms[i], terms[j], equalities, key, query)
            ):
                both = min(abs(signs[i]), abs(signs[j]))
                signs[i] -= both if signs[i] > 0 else -both
                signs[j] -= both if signs[j] > 0 else -both
    if any(s and r for s, r in zip(signs, reads, strict=True)):
        return None
    return _Linear(form.coeffs, tuple((s, t) for s, t in zip(signs, terms, strict=True) if s))


def _sum(terms: list[tuple[int, ir.Expr]]) -> ir.Expr:
    """Render sum(sign * term) as an integer IR expression."""
    result: ir.Expr | None = None
    for sign, term in terms:
        for _ in range(abs(sign)):
            if result is None:
                result = term if sign > 0 else ir.Unary("neg", term, "int")
            else:
                result = ir.BinOp("+" if sign > 0 else "-", result, term, "int")
    return result if result is not None else ir.Const(0, "int")


@dataclass(frozen=True)
class _Interval:
    lower: tuple[ir.KeyBound, ...]
    upper: tuple[ir.KeyBound, ...]


def _compare_interval(
    mask: ir.BinOp, key: str, query: str | None, equalities: tuple[Equality, ...]
) -> _Interval | None:
    variables = {key} | ({query} if query else set())
    left, right = _linearize(mask.left, variables), _linearize(mask.right, variables)
    if left is None or right is None:
        return None
    form = _cancel(left.plus(right.scaled(-1)), equalities, key, query)  # form <op> 0
    if form is None:
        return None
    key_coeff = form.coeffs.get(key, 0)
    if key_coeff not in (1, -1) or set(form.coeffs) - variables:
        return None
    # Normalise to  key <op'> rest  with rest = -form/key_coeff without the key term.
    rest_form = _Linear({k: v for k, v in form.coeffs.items() if k != key}, form.terms).scaled(
        -key_coeff
    )
    op = mask.op
    if key_coeff == -1:  # -n + r <op> 0  <=>  n <flipped op> r
        op = ir.FLIPPED_COMPARE[op]
    query_coeff = rest_form.coeffs.get(query, 0) if query else 0
    terms = list(rest_form.terms)
    if query_coeff:
        terms = [(query_coeff, ir.Index(query)), *terms] if query else terms
    slope = (query_coeff > 0) - (query_coeff < 0)

    def bound(offset: int) -> ir.KeyBound:
        expr = _sum(terms + ([(offset, ir.Const(1, "int"))] if offset else []))
        return ir.KeyBound(expr, slope)

    match op:  # key <op> rest, upper bounds exclusive
        case "<":
            return _Interval((), (bound(0),))
        case "<=":
            return _Interval((), (bound(1),))
        case ">":
            return _Interval((bound(1),), ())
        case ">=":
            return _Interval((bound(0),), ())
        case "==":
            return _Interval((bound(0),), (bound(1),))
        case _:
            return None


def _combine(bounds: tuple[ir.KeyBound, ...], func: str) -> ir.KeyBound | None:
    """min/max of bounds of one monotonic direction (needed to stay a tile-wise bound)."""
    slopes = {b.slope for b in bounds} - {0}
    if len(slopes) > 1:
        return None
    expr = bounds[0].expr
    for b in bounds[1:]:
        expr = ir.Call(func, (expr, b.expr), "int")
    return ir.KeyBound(expr, slopes.pop() if slopes else 0)


def _interval(
    mask: ir.Expr, key: str, query: str | None, equalities: tuple[Equality, ...] = ()
) -> _Interval | None:
    """The key interval of ``mask``, exact wherever ``equalities`` hold (None: no interval)."""
    match mask:
        case ir.BinOp(op="and", left=a, right=b):
            ia, ib = _interval(a, key, query, equalities), _interval(b, key, query, equalities)
            if ia is None or ib is None:
                return None
            return _Interval(ia.lower + ib.lower, ia.upper + ib.upper)
        case ir.BinOp(op="or", left=a, right=b):
            ia, ib = _interval(a, key, query, equalities), _interval(b, key, query, equalities)
            if ia is None or ib is None:
                return None
            # A union of intervals is an interval when both start at 0 (or both end at N).
            if not ia.lower and not ib.lower and ia.upper and ib.upper:
                ua, ub = _combine(ia.upper, "min"), _combine(ib.upper, "min")
                joined = _combine((ua, ub), "max") if ua and ub else None
                return _Interval((), (joined,)) if joined else None
            if not ia.upper and not ib.upper and ia.lower and ib.lower:
                la, lb = _combine(ia.lower, "max"), _combine(ib.lower, "max")
                joined = _combine((la, lb), "min") if la and lb else None
                return _Interval((joined,), ()) if joined else None
            return None
        case ir.BinOp(op="<" | "<=" | ">" | ">=" | "==") if key in indices_of(mask):
            return _compare_interval(mask, key, query, equalities)
        case _:
            return None


@dataclass(frozen=True)
class MaskAnalysis:
    """Before: ``mask_plan`` is None. After: every mask is either folded into the key
    interval of ``mask_plan`` or listed in its ``residual``; the interval is exact where the
    residual masks hold (a key is in it iff the folded masks hold; a folded mask may rely on
    a residual equality, see the module docstring). Bounds depend on the query index and
    batch values only. A mask that is an interval only by such an equality, or whose terms
    cancelled (``m - start[s[m]] >= n - start[s[m]]``), is replaced in ``masks`` by its
    interval's comparisons (``n < m + 1``), which partial tiles then test instead of its
    loads (every mask is then one conjunct); the masks' conjunction is the same.
    """

    name: str = "mask-analysis"

    def run(self, kernel: ir.AttentionKernel) -> ir.AttentionKernel:
        key = kernel.key_axis.index
        query = kernel.query_axis.index if kernel.query_axis else None
        lower: list[ir.KeyBound] = []
        upper: list[ir.KeyBound] = []
        residual: list[ir.Expr] = []
        conjuncts = [c for mask in kernel.masks for c in _conjuncts(mask)]
        batch = {a.index for a in kernel.batch_axes}
        # row == key equalities, each a mask of its own that the others may rely on
        equalities = [_equality(c, batch, key, query) for c in conjuncts]
        masks = list(conjuncts)
        for i, mask in enumerate(conjuncts):
            others = tuple(e for j, e in enumerate(equalities) if e is not None and j != i)
            interval = _interval(mask, key, query, others)
            if interval is None:
                residual.append(mask)
                continue
            lower.extend(interval.lower)
            upper.extend(interval.upper)
            as_interval = _interval_mask(interval, key)
            relies = others and _interval(mask, key, query) is None
            if relies or _loads(as_interval) < _loads(mask):
                masks[i] = as_interval
        separable = [
            s for s in (_separable(m, batch, key, query) for m in residual) if s is not None
        ]
        plan = ir.MaskPlan(tuple(lower), tuple(upper), tuple(residual), tuple(separable))
        if masks != conjuncts:
            return replace(kernel, masks=tuple(masks), mask_plan=plan)
        return replace(kernel, mask_plan=plan)


def _loads(expr: ir.Expr) -> int:
    """How many tensor reads ``expr`` makes."""
    return sum(isinstance(e, ir.Load) for e in subexprs(expr))


def _interval_mask(interval: _Interval, key: str) -> ir.Expr:
    """``interval`` as a mask: ``n >= lower and n < upper`` for each of its bounds."""
    n = ir.Index(key)
    tests = [ir.BinOp(">=", n, b.expr, "bool") for b in interval.lower]
    tests += [ir.BinOp("<", n, b.expr, "bool") for b in interval.upper]
    result = tests[0]
    for test in tests[1:]:
        result = ir.BinOp("and", result, test, "bool")
    return result


def _separable(
    mask: ir.Expr, batch: set[str], key: str, query: str | None
) -> ir.SeparableMask | None:
    """``row <op> key`` with each side reading one of the query and key indices."""
    if query is None or not (isinstance(mask, ir.BinOp) and mask.op in ir.FLIPPED_COMPARE):
        return None
    left, right = indices_of(mask.left), indices_of(mask.right)
    row_side, key_side = batch | {query}, batch | {key}
    if query in left and left <= row_side and key in right and right <= key_side:
        return ir.SeparableMask(mask.left, mask.op, mask.right)
    if key in left and left <= key_side and query in right and right <= row_side:
        return ir.SeparableMask(mask.right, ir.FLIPPED_COMPARE[mask.op], mask.left)
    return _rearranged(mask, batch, key, query)


def _rearranged(mask: ir.BinOp, batch: set[str], key: str, query: str) -> ir.SeparableMask | None:
    """An integer comparison whose sides mix row and key terms, its terms moved so that
    one side reads the query index and the other the key index: ``(m - start_q[s[m]]) >=
    (n - start_k[s[m]])`` (causality in sequence-local positions, keys packed apart from
    the queries) is ``m - start_q[s[m]] + start_k[s[m]] >= n``, whose row side a query
    tile's rows bound tightly even where the tile holds two sequences. Only where a term
    that moves reads a table (a comparison of the indices alone, ``m - n != 3``, stays
    residual: no tile of it is skipped, and an index would cost a builder launch). None
    where a term reads both indices or a side is left empty."""
    if mask.left.type != "int" or mask.right.type != "int":
        return None
    variables = {key, query}
    left, right = _linearize(mask.left, variables), _linearize(mask.right, variables)
    if left is None or right is None:
        return None
    form = left.plus(right.scaled(-1))  # form <op> 0
    if not any(indices_of(t) & variables for _, t in form.terms):
        return None
    row_side, key_side = batch | {query}, batch | {key}
    row: list[tuple[int, ir.Expr]] = []
    keys: list[tuple[int, ir.Expr]] = []
    for name, coeff in form.coeffs.items():
        (row if name == query else keys).append((coeff, ir.Index(name)))
    for sign, term in form.terms:
        reads = indices_of(term)
        if key not in reads and reads <= row_side:
            row.append((sign, term))
        elif query not in reads and reads <= key_side:
            keys.append((sign, term))
        else:
            return None
    if not any(query in indices_of(t) for _, t in row) or not keys:
        return None
    # row + keys <op> 0  <=>  row <op> -keys
    return ir.SeparableMask(_sum(row), mask.op, _sum([(-sign, t) for sign, t in keys]), mask)


def _conjuncts(mask: ir.Expr) -> list[ir.Expr]:
    """The terms of an ``and`` chain, in order (a mask that is no ``and``: itself)."""
    if isinstance(mask, ir.BinOp) and mask.op == "and":
        return _conjuncts(mask.left) + _conjuncts(mask.right)
    return [mask]


def _equality(mask: ir.Expr, batch: set[str], key: str, query: str | None) -> Equality | None:
    """``(row, key side)`` of an integer mask ``row == key side`` (either way round)."""
    sep = _separable(mask, batch, key, query)
    if sep is None or sep.op != "==" or sep.row.type != "int" or sep.key.type != "int":
        return None
    return sep.row, sep.key
