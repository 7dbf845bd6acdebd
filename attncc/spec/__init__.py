"""The spec language: parse text into a frozen AST, then check names, indices and types."""

from __future__ import annotations

from pathlib import Path

from attncc.spec.ast import Spec
from attncc.spec.check import CheckedSpec, check
from attncc.spec.errors import SpecError
from attncc.spec.parser import parse, parse_file

__all__ = ["CheckedSpec", "Spec", "SpecError", "check", "load", "parse", "parse_file"]


def load(spec: str | Path | CheckedSpec) -> CheckedSpec:
    """A checked spec from spec text, a path to a ``.attn`` file, or an already checked spec."""
    if isinstance(spec, CheckedSpec):
        return spec
    if isinstance(spec, Path) or ("\n" not in spec and _names_a_file(spec)):
        return check(parse_file(spec))
    return check(parse(spec))


def _names_a_file(text: str) -> bool:
    if text.strip().endswith(".attn"):
        return True
    try:
        return Path(text).is_file()
    except OSError:  # e.g. a one-line spec longer than a file name may be
        return False
