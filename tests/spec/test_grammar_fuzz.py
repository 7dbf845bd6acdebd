"""Grammar-aware fuzzing of the whole compiler front and middle (``spec_strategies``).

For every drawn spec: ``attncc.spec.load`` answers with a checked spec or a ``SpecError``
pinned inside the source; ``attncc.api.build`` for the Triton and the CUDA target answers
with generated code or a clean error (``SpecError``, or the ``ValueError`` naming a schedule
the target cannot run); generated Python compiles; renaming every user name leaves the
generated code unchanged but for those names, and no name lands on a word the generated code
already uses (a helper, an import, a keyword). A few safe specs run on the CPU through the
Triton interpreter and must agree with the float64 reference.

``ATTNCC_FUZZ_EXAMPLES`` sets the number of specs of the load/build test (default 1000: about
70 ms of one CPU core a spec on the 2-core CI machine, a third of it drawing the spec; the
renaming test takes a sixth as many, each built twice and tokenised); the run test draws one
safe spec per 200 (at least 3). A deep run:
``ATTNCC_FUZZ_EXAMPLES=100000 python -m pytest -q tests/spec/test_grammar_fuzz.py``.
"""

from __future__ import annotations

import io
import keyword
import os
import re
import tokenize

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from spec_strategies import CPP_KEYWORDS, ROLES, GeneratedSpec, specs

from attncc.api import build
from attncc.checking import Case, draw_params, draw_sizes, run_case
from attncc.spec import SpecError, load
from attncc.spec.check import CheckedSpec

EXAMPLES = int(os.environ.get("ATTNCC_FUZZ_EXAMPLES", "1000"))
RUN_EXAMPLES = max(3, EXAMPLES // 200)
TARGETS = ("triton", "cuda")

FAST = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Clean refusals of a target: a schedule it has no kernels for, or split-KV on a spec that
# cannot be split (``attncc.passes.schedule``). One line each, naming the spec.
CLEAN_VALUE_ERRORS = re.compile(
    r"attncc \w+: (schedule 'naive' is not available for target cuda|cannot run split_kv: )"
)

# Triton 3.6's interpreter calls int() on one-element arrays (deprecated since NumPy 1.25).
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


def load_or_error(text: str) -> CheckedSpec | None:
    """The checked spec, or None after checking that the SpecError points into ``text``."""
    try:
        return load(text)
    except SpecError as err:
        lines = text.splitlines()
        assert err.span is not None, err
        assert 1 <= err.span.line <= len(lines), err
        assert 1 <= err.span.column <= len(lines[err.span.line - 1]) + 1, err
        assert str(err).startswith(f"<spec>:{err.span.line}:{err.span.column}: error: "), err
        return None


def build_or_refuse(checked: CheckedSpec, target: str) -> tuple[str, ...] | None:
    """The generated texts (kernel source, host module) or None for a clean refusal."""
    try:
        built = build(checked, target=target)
    except SpecError as err:
        assert err.span is not None and "\n" not in err.message, err
        return None
    except ValueError as err:
        if CLEAN_VALUE_ERRORS.match(str(err)) and "\n" not in str(err):
            return None
        raise
    assert built.target == target
    compile(built.host, f"<{target} host module>", "exec")
    return (built.source, built.host) if target == "cuda" else (built.source,)


def check_one(generated: GeneratedSpec) -> None:
    checked = load_or_error(generated.text)
    if checked is not None:
        for target in TARGETS:
            build_or_refuse(checked, target)


@FAST
@given(specs())
def test_generated_specs_load_and_build_cleanly(generated: GeneratedSpec) -> None:
    check_one(generated)


# ----------------------------------------------------------------------------- names

MARKER = re.compile(r"zq(\d+)zq")


def _python_names(source: str) -> set[str]:
    """Identifiers of Python code, outside comments and strings."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.string for t in tokens if t.type == tokenize.NAME}


def _cuda_names(source: str) -> set[str]:
    """Identifiers of CUDA C++ code, outside comments and string literals."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\])*\"", " ", source, flags=re.S)
    return set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", code))


def check_names(text: str, names: set[str], back: dict[str, str], reserved: frozenset[str]) -> None:
    """Every identifier holding a spec name stands for one spec-derived thing and lands on
    no word the generated code uses for something else (nor a keyword)."""
    marked = {n for n in names if MARKER.search(n)}
    unmarked = names - marked
    seen: dict[str, str] = {}
    for name in marked:
        real = MARKER.sub(lambda m: back[m.group(0)], name)
        assert real not in unmarked, f"spec name renders as {real!r}, a word the code uses"
        assert real not in reserved, f"spec name renders as the keyword {real!r}"
        assert seen.setdefault(real, name) == name, f"{name} and {seen[real]} both render {real}"


@settings(FAST, max_examples=max(1, EXAMPLES // 6))
@given(specs())
def test_names_never_change_generated_code(generated: GeneratedSpec) -> None:
    """The spec with every name replaced by a marker ``zq<i>zq`` generates the same code
    (markers mapped back), and no name collides with the code around it."""
    markers = {role: f"zq{i}zq" for i, role in enumerate(ROLES)}
    back = {markers[role]: generated.names[role] for role in ROLES}
    neutral = load_or_error(generated.renamed(markers))
    checked = load_or_error(generated.text)
    if neutral is None:
        assert checked is None, "a name made a refused spec acceptable"
        return
    for target in TARGETS:
        renamed = build_or_refuse(neutral, target)
        if renamed is None:
            continue
        for text, language in zip(renamed, ("kernel", "host"), strict=False):
            if target == "cuda" and language == "kernel":
                check_names(text, _cuda_names(text), back, CPP_KEYWORDS)
            else:
                reserved = frozenset(keyword.kwlist)
                check_names(text, _python_names(text), back, reserved)
        if checked is None:
            continue  # a hostile name refused by the checker: fine
        original = build_or_refuse(checked, target)
        assert original is not None
        mapped = tuple(MARKER.sub(lambda m: back[m.group(0)], text) for text in renamed)
        assert mapped == original, f"{target}: a name changed more than itself"


# ----------------------------------------------------------------------------- coverage


def test_most_generated_specs_reach_code_generation() -> None:
    """The strategy writes attention, not noise: most specs pass the checker and the
    pattern and generate code for both targets (with and without hostile names)."""
    outcomes: list[tuple[bool, bool]] = []

    @settings(FAST, max_examples=100)
    @given(specs())
    def draw(generated: GeneratedSpec) -> None:
        checked = load_or_error(generated.text)
        built = checked is not None and all(
            build_or_refuse(checked, target) is not None for target in ("triton",)
        )
        outcomes.append((checked is not None, built))

    draw()
    accepted = sum(a for a, _ in outcomes) / len(outcomes)
    generated = sum(b for _, b in outcomes) / len(outcomes)
    assert accepted >= 0.8, f"{accepted:.0%} of generated specs accepted"
    assert generated >= 0.8, f"{generated:.0%} of generated specs built for Triton"


# ----------------------------------------------------------------------------- kernels


@settings(FAST, max_examples=RUN_EXAMPLES)
@given(specs(safe=True))
def test_generated_kernels_match_the_reference(generated: GeneratedSpec) -> None:
    """Safe specs (no division by zero, bounded function arguments, masks decided by
    integers) compiled for Triton agree with the float64 reference at tiny sizes."""
    import attncc

    try:
        kernel = attncc.compile(generated.text, target="triton")
    except SpecError:
        return
    except ValueError as err:
        if CLEAN_VALUE_ERRORS.match(str(err)):
            return
        raise
    rng = np.random.default_rng(0)
    sizes = draw_sizes(kernel.ir, rng, max_len=24, head_dims=(16,))
    # params without a default are drawn, as attncc check draws them
    required = [p.name for p in kernel.ir.params if p.default is None]
    params = draw_params(kernel.ir, sizes, {}, rng, required) if required else {}
    kernel.poison_outputs(True)
    try:
        result = run_case(kernel, Case(sizes, torch.float32, "contiguous", params), "cpu", rng)
    finally:
        kernel.poison_outputs(False)
    assert result.ok, (sizes, result)
