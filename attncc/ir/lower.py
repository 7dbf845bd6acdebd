"""Recognise attention in a checked spec and lower it to an ``AttentionKernel``.

The pattern: scores ``s[..] = q[..] * k[..] * <scalars>`` contracting one head index,
elementwise modifications ``s = f(s, ...)``, masks, ``p = softmax(s, n)``, and the output
``o[..] = p[..] * v[..]`` contracting n. Anything else is a ``SpecError`` saying which part
of the pattern is missing.
"""

from __future__ import annotations

from attncc.ir import nodes as ir
from attncc.spec import ast
from attncc.spec.check import FP8_DTYPES, CheckedSpec, Definition, Softmax, dtype_type, walk
from attncc.spec.errors import SpecError
from attncc.spec.functions import result_type


class _Lowering:
    def __init__(self, checked: CheckedSpec) -> None:
        self.c = checked
        self.spec = checked.spec

    def error(self, message: str, span: ast.Span | None, hint: str | None = None) -> SpecError:
        return SpecError(message, span, hint, source=self.spec.source, filename=self.spec.filename)

    # ------------------------------------------------------------------ expressions

    def expr(self, node: ast.Expr, score: str | None = None) -> ir.Expr:
        """Lower an expression; a bare or indexed ``score`` reads the current score."""
        match node:
            case ast.Number(value=value):
                return ir.Const(value, "int" if isinstance(value, int) else "float")
            case ast.Name(name=name, span=span):
                if name == score:
                    return ir.Score()
                if name in self.c.params:
                    return ir.Param(name, dtype_type(self.c.params[name].dtype))
                if name in self.c.dims:
                    return ir.Dim(name)
                if name in self.c.lets:
                    return self.expr(self.c.lets[name], score)
                if name in self.c.index_dims:
                    return ir.Index(name)
                raise self.error(
                    f"'{name}' cannot be used here",
                    span,
                    "score modifications read the scores only",
                )
            case ast.Access(tensor=tensor, indices=indices, span=span):
                if tensor.name == score:
                    own = self.c.defined_indices(score)
                    if [i.name if isinstance(i, ast.Name) else None for i in indices] != list(own):
                        # any other subscripts would read another element of the scores, which
                        # an elementwise modification does not have
                        raise self.error(
                            f"a score modification reads '{score}' at its own indices only",
                            span,
                            f"write {score}[{', '.join(own)}] or the bare name {score}",
                        )
                    return ir.Score()
                if tensor.name in self.c.views:
                    return self.expr(self.c.views[tensor.name].read(indices), score)
                if tensor.name not in self.c.inputs:
                    raise self.error(
                        f"'{tensor.name}' cannot be read here",
                        span,
                        "score modifications read the scores and input tensors only",
                    )
                info = self.c.inputs[tensor.name]
                return ir.Load(tensor.name, tuple(self.expr(i, score) for i in indices), info.type)
            case ast.Call(func=func, args=args):
                lowered = tuple(self.expr(a, score) for a in args)
                return ir.Call(
                    func.name, lowered, result_type(func.name, (a.type for a in lowered))
                )
            case ast.Neg(operand=x):
                inner = self.expr(x, score)
                return ir.Unary("neg", inner, inner.type)
            case ast.Not(operand=x):
                return ir.Unary("not", self.expr(x, score), "bool")
            case ast.Binary(op=op, left=a, right=b):
                la, lb = self.expr(a, score), self.expr(b, score)
                t: ir.Type = "int" if la.type == lb.type == "int" else "float"
                return ir.BinOp(op, la, lb, t)
            case ast.Compare(op=op, left=a, right=b):
                return ir.BinOp(op, self.expr(a, score), self.expr(b, score), "bool")
            case ast.Logical(op=op, left=a, right=b):
                return ir.BinOp(op, self.expr(a, score), self.expr(b, score), "bool")
        raise AssertionError(node)

    # ------------------------------------------------------------------ pattern

    def lower(self) -> ir.AttentionKernel:
        c = self.c
        softmaxes = [s for s in c.steps if isinstance(s, Softmax)]
        if len(softmaxes) != 1:
            span = softmaxes[1].stmt.span if softmaxes else self.spec.name.span
            raise self.error(
                f"not attention: expected exactly one softmax, found {len(softmaxes)}",
                span,
                "attention is scores, softmax(scores, key index), then a contraction with values",
            )
        softmax = softmaxes[0]
        score_defs = [
            s for s in c.steps if isinstance(s, Definition) and s.target == softmax.source
        ]
        contraction, mods = score_defs[0], score_defs[1:]
        late = [d for d in mods if c.steps.index(d) > c.steps.index(softmax)]
        if late:
            # the kernels modify the scores before the softmax; after it, nothing reads them
            raise self.error(
                f"'{softmax.source}' is modified after the softmax has read it",
                late[0].stmt.span,
                f"move the modification above {softmax.target} = softmax(...)",
            )
        query_op, key_op, scale = self.scores(contraction, softmax)
        key_index = softmax.axis
        (head_index,) = contraction.summed
        # The query axis is the score index the key does not depend on, even through a let
        # (h reaches k through g = h / (H / KVH), so h is a batch axis, not a query axis).
        key_reads = self.indices_read(key_op)
        query_axis_name = next(
            (i for i in _plain(query_op) if i in softmax.indices and i not in key_reads), None
        )
        batch = [i for i in softmax.indices if i not in (key_index, query_axis_name)]
        value_def, value_access, value_factors = self.value_contraction(softmax)
        value_indices = [
            sub.name
            for sub in value_access.indices
            if isinstance(sub, ast.Name) and sub.name in c.index_dims
        ]
        value_index = next(
            (i for i in value_indices if i not in (key_index, *batch) and i in value_def.indices),
            None,
        )
        if value_index is None:
            raise self.error(
                "the value tensor needs a head-dim index that the output keeps",
                value_access.span,
                "o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]",
            )
        expected_out = {*batch, value_index} | ({query_axis_name} if query_axis_name else set())
        if set(value_def.indices) != expected_out:
            raise self.error(
                f"the output must range over [{', '.join(sorted(expected_out))}]",
                value_def.stmt.span,
                "keep batch, head, query and value head-dim indices on the output",
            )
        for operand, role, required in (
            (query_op, "query", [head_index] + ([query_axis_name] if query_axis_name else [])),
            (key_op, "key", [head_index, key_index]),
            (value_access, "value", [key_index, value_index]),
        ):
            self.check_operand(operand, role, required, batch)

        def axis(index: str) -> ir.Axis:
            return ir.Axis(index, c.index_dims[index])

        # views are read through: the roles go to the input tensors behind them
        query_in, key_in, value_in = (
            self.through_view(a).tensor.name for a in (query_op, key_op, value_access)
        )
        roles = {query_in: "query", key_in: "key"}
        roles.setdefault(value_in, "value")
        if len({query_in, key_in, value_in}) < 3:
            raise self.error(
                "query, key and value must be three different input tensors", contraction.stmt.span
            )
        for mod in mods:
            self.elementwise(mod)
        scalars = [f for f in _factors(contraction.value) or [] if not isinstance(f, ast.Access)]
        elementwise: list[tuple[str, ast.Expr]] = [
            ("a scalar factor of the scores", f) for f in scalars
        ]
        elementwise += [("a score modification", m.value) for m in mods]
        elementwise += [("a mask", m.condition) for m in c.masks]
        for what, expr in elementwise:
            self.reject_operand_reads(what, expr, roles)
        value_scale = self.value_scale(value_factors, key_index, batch, roles)
        self.fp8_roles(roles)
        tensors = tuple(
            ir.TensorArg(t.name, t.dims, t.dtype, roles.get(t.name, "aux"))  # type: ignore[arg-type]
            for t in c.inputs.values()
        )
        params = tuple(
            ir.ParamArg(
                p.name,
                p.dtype,
                dtype_type(p.dtype),
                self.expr(p.default) if p.default is not None else None,
            )
            for p in c.params.values()
        )
        return ir.AttentionKernel(
            name=c.name,
            dims=c.dims,
            tensors=tensors,
            params=params,
            batch_axes=tuple(axis(i) for i in batch),
            query_axis=axis(query_axis_name) if query_axis_name else None,
            key_axis=axis(key_index),
            head_axis=axis(head_index),
            value_axis=axis(value_index),
            query=self.operand(query_op),
            key=self.operand(key_op),
            value=self.operand(value_access),
            score_scale=scale,
            score_mods=tuple(self.modification(m, softmax.source) for m in mods),
            masks=tuple(self.expr(m.condition) for m in c.masks),
            output=ir.Output(
                value_def.target,
                value_def.indices,
                tuple(c.index_dims[i] for i in value_def.indices),
            ),
            schedule=c.schedule,  # type: ignore[arg-type]
            derived_dims=tuple((d, self.expr(v)) for d, v in c.derived_dims.items()),
            lse_order=tuple(i for i in softmax.indices if i != key_index),
            sink=self.sink(softmax, query_axis_name, roles),
            value_scale=value_scale,
        )

    def sink(self, softmax: Softmax, query: str | None, roles: dict[str, str]) -> ir.Expr | None:
        if softmax.sink is None:
            return None
        if query is not None and query in self.indices_read(softmax.sink):
            # the kernels hold one sink per program (a head's logit), not one per query row
            raise self.error(
                f"a softmax sink may depend on batch indices only, not the query index '{query}'",
                softmax.sink.span,
                "gpt-oss's sinks are one logit per head: softmax(s, n, sinks[h])",
            )
        self.reject_operand_reads("a softmax sink", softmax.sink, roles)
        return self.expr(softmax.sink)

    def scores(
        self, contraction: Definition, softmax: Softmax
    ) -> tuple[ast.Access, ast.Access, ir.Expr]:
        span = contraction.stmt.span
        if len(contraction.summed) != 1:
            raise self.error(
                "not attention: the scores must contract exactly one head-dim index, "
                f"found {len(contraction.summed)}",
                span,
                "s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] * scale",
            )
        factors = _factors(contraction.value) or []
        accesses = [f for f in factors if isinstance(f, ast.Access)]
        scalars = [f for f in factors if not isinstance(f, ast.Access)]
        if len(accesses) != 2 or _factors(contraction.value) is None:
            raise self.error(
                "not attention: the scores must be a product of two tensors (query and key) "
                "and scalar factors",
                contraction.value.span,
                "put other terms on their own line: s = s + bias[b, h, m, n]",
            )
        for factor in scalars:
            if self.c_free(factor):
                raise self.error(
                    "a scalar factor of the scores cannot depend on an index",
                    factor.span,
                    "apply index-dependent terms as a modification: s = s * w[h]",
                )
        key = next((a for a in accesses if softmax.axis in _plain(a)), None)
        query = next((a for a in accesses if a is not key), None)
        if key is None or query is None or softmax.axis in _plain(query):
            raise self.error(
                f"not attention: exactly one factor of the scores must range over the softmax "
                f"index '{softmax.axis}' (the key)",
                contraction.value.span,
            )
        scale: ir.Expr = ir.Const(1.0, "float")
        for factor in scalars:
            lowered = self.expr(factor)
            scale = (
                lowered
                if scale == ir.Const(1.0, "float")
                else ir.BinOp("*", scale, lowered, "float")
            )
        return query, key, scale

    def indices_read(self, expr: ast.Expr) -> set[str]:
        """Indices an expression depends on, looking through lets."""
        found: set[str] = set()
        for node in walk(expr):
            if isinstance(node, ast.Name) and node.name in self.c.lets:
                found |= self.indices_read(self.c.lets[node.name])
            elif isinstance(node, ast.Name) and node.name in self.c.index_dims:
                found.add(node.name)
        return found

    def c_free(self, expr: ast.Expr) -> bool:
        return any(
            isinstance(n, ast.Name) and (n.name in self.c.index_dims or n.name in self.c.lets)
            for n in walk(expr)
        )

    def value_contraction(self, softmax: Softmax) -> tuple[Definition, ast.Access, list[ast.Expr]]:
        """The output's definition, its value tensor, and its other factors (a value scale:
        ``o = p * v * v_descale[b, h, n / 128]``, checked by ``value_scale``)."""
        out = [s for s in self.c.steps if isinstance(s, Definition) and s.target == self.c.output]
        if not out:
            raise self.error("not attention: the output must be a contraction", self.spec.name.span)
        value_def = out[-1]
        factors = _factors(value_def.value)
        uses_p = [
            f
            for f in factors or []
            if isinstance(f, ast.Access) and f.tensor.name == softmax.target
        ]
        others = [f for f in factors or [] if f not in uses_p]
        # the value tensor: the first input (or view) read at an index the output keeps and
        # the probabilities lack (the value head dim); every other factor scales the values
        values = [
            f
            for f in others
            if isinstance(f, ast.Access)
            and (f.tensor.name in self.c.inputs or f.tensor.name in self.c.views)
            and any(
                i in value_def.indices and i not in softmax.indices
                for i in _plain(f)
                if i in self.c.index_dims
            )
        ]
        if factors is None or len(uses_p) != 1 or not values:
            raise self.error(
                f"not attention: the output must be {softmax.target}[...] * v[...]",
                value_def.value.span,
                f"o[b, h, m, d] = {softmax.target}[b, h, m, n] * v[b, h, n, d]",
            )
        if tuple(value_def.summed) != (softmax.axis,):
            raise self.error(
                f"not attention: the output must sum over the softmax index '{softmax.axis}' only",
                value_def.stmt.span,
            )
        p_access = uses_p[0]
        assert isinstance(p_access, ast.Access)
        if tuple(_plain(p_access)) != softmax.indices:
            raise self.error(
                f"read {softmax.target} with its own indices [{', '.join(softmax.indices)}]",
                p_access.span,
            )
        value_access = values[0]
        assert isinstance(value_access, ast.Access)
        return value_def, value_access, [f for f in others if f is not value_access]

    def value_scale(
        self, factors: list[ast.Expr], key: str, batch: list[str], roles: dict[str, str]
    ) -> ir.Expr | None:
        """The output's factors beside p and v, multiplied: one number per key (and batch
        index), e.g. a per-block FP8 descale of v; the kernels weigh each key's probability
        by it."""
        scale: ir.Expr | None = None
        for factor in factors:
            stray = sorted(self.indices_read(factor) - {key, *batch})
            if stray:
                raise self.error(
                    f"a factor of the output beside the probabilities and the values may use "
                    f"the key index '{key}' and batch indices only, not '{stray[0]}'",
                    factor.span,
                    "a value scale is one number per key: o = p * v * v_descale[b, h, n / 128]",
                )
            self.reject_operand_reads("a value scale", factor, roles)
            lowered = self.expr(factor)
            if lowered.type == "bool":
                raise self.error("a value scale must be a number, got a boolean", factor.span)
            scale = lowered if scale is None else ir.BinOp("*", scale, lowered, "float")
        if scale is not None and scale.type != "float":
            raise self.error(
                "a value scale must be a float",
                factors[0].span,
                "write it as a float (2.0, not 2), or read a float input",
            )
        return scale

    def fp8_roles(self, roles: dict[str, str]) -> None:
        """FP8 inputs are the query, key and value, all three: the kernels' FP8 path is the
        two contractions' operands, with every other float read in float32."""
        fp8 = {name for name, info in self.c.inputs.items() if info.dtype in FP8_DTYPES}
        if not fp8:
            return
        for name in sorted(fp8):
            if name not in roles:
                raise self.error(
                    f"input '{name}' is f8e4m3, but only the query, key and value may be FP8",
                    self.c.inputs[name].span,
                    "declare side inputs (descales, biases) f32 or float",
                )
        plain = sorted(set(roles) - fp8)
        if plain:
            raise self.error(
                f"the query, key and value must all be f8e4m3 or none of them; "
                f"'{plain[0]}' is {self.c.inputs[plain[0]].dtype}",
                self.c.inputs[plain[0]].span,
                f"declare {', '.join(plain)} f8e4m3 too",
            )

    def check_operand(
        self, access: ast.Access, role: str, required: list[str], batch: list[str]
    ) -> None:
        """Each subscript is a required plain index or an expression of batch indices only."""
        plain = _plain(access)
        for index in required:
            if index not in plain:
                raise self.error(
                    f"the {role} tensor '{access.tensor.name}' must be indexed by "
                    f"'{index}' directly",
                    access.span,
                )
        for sub in access.indices:
            if isinstance(sub, ast.Name) and sub.name in required:
                continue
            for index in sorted(self.indices_read(sub)):
                if index not in batch:
                    raise self.error(
                        f"the {role} subscript uses '{index}', which is not a batch index",
                        sub.span,
                        "query/key/value subscripts other than the axes may depend on "
                        f"batch indices ({', '.join(batch)}) only",
                    )

    def through_view(self, access: ast.Access) -> ast.Access:
        view = self.c.views.get(access.tensor.name)
        return view.read(access.indices) if view is not None else access

    def operand(self, access: ast.Access) -> ir.Operand:
        target = self.through_view(access)
        return ir.Operand(target.tensor.name, tuple(self.expr(i) for i in target.indices))

    def elementwise(self, mod: Definition) -> None:
        """A later assignment to the scores modifies each score on its own: no sum."""
        if mod.summed:
            raise self.error(
                f"a score modification is elementwise, but this one sums over "
                f"{', '.join(repr(i) for i in mod.summed)}",
                mod.stmt.span,
                f"the first definition of '{mod.target}' is the only contraction of the "
                "scores; contract other tensors into a tensor of their own, or index every "
                "term by the scores' indices",
            )

    def reject_operand_reads(self, what: str, expr: ast.Expr, roles: dict[str, str]) -> None:
        """Query, key and value are read by the two contractions only: the kernels hold them
        as tiles, not as tensors an elementwise expression can index."""
        for node in walk(expr):
            if not isinstance(node, ast.Access):
                continue
            name = (
                self.through_view(node).tensor.name
                if node.tensor.name in self.c.views
                else node.tensor.name
            )
            if name in roles:
                raise self.error(
                    f"{what} cannot read the {roles[name]} tensor '{name}'",
                    node.span,
                    "query, key and value are read by the score and output contractions "
                    "only; pass what the expression needs as an input of its own",
                )

    def modification(self, mod: Definition, score: str) -> ir.Expr:
        lowered = self.expr(mod.value, score)
        if lowered.type != "float":
            raise self.error("a score modification must be a float", mod.value.span)
        return lowered


def _factors(expr: ast.Expr) -> list[ast.Expr] | None:
    """The factors of a product, or None when ``expr`` is not a product of factors."""
    if isinstance(expr, ast.Binary) and expr.op == "*":
        left, right = _factors(expr.left), _factors(expr.right)
        return None if left is None or right is None else left + right
    if isinstance(expr, ast.Binary) and expr.op == "/":
        # x / c keeps x's factors and divides a scalar factor: only the left may be a tensor.
        left = _factors(expr.left)
        return (
            None
            if left is None
            else [*left, ast.Binary("/", ast.Number(1.0, expr.span), expr.right, expr.span)]
        )
    return [expr]


def _plain(access: ast.Access) -> list[str]:
    return [s.name for s in access.indices if isinstance(s, ast.Name)]


def lower(checked: CheckedSpec) -> ir.AttentionKernel:
    """Recognise attention; raises ``SpecError`` when the spec is not attention."""
    return _Lowering(checked).lower()
