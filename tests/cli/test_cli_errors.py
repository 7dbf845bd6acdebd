"""Every way a command line can go wrong ends in one clear line and an exit status, never a
traceback: 2 for usage and spec errors, 1 for a check that fails, 3 for a bug in attncc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import attncc
from attncc import cli
from attncc.runtime.kernel import Kernel

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CAUSAL = str(EXAMPLES / "causal.attn")


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(args)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.out, captured.err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    binary = tmp_path / "binary.attn"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    nul = tmp_path / "nul.attn"
    nul.write_bytes(b"attention x\x00\n")
    empty = tmp_path / "empty.attn"
    empty.write_text("")
    bad = tmp_path / "bad.attn"
    bad.write_text(Path(CAUSAL).read_text().replace("mask m >= n", "mask m >= "))
    return {
        "missing": str(tmp_path / "missing.attn"),
        "missing-no-suffix": str(tmp_path / "missing"),
        "directory": str(tmp_path),
        "binary": str(binary),
        "nul": str(nul),
        "empty": str(empty),
        "bad": str(bad),
    }


# (arguments, exit status, what the one line says); FILE:name is a file of the fixture
USAGE_ERRORS = [
    (["compile", "FILE:missing"], "missing.attn: no such file"),
    (["compile", "FILE:missing-no-suffix"], "missing: no such file"),
    (["check", "FILE:missing"], "missing.attn: no such file"),
    (["demo", "FILE:missing"], "missing.attn: no such file"),
    (["bench", "FILE:missing"], "missing.attn: no such file"),
    (["compile", "FILE:directory"], "is a directory, not a spec file"),
    (["check", "FILE:directory"], "is a directory, not a spec file"),
    (["compile", "FILE:binary"], "not a UTF-8 text file (byte 0x89 at offset 0)"),
    (["check", "FILE:binary"], "not a UTF-8 text file"),
    ([], "the following arguments are required: command"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["compile"], "the following arguments are required: spec"),
    (["compile", CAUSAL, "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["compile", CAUSAL, "--target", "nonsense"], "argument --target: invalid choice"),
    (["compile", CAUSAL, "--schedule", "fast"], "argument --schedule: invalid choice"),
    (["compile", CAUSAL, "--print-ir-after", "nope"], "unknown pass 'nope'; passes: "),
    (["check", CAUSAL, "--trials", "-1"], "argument --trials: must be at least 1, got -1"),
    (["check", CAUSAL, "--trials", "0"], "argument --trials: must be at least 1, got 0"),
    (["check", CAUSAL, "--trials", "many"], "argument --trials: expected an integer"),
    (["check", CAUSAL, "--seed", "-3"], "argument --seed: must be at least 0, got -3"),
    (["check", CAUSAL, "--max-len", "0"], "argument --max-len: must be at least 1"),
    (["check", CAUSAL, "--dtypes", "fp8"], "unknown dtype 'fp8'; choose from fp32, fp16, bf16"),
    (["check", CAUSAL, "--dtypes", "nonsense"], "unknown dtype 'nonsense'"),
    (["check", CAUSAL, "--dtypes", ","], "no dtype given"),
    (["check", CAUSAL, "--dims", "garbage"], "expected NAME=SIZE[,NAME=SIZE...], got 'garbage'"),
    (["check", CAUSAL, "--dims", "N=big"], "N: expected an integer, got 'big'"),
    (["check", CAUSAL, "--dims", "N=0"], "N: must be at least 1, got 0"),
    (["check", CAUSAL, "--dims", "N=4,N=5"], "--dims: N given twice (4 and 5)"),
    (["check", CAUSAL, "--dims", "X=4"], "causal has no dim 'X'; its dims are B, H, M, N, D"),
    (["check", CAUSAL, "--param", "garbage"], "expected NAME=VALUE[,NAME=VALUE...]"),
    (["check", CAUSAL, "--param", "scale=high"], "scale: expected a finite number"),
    (["check", CAUSAL, "--param", "scale=nan"], "scale: expected a finite number"),
    (["check", CAUSAL, "--param", "window=4"], "causal has no param 'window'"),
    (["check", CAUSAL, "--target", "nonsense"], "argument --target: invalid choice"),
    (["check", CAUSAL, "--device", "tpu"], "argument --device: invalid choice"),
    (["check", CAUSAL, "--target", "cuda"], "--target cuda runs on CUDA tensors"),
    (
        ["check", str(EXAMPLES / "paged_decode.attn"), "--dims", "N=64"],
        "dim N is derived (N = NP * PAGE); set the dims it is computed from",
    ),
    (
        ["compile", str(EXAMPLES / "naive.attn"), "--target", "cuda"],
        f"{EXAMPLES / 'naive.attn'}: the cuda target has no naive schedule; use --target triton",
    ),
    (
        ["compile", CAUSAL, "--target", "cuda", "--schedule", "naive"],
        f"{CAUSAL}: the cuda target has no naive schedule; use --target triton",
    ),
    (["compile", CAUSAL, "-o", "/no/such/dir/out.py"], "cannot write /no/such/dir/out.py"),
    (["bench", CAUSAL, "--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["bench", CAUSAL, "--shapes", "garbage"], "--shapes: expected B,H,S,D"),
]


@pytest.mark.parametrize(("args", "message"), USAGE_ERRORS, ids=lambda x: str(x)[:60])
def test_usage_errors_are_one_line_and_exit_2(
    args: list[str], message: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = [files[a[5:]] if a.startswith("FILE:") else a for a in args]
    code, _, err = run(args, capsys)
    assert code == 2, err
    assert err.startswith("attncc: error: ") and err.count("\n") == 1, err
    assert message in err


@pytest.mark.parametrize("name", ["nul", "empty", "bad"])
@pytest.mark.parametrize("command", ["compile", "check"])
def test_bad_specs_are_reported_at_their_position(
    name: str, command: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run([command, files[name]], capsys)
    assert code == 2
    assert err.startswith(f"{files[name]}:") and ": error: " in err.splitlines()[0]
    assert "^" in err


def test_the_api_refuses_naive_on_cuda_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from attncc import api

    def no_passes(*args: object, **kwargs: object) -> None:
        raise AssertionError("the passes ran")

    monkeypatch.setattr(api, "optimise", no_passes)
    refused = "schedule 'naive' is not available for target cuda"
    with pytest.raises(ValueError, match=f"attncc naive: {refused}"):
        attncc.compile(EXAMPLES / "naive.attn", target="cuda")
    with pytest.raises(ValueError, match=f"attncc causal: {refused}"):
        api.build(CAUSAL, target="cuda", schedule="naive")


# ----------------------------------------------------------------------------- failing kernels

CHECK_FAST = ["--trials", "3", "--max-len", "16", "--dtypes", "fp32"]


def test_a_kernel_that_raises_is_a_verdict_row_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = []

    def boom(self: Kernel, *args: object, **kwargs: object) -> None:
        calls.append(1)
        raise RuntimeError("boom\nsecond line of the message")

    monkeypatch.setattr(Kernel, "__call__", boom)
    code, out, err = run(["check", CAUSAL, *CHECK_FAST], capsys)
    assert code == 1 and err == ""
    table = out.strip().splitlines()[2:-1]
    assert len(calls) == 3 and len(table) == 3
    assert all(row.endswith("error: RuntimeError: boom") for row in table)
    assert out.rstrip().endswith("0 passed, 3 failed")


def test_a_kernel_with_wrong_results_fails_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    right = Kernel.__call__

    def wrong(self: Kernel, *args: object, **kwargs: object) -> object:
        out, lse = right(self, *args, **kwargs)
        return out * 1.5, lse

    monkeypatch.setattr(Kernel, "__call__", wrong)
    code, out, _ = run(["check", CAUSAL, *CHECK_FAST], capsys)
    assert code == 1
    assert out.rstrip().endswith("0 passed, 3 failed") and "FAIL (" in out


def test_debug_shows_the_failing_kernels_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(self: Kernel, *args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(Kernel, "__call__", boom)
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["check", CAUSAL, *CHECK_FAST, "--debug"])


def test_an_internal_error_is_one_line_with_a_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from attncc import checking

    def bug(*args: object, **kwargs: object) -> None:
        raise KeyError("oops")

    monkeypatch.delenv("ATTNCC_DEBUG", raising=False)
    monkeypatch.setattr(checking, "check", bug)
    code, _, err = run(["check", CAUSAL, *CHECK_FAST], capsys)
    assert code == 3
    assert err.count("\n") == 1
    assert err.startswith("attncc: internal error: KeyError: 'oops'")
    assert "--debug" in err and "ATTNCC_DEBUG=1" in err
    with pytest.raises(KeyError):
        cli.main(["--debug", "check", CAUSAL, *CHECK_FAST])
    monkeypatch.setenv("ATTNCC_DEBUG", "1")
    with pytest.raises(KeyError):
        cli.main(["check", CAUSAL, *CHECK_FAST])


# ----------------------------------------------------------------------------- end to end


def attncc_process(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ATTNCC_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "attncc", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_python_m_attncc_exit_codes() -> None:
    refused = attncc_process("compile", "--target", "cuda", "examples/naive.attn")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == (
        "attncc: error: examples/naive.attn: the cuda target has no naive schedule; "
        "use --target triton\n"
    )
    missing = attncc_process("check", "examples/missing.attn")
    assert (missing.returncode, missing.stderr) == (
        2,
        "attncc: error: examples/missing.attn: no such file\n",
    )
    fp8 = attncc_process("check", "examples/causal.attn", "--dtypes", "fp8")
    assert fp8.returncode == 2 and "Traceback" not in fp8.stderr
    assert fp8.stderr.startswith("attncc: error: argument --dtypes: unknown dtype 'fp8'")


def test_python_m_attncc_check_failure_exits_1(tmp_path: Path) -> None:
    from tests.cli.test_check_draws import PACKED

    spec = tmp_path / "packed.attn"
    spec.write_text(PACKED)
    failed = attncc_process("check", str(spec), "--trials", "2", "--dims", "T=1,N=3")
    assert failed.returncode == 1, failed.stderr
    assert "Traceback" not in failed.stderr
    assert failed.stdout.rstrip().endswith("0 passed, 2 failed")
