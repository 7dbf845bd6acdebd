"""``attncc check --backward`` and ``attncc.checking.check_backward``: gradients of drawn
trials against the float64 autograd reference, exit codes and refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import attncc
from attncc import cli
from attncc.checking import cases, check_backward, grad_table
from attncc.runtime import autograd

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CAUSAL = str(EXAMPLES / "causal.attn")
SHORT = ["--trials", "2", "--max-len", "24"]

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


def test_backward_check_prints_one_row_per_trial_and_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["check", CAUSAL, "--backward", *SHORT, "--dtypes", "fp32,bf16"]) == 0
    lines = capsys.readouterr().out.rstrip().splitlines()
    assert lines[0] == "causal (fused, cpu, backward):"
    assert lines[1].split() == [
        "shape", "dtype", "layout", "params", "grad", "error", "bound", "verdict"
    ]  # fmt: skip
    rows = lines[2:-1]
    assert len(rows) == 2 and all(row.split()[-1] == "ok" for row in rows)
    assert [row.split()[5] for row in rows] == ["float32", "bfloat16"]
    assert all(row.split()[8] in ("dq", "dk", "dv") for row in rows)
    assert lines[-1] == "2 passed, 0 failed"


def _scale_last_gradient(monkeypatch: pytest.MonkeyPatch, factor: float) -> None:
    """A backward whose last float input's gradient (v's, for causal) is ``factor`` times
    the right one."""
    right = autograd.Backward.run

    def wrong(self: autograd.Backward, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        grads = right(self, *args, **kwargs)
        return [*grads[:-1], grads[-1] * factor]

    monkeypatch.setattr(autograd.Backward, "run", wrong)


def test_a_wrong_gradient_fails_the_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _scale_last_gradient(monkeypatch, 1.01)
    assert cli.main(["check", CAUSAL, "--backward", *SHORT, "--dtypes", "fp32"]) == 1
    out = capsys.readouterr().out
    rows = out.rstrip().splitlines()[2:-1]
    # v's gradient is the worst of each row, and only it fails
    assert all(" dv " in row and row.endswith("FAIL (dv: error above bound)") for row in rows)
    assert out.rstrip().endswith("0 passed, 2 failed")


def test_the_forward_check_ignores_the_backward(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _scale_last_gradient(monkeypatch, 2.0)
    assert cli.main(["check", CAUSAL, *SHORT, "--dtypes", "fp32"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("2 passed, 0 failed")


def test_a_raising_backward_is_a_row_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(self: autograd.Backward, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(autograd.Backward, "run", boom)
    assert cli.main(["check", CAUSAL, "--backward", *SHORT, "--dtypes", "fp32"]) == 1
    rows = capsys.readouterr().out.rstrip().splitlines()[2:-1]
    assert len(rows) == 2 and all(row.endswith("error: RuntimeError: boom") for row in rows)
    # --debug: the traceback instead of a row
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["--debug", "check", CAUSAL, "--backward", *SHORT, "--dtypes", "fp32"])


ONLY_FUSED = "only the fused prefill schedule has a backward (this kernel is {})"
DECODE = "decode (no query axis) has no backward: only prefill kernels do"


@pytest.mark.parametrize(
    ("spec", "flags", "why"),
    [
        ("decode.attn", [], DECODE),
        ("causal.attn", ["--schedule", "naive"], ONLY_FUSED.format("naive")),
        ("paged_decode.attn", ["--schedule", "fused"], DECODE),
    ],
)
def test_a_spec_without_a_backward_is_one_line(
    spec: str, flags: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(EXAMPLES / spec)
    assert cli.main(["check", path, "--backward", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    prefix = f"attncc: error: {path}: no backward for this spec: "
    assert captured.err.startswith(prefix) and captured.err.count("\n") == 1
    assert captured.err == f"{prefix}{why}\n"


def test_backward_trials_are_the_forward_checks_trials() -> None:
    """Same seed, same cases: a failing gradient row can be rerun as a forward check."""
    kernel = attncc.compile(EXAMPLES / "alibi.attn", target="triton")
    dtypes = (torch.bfloat16,)
    results = check_backward(kernel, trials=2, seed=3, dtypes=dtypes, max_len=16)
    assert [r.case for r in results] == list(cases(kernel.ir, 2, 3, dtypes, 16))
    # the side input's gradient is checked beside q's, k's and v's
    assert all(set(r.grads) == {"q", "k", "v", "slopes"} for r in results), grad_table(results)
    assert all(r.ok for r in results), grad_table(results)


def test_check_backward_refuses_a_kernel_without_one() -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn", target="triton", schedule="naive")
    with pytest.raises(ValueError, match=r"^no backward for this spec: only the fused prefill"):
        check_backward(kernel, trials=1)


def test_fixed_dims_and_params_reach_the_backward_trials(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = str(EXAMPLES / "sliding_window.attn")
    args = ["check", path, "--backward", "--trials", "1", "--dtypes", "bf16"]
    args += ["--dims", "M=20,N=20,D=16", "--param", "window=5"]
    assert cli.main(args) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert "M=20 N=20 D=16" in row and "window=5" in row and row.endswith("ok")
    assert cli.main(["check", path, "--backward", "--dims", "X=3"]) == 2
    assert "has no dim 'X'" in capsys.readouterr().err
