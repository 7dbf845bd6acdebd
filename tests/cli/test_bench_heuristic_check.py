"""benchmarks/heuristic_check.py (the GPU suite's `heuristic` step) on the CPU: its main on a
tiny case in the Triton interpreter, every configuration really run and compared, with
deterministic fake times in place of the GPU timing; its cases and --help without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from script_module import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "heuristic_check.py"
CASE = "causal 1,2,128,16"
# the CPU table's configuration for CASE (attncc.runtime.heuristics: the interpreter's row)
TABLE = "128x64/w4/s3"
BEST = "64x64/w4/s3/tma"  # a tuning candidate (PREFILL_CANDIDATES' first)


@pytest.fixture()
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = load_script(SCRIPT, "heuristic_check_script")
    monkeypatch.setattr(module, "DEVICE", "cpu")
    monkeypatch.setenv("ATTNCC_AUTOTUNE", "")  # main sets it to 0; the fixture restores it
    return module


def fake_timing(
    script: ModuleType, times: dict[str, float], perturb: str | None = None
) -> Callable[..., Any]:
    """``prepare_config`` running the real call (its output is compared) with a timer that
    returns ``times[config]`` (1 ms for any other); ``perturb``'s output is off by 0.5."""
    real = script.prepare_config

    def prepare(*args: Any) -> tuple[torch.Tensor, Callable[[], float]]:
        out, _ = real(*args)
        key = script.describe(args[4])
        if key == perturb:
            out = out + 0.5
        return out, lambda: times.get(key, 1.0)

    return prepare


def run(script: ModuleType, tmp_path: Path, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    path = tmp_path / "rows.jsonl"
    code = script.main(["--cases", CASE, "--dtype", "fp32", "--json", str(path), *extra])
    return code, [json.loads(line) for line in path.read_text().splitlines()]


def test_table_slower_than_best_by_more_than_10_percent_is_a_miss(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(script, "prepare_config", fake_timing(script, {TABLE: 1.2, BEST: 0.8}))
    code, rows = run(script, tmp_path)
    assert code == 0
    (row,) = rows
    assert (row["spec"], row["shape"], row["dtype"], row["device"]) == (
        "causal",
        "1,2,128,16",
        "fp32",
        "cpu",
    )
    assert row["table_config"] == TABLE and row["table_ms"] == 1.2
    assert row["best_config"] == BEST and row["best_ms"] == 0.8
    assert row["best"] == {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "tma": 1}
    assert row["ratio"] == pytest.approx(1.5) and row["miss"] is True
    assert row["table_is_candidate"] is False and not row["failed"]
    assert len(row["times"]) == 8 + 2  # every tuning candidate timed (float32: two more)
    out = capsys.readouterr().out
    assert f"table {TABLE} 1200.0 us | best {BEST} 800.0 us | table/best 1.500 MISS" in out
    assert "worst table/best 1.500 (causal 1,2,128,16); 1 MISS of 1 cases" in out


def test_table_within_10_percent_is_no_miss(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(script, "prepare_config", fake_timing(script, {TABLE: 1.05, BEST: 1.0}))
    code, (row,) = run(script, tmp_path, "--rounds", "1")
    assert code == 0 and row["ratio"] == pytest.approx(1.05) and row["miss"] is False
    out = capsys.readouterr().out
    assert "table/best 1.050\n" in out and "0 MISS of 1 cases" in out


def test_an_extra_configuration_is_timed_and_may_be_the_best(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = "32x32/w4/s2"
    monkeypatch.setattr(script, "prepare_config", fake_timing(script, {TABLE: 1.0, extra: 0.5}))
    code, (row,) = run(script, tmp_path, "--rounds", "1", "--extra", f"{extra};64x32/w4/s3/tma")
    assert code == 0 and len(row["times"]) == 10 + 2
    assert row["best_config"] == extra and row["ratio"] == pytest.approx(2.0)
    assert row["best"] == {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "tma": 0}
    with pytest.raises(SystemExit, match="--extra: expected"):
        script.parse_config("32x32")


def test_graphed_times_prefill_as_graph_replays(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed = fake_timing(script, {})
    seen: list[bool] = []

    def prepare(*args: Any) -> tuple[torch.Tensor, Callable[[], float]]:
        seen.append(args[5])
        return timed(*args)

    monkeypatch.setattr(script, "prepare_config", prepare)
    run(script, tmp_path, "--rounds", "1")
    assert seen and not any(seen)  # prefill: do_bench of eager calls by default
    seen.clear()
    run(script, tmp_path, "--rounds", "1", "--graphed")
    assert seen and all(seen)


def test_a_candidate_whose_output_differs_is_an_error_row(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(script, "prepare_config", fake_timing(script, {}, perturb=BEST))
    code, (row,) = run(script, tmp_path)
    assert code == 1
    assert "output differs" in row["error"] and set(row["mismatch"]) == {BEST}
    assert row["mismatch"][BEST] == pytest.approx(0.5)
    assert "ratio" not in row
    out = capsys.readouterr().out
    assert "causal 1,2,128,16 fp32: ERROR output differs" in out and "1 errors" in out


def test_default_and_selected_cases(script: ModuleType) -> None:
    cases = script.default_cases()
    assert ("causal", "4,16,4096,128") in cases and ("gqa_causal", "4,32:8,4096,128") in cases
    assert ("decode", "8,32:8,32768,128") in cases and ("paged_decode", "1,32:8,8192,128") in cases
    assert ("fp8_causal", "4,16,4096,128") in cases  # the FP8 row of the table too
    assert len(cases) == 6 + 1 + 2 + 2 * 4  # 6 variants, GQA, 2 FP8 at 4k; decode, paged x 4
    assert not any(shape.endswith(",64") or ",1024," in shape for _, shape in cases)
    assert script.select("decode", False) == [c for c in cases if c[0] == "decode"]
    assert script.select("fused 2,4,512,64", False) == [("fused", "2,4,512,64")]
    assert len(script.select(None, True)) == len(script.QUICK)
    with pytest.raises(SystemExit):
        script.select("nosuchspec", False)


def test_help_runs_without_a_gpu() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "--cases" in done.stdout and "--json" in done.stdout
