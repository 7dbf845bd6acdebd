"""Golden generated source, and the template rules of STYLE.md (headers, StrictUndefined).

A golden mismatch fails with a unified diff. To accept a deliberate change, regenerate:

    ATTNCC_UPDATE_GOLDEN=1 .venv/bin/pytest tests/codegen tests/ir

and review the diff of ``tests/golden`` like code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import golden_files
import jinja2
import pytest
from jinja2 import meta

import attncc
from attncc.api import build
from attncc.codegen import templating
from attncc.codegen import triton as triton_backend

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
EXAMPLES = ROOT / "examples"


def assert_golden(actual: str, path: Path) -> None:
    golden_files.assert_golden(actual, path, "generated now")


# (example, schedule): the fused GQA kernel, the materialised naive one, GQA split-KV, and a
# fused kernel that walks a tile index (document ids)
GOLDEN_SOURCES = [
    ("gqa_causal", "fused"),
    ("naive", "naive"),
    ("gqa_causal", "split_kv"),
    ("document_mask", "fused"),
]


@pytest.mark.parametrize(("name", "schedule"), GOLDEN_SOURCES)
def test_generated_source_is_golden(name: str, schedule: str) -> None:
    # the relative path keeps the header free of this checkout's location
    built = build(EXAMPLES / f"{name}.attn", schedule=schedule)  # type: ignore[arg-type]
    assert built.ir.schedule == schedule
    assert_golden(built.source, GOLDEN / f"{name}.{schedule}.py.txt")


def test_generated_source_is_deterministic() -> None:
    first = build(EXAMPLES / "gqa_causal.attn").source
    assert first == build(EXAMPLES / "gqa_causal.attn").source
    header = first.splitlines()[0]
    assert f"attncc {attncc.__version__}" in header and "'gqa_causal'" in header


def test_generated_source_compiles_for_every_example() -> None:
    for path in sorted(EXAMPLES.glob("*.attn")):
        text = path.read_text()
        # sinks and FP8 inputs run fused only (for now)
        fused_only = "softmax(s, n, " in text or ": f8e4m3" in text
        for schedule in ("fused",) if fused_only else ("naive", "fused", "split_kv"):
            source = build(path, schedule=schedule).source  # type: ignore[arg-type]
            compile(source, f"{path.stem}.{schedule}.py", "exec")


# ----------------------------------------------------------------------------- templates

TEMPLATES = sorted(p.name for p in triton_backend.TEMPLATE_DIR.glob("*.jinja"))
HEADER = re.compile(r"\A\{#-?(.*?)-?#\}", re.S)


def own_variables(env: jinja2.Environment, template: str) -> set[str]:
    source = env.loader.get_source(env, template)[0]  # type: ignore[union-attr]
    return meta.find_undeclared_variables(env.parse(source))


def all_variables(env: jinja2.Environment, template: str) -> set[str]:
    """The template's variables and those of every template it extends or includes."""
    names: set[str] = set()
    todo, seen = [template], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        source = env.loader.get_source(env, name)[0]  # type: ignore[union-attr]
        names |= meta.find_undeclared_variables(env.parse(source))
        todo += [t for t in meta.find_referenced_templates(env.parse(source)) if t]
    return names


def assert_every_variable_required(
    env: jinja2.Environment, template: str, values: dict[str, Any]
) -> None:
    """The context gives every variable the template (and what it includes) reads, and
    leaving out any one of them raises (StrictUndefined), never renders silently."""
    names = all_variables(env, template)
    assert names <= set(values), f"the context lacks {sorted(names - set(values))}"
    for name in sorted(names):
        partial = {k: v for k, v in values.items() if k != name}
        with pytest.raises(jinja2.UndefinedError):
            env.get_template(template).render(**partial)


def test_environment_follows_the_house_rules() -> None:
    env = triton_backend.environment()
    assert env.undefined is jinja2.StrictUndefined
    assert env.trim_blocks and env.lstrip_blocks
    assert {"base.py.jinja", "host.py.jinja", "fused.py.jinja", "naive.py.jinja"} <= set(TEMPLATES)


# every backend's templates: (backend, template)
BACKEND_TEMPLATES = [
    (backend, p.name)
    for backend in ("triton", "cuda")
    for p in sorted((templating.TEMPLATES / backend).glob("*.jinja"))
]


@pytest.mark.parametrize(("backend", "template"), BACKEND_TEMPLATES)
def test_template_header_names_its_variables(backend: str, template: str) -> None:
    env = templating.environment(backend)
    source = env.loader.get_source(env, template)[0]  # type: ignore[union-attr]
    header = HEADER.match(source)
    assert header, f"{template} must open with a {{# ... #}} header comment"
    named = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", header.group(1)))
    missing = own_variables(env, template) - named
    assert not missing, f"{template}'s header does not name {sorted(missing)}"


# every schedule's template, and the fused one with a tile index
CONTEXTS = [
    ("gqa_causal", "fused"),
    ("gqa_causal", "naive"),
    ("gqa_causal", "split_kv"),
    ("document_mask", "fused"),
]


def context(name: str, schedule: str) -> tuple[str, dict[str, object]]:
    checked, kernel = attncc.optimise(EXAMPLES / f"{name}.attn", schedule)  # type: ignore[arg-type]
    values = triton_backend._Context(kernel, checked.spec.source).fused()
    return f"{schedule}.py.jinja", values


@pytest.mark.parametrize(("name", "schedule"), CONTEXTS)
def test_rendering_the_full_context_matches_render(name: str, schedule: str) -> None:
    template, values = context(name, schedule)
    env = triton_backend.environment()
    checked, kernel = attncc.optimise(EXAMPLES / f"{name}.attn", schedule)  # type: ignore[arg-type]
    assert (
        env.get_template(template).render(**values)
        == triton_backend.render(kernel, checked.spec.source).source
    )


@pytest.mark.parametrize(("name", "schedule"), CONTEXTS)
def test_rendering_without_any_variable_raises(name: str, schedule: str) -> None:
    template, values = context(name, schedule)
    assert_every_variable_required(triton_backend.environment(), template, values)


@pytest.mark.parametrize(("name", "schedule"), CONTEXTS)
def test_a_missing_variable_is_named(name: str, schedule: str) -> None:
    template, values = context(name, schedule)
    env = triton_backend.environment()
    for name in sorted(all_variables(env, template)):
        partial = {k: v for k, v in values.items() if k != name}
        with pytest.raises(jinja2.UndefinedError, match=f"'{name}' is undefined"):
            env.get_template(template).render(**partial)


def test_strict_undefined_on_a_plain_template() -> None:
    env = triton_backend.environment()
    with pytest.raises(jinja2.UndefinedError, match="'block_m' is undefined"):
        env.from_string("BLOCK_M = {{ block_m }}\n").render()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{% for x in items %}{{ x }}{% endfor %}").render()


@pytest.mark.parametrize("name", ["paged_decode", "document_mask", "sliding_window", "naive"])
def test_sizes_are_runtime_values_in_every_triton_kernel(name: str) -> None:
    """Every top-level kernel tells Triton not to specialize sizes but the query and key
    lengths, int params and the log-sum-exp's outer strides (a batch of 8 after one of 16
    would otherwise recompile)."""
    source = attncc.compile(EXAMPLES / f"{name}.attn").source
    kernels = re.findall(r"@triton\.jit(.*)\ndef (\w+)\(", source)
    top_level = [
        (opts, fn)
        for opts, fn in kernels
        if not fn.startswith(("_tanh", "_max", "_sum", "_udiv", "_umod", "_row_lse"))
    ]
    top_level = [(opts, fn) for opts, fn in top_level if not fn.endswith("_combine")]
    assert top_level, source[:200]
    dims = re.findall(r"^dims\s+(.*)$", (EXAMPLES / f"{name}.attn").read_text(), re.M)
    names = [d.split("=")[0].strip() for line in dims for d in line.split(",")]
    lowered = attncc.optimise(EXAMPLES / f"{name}.attn")[1]
    lengths = {lowered.key_axis.dim} | ({lowered.query_axis.dim} if lowered.query_axis else set())
    for opts, fn in top_level:
        assert opts.startswith("(do_not_specialize=["), (fn, opts)
        for dim in names:
            assert (f'"d_{dim}"' in opts) == (dim not in lengths), (fn, dim, opts)
        if name == "sliding_window":
            assert '"p_window"' in opts, (fn, opts)


HOSTILE_SPEC = (
    "# a comment ending in a line splice \\\n"
    "attention hostile   # form feed \x0c, line separator \u2028, trigraph ??/\n"
    "dims  B, H, M, N, D\n"
    "in    q[B, H, M, D]\n"
    "in    k[B, H, N, D]\n"
    "in    v[B, H, N, D]\n"
    "param scale: f32 = 1 / sqrt(D)\n"
    "s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] * scale   # */ \\\n"
    "mask m >= n\n"
    "p = softmax(s, n)\n"
    "o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]\n"
    "out o\n"
)


@pytest.mark.parametrize("target", ["triton", "cuda"])
def test_spec_text_cannot_leave_its_comments(target: str) -> None:
    """Spec text reaches generated code only as one-line comments: no line break (for
    Python's tokenizer, C++'s or an editor's), no C++ line splice or its trigraph survives."""
    built = build(HOSTILE_SPEC, target=target)
    marker = "//" if target == "cuda" else "#"
    lines = built.source.split("\n")
    assert len(lines) == len(built.source.splitlines()) + (built.source.endswith("\n"))
    for line in lines:
        if "splice" in line or "form feed" in line or "*/" in line or "softmax(s, n)" in line:
            assert line.lstrip().startswith(marker), line
        assert not line.rstrip().endswith("\\"), line
        assert "??/" not in line, line
    # the statements' own lines are cited beside the code (file name <spec> for text specs)
    marker_line = f"{marker} <spec>:9: mask m >= n"
    assert any(line.strip() == marker_line for line in lines)
    if target == "triton":
        compile(built.source, "hostile.py", "exec")
