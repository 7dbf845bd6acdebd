"""``attncc tune``: its tuning loop on CPU tensors with a fake timer, the cache entry it writes,
and which later calls read it (and which do not)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

import attncc
from attncc.bench import Shape
from attncc.cli import main
from attncc.runtime import autotune, heuristics
from attncc.runtime.autotune import (
    FP32_PREFILL_CANDIDATES,
    PREFILL_CANDIDATES,
    TUNING_ROUNDS,
    tune_shapes,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CAUSAL = EXAMPLES / "causal.attn"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATTNCC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ATTNCC_AUTOTUNE", raising=False)  # the default: never tune inline
    return tmp_path


def _prefers_wide(fn: Any, config: dict[str, int]) -> float:
    """A fake timer: 128x128 with 8 warps wins (not the table's pick for any CPU key)."""
    return 1.0 if config["BLOCK_N"] == 128 and config["num_warps"] == 8 else 2.0


def _cpu_inputs(dtype: torch.dtype = torch.float32) -> Any:
    def make(sizes: dict[str, int]) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        shape = [sizes[d] for d in ("B", "H", "M", "D")]
        return {n: torch.randn(shape, generator=gen).to(dtype) for n in ("q", "k", "v")}

    return make


def _args(b: int, h: int, s: int, d: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(b, h, s, d, generator=gen).to(dtype) for _ in range(3)]


def test_tune_writes_the_entry_later_calls_read() -> None:
    kernel = attncc.compile(CAUSAL)
    bar = io.StringIO()
    picks = tune_shapes(
        kernel, [Shape.parse("1,2,40,32")], torch.float32, _cpu_inputs(), _prefers_wide, bar
    )
    ((shape, key, best),) = picks
    assert shape == "B=1 H=2 S=40 D=32" and best["BLOCK_N"] == 128 and best["num_warps"] == 8
    assert key.startswith("cpu|triton ") and "float32" in key and "D=32" in key
    # the bar: one line, rewritten per candidate, ending at the pick
    total = TUNING_ROUNDS * (len(PREFILL_CANDIDATES) + len(FP32_PREFILL_CANDIDATES))  # float32
    assert bar.getvalue().count("\r") == total + 1 and bar.getvalue().endswith("\n")
    assert f"tuning B=1 H=2 S=40 D=32 {total}/{total} [{'=' * 20}] 128x128/w8/s3" in bar.getvalue()

    later = attncc.compile(CAUSAL)  # a new Kernel: what a new process sees
    q, k, v = _args(1, 2, 50, 32)  # another length of the same bucket
    assert later.launch_config(q, k, v) == best
    out = later(q, k, v)  # runs with the tuned tile, and right
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)
    assert later.tuner.sources["table"] == 0 and later.tuner.tuned == 0  # read, never timed


@pytest.mark.parametrize(
    "change", ["dtype", "head dim", "length bucket", "device name", "triton version"]
)
def test_a_changed_key_never_reuses_a_tuned_entry(
    change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = attncc.compile(CAUSAL)
    tune_shapes(kernel, [Shape.parse("1,2,40,32")], torch.float32, _cpu_inputs(), _prefers_wide)
    args = {
        "dtype": _args(1, 2, 40, 32, torch.float16),
        "head dim": _args(1, 2, 40, 64),
        "length bucket": _args(1, 2, 100, 32),
    }.get(change, _args(1, 2, 40, 32))
    if change == "device name":
        monkeypatch.setattr(autotune, "gpu_name", lambda device: "NVIDIA H200")
    if change == "triton version":
        monkeypatch.setattr(autotune, "triton_version", lambda: "9.9.9")
    later = attncc.compile(CAUSAL)
    tensors = dict(zip(later.input_names, args, strict=True))
    sizes, dtype, device = later.module(True)._check(tensors, {})
    assert later.launch_config(*args) == heuristics.config_for(later.ir, sizes, dtype, device)
    assert later.tuner.sources == {"tuned": 0, "table": 1}


def test_autotune_0_ignores_tuned_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = attncc.compile(CAUSAL)
    tune_shapes(kernel, [Shape.parse("1,2,40,32")], torch.float32, _cpu_inputs(), _prefers_wide)
    monkeypatch.setenv("ATTNCC_AUTOTUNE", "0")
    later = attncc.compile(CAUSAL)
    assert later.launch_config(*_args(1, 2, 40, 32))["num_warps"] == 4  # the table's


def test_the_cli_needs_a_gpu_and_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["tune", str(CAUSAL), "--shapes", "1,2,64,32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "attncc: error: attncc tune times kernels on a CUDA GPU, and none is visible here"
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shapes", "1,2,64"], "--shapes: expected B,H,S,D"),
        (["--shapes", "1,2,64,32", "--target", "cuda"], "nothing to tune"),
        (["--shapes", ";"], "no shape given"),
    ],
)
def test_the_cli_refuses_bad_arguments_before_the_gpu(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", str(CAUSAL), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_the_tuning_file_is_read_again_only_once_it_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every new call geometry looks its tuned entry up (a decode call over a cache growing a
    token a call: one each call); the file is parsed again only after it changed, as when
    another process tuned, and the record of chosen configurations keeps the latest shapes."""
    kernel = attncc.compile(CAUSAL)
    tune_shapes(kernel, [Shape.parse("1,2,40,32")], torch.float32, _cpu_inputs(), _prefers_wide)
    later = attncc.compile(CAUSAL)
    reads: list[Path] = []
    read_text = Path.read_text

    def counted(path: Path, *args: Any, **kwargs: Any) -> str:
        reads.append(path)
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    for length in range(33, 64):  # one bucket: the tuned pick each time
        assert later.launch_config(*_args(1, 2, length, 32))["BLOCK_N"] == 128
    assert reads == [later.tuner.path]
    other = attncc.compile(CAUSAL)  # another process's tuning of another bucket
    tune_shapes(other, [Shape.parse("1,2,100,32")], torch.float32, _cpu_inputs(), _prefers_wide)
    reads.clear()
    assert later.launch_config(*_args(1, 2, 100, 32))["BLOCK_N"] == 128
    assert later.launch_config(*_args(1, 2, 101, 32))["BLOCK_N"] == 128
    assert reads == [later.tuner.path]
    assert later.tuner.sources == {"tuned": 33, "table": 0}
    monkeypatch.setattr(autotune, "_CHOSEN_KEPT", 4)
    for length in range(33, 41):
        later.launch_config(*_args(1, 2, length, 32))
    assert len(later.tuner._by_shapes) == 4


def test_a_growing_cache_chooses_its_configuration_once_a_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decode cache growing a token a call is a new geometry each call: the configuration
    is chosen once a power-of-two bucket of key lengths (what tuned entries are keyed by),
    and a tuning written since is taken at the next new length."""
    kernel = attncc.compile(EXAMPLES / "decode.attn")
    looked_up: list[int] = []
    config_for = heuristics.config_for

    def counted(ir: Any, sizes: dict[str, int], *rest: Any) -> dict[str, Any]:
        looked_up.append(sizes["N"])
        return config_for(ir, sizes, *rest)

    monkeypatch.setattr(heuristics, "config_for", counted)
    q = torch.randn(1, 4, 32)

    def config(n: int) -> dict[str, int]:
        k = torch.randn(1, n, 2, 32)
        return kernel.launch_config(q, k, k, torch.full((1,), n, dtype=torch.int32))

    chosen = [config(n) for n in range(33, 65)]
    assert looked_up == [33] and all(c == chosen[0] for c in chosen)
    assert kernel.tuner.sources == {"tuned": 0, "table": 32}
    config(65)  # the next bucket
    assert looked_up == [33, 65]
    entry = {**chosen[0], "BLOCK_N": 2 * chosen[0]["BLOCK_N"]}
    sizes, dtype, device = kernel._host._check(
        {"q": q, "k": torch.randn(1, 40, 2, 32), "v": torch.randn(1, 40, 2, 32),
         "cache_len": torch.full((1,), 40, dtype=torch.int32)}, {}
    )  # fmt: skip
    kernel.tuner._store(kernel.tuner.key(sizes, dtype, device), entry)
    assert config(41) == entry
