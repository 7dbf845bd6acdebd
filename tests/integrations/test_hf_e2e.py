"""benchmarks/hf_e2e.py (the GPU suite's `hf` step) runs end to end at toy sizes on the CPU,
for every model family it builds."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from script_module import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hf_e2e.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script(SCRIPT, "hf_e2e_script")


FAMILIES = ["llama", "qwen2", "mistral", "gemma2", "gemma3", "gpt_oss"]


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_run_times_each_implementation_and_agrees(
    script: ModuleType, family: str, tmp_path: Path
) -> None:
    assert sorted(script.FAMILIES) == sorted(FAMILIES)
    out = tmp_path / "hf.jsonl"
    rows = script.main(["--tiny", "--family", family, "--json", str(out)])
    reference = {"gemma2": "eager", "gpt_oss": "eager"}.get(family, "sdpa")
    assert [row["impl"] for row in rows] == [reference, "attncc"]
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    printed = script.table(out).splitlines()
    assert len(printed) == 3 and printed[2].split()[:3] == [family, "1", "attncc"]
    for row in rows:
        assert row["family"] == family and "error" not in row
        assert row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0
        assert row["reference"] == reference
        # fp32 at toy sizes: the same logits, so the same greedy tokens, prefill's included
        assert row["max_logit_diff_vs_first"] < 1e-4
        assert row["median_logit_diff_vs_first"] < 1e-4
        assert row["greedy_tokens_agreeing"] == row["decode"] + 1


def test_realistic_configs_keep_each_familys_attention(script: ModuleType) -> None:
    """The realistic sizes keep windows shorter than the 2048-token prompt, Gemma 2's
    soft-capping and gpt-oss's experts (its sinks come with the family's attention)."""
    configs = {family: script.family_config(family, tiny=False) for family in FAMILIES}
    assert configs["mistral"].sliding_window == 1024
    assert configs["gemma2"].attn_logit_softcapping == 50.0
    assert configs["gemma2"].sliding_window == 1024
    assert configs["gemma3"].layer_types.count("full_attention") == 2
    assert configs["gemma3"].sliding_window == 512
    assert configs["gpt_oss"].sliding_window == 128
    assert configs["gpt_oss"].num_local_experts == 4
    assert configs["qwen2"].num_key_value_heads == 2


def test_a_refused_implementation_is_an_error_row(script: ModuleType, tmp_path: Path) -> None:
    """transformers gives Gemma 2 no sdpa (no soft-capping): a row with the error, and the
    next implementation that runs becomes the reference."""
    out = tmp_path / "hf.jsonl"
    rows = script.main(
        ["--tiny", "--family", "gemma2", "--impls", "sdpa,attncc", "--json", str(out)]
    )
    assert [row["impl"] for row in rows] == ["sdpa", "attncc"]
    assert "does not support" in rows[0]["error"] and "prefill_tok_s" not in rows[0]
    assert rows[1]["reference"] == "attncc" and rows[1]["max_logit_diff_vs_first"] == 0
    assert "error: ValueError" in script.table(out).splitlines()[1]
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows


def test_profile_prints_each_implementations_phases(
    script: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    script.main(["--tiny", "--profile"])
    printed = capsys.readouterr().out
    for impl in ("sdpa", "attncc"):
        for phase in ("prefill", "decode"):
            assert f"== {impl} {phase}, by self_cpu_time_total" in printed
    assert "aten::" in printed
