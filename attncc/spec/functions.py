"""The built-in functions of the spec language: one table every stage derives from.

The checker types calls from it; the reference, the torch evaluator and both backends keep
their own implementation tables keyed by these names and refuse to import when one is missing
(``require_all``), and tests/spec/test_functions.py evaluates and renders every entry.

Typing rules (``Function.typing``):

- ``float``: every argument is promoted to float (an int operand is converted first: float64
  in the reference, float32 in the kernels) and the result is float.
- ``numeric``: the result is int when every argument is int, else float (int arguments are
  then promoted, as in mixed arithmetic).
- ``select``: ``where(c, a, b)``: ``c`` is bool; ``a`` and ``b`` follow the ``numeric`` rule.

``softmax`` is not in the table: it is a statement form (``p = softmax(s, n)``), not a function
of values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Type = Literal["int", "float", "bool"]
Typing = Literal["float", "numeric", "select"]


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    arity: int
    typing: Typing
    meaning: str  # one line for docs and error hints


_TABLE = (
    Function("exp", 1, "float", "e to the x"),
    Function("log", 1, "float", "natural logarithm"),
    Function("sqrt", 1, "float", "square root"),
    Function("tanh", 1, "float", "hyperbolic tangent"),
    Function("sin", 1, "float", "sine (radians)"),
    Function("cos", 1, "float", "cosine (radians)"),
    Function("tan", 1, "float", "tangent (radians)"),
    Function("sigmoid", 1, "float", "1 / (1 + exp(-x))"),
    Function("erf", 1, "float", "the error function"),
    Function("floor", 1, "float", "largest integer value <= x, as a float"),
    Function("ceil", 1, "float", "smallest integer value >= x, as a float"),
    Function("pow", 2, "float", "a to the power b (C's pow: a < 0 needs an integer b)"),
    Function("abs", 1, "numeric", "absolute value"),
    Function("min", 2, "numeric", "the smaller of a and b"),
    Function("max", 2, "numeric", "the larger of a and b"),
    Function("where", 3, "select", "a where c, else b"),
)

#: Every built-in function by name, in the order the docs list them.
BUILTINS: Mapping[str, Function] = {f.name: f for f in _TABLE}
#: The names of the built-in functions (``softmax`` excluded: see the module doc).
FUNCTION_NAMES: tuple[str, ...] = tuple(BUILTINS)
#: Names no dim, input, param, let or view may take.
RESERVED_NAMES: tuple[str, ...] = (*FUNCTION_NAMES, "softmax")


def promotes(name: str) -> bool:
    """Whether ``name`` converts int arguments to float whatever the other arguments are."""
    return BUILTINS[name].typing == "float"


def numeric_args(name: str, count: int) -> range:
    """Positions of the numeric arguments (all but ``where``'s condition)."""
    return range(1, count) if BUILTINS[name].typing == "select" else range(count)


def result_type(name: str, arg_types: Iterable[Type]) -> Type:
    """The type of a call whose arguments are already checked (numbers where numbers go)."""
    types = list(arg_types)
    if promotes(name):
        return "float"
    numeric = [types[i] for i in numeric_args(name, len(types))]
    return "int" if all(t == "int" for t in numeric) else "float"


def widened(name: str, arg_types: Sequence[Type]) -> tuple[bool, ...]:
    """Which arguments a call converts from int to float before applying the function: the
    int numeric arguments of a float function, or of a call whose result is float."""
    widen = result_type(name, arg_types) == "float"
    positions = numeric_args(name, len(arg_types))
    return tuple(widen and i in positions and t == "int" for i, t in enumerate(arg_types))


def require_all(table: Iterable[str], where: str) -> None:
    """Fail loudly at import when an implementation table and the built-ins disagree."""
    names = set(table)
    missing, extra = set(FUNCTION_NAMES) - names, names - set(FUNCTION_NAMES)
    if missing or extra:
        raise ImportError(
            f"{where}: built-in functions missing {sorted(missing)}, unknown {sorted(extra)}"
        )
