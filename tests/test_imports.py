"""The package imports one way: no module of attncc reads a name from the package root, whose
``__init__`` imports the api and through it nearly every module (a module that did would work
only while the root happens to bind that name before its own imports start)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attncc"


def names_read_from_the_root(path: Path) -> list[str]:
    """The names ``path`` imports from the ``attncc`` package itself that are not submodules."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        parent = path.parent.relative_to(ROOT).parts
        if node.level:  # relative: resolve to the absolute package
            base = parent[: len(parent) - node.level + 1]
            module = ".".join([*base, *filter(None, [node.module])])
        else:
            module = node.module or ""
        if module != "attncc":
            continue
        for alias in node.names:
            submodule = PACKAGE / alias.name
            if not (submodule.with_suffix(".py").exists() or (submodule / "__init__.py").exists()):
                found.append(alias.name)
    return found


def test_no_module_reads_a_name_from_the_package_root() -> None:
    offenders = {
        str(path.relative_to(ROOT)): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "__init__.py" and (names := names_read_from_the_root(path))
    }
    assert offenders == {}


FIRST_IMPORTS = ["attncc.codegen.host", "attncc.runtime.nvrtc", "attncc.version"]


@pytest.mark.parametrize("module", FIRST_IMPORTS)
def test_a_module_imported_first_in_a_fresh_interpreter(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}; import attncc; print(attncc.__version__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == attncc_version()


def attncc_version() -> str:
    tree = ast.parse((PACKAGE / "version.py").read_text())
    values = [n.value.value for n in tree.body if isinstance(n, ast.Assign)]
    assert len(values) == 1 and isinstance(values[0], str)
    return values[0]
