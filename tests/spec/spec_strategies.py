"""Hypothesis strategies that write well-formed attention specs from the grammar.

``specs()`` builds a spec statement by statement: dims (grouped-query heads, paged caches
with a derived key length, decode without a query axis, a separate value head dim), inputs
in any axis order, f32/i32 params with and without defaults, lets, gather views, scores
with scalar factors, score modifications that use every binary operator and every built-in
function of the checker's table over mixed int and float operands, masks of comparisons
joined by and/or/not, and a schedule. Most drawn specs are attention, so they reach the IR,
the passes and both code generators.

Every user name is a placeholder (``GeneratedSpec.names``): the same spec renders with the
names drawn (some of them Python, C++ or generated-code words) or with neutral ones, which
is how the tests check that no name changes the meaning of generated code.

``safe=True`` draws specs whose kernels can be compared with the reference at any sizes:
integer divisors are dims or positive literals, float functions and divisors see bounded
positive arguments, and float values never decide a comparison (float32 and float64 round
near a boundary differently, which would flip a mask without anything being wrong).
"""

from __future__ import annotations

import importlib
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

from attncc.spec.functions import BUILTINS
from attncc.spec.parser import KEYWORDS, MAX_NAME_LENGTH

# the module, not the function ``attncc.spec.check`` that the package exports under its name
spec_check = importlib.import_module("attncc.spec.check")

ROOT = Path(__file__).resolve().parents[2]

# The language's function table (name -> arity), so functions added to it are drawn without
# a change here. ``where`` takes a condition first; every other function takes numbers.
FUNCTION_ARITY: dict[str, int] = {name: f.arity for name, f in BUILTINS.items()}
# Functions whose result has the type of their number arguments; the others give floats.
NUMERIC_FUNCTIONS = frozenset(n for n, f in BUILTINS.items() if f.typing != "float")
BINARY_OPS = ("+", "-", "*", "/", "%")
COMPARE_OPS = ("==", "!=", "<", "<=", ">", ">=")
SCHEDULES = spec_check.SCHEDULES

CPP_KEYWORDS = frozenset(
    """
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
    char16_t char32_t class compl concept const consteval constexpr constinit const_cast
    continue co_await co_return co_yield decltype default delete do double dynamic_cast else
    enum explicit export extern false float for friend goto if inline int long mutable
    namespace new noexcept not not_eq nullptr operator or or_eq private protected public
    register reinterpret_cast requires return short signed sizeof static static_assert
    static_cast struct switch template this thread_local throw true try typedef typeid typename
    union unsigned using virtual void volatile wchar_t while xor xor_eq __global__ __device__
    __host__ __shared__ __restrict__ __forceinline__ threadIdx blockIdx blockDim gridDim
    warpSize float2 float4 int4 half __half __nv_bfloat16 size_t NULL main printf
    """.split()  # noqa: SIM905 - a word list
)
PYTHON_WORDS = frozenset(
    [
        *keyword.kwlist,
        *keyword.softkwlist,
        *"""
        int float bool str len range print min max abs sum list dict tuple set object type id input
        open exec eval compile globals locals vars getattr setattr __import__ __builtins__ __name__
        __class__ __dict__ __init__ __file__ self cls tl torch triton math os functools numpy np
        """.split(),  # noqa: SIM905 - a word list
    ]
)


def _template_words() -> frozenset[str]:
    """Every identifier in the templates: the locals, helpers and macros generated code
    defines (``pid``, ``offs_m``, ``acc``, ``_forward``, ``ATTNCC_ELEM``, ...)."""
    words: set[str] = set()
    for path in (ROOT / "templates").rglob("*.jinja"):
        words.update(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", path.read_text()))
    return frozenset(words)


def usable(name: str) -> bool:
    """Names the language lets a spec declare (not a keyword or built-in function)."""
    return name not in KEYWORDS and name not in spec_check.FUNCTIONS and name != "softmax"


HOSTILE_NAMES = tuple(
    sorted(n for n in CPP_KEYWORDS | PYTHON_WORDS | _template_words() if usable(n))
)

# Neutral names of each role; a drawn spec replaces some with hostile ones.
ROLES = {
    # dims
    "B": "B",
    "H": "H",
    "KVH": "KVH",
    "M": "M",
    "N": "N",
    "D": "D",
    "DV": "DV",
    "P": "P",
    "PAGE": "PAGE",
    "NP": "NP",
    # inputs
    "q": "q",
    "k": "k",
    "v": "v",
    "bias": "bias",
    "slopes": "slopes",
    "lens": "cache_len",
    "docq": "doc_q",
    "dock": "doc_k",
    "flags": "keep",
    "kp": "k_pages",
    "vp": "v_pages",
    "table": "page_table",
    # params
    "scale": "scale",
    "cap": "cap",
    "window": "window",
    "offset": "offset",
    # lets, views, computed tensors
    "g": "g",
    "r": "r",
    "kc": "kc",
    "vc": "vc",
    "s": "s",
    "p": "p",
    "o": "o",
    # indices (view locals: vb, vn, vj, vd)
    "b": "b",
    "h": "h",
    "m": "m",
    "n": "n",
    "d": "d",
    "e": "e",
    "vb": "vb",
    "vn": "vn",
    "vj": "vj",
    "vd": "vd",
    "name": "fuzzed",
}


@dataclass(frozen=True)
class GeneratedSpec:
    """Spec text with ``{role}`` placeholders for every user name."""

    template: str
    names: dict[str, str]
    safe: bool = False
    features: frozenset[str] = field(default_factory=frozenset)

    @property
    def text(self) -> str:
        return self.template.format(**self.names)

    def renamed(self, names: dict[str, str]) -> str:
        return self.template.format(**{**self.names, **names})

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        return f"GeneratedSpec(safe={self.safe}):\n{self.text}"


def pick(draw: st.DrawFn, options: list[str] | tuple[str, ...]) -> str:
    """One of ``options``. Cheaper than a fresh ``st.sampled_from`` per draw, which hashes
    its elements every time (most of the drawing time with a few hundred options)."""
    return options[draw(st.integers(0, len(options) - 1))]


_HOSTILE = st.sampled_from(HOSTILE_NAMES)
# names as long as the language allows (longer ones: tests/spec/test_identifiers.py)
_LONG_NAMES = st.sampled_from(["x", "X_", "_x1"]).map(
    lambda s: (s * MAX_NAME_LENGTH)[:MAX_NAME_LENGTH]
)


def _placeholder(role: str) -> str:
    return "{" + role + "}"


class _Scope:
    """Operands an expression may use, as template text, by type."""

    def __init__(self, safe: bool) -> None:
        self.safe = safe
        self.ints: list[str] = []
        self.floats: list[str] = []
        self.bools: list[str] = []
        self.divisors: list[str] = []  # positive integers (dims)

    def with_floats(self, *extra: str) -> _Scope:
        scope = _Scope(self.safe)
        scope.ints, scope.bools, scope.divisors = self.ints, self.bools, self.divisors
        scope.floats = [*self.floats, *extra]
        return scope


# the kernels' integers are 32-bit: the parser refuses larger literals
# (tests/spec/test_identifiers.py has those)
_INT_LITERALS = st.one_of(
    st.integers(0, 100),
    st.sampled_from([2**16, 2**30, 2**31 - 1]),
    st.integers(0, 2**31 - 1),
)
# repr of a float is valid spec syntax except for inf, nan and negatives (not drawn)
_FLOAT_LITERALS = st.one_of(
    st.sampled_from(["0.5", "1.", ".25", "1e-3", "1E3", "2.5e+2", "0.0", "1e38", "1e-45"]),
    # float32 values, spelled as their float64 repr (tests/spec/test_identifiers.py has the
    # literals past float32, which the parser refuses)
    st.floats(0, 2.0**100, width=32).map(repr),
)


def _int_literal(draw: st.DrawFn, safe: bool) -> str:
    if safe:
        return str(draw(st.integers(0, 9)))
    return str(draw(_INT_LITERALS))


def _float_literal(draw: st.DrawFn, safe: bool) -> str:
    if safe:
        return pick(draw, ["0.5", "1.", ".25", "2.0", "1e-1", "0.125", "3.5e0"])
    return draw(_FLOAT_LITERALS)


def _paren(text: str) -> str:
    return f"({text})"


def int_expr(draw: st.DrawFn, scope: _Scope, depth: int) -> str:
    choices = ["leaf"] * 3
    if depth > 0:
        choices += ["binary", "binary", "neg", "call"]
    match pick(draw, choices):
        case "leaf":
            return (
                pick(draw, scope.ints)
                if scope.ints and draw(st.booleans())
                else _int_literal(draw, scope.safe)
            )
        case "binary":
            op = pick(draw, BINARY_OPS)
            left = int_expr(draw, scope, depth - 1)
            if op in "/%" and scope.safe:  # never zero: a dim, or a positive number
                right = pick(draw, [*scope.divisors, "3", "abs"])
                if right == "abs":
                    right = f"(abs({int_expr(draw, scope, depth - 1)}) + 1)"
            else:
                right = int_expr(draw, scope, depth - 1)
            return _paren(f"{left} {op} {right}")
        case "neg":
            return "-" + _paren(int_expr(draw, scope, depth - 1))
        case _:
            func = pick(draw, sorted(NUMERIC_FUNCTIONS & set(FUNCTION_ARITY)))
            if func == "where":
                args = [bool_expr(draw, scope, depth - 1)]
                args += [int_expr(draw, scope, depth - 1) for _ in range(2)]
            else:
                args = [int_expr(draw, scope, depth - 1) for _ in range(FUNCTION_ARITY[func])]
            return f"{func}({', '.join(args)})"


def number_expr(draw: st.DrawFn, scope: _Scope, depth: int) -> str:
    if draw(st.booleans()):
        return int_expr(draw, scope, depth)
    return float_expr(draw, scope, depth)


def _bounded(draw: st.DrawFn, scope: _Scope, depth: int) -> str:
    """A number in [1, 3] in safe mode (any function's argument, any divisor)."""
    inner = number_expr(draw, scope, depth)
    return f"(tanh({inner}) + 2.0)" if scope.safe else inner


def float_expr(draw: st.DrawFn, scope: _Scope, depth: int) -> str:
    choices = ["leaf"] * 3
    if depth > 0:
        choices += ["binary", "binary", "binary", "neg", "call", "call"]
    match pick(draw, choices):
        case "leaf":
            return (
                pick(draw, scope.floats)
                if scope.floats and draw(st.booleans())
                else _float_literal(draw, scope.safe)
            )
        case "binary":
            op = pick(draw, BINARY_OPS[:4])
            # one float side makes a float: the other may be an int (mixed operands)
            sides = [float_expr(draw, scope, depth - 1), number_expr(draw, scope, depth - 1)]
            if draw(st.booleans()):
                sides.reverse()
            if op == "/" and scope.safe:
                sides[1] = _bounded(draw, scope, depth - 1)
            return _paren(f"{sides[0]} {op} {sides[1]}")
        case "neg":
            return "-" + _paren(float_expr(draw, scope, depth - 1))
        case _:
            func = pick(draw, sorted(FUNCTION_ARITY))
            arity = FUNCTION_ARITY[func]
            if func == "where":
                cond = bool_expr(draw, scope, depth - 1)
                a, b = float_expr(draw, scope, depth - 1), number_expr(draw, scope, depth - 1)
                if draw(st.booleans()):
                    a, b = b, a
                return f"where({cond}, {a}, {b})"
            if func in NUMERIC_FUNCTIONS:
                args = [float_expr(draw, scope, depth - 1)]
                args += [number_expr(draw, scope, depth - 1) for _ in range(arity - 1)]
                return f"{func}({', '.join(draw(st.permutations(args)))})"
            # a float function: its arguments may be ints (sqrt(D), exp(m - n))
            return f"{func}({', '.join(_bounded(draw, scope, depth - 1) for _ in range(arity))})"


def bool_expr(draw: st.DrawFn, scope: _Scope, depth: int) -> str:
    choices = ["compare"] * 3 + (["bool"] if scope.bools else [])
    if depth > 0:
        choices += ["and", "or", "not"]
    match pick(draw, choices):
        case "compare":
            op = pick(draw, COMPARE_OPS)
            if scope.safe:
                left, right = int_expr(draw, scope, depth), int_expr(draw, scope, depth)
            else:
                left, right = number_expr(draw, scope, depth), number_expr(draw, scope, depth)
            return f"{left} {op} {right}"
        case "bool":
            return pick(draw, scope.bools)
        case "not":
            return f"not {_paren(bool_expr(draw, scope, depth - 1))}"
        case word:
            left, right = bool_expr(draw, scope, depth - 1), bool_expr(draw, scope, depth - 1)
            return f"{_paren(left)} {word} {_paren(right)}"


def _access(tensor: str, subscripts: list[str]) -> str:
    return f"{_placeholder(tensor)}[{', '.join(subscripts)}]"


def _noise(draw: st.DrawFn) -> str:
    """A trailing comment or nothing."""
    return pick(draw, ["", "", "", "  # a comment: (, [, not", "\t# x"])


_ROLES = st.sampled_from(tuple(ROLES))


@st.composite
def names(draw: st.DrawFn, hostile: bool = True) -> dict[str, str]:
    """A distinct name for every role: the neutral ones, a few replaced by hostile ones."""
    chosen = dict(ROLES)
    roles = [draw(_ROLES) for _ in range(draw(st.integers(0, 3)) if hostile else 0)]
    # the kernel's name is the one that names a function of the generated module
    if hostile and draw(st.integers(0, 3)) == 0:
        roles.append("name")
    for role in roles:
        name = draw(st.one_of(_HOSTILE, _LONG_NAMES))
        if name not in chosen.values():
            chosen[role] = name
    return chosen


@st.composite
def specs(draw: st.DrawFn, safe: bool = False, hostile: bool = True) -> GeneratedSpec:
    """An attention spec (see the module docstring)."""
    ph = _placeholder
    features: set[str] = set()
    decode = draw(st.booleans())
    gqa = draw(st.booleans())
    batch = draw(st.integers(0, 4)) > 0
    paged = draw(st.integers(0, 3)) == 0
    split_dv = draw(st.integers(0, 3)) == 0
    features |= {f for f, on in [("decode", decode), ("gqa", gqa), ("paged", paged)] if on}

    # axes: (dim role, index role)
    q_axes = [("B", "b")] if batch else []
    q_axes += [("H", "h")] + ([] if decode else [("M", "m")]) + [("D", "d")]
    kv_head = ("KVH", "g") if gqa else ("H", "h")
    value_dim = ("DV", "e") if split_dv else ("D", "d")
    k_axes = [*q_axes[:batch], kv_head, ("N", "n"), ("D", "d")]
    v_axes = [*q_axes[:batch], kv_head, ("N", "n"), value_dim]
    score_axes = [a for a in q_axes if a[0] != "D"] + [("N", "n")]

    lines = [f"attention {ph('name')}{_noise(draw)}"]
    dims = [a[0] for a in q_axes] + (["KVH"] if gqa else []) + (["DV"] if split_dv else [])
    dims += ["P", "PAGE", "NP"] if paged else ["N"]
    dims = draw(st.permutations(dims))
    cut = draw(st.integers(1, len(dims)))
    for group in (dims[:cut], dims[cut:]):
        if group:
            lines.append(f"dims {', '.join(ph(d) for d in group)}{_noise(draw)}")
    if paged:
        lines.append(f"dims {ph('N')} = {ph('NP')} * {ph('PAGE')}")

    declarations: list[str] = []

    def input_decl(role: str, axes: list[tuple[str, str]], dtype: str = "") -> list[str]:
        """Declare ``role`` with its axes in a drawn order; the subscripts in that order."""
        order = draw(st.permutations(axes))
        declarations.append(
            f"in {ph(role)}[{', '.join(ph(d) for d, _ in order)}]{dtype}{_noise(draw)}"
        )
        return [ph(i) for _, i in order]

    q_subs = input_decl("q", q_axes)
    if paged:
        pool = [("P", "#page"), ("PAGE", "#slot"), (kv_head[0], "vj"), ("D", "vd")]
        kp_order = draw(st.permutations(pool))
        vp_order = [(value_dim[0], "vd") if a[0] == "D" else a for a in kp_order]
        table = [("B", "vb")] if batch else []
        declarations.append(f"in {ph('kp')}[{', '.join(ph(d) for d, _ in kp_order)}]")
        declarations.append(f"in {ph('vp')}[{', '.join(ph(d) for d, _ in vp_order)}]")
        table_dims = [d for d, _ in table] + ["NP"]
        declarations.append(f"in {ph('table')}[{', '.join(ph(d) for d in table_dims)}]: i32")
    else:
        k_subs = input_decl("k", k_axes)
        v_subs = input_decl("v", v_axes)

    scope = _Scope(safe)
    index_of = {i: d for d, i in score_axes}
    scope.ints += [ph(i) for i in index_of]
    all_dims = [*dims, "N"] if paged else dims
    scope.ints += [ph(d) for d in all_dims]
    scope.divisors += [ph(d) for d in all_dims]
    if draw(st.booleans()):
        subs = input_decl("bias", [a for a in score_axes if a[0] != "B" or draw(st.booleans())])
        scope.floats.append(_access("bias", subs))
    if draw(st.booleans()):
        declarations.append(f"in {ph('slopes')}[{ph('H')}]")
        scope.floats.append(_access("slopes", [ph("h")]))
        if not safe:
            scope.floats.append(_access("slopes", [f"{ph('H')} - 1 - {ph('h')}"]))
    if batch and draw(st.booleans()):
        dtype = pick(draw, [": i32", ": i64"])
        declarations.append(f"in {ph('lens')}[{ph('B')}]{dtype}")
        scope.ints.append(_access("lens", [ph("b")]))
    if draw(st.booleans()):
        doc_axes = [("B", "b")] if batch else []
        subs = input_decl("dock", [*doc_axes, ("N", "n")], ": i32") if not paged else None
        if subs is not None:
            scope.ints.append(_access("dock", subs))
        if not decode:
            scope.ints.append(_access("docq", input_decl("docq", [*doc_axes, ("M", "m")], ": i32")))
    if draw(st.integers(0, 3)) == 0 and not paged:
        subs = input_decl("flags", [a for a in score_axes if a[0] in ("B", "N")], ": bool")
        scope.bools.append(_access("flags", subs))

    # params: the score scale, and a few more of both types
    scale = pick(draw, ["param", "param", "sqrt", "literal", "none"])
    if scale == "param":
        default = draw(
            st.sampled_from([f" = 1 / sqrt({ph('D')})", " = 0.125", " = 1", "", " = 1 / 8.0"])
        )
        declarations.append(f"param {ph('scale')}: f32{default}")
    for role, dtype, default in [
        ("cap", "f32", " = 20.0"),
        ("window", "i32", f" = {ph('N')} / 2 + 1"),
        ("offset", "i32", " = 0"),
    ]:
        if draw(st.booleans()):
            if draw(st.booleans()) or safe:
                declarations.append(f"param {ph(role)}: {dtype}{default}")
            else:
                declarations.append(f"param {ph(role)}: {dtype}")
            (scope.floats if dtype == "f32" else scope.ints).append(ph(role))
    lines += draw(st.permutations(declarations))

    if gqa:
        lines.append(f"let {ph('g')} = {ph('h')} / ({ph('H')} / {ph('KVH')}){_noise(draw)}")
    if not decode and draw(st.booleans()):
        lines.append(f"let {ph('r')} = {ph('m')} - {ph('n')}")
        scope.ints.append(ph("r"))

    if paged:
        table_subs = [ph("vb")] if batch else []
        table_subs.append(f"{ph('vn')} / {ph('PAGE')}")
        page = {"#page": _access("table", table_subs), "#slot": f"{ph('vn')} % {ph('PAGE')}"}
        view_axes = [a for a in [("B", "vb")] if batch] + [("N", "vn"), (kv_head[0], "vj")]
        outer = {"vb": ph("b"), "vn": ph("n"), "vj": ph(kv_head[1])}
        for view, pages, order, dim in (
            ("kc", "kp", kp_order, "D"),
            ("vc", "vp", vp_order, value_dim[0]),
        ):
            formals = draw(st.permutations([*view_axes, (dim, "vd")]))
            body = [page.get(i, ph(i)) for _, i in order]
            lines.append(
                f"view {ph(view)}[{', '.join(f'{ph(i)}: {ph(d)}' for d, i in formals)}] = "
                f"{_access(pages, body)}"
            )
            inner = {"vd": ph("d") if view == "kc" else ph(value_dim[1]), **outer}
            subs = [inner[i] for _, i in formals]
            if view == "kc":
                k_subs, k_role = subs, "kc"
            else:
                v_subs, v_role = subs, "vc"
    else:
        k_role, v_role = "k", "v"

    score_order = draw(st.permutations(score_axes))
    score_subs = [ph(i) for _, i in score_order]
    factors = [_access("q", q_subs), _access(k_role, k_subs)]
    if scale == "param":
        factors.append(ph("scale"))
    elif scale == "literal":
        factors.append(pick(draw, ["0.125", "2", "0.5"]))
    factors = draw(st.permutations(factors))
    scores = " * ".join(factors) + (f" / sqrt({ph('D')})" if scale == "sqrt" else "")
    lines.append(f"{_access('s', score_subs)} = {scores}{_noise(draw)}")

    depth = draw(st.integers(1, 3))
    for _ in range(draw(st.integers(0, 3))):
        features.add("modification")
        value = float_expr(draw, scope.with_floats(ph("s")), depth)
        form = pick(draw, ["bare", "indexed", "plus"])
        if form == "plus":
            lines.append(f"{ph('s')} = {ph('s')} + {value}")
        elif form == "indexed":
            lines.append(f"{_access('s', score_subs)} = {value}")
        else:
            lines.append(f"{ph('s')} = {value}")
    for _ in range(draw(st.integers(0, 2))):
        features.add("mask")
        lines.append(f"mask {bool_expr(draw, scope, depth)}{_noise(draw)}")

    lines.append(f"{ph('p')} = softmax({ph('s')}, {ph('n')})")
    out_axes = [a for a in q_axes if a[0] != "D"] + [value_dim]
    out_order = draw(st.permutations(out_axes))
    v_factor = _access(v_role, v_subs)
    p_factor = _access("p", score_subs)
    product = " * ".join(draw(st.permutations([p_factor, v_factor])))
    lines.append(f"{_access('o', [ph(i) for _, i in out_order])} = {product}")
    lines.append(f"out {ph('o')}")
    schedule = pick(draw, [None, None, *SCHEDULES])
    if schedule is not None:
        lines.append(f"schedule {schedule}")
        features.add(f"schedule {schedule}")
    if draw(st.booleans()):
        lines.insert(draw(st.integers(1, len(lines))), "")

    if paged:
        features.add("view")
    return GeneratedSpec("\n".join(lines) + "\n", draw(names(hostile)), safe, frozenset(features))
