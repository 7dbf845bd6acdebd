"""benchmarks/hf_e2e.py (the GPU suite's `hf` step) runs end to end at toy sizes on the CPU."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hf_e2e.py"


def test_tiny_run_times_each_implementation_and_agrees(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("hf_e2e_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "hf.jsonl"
    rows = script.main(["--tiny", "--json", str(out)])
    assert [row["impl"] for row in rows] == ["sdpa", "attncc"]
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    for row in rows:
        assert row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0
        assert row["reference"] == "sdpa"
        # fp32 at toy sizes: the same logits, so the same greedy tokens, prefill's included
        assert row["max_logit_diff_vs_first"] < 1e-4
        assert row["greedy_tokens_agreeing"] == row["decode"] + 1
