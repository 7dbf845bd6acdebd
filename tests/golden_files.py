"""Golden-file comparison shared by the generated-source and printed-IR tests."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UPDATE = os.environ.get("ATTNCC_UPDATE_GOLDEN") == "1"


def assert_golden(actual: str, path: Path, what: str) -> None:
    """``actual`` must equal the file at ``path``; ATTNCC_UPDATE_GOLDEN=1 rewrites it."""
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    if not path.exists():
        pytest.fail(f"no golden file {path}; create it with ATTNCC_UPDATE_GOLDEN=1")
    expected = path.read_text()
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=str(path.relative_to(ROOT)),
                tofile=what,
            )
        )
        pytest.fail(
            f"{path.name} differs from the golden file:\n{diff}\n"
            "If the change is intended, regenerate with "
            "ATTNCC_UPDATE_GOLDEN=1 .venv/bin/pytest tests/codegen tests/ir",
            pytrace=False,
        )
