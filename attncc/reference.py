"""Float64 NumPy evaluation of a spec, straight from the checked AST (never the optimised IR).

``reference(spec)`` returns a callable ``fn(*inputs, return_lse=False, **named)``. Inputs go by
position in declaration order or by name, params by name; a param left out takes its default,
computed from the dim sizes (and earlier params). Numpy arrays and torch tensors are accepted:
float inputs become float64, integer inputs int64. Every dim's size is bound from the input
shapes. The result is a float64 array laid out in the order of the output's left-hand indices;
with ``return_lse=True`` it is ``(out, lse)``, ``lse`` being the natural log-sum-exp of the masked
scores over the softmax axis, laid out as the scores' indices without that axis.

The spec is evaluated exactly as written, with everything materialised:

- ``t[i, ...] = expr`` evaluates ``expr`` over all its free indices and sums the indices missing
  on the left. A product of factors goes through ``np.einsum``, so ``q * k`` never materialises
  B*H*M*N*D; any other expression is materialised whole (fine at test sizes). A left-hand index
  that the right-hand side never uses broadcasts.
- A bare defined name (``s`` in ``s = s - slopes[h] * (m - n)``) is that tensor at the
  statement's left-hand indices. An index is ``arange`` over its dim, a dim is its size, a
  ``let`` is an integer index expression, and a subscript may be any integer expression (numpy
  advanced indexing with broadcasting). A subscript outside its dim is an error, not a wrap-around.
- Integer ``/`` truncates toward zero and ``%`` takes the sign of the dividend (C semantics, as in
  Triton and CUDA); ``/`` with a float operand is true division. Integer division by zero is an
  error; float arithmetic follows IEEE (``1 / 0.0`` is ``inf``).
- f32 params are Python floats, i32 params Python ints.
- ``reference(spec, rounding="float16")`` (or ``"bfloat16"``, ``"float32"``) emulates the same
  math done naively in a lower precision: float inputs and every materialised result (each
  statement, the probabilities, the output) are rounded to that dtype, and float32's products
  accumulate in float32 (as an eager float32 matmul does; ``_contraction_type``). The tolerance rule
  (``attncc.tolerance``) measures kernels against this. ``rounding="float8_e4m3"`` is plain
  per-tensor FP8 done eagerly, for FP8 specs: ``f8e4m3`` inputs and the probabilities are
  requantised to e4m3 with one scale per tensor (its maximum maps to 448), other float inputs
  rounded to float32 (the kernels read them so), every other materialised value (scores, the
  output) to bfloat16.
- Every ``mask`` statement is ANDed together and applied to the softmax's source: masked scores
  are ``-inf``. A row with no visible key has probabilities 0 (so its output is 0) and lse
  ``-inf``, never NaN: the flash-attn and FlexAttention convention.
"""

from __future__ import annotations

import math
import operator
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from attncc.spec import CheckedSpec, ast, load
from attncc.spec.check import FP8_DTYPES, Definition, Softmax, TensorInfo, dtype_type, walk
from attncc.spec.functions import Type, require_all, widened

__all__ = ["Reference", "reference"]

Array = npt.NDArray[Any]

_ERF = np.frompyfunc(math.erf, 1, 1)  # numpy has no erf; test sizes make a ufunc of math.erf fine


def _sigmoid(x: Array) -> Array:
    return np.asarray(1.0 / (1.0 + np.exp(-x)))


# Each built-in function (attncc.spec.functions) in float64; float functions get their int
# arguments as float64 first (``float_args`` of the call's types).
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "sigmoid": _sigmoid,
    "erf": lambda x: np.asarray(_ERF(x), dtype=np.float64),
    "floor": np.floor,
    "ceil": np.ceil,
    "pow": np.power,
    "abs": np.abs,
    "min": np.minimum,
    "max": np.maximum,
    "where": np.where,
}
require_all(_FUNCTIONS, "the reference")
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "==": np.equal,
    "!=": np.not_equal,
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
}


Rounding = Literal["float32", "float16", "bfloat16", "float8_e4m3"]
# float8_e4m3's rounding of each kind of value (the module doc)
_FP8_STAGES: dict[str, Rounding] = {
    "fp8 input": "float8_e4m3",
    "input": "float32",
    "value": "bfloat16",
    "probabilities": "float8_e4m3",
}


def _stage(rounding: Rounding | None, stage: str) -> Rounding | None:
    return _FP8_STAGES[stage] if rounding == "float8_e4m3" else rounding


def _contraction_type(rounding: Rounding | None) -> type[np.floating[Any]]:
    """The type a product is contracted in: float32 for ``rounding="float32"``, as an eager
    float32 matmul accumulates (the rule measures kernels against eager PyTorch, as
    FlexAttention's tests do). Contracted in float64 and rounded once, the naive error left
    out the accumulation error every float32 GEMM has, which a large scale makes the largest:
    at scale 7.42 and D=128 eager PyTorch's float32 output missed float64's by 4-10e-5, that
    model's by 0.8-1.6e-5, and kernels as accurate as eager PyTorch failed the rule. 16-bit
    roundings keep float64: float32 accumulation is far below their own rounding."""
    return np.float32 if rounding == "float32" else np.float64


def reference(spec: str | Path | CheckedSpec, rounding: Rounding | None = None) -> Reference:
    """The float64 reference of a spec given as text, a path to a ``.attn`` file, or checked.

    ``rounding`` rounds every materialised value to a lower precision (see the module doc).
    """
    return Reference(load(spec), rounding)


def round_to(array: Array, rounding: Rounding | None) -> Array:
    """``array`` rounded to ``rounding`` (nearest even) and widened back to float64."""
    if rounding is None or array.dtype.kind != "f":
        return array
    if rounding == "float8_e4m3":
        return _round_e4m3_per_tensor(np.asarray(array, dtype=np.float64))
    if rounding == "bfloat16":
        # bfloat16 is the upper half of a float32: round the lower half away, to nearest even
        bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
        bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(
            0xFFFF0000
        )
        return bits.view(np.float32).astype(np.float64)
    return array.astype(rounding).astype(np.float64)


def _round_e4m3_per_tensor(array: Array) -> Array:
    """Scale so the largest finite magnitude is 448 (e4m3's largest), round to e4m3 (3
    mantissa bits, normals from 2^-6, subnormal step 2^-9; nearest even), scale back.
    Non-finite values stay."""
    finite = np.isfinite(array)
    amax = float(np.max(np.abs(array[finite]), initial=0.0))
    if amax == 0.0:
        return array
    scale = amax / 448.0
    x = np.where(finite, array, 0.0) / scale
    step = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(x), 2.0**-6))) - 3)
    rounded = np.clip(np.round(x / step) * step, -448.0, 448.0)  # np.round: half to even
    return np.where(finite, rounded * scale, array)


class Reference:
    """Evaluates one checked spec; call it like the compiled kernel."""

    def __init__(self, spec: CheckedSpec, rounding: Rounding | None = None) -> None:
        self.spec = spec
        self.rounding = rounding

    def __repr__(self) -> str:
        return f"reference({self.spec.name!r})"

    @overload
    def __call__(self, *inputs: Any, return_lse: Literal[False] = ..., **named: Any) -> Array: ...
    @overload
    def __call__(
        self, *inputs: Any, return_lse: Literal[True], **named: Any
    ) -> tuple[Array, Array]: ...
    @overload
    def __call__(
        self, *inputs: Any, return_lse: bool, **named: Any
    ) -> Array | tuple[Array, Array]: ...

    def __call__(
        self, *inputs: Any, return_lse: bool = False, **named: Any
    ) -> Array | tuple[Array, Array]:
        spec = self.spec
        softmaxes = [step for step in spec.steps if isinstance(step, Softmax)]
        if return_lse and len(softmaxes) != 1:
            raise ValueError(
                f"return_lse needs exactly one softmax, but '{spec.name}' has {len(softmaxes)}"
            )
        tensors = {
            k: round_to(
                v,
                _stage(
                    self.rounding,
                    "fp8 input" if spec.inputs[k].dtype in FP8_DTYPES else "input",
                ),
            )
            for k, v in _bind_inputs(spec, inputs, named).items()
        }
        # IEEE results (exp overflow, log(0), 1/0.0) are the intended semantics, not warnings.
        with np.errstate(all="ignore"):
            evaluator = _Evaluator(spec, tensors, _bind_sizes(spec, tensors), self.rounding)
            for name, info in spec.params.items():
                if name in named:
                    value = named[name]
                elif info.default is not None:
                    value = evaluator.eval(info.default, ()).item()
                else:
                    raise TypeError(f"missing param '{name}': it has no default")
                evaluator.params[name] = _param_value(name, info.dtype, value)
            for step in spec.steps:
                if isinstance(step, Definition):
                    evaluator.define(step)
                else:
                    evaluator.softmax(step)
        out = np.ascontiguousarray(evaluator.defined[spec.output][1], dtype=np.float64)
        if return_lse:
            return out, evaluator.lse
        return out


# ----------------------------------------------------------------------------- binding


def _bind_inputs(
    spec: CheckedSpec, inputs: tuple[Any, ...], named: dict[str, Any]
) -> dict[str, Array]:
    names = list(spec.inputs)
    if len(inputs) > len(names):
        raise TypeError(
            f"'{spec.name}' takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}"
        )
    given = dict(zip(names, inputs, strict=False))  # fewer inputs may come by name
    for key, value in named.items():
        if key in given:
            raise TypeError(f"input '{key}' given both by position and by name")
        if key in spec.inputs:
            given[key] = value
        elif key not in spec.params:
            raise TypeError(
                f"unknown argument '{key}': inputs are {', '.join(names)}; "
                f"params are {', '.join(spec.params) or 'none'}"
            )
    missing = [name for name in names if name not in given]
    if missing:
        raise TypeError(f"missing input{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    return {name: _as_array(spec.inputs[name], given[name]) for name in names}


def _as_array(info: TensorInfo, value: Any) -> Array:
    if hasattr(value, "detach"):  # a torch tensor, converted without importing torch here
        tensor = value.detach().cpu()
        if tensor.is_floating_point():
            value = tensor.double().numpy()
        elif str(tensor.dtype) == "torch.bool" or tensor.is_complex():
            value = tensor.numpy()
        else:
            value = tensor.long().numpy()
    array = np.asarray(value)
    kind, want = array.dtype.kind, dtype_type(info.dtype)
    if want == "float" and kind == "f":
        return array.astype(np.float64)
    if want == "int" and kind in "iu":
        return array.astype(np.int64)
    if want == "bool" and kind == "b":
        return array
    raise TypeError(f"input '{info.name}' is declared {info.dtype}, but got dtype {array.dtype}")


def _bind_sizes(spec: CheckedSpec, tensors: dict[str, Array]) -> dict[str, int]:
    """Each dim's size, from the first input that has it; later inputs must agree."""
    sizes: dict[str, int] = {}
    bound_by: dict[str, str] = {}
    for name, info in spec.inputs.items():
        shape = tensors[name].shape
        declared = f"{name}[{', '.join(info.dims)}]"
        if len(shape) != len(info.dims):
            raise ValueError(
                f"input '{name}' has {len(shape)} dims (shape {tuple(shape)}), "
                f"expected {len(info.dims)}: {declared}"
            )
        clashes: list[str] = []
        for dim, size in zip(info.dims, shape, strict=True):
            if dim not in sizes:
                sizes[dim], bound_by[dim] = size, name
            elif sizes[dim] != size:
                source = (
                    "earlier in this input" if bound_by[dim] == name else f"from '{bound_by[dim]}'"
                )
                clashes.append(f"{dim} is {sizes[dim]} ({source}) but {size} here")
        if clashes:
            expected = tuple(sizes[dim] for dim in info.dims)
            raise ValueError(
                f"input '{name}' has shape {tuple(shape)}, expected {declared} = {expected}: "
                + "; ".join(clashes)
            )
    for dim, value in spec.derived_dims.items():  # in declaration order, so later ones see earlier
        sizes[dim] = int(_Evaluator(spec, tensors, sizes).eval(value, ()).item())
    return sizes


def _param_value(name: str, dtype: str, value: Any) -> int | float:
    """f32 params become Python floats, i32 params Python ints (a float is refused, not rounded)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value) if dtype == "f32" else operator.index(value)
    except (TypeError, ValueError):
        raise TypeError(f"param '{name}' is {dtype}, got {value!r}") from None


# ----------------------------------------------------------------------------- evaluation


class _Evaluator:
    """Values live in *frames*: an array for the index tuple ``frame`` has one axis per index in
    that order (size 1 where it does not vary), so numpy broadcasting lines indices up."""

    def __init__(
        self,
        spec: CheckedSpec,
        tensors: dict[str, Array],
        sizes: dict[str, int],
        rounding: Rounding | None = None,
    ) -> None:
        self.spec = spec
        self.rounding = rounding
        self.tensors = tensors
        self.sizes = sizes
        self.params: dict[str, int | float] = {}
        self.defined: dict[str, tuple[tuple[str, ...], Array]] = {}
        self.lse: Array = np.empty(0)

    def shape(self, frame: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(self.sizes[self.spec.index_dims[i]] for i in frame)

    def free(self, expr: ast.Expr) -> tuple[str, ...]:
        """Indices ``expr`` ranges over, in order of first appearance (lets expanded)."""
        found: list[str] = []
        for node in walk(expr):
            if isinstance(node, ast.Name):
                if node.name in self.spec.lets:
                    found += self.free(self.spec.lets[node.name])
                elif node.name in self.spec.index_dims:
                    found.append(node.name)
                elif node.name in self.defined:
                    found += self.defined[node.name][0]
        return tuple(dict.fromkeys(found))

    # ------------------------------------------------------------------ steps

    def define(self, step: Definition) -> None:
        """``target[indices] = value``, summing the indices of value missing on the left."""
        # Each factor of a product is materialised over its own indices only and einsum
        # contracts them, so q[b,h,m,d] * k[b,h,n,d] never becomes a B*H*M*N*D array.
        letter = dict(zip(self.spec.index_dims, string.ascii_letters, strict=False))
        operands: list[Array] = []
        subscripts: list[str] = []
        used: set[str] = set()
        work = _contraction_type(self.rounding)
        for factor in _factors(step.value):
            frame = self.free(factor)
            value = self.eval(factor, frame).astype(work)
            operands.append(np.broadcast_to(value, self.shape(frame)))
            subscripts.append("".join(letter[i] for i in frame))
            used.update(frame)
        kept = tuple(i for i in step.indices if i in used)
        equation = f"{','.join(subscripts)}->{''.join(letter[i] for i in kept)}"
        result = np.einsum(equation, *operands, optimize=True)
        full = np.broadcast_to(_place(result, kept, step.indices), self.shape(step.indices))
        self.defined[step.target] = (
            step.indices,
            round_to(np.array(full, dtype=np.float64), _stage(self.rounding, "value")),
        )

    def softmax(self, step: Softmax) -> None:
        indices, scores = self.defined[step.source]
        for mask in self.spec.masks:
            stray = [i for i in self.free(mask.condition) if i not in indices]
            if stray:
                raise ValueError(
                    f"{self.spec.spec.filename}:{mask.span.line}: mask uses index '{stray[0]}', "
                    f"which the scores '{step.source}' of this softmax do not have"
                )
            visible = self.eval(mask.condition, indices)
            scores = np.where(np.broadcast_to(visible, scores.shape), scores, -np.inf)
        axis = indices.index(step.axis)
        sink = None
        if step.sink is not None:
            # one logit per row, joining the normaliser only (it has no value)
            sink = np.broadcast_to(self.eval(step.sink, indices), scores.shape)
            sink = np.take(sink, [0], axis=axis).astype(np.float64)
            scores = np.concatenate([scores, sink], axis=axis)
        peak = np.max(scores, axis=axis, keepdims=True, initial=-np.inf)
        # A row with every key masked has peak -inf; shifting by 0 instead keeps exp() at 0
        # rather than exp(-inf - -inf) = NaN.
        peak = np.where(np.isneginf(peak), 0.0, peak)
        weights = np.exp(scores - peak)
        total = np.sum(weights, axis=axis, keepdims=True)
        # Such a row has weights 0 and total 0: divide by 1 to give probabilities 0. NaN scores
        # still propagate, since NaN == 0 is false.
        probs = weights / np.where(total == 0, 1.0, total)
        if sink is not None:
            probs = np.delete(probs, -1, axis=axis)
        self.defined[step.target] = (
            indices,
            round_to(probs, _stage(self.rounding, "probabilities")),
        )
        self.lse = np.squeeze(peak + np.log(total), axis=axis)  # log(0) = -inf

    # ------------------------------------------------------------------ expressions

    def eval(self, expr: ast.Expr, frame: tuple[str, ...]) -> Array:
        """``expr`` as an array broadcastable to the frame's shape (0-d for a scalar)."""
        spec = self.spec
        match expr:
            case ast.Number(value=number):
                return _scalar(number)
            case ast.Name(name=name):
                if name in self.params:
                    return _scalar(self.params[name])
                if name in self.sizes:
                    return _scalar(self.sizes[name])
                if name in spec.lets:
                    return self.eval(spec.lets[name], frame)
                if name in spec.index_dims:
                    index = np.arange(self.shape((name,))[0], dtype=np.int64)
                    return _place(index, (name,), frame)
                indices, tensor = self.defined[name]
                return _place(tensor, indices, frame)
            case ast.Access(tensor=tensor, indices=subscripts):
                return self.access(tensor.name, subscripts, frame)
            case ast.Call(func=func, args=args):
                values = [self.eval(arg, frame) for arg in args]
                types = [_type_of(v) for v in values]
                values = [
                    v.astype(np.float64) if widen else v
                    for v, widen in zip(values, widened(func.name, types), strict=True)
                ]
                return np.asarray(_FUNCTIONS[func.name](*values))
            case ast.Neg(operand=operand):
                return np.negative(self.eval(operand, frame))
            case ast.Binary(op=op, left=left, right=right):
                return self.arithmetic(expr, self.eval(left, frame), self.eval(right, frame))
            case ast.Compare(op=op, left=left, right=right):
                return np.asarray(_COMPARE[op](self.eval(left, frame), self.eval(right, frame)))
            case ast.Logical(op=op, left=left, right=right):
                combine = np.logical_and if op == "and" else np.logical_or
                return np.asarray(combine(self.eval(left, frame), self.eval(right, frame)))
            case ast.Not(operand=operand):
                return np.asarray(np.logical_not(self.eval(operand, frame)))
        raise AssertionError(expr)

    def access(self, name: str, subscripts: tuple[ast.Expr, ...], frame: tuple[str, ...]) -> Array:
        if name in self.spec.views:  # a gather view reads its input at substituted subscripts
            target = self.spec.views[name].read(subscripts)
            return self.access(target.tensor.name, target.indices, frame)
        tensor = self.tensors[name] if name in self.tensors else self.defined[name][1]
        where: list[Array] = []
        for axis, sub in enumerate(subscripts):
            position = self.eval(sub, frame)
            size = tensor.shape[axis]
            if position.size and (position.min() < 0 or position.max() >= size):
                # numpy would wrap negatives around silently; a kernel would read out of bounds
                raise ValueError(
                    f"{self.spec.spec.filename}:{sub.span.line}:{sub.span.column}: subscript "
                    f"{axis} of '{name}' reaches {position.min()}..{position.max()}, "
                    f"outside 0..{size - 1}"
                )
            where.append(position)
        return np.asarray(tensor[tuple(where)])

    def arithmetic(self, expr: ast.Binary, a: Array, b: Array) -> Array:
        integer = a.dtype.kind in "iu" and b.dtype.kind in "iu"
        if expr.op in "/%" and integer and np.any(b == 0):
            raise ValueError(
                f"{self.spec.spec.filename}:{expr.span.line}:{expr.span.column}: "
                f"integer {'division' if expr.op == '/' else 'remainder'} by zero"
            )
        match expr.op:
            case "+":
                return np.asarray(a + b)
            case "-":
                return np.asarray(a - b)
            case "*":
                return np.asarray(a * b)
            case "%":
                return np.asarray(np.fmod(a, b))  # the sign of the dividend, as in C
            case "/" if integer:
                # Truncate toward zero (C), exactly: a - fmod(a, b) is a multiple of b.
                return np.asarray((a - np.fmod(a, b)) // b)
            case "/":
                return np.asarray(np.true_divide(a, b))
        raise AssertionError(expr.op)


def _type_of(value: Array) -> Type:
    kind = value.dtype.kind
    return "bool" if kind == "b" else "int" if kind in "iu" else "float"


def _scalar(value: int | float) -> Array:
    return np.asarray(value, dtype=np.int64 if isinstance(value, int) else np.float64)


def _factors(expr: ast.Expr) -> list[ast.Expr]:
    """The factors of a product ``a * b * ...``; any other expression is one factor."""
    if isinstance(expr, ast.Binary) and expr.op == "*":
        return _factors(expr.left) + _factors(expr.right)
    return [expr]


def _place(array: Array, indices: tuple[str, ...], frame: tuple[str, ...]) -> Array:
    """``array`` (one axis per name in ``indices``) viewed in ``frame``: axes moved to the frame's
    order, size 1 for frame indices it lacks."""
    order = sorted(range(len(indices)), key=lambda axis: frame.index(indices[axis]))
    shape = [array.shape[indices.index(i)] if i in indices else 1 for i in frame]
    return np.transpose(array, order).reshape(shape)
