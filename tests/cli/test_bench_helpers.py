"""The benchmark's CPU-side pieces (timing itself needs a GPU: benchmarks/gpu_suite.sh)."""

from __future__ import annotations

from pathlib import Path

import attncc
from attncc.bench import Row, RunPlan, Shape, Startup, default_shapes, format_rows, sizes_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_shapes_parse_with_and_without_kv_heads() -> None:
    assert Shape.parse("4,16,4096,128") == Shape(4, 16, None, 4096, 128)
    assert Shape.parse("2,32:8,4096,128") == Shape(2, 32, 8, 4096, 128)
    assert str(Shape.parse("2,32:8,4096,128")) == "B=2 H=32:8 S=4096 D=128"


def test_default_shapes_hold_16k_tokens() -> None:
    kernel = attncc.optimise(EXAMPLES / "gqa_causal.attn")[1]
    shapes = default_shapes(kernel)
    assert [s.batch * s.seq for s in shapes] == [16384] * 5
    assert {(s.heads, s.kv_heads) for s in shapes} == {(32, 8)}


def test_sizes_for_gqa_and_a_paged_cache() -> None:
    gqa = attncc.optimise(EXAMPLES / "gqa_causal.attn")[1]
    assert sizes_for(gqa, Shape(2, 32, 8, 4096, 128)) == {
        "B": 2, "H": 32, "KVH": 8, "M": 4096, "N": 4096, "D": 128,
    }  # fmt: skip
    paged = attncc.optimise(EXAMPLES / "paged_decode.attn")[1]
    sizes = sizes_for(paged, Shape(8, 32, 8, 8192, 128))
    assert sizes["PAGE"] == 16 and sizes["NP"] == 512 and sizes["N"] == 8192
    assert sizes["P"] == 8 * 512  # a page per slot of the table


def test_rows_and_startup_print() -> None:
    row = Row("causal", "B=4 H=16 S=4096 D=128", "bf16", 0.5, 400.0, None, {"flex": 320.0})
    table = format_rows([row], ["flex"])
    assert "x flex" not in table and "xflex" in table.splitlines()[0]
    assert table.splitlines()[1].split()[-2:] == ["320.0", "1.25"]
    startup = Startup(0.21, [("B=1", 2.8, 1), ("B=2", 0.01, 0)])
    assert (
        str(startup) == "attncc.compile 0.210 s; first calls: B=1: 2.80 s (autotuned), B=2: 0.01 s"
    )


def test_run_plan_resumes_from_its_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "bench.jsonl"
    first = RunPlan(str(path))
    first.record(Row("causal", "B=4 H=16 S=4096 D=128", "bf16", 0.6, 420.0, None))
    first.record(Row("decode [cuda]", "B=8 H=32:8 S=8192 D=128", "bf16", 0.3, 3.3, 0.8))
    assert len(path.read_text().splitlines()) == 2  # appended as measured
    resumed = RunPlan(str(path), resume=True)
    assert resumed.done == {
        ("causal", "B=4 H=16 S=4096 D=128", "bf16"),
        ("decode [cuda]", "B=8 H=32:8 S=8192 D=128", "bf16"),
    }
    assert RunPlan(str(path)).done == set()  # without --resume every shape runs
    assert RunPlan(str(tmp_path / "absent.jsonl"), resume=True).done == set()
