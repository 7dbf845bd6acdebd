"""benchmarks/backward.py's CPU-side pieces: the variant list, resuming, ratios and targets,
the table, and one row's plumbing with the kernel in the interpreter (timings and anchors
stand-ins; the timing itself needs a GPU: benchmarks/gpu_suite.sh backward)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from script_module import load_script

import attncc

ROOT = Path(__file__).resolve().parents[2]


def _backward_module() -> Any:
    path = ROOT / "benchmarks" / "backward.py"
    return load_script(path, "backward_script")


def _row(spec: str, shape: str, **values: Any) -> dict[str, Any]:
    row = {"spec": spec, "shape": shape, "dtype": "bf16", "backend": "cuda", "error": None}
    row.update(values)
    return row


def test_the_issues_variants_at_16k_tokens_and_d128() -> None:
    bwd = _backward_module()
    jobs = bwd.parse([]).jobs
    assert [j.spec for j in jobs] == [
        "fused", "causal", "sliding_window", "alibi", "softcap", "document_mask", "gqa_causal",
    ]  # fmt: skip
    for job in jobs:
        assert (ROOT / "examples" / f"{job.spec}.attn").exists()
        assert [s.split(",")[2] for s in job.shapes] == ["4096", "8192"]
        for shape in job.shapes:
            b, h, s, d = shape.split(",")
            assert int(b) * int(s) == 16384 and d == "128"
            assert h == ("32:8" if job.spec == "gqa_causal" else "16")
        command = job.command("b.jsonl", False)
        assert command[2:4] == ["--one", job.spec] and "--warm" not in command
        assert command[command.index("--target") + 1] == "auto"
    # a compiling process per (variant, shape), the longest sequences first
    warm = bwd.warm_jobs(jobs)
    assert len(warm) == 14 and all(len(j.shapes) == 1 for j in warm)
    assert [j.shapes[0].split(",")[2] for j in warm[:7]] == ["8192"] * 7
    assert "--warm" in warm[0].command("b.jsonl", True)
    picked = bwd.parse(["--variants", "causal", "--seqs", "2048", "--target", "triton"]).jobs
    assert [(j.spec, j.shapes, j.target) for j in picked] == [
        ("causal", ("8,16,2048,128",), "triton")
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--variants", "full"], "unknown variant full (variants: fused, causal"),
        (["--seqs", "3000"], "no matrix shape of length 3000 (lengths: 1024, 2048"),
        (["--rounds", "0"], "--rounds must be at least 1, got 0"),
    ],
)
def test_bad_arguments_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bwd = _backward_module()
    with pytest.raises(SystemExit) as exit_info:
        bwd.parse(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_pending_skips_measured_shapes_but_retries_errors(tmp_path: Path) -> None:
    bwd = _backward_module()
    jobs = bwd.jobs_for(("causal", "alibi"), (4096, 8192))
    path = tmp_path / "b.jsonl"
    assert bwd.pending(jobs, str(path)) == jobs
    rows = [
        _row("causal", "B=4 H=16 S=4096 D=128", bwd_ms=1.0),
        _row("alibi", "B=4 H=16 S=4096 D=128", error="RuntimeError: boom"),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    left = bwd.pending(jobs, str(path))
    assert [(j.spec, j.shapes) for j in left] == [
        ("causal", ("2,16,8192,128",)),
        ("alibi", ("4,16,4096,128", "2,16,8192,128")),
    ]


def test_ratios_and_the_targets_each_row_misses() -> None:
    bwd = _backward_module()
    anchors = {"flex": 5.0, "sdpa-flash": 5.2, "sdpa-cudnn": 3.0}
    full = _row("fused", "B=4 H=16 S=4096 D=128", fwd_ms=1.0, bwd_ms=4.0, anchors=anchors)
    got = bwd.ratios(full)
    assert got == {"bwd/fwd": 4.0, "flex": 1.25, "sdpa-flash": 1.3, "sdpa-cudnn": 0.75}
    # 4x its forward (target <= 3), 1.25x Flex (>= 1.3), 0.75x cuDNN (>= 0.85); FA2 met
    assert bwd.missed(full) == ["bwd/fwd", "flex", "cudnn"]
    # SDPA's targets are full's and causal's; bwd/fwd is full attention's
    gqa = _row("gqa_causal", "B=4 H=32:8 S=4096 D=128", fwd_ms=1.0, bwd_ms=4.0, anchors=anchors)
    assert bwd.missed(gqa) == ["flex"]
    alibi = {"flex": 6.0, "sdpa-flash": None, "sdpa-cudnn": None}
    ok = _row("alibi", "B=4 H=16 S=4096 D=128", fwd_ms=None, bwd_ms=4.0, anchors=alibi)
    assert bwd.ratios(ok) == {"bwd/fwd": None, "flex": 1.5, "sdpa-flash": None, "sdpa-cudnn": None}
    assert bwd.missed(ok) == []


def test_the_table_lists_errors_and_shapes_never_measured() -> None:
    bwd = _backward_module()
    anchors = {"flex": 5.0, "sdpa-flash": 5.2, "sdpa-cudnn": 3.0}
    rows = [
        _row("fused", "B=4 H=16 S=4096 D=128", fwd_ms=9.0, bwd_ms=9.0, anchors=anchors),
        _row("fused", "B=4 H=16 S=4096 D=128", fwd_ms=1.0, bwd_ms=4.0, anchors=anchors,
             bwd_tflops=300.0),  # a rerun replaces the earlier row
        _row("alibi", "B=4 H=16 S=4096 D=128", error="RuntimeError: out of resources"),
    ]  # fmt: skip
    table = bwd.format_rows(rows, bwd.jobs_for(("fused", "alibi"), (4096,))).splitlines()
    assert table[0].split() == [
        "variant", "shape", "dtype", "backend", "fwd", "ms", "bwd", "ms", "bwd", "TFLOP/s",
        "bwd/fwd", "flex", "ms", "xflex", "fa2", "ms", "xfa2", "cudnn", "ms", "xcudnn", "missed",
    ]  # fmt: skip
    assert len(table) == 3  # every shape of the jobs has a row: none listed as not measured
    assert table[1].split()[-12:] == [
        "cuda", "1.000", "4.000", "300.0", "4.00", "5.000", "1.25", "5.200", "1.30", "3.000",
        "0.75", "bwd/fwd,flex,cudnn",
    ]  # fmt: skip
    assert table[2].split()[0] == "alibi" and "error: RuntimeError: out of resources" in table[2]
    missing = bwd.format_rows(rows, bwd.jobs_for(("fused",), (4096, 8192))).splitlines()
    assert missing[-1].split()[0] == "fused" and missing[-1].endswith("not measured")
    assert "S=8192" in missing[-1]


def _cpu_bench(monkeypatch: pytest.MonkeyPatch, bwd: Any) -> list[Any]:
    """bench's GPU pieces replaced: CPU inputs, a stand-in Flex that refuses gradients of
    captured tensors, and a timer that runs each call once (returned: what each returned)."""
    import attncc.bench as bench

    def cpu_inputs(kernel: Any, sizes: dict[str, int], dtype: Any, documents: int) -> Any:
        gen = torch.Generator().manual_seed(0)
        return {
            t.name: torch.randn([sizes[d] for d in t.dims], generator=gen) * 0.3
            for t in kernel.tensors
        }

    def anchors(kernel: Any, tensors: Any, *args: Any) -> dict[str, Any]:
        q, k, v, slopes = (tensors[n] for n in ("q", "k", "v", "slopes"))

        def flex() -> Any:
            if slopes.requires_grad:
                raise RuntimeError("captured tensors requiring grad")
            scores = q @ k.transpose(-1, -2) - slopes[:, None, None]
            return torch.softmax(scores, -1) @ v

        return {"flex": flex, "sdpa-flash": None, "sdpa-cudnn": None}

    returned: list[Any] = []

    def fake_median_ms(fns: list[Callable[[], Any]], graphed: bool) -> float:
        returned.append(fns[0]())
        return 2.0 if isinstance(returned[-1], tuple) else 1.0  # backward calls: 2 ms

    monkeypatch.setattr(bench, "bench_inputs", cpu_inputs)
    monkeypatch.setattr(bench, "visible_fraction", lambda *a: 0.5)
    monkeypatch.setattr(bench, "anchor_runners", anchors)
    monkeypatch.setattr(bench, "median_ms", fake_median_ms)
    return returned


def test_a_row_times_attncc_backward_with_dslopes_and_its_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bwd = _backward_module()
    returned = _cpu_bench(monkeypatch, bwd)
    kernel = attncc.compile(ROOT / "examples" / "alibi.attn", target="triton")
    row = bwd.measure_shape(kernel, "alibi", "1,2,32,16", "bf16", 2, False)
    assert row["error"] is None and row["backend"] == "triton"
    assert row["grads"] == ["q", "k", "v", "slopes"]
    # attncc's backward and forward, and Flex's backward, each once a round, 3 rounds
    grads = [r for r in returned if isinstance(r, tuple) and len(r) == 4]
    assert len(grads) == 3 and len(returned) == 9
    dq, dk, dv, dslopes = grads[0]
    assert dslopes.shape == (2,) and bool(dslopes.abs().sum() > 0)
    assert all(bool(g.abs().sum() > 0) for g in (dq, dk, dv))
    flex = [r for r in returned if isinstance(r, tuple) and len(r) == 3]
    assert len(flex) == 3  # Flex's backward of q, k and v alone
    assert row["bwd_ms"] == 2.0 and row["fwd_ms"] == 1.0
    assert row["anchors"] == {"flex": 2.0, "sdpa-flash": None, "sdpa-cudnn": None}
    flops = 2.5 * 4 * 2 * 32 * 32 * 16 * 0.5
    assert row["bwd_tflops"] == pytest.approx(flops / 2e-3 / 1e12)
    assert "flex: no gradient of slopes" in row["notes"]
    assert "sdpa-flash: does not compute this variant" in row["notes"]


def test_a_failing_shape_is_an_error_row_and_the_next_still_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bwd = _backward_module()
    path = tmp_path / "b.jsonl"

    def measure(kernel: Any, spec: str, shape: str, dtype: str, *args: Any) -> dict[str, Any]:
        if shape.startswith("4,"):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return _row(spec, shape, fwd_ms=1.0, bwd_ms=2.0, anchors={})

    monkeypatch.setattr(bwd, "measure_shape", measure)
    argv = ["--one", "causal", "--shapes", "4,16,4096,128;2,16,8192,128", "--json", str(path)]
    assert bwd.main([*argv, "--target", "triton"]) == 1
    rows = bwd.read_rows(str(path))
    assert [r["shape"] for r in rows] == ["B=4 H=16 S=4096 D=128", "2,16,8192,128"]
    assert rows[0]["error"] == "OutOfMemoryError: CUDA out of memory" and rows[1]["error"] is None


def test_the_run_compiles_in_parallel_then_measures_within_the_budget(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bwd = _backward_module()
    calls: list[tuple[list[Any], list[str], bool, float]] = []

    def run_pool(jobs: list[Any], slots: list[str], path: str, warm: bool, deadline: float,
                 log: Any) -> int:  # fmt: skip
        calls.append((jobs, slots, warm, deadline))
        return 0

    monkeypatch.setattr(bwd.matrix, "gpu_count", lambda: 1)
    monkeypatch.setattr(bwd.matrix, "run_pool", run_pool)
    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps(_row("causal", "B=4 H=16 S=4096 D=128", fwd_ms=1.0, bwd_ms=3.0,
                                    anchors={"flex": 6.0})) + "\n")  # fmt: skip
    argv = ["--json", str(path), "--budget", "240", "--workers", "3", "--log", str(tmp_path / "l")]
    began = time.time()
    assert bwd.main([*argv, "--variants", "fused,causal"]) == 0
    (warm, warm_slots, is_warm, warm_end), (measure, gpus, is_measure, end) = calls
    assert is_warm and not is_measure and warm_slots == ["0"] * 3 and gpus == ["0"]
    # the measured shape is skipped; a compiling process per remaining (variant, shape)
    assert [j.shapes for j in measure] == [("4,16,4096,128", "2,16,8192,128"), ("2,16,8192,128",)]
    assert sorted(s for j in warm for s in j.shapes) == sorted(s for j in measure for s in j.shapes)
    # no shape starts after budget - GRACE: the last one's grace ends within the budget
    assert began + 0.45 * 240 - 1 < warm_end < end <= time.time() + 240 - bwd.matrix.GRACE
    table = capsys.readouterr().out.splitlines()
    assert sum(line.endswith("not measured") for line in table) == 3
    assert any(line.startswith("causal") and "2.00" in line for line in table)


def test_anchor_backwards_differentiate_each_anchor_run_once() -> None:
    """backward_backends.anchor_backwards (shared with backward_host.py): each anchor that
    has a runner gets a backward of q, k and v over one kept forward graph, repeatable; an
    anchor without one (None) gets none."""
    module = load_script(ROOT / "benchmarks" / "backward_backends.py", "backward_backends_script")
    leaves = [torch.randn(2, 3, requires_grad=True) for _ in range(3)]
    forwards = [0]

    def runner() -> torch.Tensor:
        forwards[0] += 1
        return leaves[0] * 2 + leaves[1] * 3 + leaves[2]

    grad = torch.ones(2, 3)
    calls = module.anchor_backwards({"flex": runner, "sdpa-flash": None}, leaves, grad)
    assert list(calls) == ["flex"]
    for _ in range(2):
        dq, dk, dv = calls["flex"]()
        assert torch.equal(dq, grad * 2) and torch.equal(dk, grad * 3) and torch.equal(dv, grad)
    assert forwards[0] == 1
