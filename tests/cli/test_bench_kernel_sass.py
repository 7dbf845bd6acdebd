"""benchmarks/kernel_sass.py: the loops it finds in SASS text, and one run on an example
where nvcc is installed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
kernel_sass = load_script(ROOT / "benchmarks" / "kernel_sass.py", "kernel_sass")


def sass(lines: list[str]) -> str:
    """cuobjdump's layout: an address comment, the instruction, its encoding."""
    return "\n".join(
        f"        /*{16 * i:04x}*/                   {text} ;  /* 0x000 */"
        for i, text in enumerate(lines)
    )


def test_a_conditional_branch_back_is_a_loop_and_its_body_is_counted() -> None:
    body = ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24", "LDL R2, [R1+0x8]"]
    body += ["FFMA R1, R2, R3, R4"] * 70 + ["SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR9], RZ"]
    code = ["MOV R0, RZ", *body, "@!P0 BRA 0x10", "EXIT"]
    (loop,) = kernel_sass.loops(sass(code))
    assert (loop.start, loop.end) == (0x10, 16 * (len(body) + 1))
    assert loop.counts == {
        "instructions": len(body) + 1,
        "HGMMA": 1,
        "QGMMA": 0,
        "LDGSTS": 0,
        "LDL": 1,
        "STL": 0,
        "SYNCS": 1,
    }


def test_opcodes_asked_for_are_counted_beside_the_default_ones() -> None:
    body = ["MUFU.EX2 R1, R2", "MUFU.EX2 R3, R4", "FMUL R5, R6, R7"] + ["FFMA R1, R2, R3, R4"] * 70
    code = ["MOV R0, RZ", *body, "@!P0 BRA 0x10", "EXIT"]
    (loop,) = kernel_sass.loops(sass(code), (*kernel_sass.COUNTED, "MUFU", "FMUL", "SHFL"))
    assert (loop.counts["MUFU"], loop.counts["FMUL"], loop.counts["SHFL"]) == (2, 1, 0)
    assert loop.counts["HGMMA"] == 0 and loop.counts["instructions"] == len(body) + 1


def test_jumps_back_from_barrier_retries_and_short_loops_are_not_listed() -> None:
    # ptxas puts a barrier wait's retries after the kernel's end, jumping back unconditionally
    stub = ["FFMA R1, R2, R3, R4"] * 80 + ["EXIT", "@!P0 BRA 0x510", "BRA 0x10"]
    short = ["FFMA R1, R2, R3, R4"] * 10 + ["@P1 BRA 0x0"]
    assert kernel_sass.loops(sass(short + stub)) == ()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: nothing to compile")
def test_the_causal_backward_has_its_mma_loop(capsys: pytest.CaptureFixture[str]) -> None:
    kernel_sass.main([str(ROOT / "examples" / "causal.attn"), "--kernel", "_bwd$"])
    out = capsys.readouterr().out
    assert "attncc_causal_bwd: " in out and "registers, spills" in out
    # the MMA groups' step: every warp-group MMA of a query tile in one loop
    assert "HGMMA 32" in out
