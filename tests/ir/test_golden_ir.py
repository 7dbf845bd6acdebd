"""Golden printed IR: ``attncc compile SPEC --print-ir-after-all`` for every example.

A mismatch fails with a unified diff. To accept a deliberate change, regenerate:

    ATTNCC_UPDATE_GOLDEN=1 .venv/bin/pytest tests/codegen tests/ir
"""

from __future__ import annotations

from pathlib import Path

import golden_files
import pytest

from attncc import cli
from attncc.ir import kernel_str, lower
from attncc.passes import PASS_NAMES, default_passes, run_passes
from attncc.spec import load

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "ir"
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))


def assert_golden(actual: str, path: Path) -> None:
    golden_files.assert_golden(actual, path, "printed now")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_print_ir_after_all_is_golden(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", str(path), "--print-ir-after-all"]) == 0
    printed = capsys.readouterr().out
    assert_golden(printed, GOLDEN / f"{path.stem}.txt")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_print_ir_after_all_is_kernel_str_after_each_pass(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI listing is exactly the lowered kernel and then each pass's result, in order."""
    assert cli.main(["compile", str(path), "--print-ir-after-all"]) == 0
    printed = capsys.readouterr().out
    kernel = lower(load(path))
    expected = [f"// IR after lower\n{kernel_str(kernel)}\n"]

    def record(p: object, after: object) -> None:
        expected.append(f"// IR after {p.name}\n{kernel_str(after)}\n")  # type: ignore[attr-defined,arg-type]

    run_passes(kernel, default_passes(), after_each=record)
    assert printed == "".join(expected)
    assert [line[len("// IR after ") :] for line in printed.splitlines() if "IR after" in line] == [
        "lower",
        *PASS_NAMES,
    ]


def test_print_ir_after_one_pass(capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "examples" / "causal.attn"
    assert cli.main(["compile", str(path), "--print-ir-after", "mask-analysis"]) == 0
    printed = capsys.readouterr().out
    assert "// IR after mask-analysis" in printed
    assert "keys   from max(0) to min(m + 1 [slope +1])" in printed
    assert "// IR after tiling" not in printed


def test_print_ir_after_an_unknown_pass(capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "examples" / "causal.attn"
    assert cli.main(["compile", str(path), "--print-ir-after", "tilling"]) == 2
    err = capsys.readouterr().err
    assert "unknown pass 'tilling'" in err and "tiling" in err
