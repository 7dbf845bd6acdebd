"""What both backends' renderers share: the Jinja environment rules of STYLE.md
(StrictUndefined, trim/lstrip blocks, a ``py`` filter for host literals, compiled templates
cached on disk so a warm start skips Jinja's compilation) and small text helpers."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jinja2

from attncc.cache import cache_dir
from attncc.codegen.exprs import safe_name

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
COMMON_TEMPLATE_DIR = TEMPLATES / "common"


def _bytecode_dir() -> str:
    path = cache_dir() / "jinja"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def python_literal(value: Any) -> str:
    """The ``py`` filter: a value as a Python literal (names go into host code quoted);
    tuples and dicts of literals too."""
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    if isinstance(value, tuple):
        items = ", ".join(python_literal(v) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    if isinstance(value, dict):
        items = ", ".join(f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items())
        return f"{{{items}}}"
    if not isinstance(value, str | int | float | bool | type(None)):
        raise TypeError(f"py filter: {type(value).__name__} is not a literal")
    return repr(value)


@functools.cache
def environment(backend: str) -> jinja2.Environment:
    """One environment per backend and process: ``templates/<backend>`` first, then
    ``templates/common``."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([TEMPLATES / backend, COMMON_TEMPLATE_DIR]),
        bytecode_cache=jinja2.FileSystemBytecodeCache(_bytecode_dir()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["py"] = python_literal
    return env


def entry_name(spec_name: str) -> str:
    """The generated module's entry point: the spec's name behind a prefix, so that no name
    (``torch``, ``def``, ``_forward``, ``len``) rebinds or shadows a name the module uses."""
    return f"attncc_{safe_name(spec_name)}"


def nested(func: str, parts: list[str]) -> str:
    """``func(func(a, b), c)`` for ``parts`` [a, b, c] (at least one part)."""
    result = parts[0]
    for part in parts[1:]:
        result = f"{func}({result}, {part})"
    return result
