"""Check a compiled kernel against the float64 reference on random shapes, layouts and dtypes.

Used by ``attncc check`` and the test suites. Inputs are drawn fresh for every trial (never
zeros), outputs are poisoned with NaN before the run so unwritten elements show, and the
verdict follows ``attncc.tolerance``. A trial whose kernel (or reference) raises is a failed
result with the error, not the end of the run.

``check_backward`` draws the same trials and checks gradients instead: forward and backward
with a random ``grad_out``, every float input's gradient against ``reference_grads`` in
float64 by ``compare_grad``, the bound set by the same math done eagerly in the trial's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attncc.codegen.backward import BackwardUnsupported, check_supported
from attncc.ir import nodes as ir
from attncc.ir.nodes import AttentionKernel
from attncc.ir.printer import expr_str as ir_str
from attncc.ir.verify import subexprs
from attncc.reference import Rounding, reference
from attncc.reference_grad import eager_grads, float_inputs, gradient_terms, reference_grads
from attncc.runtime.kernel import Kernel
from attncc.text import format_table
from attncc.tolerance import Verdict, compare, compare_grad
from attncc.torch_eval import evaluate

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# an input declared with a dtype is drawn in it, whatever the trial's dtype for q, k and v
DECLARED_DTYPES = {
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "f64": torch.float64,
    "f8e4m3": torch.float8_e4m3fn,
}
DTYPE_NAMES: dict[torch.dtype, Rounding] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    # FP8 q, k and v: measured against plain per-tensor FP8 done eagerly (attncc.reference)
    torch.float8_e4m3fn: "float8_e4m3",
}
LAYOUTS = ("contiguous", "strided", "permuted")
HEAD_DIMS = (16, 32, 40, 64, 80, 96, 128)
TABLE_SIZES = (1, 64)  # a dim only sizes a table (buckets, a pool): 1..64 entries
FLOAT_PARAM_RANGE = (0.1, 10.0)  # an f32 param without a default: log-uniform in here


@dataclass(frozen=True)
class Case:
    sizes: dict[str, int]
    dtype: torch.dtype
    layout: str
    params: dict[str, int | float] = field(default_factory=dict)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.sizes.items())


@dataclass(frozen=True)
class Result:
    """The verdicts of one trial; ``error`` is set (and both verdicts fail) when the kernel
    or the reference raised."""

    case: Case
    output: Verdict
    lse: Verdict
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.output.ok and self.lse.ok

    @staticmethod
    def failed(case: Case, error: str) -> Result:
        nan = float("nan")
        verdict = Verdict(nan, nan, nan, nan, False, error)
        return Result(case, verdict, verdict, error)


def draw_sizes(
    kernel: AttentionKernel,
    rng: np.random.Generator,
    max_len: int = 96,
    head_dims: Sequence[int] = HEAD_DIMS,
    fixed: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Sizes for every dim: lengths 1..max_len (M != N allowed), head dims from ``head_dims``,
    batch and heads 1..3 (query heads a multiple of kv heads), page pools 1..63 pages; a dim
    that sizes another tensor (a packed cache's tokens, a bucket table) holds every entry the
    spec reads from it for these sizes, plus up to as many again, or 1..64 entries where the
    reads cannot be bounded. ``fixed`` (validated by ``check_dims``) sets dims outright; the
    random draws are the same with or without it."""
    fixed = dict(fixed or {})
    sizes: dict[str, int] = {}

    def put(dim: str, value: int) -> None:
        sizes[dim] = fixed.get(dim, value)

    for dim in kernel.dims:
        put(dim, int(rng.integers(1, 4)))
    for axis in kernel.batch_axes:
        put(axis.dim, int(rng.integers(1, 4)))
    put(kernel.key_axis.dim, int(rng.integers(1, max_len + 1)))
    if kernel.query_axis is not None and kernel.query_axis.dim != kernel.key_axis.dim:
        put(kernel.query_axis.dim, int(rng.integers(1, max_len + 1)))
    put(kernel.head_axis.dim, int(rng.choice(list(head_dims))))
    if kernel.value_axis.dim != kernel.head_axis.dim:
        put(kernel.value_axis.dim, int(rng.choice(list(head_dims))))
    if kernel.group is not None:
        kv = int(rng.integers(1, 3))
        ratio = int(rng.integers(1, 4))
        heads, kv_heads = kernel.group.head.dim, kernel.group.kv_dim
        if heads in fixed and kv_heads not in fixed:
            kv = kv if fixed[heads] % kv == 0 else 1
        kv = fixed.get(kv_heads, kv)
        sizes[kv_heads] = kv
        sizes[heads] = fixed.get(heads, kv * ratio)
    for dim in index_tensor_dims(kernel).values():
        put(dim, int(rng.integers(1, 64)))  # a pool to pick from (pages)
    key_length, page = int(rng.integers(1, max_len + 1)), int(rng.integers(1, 18))
    derive_sizes(kernel, sizes, key_length, page, fixed)
    if _draw_table_dims(kernel, sizes, fixed, rng):
        derive_sizes(kernel, sizes, key_length, page, fixed)  # a derived dim may use one
    if kernel.schedule == "split_kv" and kernel.query_axis is not None:
        # split-KV holds every (query head of a group, query) row in one tile: at most 128
        group = sizes[kernel.group.head.dim] // sizes[kernel.group.kv_dim] if kernel.group else 1
        query = kernel.query_axis.dim
        if query not in fixed:
            sizes[query] = min(sizes[query], 128 // group)
            if kernel.key_axis.dim == query:
                sizes[kernel.key_axis.dim] = sizes[query]
    return sizes


def derive_sizes(
    kernel: AttentionKernel,
    sizes: dict[str, int],
    key_length: int,
    page: int,
    fixed: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Compute the derived dims into ``sizes``. A paged key axis ``N = NP * PAGE`` first gets
    pages of ``page`` tokens, and pages enough for ``key_length`` keys (each unless ``fixed``)."""
    fixed = fixed or {}
    for dim, value in kernel.derived_dims:
        if (
            dim == kernel.key_axis.dim
            and isinstance(value, ir.BinOp)
            and value.op == "*"
            and isinstance(value.left, ir.Dim)
            and isinstance(value.right, ir.Dim)
        ):
            sizes[value.right.name] = fixed.get(value.right.name, page)
            pages = -(-key_length // sizes[value.right.name])
            sizes[value.left.name] = fixed.get(value.left.name, pages)
        sizes[dim] = int(evaluate(value, {}, sizes, {}, {}))
    return sizes


def _known_dims(kernel: AttentionKernel) -> set[str]:
    """The dims ``draw_sizes`` draws by their role (axes, GQA, page pools, paged keys)."""
    axes = [*kernel.batch_axes, kernel.key_axis, kernel.head_axis, kernel.value_axis]
    known = {a.dim for a in axes}
    if kernel.query_axis is not None:
        known.add(kernel.query_axis.dim)
    if kernel.group is not None:
        known |= {kernel.group.head.dim, kernel.group.kv_dim}
    known |= set(index_tensor_dims(kernel).values())
    for dim, value in kernel.derived_dims:
        known.add(dim)
        if dim == kernel.key_axis.dim and isinstance(value, ir.BinOp):
            known |= {e.name for e in (value.left, value.right) if isinstance(e, ir.Dim)}
    return known


def _subscripts(kernel: AttentionKernel) -> Iterator[tuple[str, ir.Expr]]:
    """Every (dim, subscript expression) pair of every tensor read."""
    for operand in (kernel.query, kernel.key, kernel.value):
        yield from zip(kernel.tensor(operand.tensor).dims, operand.indices, strict=True)
    for expr in (*kernel.score_mods, *kernel.masks):
        for e in subexprs(expr):
            if isinstance(e, ir.Load):
                yield from zip(kernel.tensor(e.tensor).dims, e.indices, strict=True)


def _draw_table_dims(
    kernel: AttentionKernel,
    sizes: dict[str, int],
    fixed: Mapping[str, int],
    rng: np.random.Generator,
) -> bool:
    """Size the dims no role covers (a packed cache's tokens, a bucket table's entries): at
    least one past the largest subscript the spec reads them with (as ``make_inputs`` draws
    integer inputs), plus up to as many again; 1..64 where a subscript cannot be bounded.
    Drawn at 1..3 these passed a packed-cache spec whose reads never left the first rows."""
    todo = [d for d in table_dims(kernel) if d not in fixed]
    if not todo:
        return False
    key_size = sizes[kernel.key_axis.dim]
    # int params as draw_params draws them (1..key length + 1), or their default: a block
    # size divides a row index (an FP8 descale per block of rows, k_descale[b, h, n / block])
    defaults = param_defaults(kernel, sizes, {})
    int_params = {
        p.name: (
            min(1, int(defaults.get(p.name, 1))),
            max(key_size + 1, int(defaults.get(p.name, 1))),
        )
        for p in kernel.params
        if p.type == "int"
    }

    def pick(need: int | None) -> int:
        if need is None:
            return int(rng.integers(TABLE_SIZES[0], TABLE_SIZES[1] + 1))
        return max(need, 1) + int(rng.integers(0, max(need, 1) + 1))

    size_table_dims(kernel, sizes, todo, int_params, pick)
    return True


def table_dims(kernel: AttentionKernel) -> list[str]:
    """The dims no role covers: they size tables the spec reads by subscripts (a packed
    cache's tokens, a bucket table's entries, FP8 descales per block of rows)."""
    known = _known_dims(kernel)
    return [d for d in kernel.dims if d not in known]


def size_table_dims(
    kernel: AttentionKernel,
    sizes: dict[str, int],
    todo: Sequence[str],
    int_params: Mapping[str, tuple[int, int]],
    pick: Callable[[int | None], int],
) -> None:
    """Size each dim of ``todo`` in turn: ``pick`` of one past the largest subscript the spec
    reads it with, for these ``sizes`` and int params in their ``int_params`` ranges (None
    where a subscript cannot be bounded)."""
    axes = [*kernel.batch_axes, kernel.key_axis, kernel.head_axis, kernel.value_axis]
    if kernel.query_axis is not None:
        axes.append(kernel.query_axis)
    index_dims = {a.index: a.dim for a in axes}
    key_size = sizes[kernel.key_axis.dim]
    indexing = index_tensor_dims(kernel)
    pending = set(todo)

    def bounds(e: ir.Expr) -> tuple[int, int] | None:
        """The integer range of ``e`` over these sizes and drawn inputs (None: unknown)."""
        match e:
            case ir.Const(value=value) if isinstance(value, int):
                return value, value
            case ir.Dim(name=name) if name not in pending:
                return sizes[name], sizes[name]
            case ir.Param(name=name) if name in int_params:
                return int_params[name]
            case ir.Index(name=name) if name in index_dims and index_dims[name] not in pending:
                return 0, sizes[index_dims[name]] - 1
            case ir.Load(tensor=name) if name in indexing:
                return 0, sizes[indexing[name]] - 1
            case ir.Load(tensor=name) if kernel.tensor(name).dtype in ("i32", "i64"):
                return 0, key_size
            case ir.Unary(op="neg", operand=x):
                r = bounds(x)
                return None if r is None else (-r[1], -r[0])
            case ir.BinOp(op=op, left=a, right=b) if op in ("+", "-", "*", "/", "%"):
                ra, rb = bounds(a), bounds(b)
                if ra is None or rb is None:
                    return None
                if op == "%":
                    top = max(abs(rb[0]), abs(rb[1])) - 1
                    return (0, min(ra[1], top)) if ra[0] >= 0 else (-top, top)
                if op == "/" and rb[0] <= 0 <= rb[1]:
                    return None
                corners = [_int_op(op, x, y) for x in ra for y in rb]
                return min(corners), max(corners)
            case ir.Call(func=func, args=(a, b)) if func in ("min", "max"):
                ra, rb = bounds(a), bounds(b)
                if ra is None or rb is None:
                    return None
                pick = min if func == "min" else max
                return pick(ra[0], rb[0]), pick(ra[1], rb[1])
        return None

    reads = list(_subscripts(kernel))
    for dim in todo:
        largest: list[tuple[int, int] | None] = [bounds(sub) for d, sub in reads if d == dim]
        bounded = bool(largest) and all(r is not None for r in largest)
        sizes[dim] = pick(max(r[1] for r in largest if r is not None) + 1 if bounded else None)
        pending.discard(dim)


def _int_op(op: str, a: int, b: int) -> int:
    """``a op b`` with the spec's integer semantics (division truncates toward zero)."""
    if op == "/":
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a + b if op == "+" else a - b if op == "-" else a * b


def check_dims(kernel: AttentionKernel, dims: Mapping[str, int]) -> None:
    """Raise ValueError unless ``dims`` can fix sizes of ``kernel``: declared, not derived,
    at least 1, and query heads a multiple of kv heads."""
    derived = dict(kernel.derived_dims)
    for name, value in dims.items():
        if name in derived:
            raise ValueError(
                f"dim {name} is derived ({name} = {ir_str(derived[name])}); "
                "set the dims it is computed from"
            )
        if name not in kernel.dims:
            raise ValueError(
                f"{kernel.name} has no dim {name!r}; its dims are {', '.join(kernel.dims)}"
            )
        if value < 1:
            raise ValueError(f"dim {name} must be at least 1, got {value}")
    group = kernel.group
    if group is not None and group.head.dim in dims and group.kv_dim in dims:
        heads, kv_heads = dims[group.head.dim], dims[group.kv_dim]
        if heads % kv_heads:
            raise ValueError(
                f"{group.head.dim}={heads} is not a multiple of {group.kv_dim}={kv_heads}"
            )


def check_params(kernel: AttentionKernel, params: Mapping[str, int | float]) -> None:
    """Raise ValueError unless every name is a param of ``kernel`` and every ``i32`` param
    gets an integer."""
    types = {p.name: p for p in kernel.params}
    for name, value in params.items():
        if name not in types:
            names = ", ".join(types) or "none"
            raise ValueError(f"{kernel.name} has no param {name!r}; its params: {names}")
        if types[name].type == "int" and not isinstance(value, int):
            raise ValueError(f"param {name} is {types[name].dtype}: give an integer, not {value}")


def index_tensor_dims(kernel: AttentionKernel) -> dict[str, str]:
    """Integer inputs read as a whole subscript of another tensor (a page table), mapped to
    the dim they index: their values must lie in [0, size of that dim)."""
    found: dict[str, str] = {}
    exprs = [*kernel.query.indices, *kernel.key.indices, *kernel.value.indices]
    exprs += [*kernel.score_mods, *kernel.masks]
    for expr in exprs:
        for e in subexprs(expr):
            if isinstance(e, ir.Load):
                dims = kernel.tensor(e.tensor).dims
                for sub, dim in zip(e.indices, dims, strict=True):
                    if isinstance(sub, ir.Load):
                        found[sub.tensor] = dim
    for operand in (kernel.query, kernel.key, kernel.value):
        dims = kernel.tensor(operand.tensor).dims
        for sub, dim in zip(operand.indices, dims, strict=True):
            if isinstance(sub, ir.Load):
                found[sub.tensor] = dim
    return found


def _layout(t: torch.Tensor, layout: str, rng: np.random.Generator) -> torch.Tensor:
    """The same values in a non-contiguous arrangement."""
    if layout == "strided" and t.dim() > 0:
        pad = int(rng.integers(1, 5))
        # drawn in float32: torch has no normal_ for FP8
        wide = torch.randn((*t.shape[:-1], t.shape[-1] + pad), device=t.device).to(t.dtype)
        wide[..., : t.shape[-1]] = t
        return wide[..., : t.shape[-1]]
    if layout == "permuted" and t.dim() > 1:
        order = list(range(t.dim()))[::-1]
        return t.permute(order).contiguous().permute(order)
    return t


# functions whose first argument must be positive (pow: a negative base needs an integer
# exponent)
_POSITIVE_ARGUMENT = ("log", "sqrt", "pow")
# where an input the spec divides by, or takes a log, square root or power of, is drawn
DOMAIN_DRAW = (0.5, 2.0)


def domain_inputs(kernel: AttentionKernel) -> frozenset[str]:
    """The float inputs read inside a divisor or the argument of a log, a square root or a
    power's base. Drawn from N(0, 1), a log's argument would be negative in half the draws
    (NaN, every trial failed) and a divisor near zero in some: a per-head temperature of
    -0.04 made scores of 100 and more, where weights recomputed from a float32
    log-sum-exp (every flash backward's) round worse than a naive softmax (dv 1.87e-4
    against a bound of 7.75e-5, fp32, `s = s / temp[h]`)."""
    exprs = [kernel.score_scale, *kernel.score_mods, *kernel.masks]
    if kernel.sink is not None:
        exprs.append(kernel.sink)
    names: set[str] = set()
    for expr in exprs:
        for sub in subexprs(expr):
            if isinstance(sub, ir.BinOp) and sub.op == "/" and sub.type == "float":
                inside: tuple[ir.Expr, ...] = (sub.right,)
            elif isinstance(sub, ir.Call) and sub.func in _POSITIVE_ARGUMENT:
                inside = sub.args[:1]
            else:
                continue
            names.update(e.tensor for a in inside for e in subexprs(a) if isinstance(e, ir.Load))
    return frozenset(names)


def make_inputs(
    kernel: AttentionKernel,
    sizes: dict[str, int],
    dtype: torch.dtype,
    device: str,
    rng: np.random.Generator,
    layout: str = "contiguous",
) -> dict[str, torch.Tensor]:
    """Random inputs: floats ~ N(0, 1), or uniform over ``DOMAIN_DRAW`` for those the spec
    divides by or takes a log, square root or power of (``domain_inputs``), in ``dtype``
    unless declared in another (an `f32` bias stays f32 beside bf16 q, k, v); integers
    that index another tensor (page tables) uniform over that dim; other integers sorted
    in [0, key length] along the last axis (document ids, cache lengths); booleans fair
    coins."""
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    key_size = sizes[kernel.key_axis.dim]
    indexing = index_tensor_dims(kernel)
    bounded = domain_inputs(kernel)
    inputs = {}
    for arg in kernel.tensors:
        shape = tuple(sizes[d] for d in arg.dims)
        if arg.name in indexing:  # e.g. page ids: anywhere in the pool, in any order
            values = torch.randint(0, max(sizes[indexing[arg.name]], 1), shape, generator=gen)
            tensor = values.to(torch.int32 if arg.dtype == "i32" else torch.int64)
        elif arg.dtype in ("i32", "i64"):
            values = torch.randint(0, key_size + 1, shape, generator=gen)
            values = values.sort(dim=-1).values if values.dim() else values
            tensor = values.to(torch.int32 if arg.dtype == "i32" else torch.int64)
        elif arg.dtype == "bool":
            tensor = torch.rand(shape, generator=gen) < 0.5
        else:
            if arg.name in bounded:
                low, high = DOMAIN_DRAW
                tensor = low + (high - low) * torch.rand(shape, generator=gen)
            else:
                tensor = torch.randn(shape, generator=gen)
            tensor = _layout(tensor.to(DECLARED_DTYPES.get(arg.dtype, dtype)), layout, rng)
        inputs[arg.name] = tensor.to(device)
    return inputs


def operand_dtype(kernel: AttentionKernel) -> torch.dtype | None:
    """The dtype q, k and v are declared in, if they are (None: `float`, any of them)."""
    for operand in (kernel.query, kernel.key, kernel.value):
        declared = DECLARED_DTYPES.get(kernel.tensor(operand.tensor).dtype)
        if declared in DTYPE_NAMES:
            return declared
    return None


def draw_params(
    kernel: AttentionKernel,
    sizes: dict[str, int],
    defaults: dict[str, Any],
    rng: np.random.Generator,
    names: Sequence[str] | None = None,
) -> dict[str, int | float]:
    """Integer params across the key range (windows, prefixes); floats around their default,
    or log-uniform over ``FLOAT_PARAM_RANGE`` without one. Only ``names`` when given."""
    key_size = sizes[kernel.key_axis.dim]
    params: dict[str, int | float] = {}
    for p in kernel.params:
        if names is not None and p.name not in names:
            continue
        if p.type == "int":
            params[p.name] = int(rng.integers(1, key_size + 2))
        elif defaults.get(p.name) is not None:
            params[p.name] = float(defaults[p.name] or 1.0) * float(rng.uniform(0.05, 2.0))
        else:
            low, high = (math.log(x) for x in FLOAT_PARAM_RANGE)
            params[p.name] = math.exp(float(rng.uniform(low, high)))
    return params


def param_defaults(
    kernel: AttentionKernel, sizes: Mapping[str, int], given: Mapping[str, int | float]
) -> dict[str, Any]:
    """The value of every param with a default, for these sizes and the ``given`` params
    (a default may use an earlier param, which may have none of its own)."""
    values: dict[str, Any] = dict(given)
    defaults: dict[str, Any] = {}
    for p in kernel.params:
        if p.name in values or p.default is None:
            continue
        try:
            value = evaluate(p.default, {}, sizes, values, {})
        except KeyError:  # uses a param not given: no default to draw around
            continue
        defaults[p.name] = values[p.name] = float(value) if p.type == "float" else int(value)
    return defaults


def _numpy(t: torch.Tensor) -> np.ndarray[Any, Any]:
    return t.detach().to("cpu", torch.float64).numpy()


def _error_text(err: BaseException) -> str:
    """One line: the exception's type and its message's first line."""
    message = str(err).strip().splitlines()
    return f"{type(err).__name__}: {message[0]}" if message else type(err).__name__


def run_case(
    kernel: Kernel, case: Case, device: str, rng: np.random.Generator, raise_errors: bool = False
) -> Result:
    """One trial. An exception of the kernel or the reference is a failed ``Result`` naming
    it (``raise_errors``: raised, for its traceback)."""
    inputs = make_inputs(kernel.ir, case.sizes, case.dtype, device, rng, case.layout)
    # the reference first: it refuses reads outside a tensor (a pool fixed too small), which
    # the kernel would make unchecked (on a GPU, a fault that ends every later trial too)
    stage = "reference: "
    try:
        exact_fn = reference(kernel.spec)
        naive_fn = reference(kernel.spec, rounding=DTYPE_NAMES[case.dtype])
        host = {k: v.cpu() for k, v in inputs.items()}
        exact_out, exact_lse = exact_fn(**host, **case.params, return_lse=True)
        naive_out, naive_lse = naive_fn(**host, **case.params, return_lse=True)
        stage = ""
        out, lse = kernel(**inputs, **case.params, return_lse=True)
    except Exception as err:
        if raise_errors:
            raise
        return Result.failed(case, stage + _error_text(err))
    dtype = DTYPE_NAMES[case.dtype]
    return Result(
        case,
        compare(_numpy(out), exact_out, naive_out, dtype),
        compare(_numpy(lse), exact_lse, naive_lse, "float32"),
    )


def cases(
    kernel: AttentionKernel,
    trials: int,
    seed: int,
    dtypes: Sequence[torch.dtype],
    max_len: int = 96,
    dims: Mapping[str, int] | None = None,
    params: Mapping[str, int | float] | None = None,
) -> Iterator[Case]:
    """``trials`` random cases; the first keeps param defaults, the rest draw params. Params
    without a default are drawn in every case; ``dims`` and ``params`` are fixed in all. q, k
    and v declared in one dtype are drawn in it, whatever ``dtypes`` says."""
    rng = np.random.default_rng(seed)
    fixed = dict(params or {})
    required = [p.name for p in kernel.params if p.default is None and p.name not in fixed]
    declared = operand_dtype(kernel)
    for trial in range(trials):
        sizes = draw_sizes(kernel, rng, max_len, fixed=dims)
        if trial == 0:
            drawn = draw_params(kernel, sizes, {}, rng, required) if required else {}
        else:
            defaults = param_defaults(kernel, sizes, fixed)
            drawn = draw_params(kernel, sizes, defaults, rng)
        dtype = declared or dtypes[trial % len(dtypes)]
        layout = LAYOUTS[trial % len(LAYOUTS)]
        yield Case(sizes, dtype, layout, {**drawn, **fixed})


def check(
    kernel: Kernel,
    trials: int = 8,
    seed: int = 0,
    device: str = "cpu",
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float16, torch.bfloat16),
    max_len: int = 96,
    dims: Mapping[str, int] | None = None,
    params: Mapping[str, int | float] | None = None,
    raise_errors: bool = False,
) -> list[Result]:
    """Run ``trials`` random cases on ``device``; every result carries its verdicts. ``dims``
    and ``params`` fix sizes and params in every case (ValueError unless ``check_dims`` and
    ``check_params`` accept them); a trial that raises is a failed result unless
    ``raise_errors``."""
    check_dims(kernel.ir, dims or {})
    check_params(kernel.ir, params or {})
    kernel.poison_outputs(True)
    try:
        rng = np.random.default_rng(seed + 1)
        return [
            run_case(kernel, case, device, rng, raise_errors)
            for case in cases(kernel.ir, trials, seed, dtypes, max_len, dims, params)
        ]
    finally:
        kernel.poison_outputs(False)


def table(results: Sequence[Result]) -> str:
    rows = [("shape", "dtype", "layout", "params", "error", "bound", "lse error", "verdict")]
    for r in results:
        params = ",".join(f"{k}={v:.3g}" for k, v in r.case.params.items()) or "defaults"
        numbers = (
            ("-", "-", "-")
            if r.error
            else (f"{r.output.error:.2e}", f"{r.output.bound:.2e}", f"{r.lse.error:.2e}")
        )
        verdict = (
            f"error: {r.error}"
            if r.error
            else "ok"
            if r.ok
            else f"FAIL ({r.output.reason or r.lse.reason})"
        )
        rows.append(
            (r.case.describe(), DTYPE_NAMES[r.case.dtype], r.case.layout, params, *numbers, verdict)
        )
    return format_table(rows)


# ----------------------------------------------------------------------------- gradients

# how attncc.codegen.backward words a refusal: "attncc NAME: no backward for this spec: WHY"
NO_BACKWARD = "no backward for this spec: "


@dataclass(frozen=True)
class GradResult:
    """The gradient verdicts of one trial, by float input; ``error`` is set (and ``grads``
    empty) when the kernel or the reference raised."""

    case: Case
    grads: dict[str, Verdict]
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(v.ok for v in self.grads.values())

    @property
    def worst(self) -> tuple[str, Verdict] | None:
        """The failing gradient furthest above its bound, else the closest to it."""
        if not self.grads:
            return None

        def badness(item: tuple[str, Verdict]) -> tuple[bool, float]:
            v = item[1]
            ratio = v.error / v.bound if v.bound > 0 else (0.0 if v.error == 0 else math.inf)
            return (not v.ok, ratio)

        return max(self.grads.items(), key=badness)


def backward_refusal(kernel: AttentionKernel) -> str | None:
    """Why ``kernel`` has no backward (the words after "no backward for this spec: "), or
    None when it has one."""
    try:
        check_supported(kernel)
    except BackwardUnsupported as err:
        return str(err).split(NO_BACKWARD, 1)[-1]
    return None


def _grad_verdict(
    grad: torch.Tensor | None,
    exact: torch.Tensor,
    eager: Sequence[torch.Tensor],
    dtype: torch.dtype,
    terms: int,
) -> Verdict:
    if grad is None:
        nan = float("nan")
        return Verdict(nan, nan, nan, nan, False, "no gradient")
    name = DTYPE_NAMES.get(dtype, "float32")  # an f64 input: float32's floor, the smallest
    return compare_grad(_numpy(grad), _numpy(exact), [_numpy(e) for e in eager], name, terms)


def run_grad_case(
    kernel: Kernel, case: Case, device: str, rng: np.random.Generator, raise_errors: bool = False
) -> GradResult:
    """One gradient trial: the inputs ``run_case`` would draw, a random ``grad_out``, the
    kernel's forward and backward against ``reference_grads``. An exception of the kernel or
    the reference is a failed result naming it (``raise_errors``: raised)."""
    inputs = make_inputs(kernel.ir, case.sizes, case.dtype, device, rng, case.layout)
    floats = set(float_inputs(kernel.ir))
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    shape = [case.sizes[d] for d in kernel.ir.output.dims]
    grad_out = torch.randn(shape, generator=gen).to(case.dtype)
    # the reference first, as run_case does: it refuses reads outside a tensor
    stage = "reference: "
    try:
        host = {k: v.cpu() for k, v in inputs.items()}
        _, exact = reference_grads(kernel.spec, host, grad_out, case.params)
        eager = eager_grads(kernel.spec, host, grad_out, case.params, dtype=case.dtype)
        terms = gradient_terms(kernel.spec, host, case.params)
        stage = ""
        # detach keeps each input's strides: the backward sees the drawn layout
        leaves = {k: v.detach().requires_grad_(k in floats) for k, v in inputs.items()}
        with torch.enable_grad():
            out = kernel(**leaves, **case.params, return_lse=False)
            out.backward(grad_out.to(device, out.dtype))
    except Exception as err:
        if raise_errors:
            raise
        return GradResult(case, {}, stage + _error_text(err))
    verdicts = {
        name: _grad_verdict(
            leaves[name].grad, exact[name], eager[name], leaves[name].dtype, terms.get(name, 1)
        )
        for name in float_inputs(kernel.ir)
    }
    return GradResult(case, verdicts)


def check_backward(
    kernel: Kernel,
    trials: int = 8,
    seed: int = 0,
    device: str = "cpu",
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float16, torch.bfloat16),
    max_len: int = 96,
    dims: Mapping[str, int] | None = None,
    params: Mapping[str, int | float] | None = None,
    raise_errors: bool = False,
) -> list[GradResult]:
    """``check``'s trials (the same cases for the same arguments), checking gradients.
    ValueError, naming why, for a kernel without a backward."""
    check_dims(kernel.ir, dims or {})
    check_params(kernel.ir, params or {})
    why = backward_refusal(kernel.ir)
    if why is not None:
        raise ValueError(NO_BACKWARD + why)
    rng = np.random.default_rng(seed + 1)
    return [
        run_grad_case(kernel, case, device, rng, raise_errors)
        for case in cases(kernel.ir, trials, seed, dtypes, max_len, dims, params)
    ]


def grad_table(results: Sequence[GradResult]) -> str:
    """One row per trial: the worst gradient (by error over bound) and its verdict."""
    rows = [("shape", "dtype", "layout", "params", "grad", "error", "bound", "verdict")]
    for r in results:
        params = ",".join(f"{k}={v:.3g}" for k, v in r.case.params.items()) or "defaults"
        worst = r.worst
        if r.error or worst is None:
            numbers = ("-", "-", "-")
        else:
            name, v = worst
            numbers = (f"d{name}", f"{v.error:.2e}", f"{v.bound:.2e}")
        if r.error:
            verdict = f"error: {r.error}"
        elif r.ok:
            verdict = "ok"
        else:
            failing = [f"d{n}" for n, v in r.grads.items() if not v.ok]
            reason = worst[1].reason if worst is not None else ""
            verdict = f"FAIL ({', '.join(failing)}: {reason})"
        rows.append(
            (r.case.describe(), DTYPE_NAMES[r.case.dtype], r.case.layout, params, *numbers, verdict)
        )
    return format_table(rows)
