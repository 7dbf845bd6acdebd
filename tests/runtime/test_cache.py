"""The on-disk cache: stable keys, atomic writes, and tuning results reused across processes.

Tuning needs timings, not a GPU: the tests give the tuner a fake timer and CPU tensors, so
every path but the real do_bench runs here.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import attncc
from attncc.cache import atomic_write, content_key
from attncc.runtime import heuristics
from attncc.runtime.autotune import (
    FP32_PREFILL_CANDIDATES,
    PREFILL_CANDIDATES,
    TUNING_ROUNDS,
    Tuner,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATTNCC_CACHE_DIR", str(tmp_path))
    # calls tune inline only when asked to; these tests are about that tuning
    monkeypatch.setenv("ATTNCC_AUTOTUNE", "1")
    return tmp_path


def test_content_key_is_stable_and_separates_parts() -> None:
    assert content_key("a", "b") == content_key("a", "b")
    assert content_key("a", "b") != content_key("ab", "")  # parts are delimited
    assert content_key("a") != content_key("b")


def test_module_file_is_keyed_by_the_generated_source(private_cache: Path) -> None:
    first = attncc.compile(EXAMPLES / "causal.attn")
    again = attncc.compile(EXAMPLES / "causal.attn")
    other = attncc.compile(EXAMPLES / "causal.attn", block_n=32)  # other options, other source
    assert first.path == again.path and first.path.parent.parent == private_cache
    assert other.path != first.path
    assert first.path.read_text() == first.source


def test_the_key_is_the_same_in_a_new_process() -> None:
    code = "import attncc; print(attncc.compile(attncc.load(r'%s')).path.name)" % (
        EXAMPLES / "gqa_causal.attn"
    )
    names = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(names) == 1 and names.pop() == attncc.compile(EXAMPLES / "gqa_causal.attn").path.name


def _writer(path: str, worker: int) -> None:
    for i in range(40):
        atomic_write(Path(path), json.dumps({"worker": worker, "i": i, "pad": "x" * 5000}))


def test_concurrent_atomic_writes_never_leave_a_torn_file(private_cache: Path) -> None:
    target = private_cache / "tuning" / "shared.json"
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_writer, args=(str(target), w)) for w in range(3)]
    for w in workers:
        w.start()
    seen = 0
    while any(w.is_alive() for w in workers):
        if target.exists():
            json.loads(target.read_text())  # every read sees one whole write
            seen += 1
    for w in workers:
        w.join()
        assert w.exitcode == 0
    assert json.loads(target.read_text())["i"] == 39
    assert [p.name for p in target.parent.iterdir()] == ["shared.json"]  # no temporaries left


class FakeTimer:
    """Times configurations by a fixed preference, counting how often it is asked."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fn: Any, config: dict[str, int]) -> float:
        self.calls += 1
        return 1.0 if config["BLOCK_N"] == 128 and config["num_warps"] == 8 else 2.0


# the inputs below are float32: tuning tries its narrow tiles too
FP32_CANDIDATES = len(PREFILL_CANDIDATES) + len(FP32_PREFILL_CANDIDATES)


def _inputs(length: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(length)
    q = torch.randn(1, 2, length, 32, generator=gen)
    return {"q": q, "k": torch.randn(1, 2, length, 32, generator=gen), "v": q.clone()}


def test_tuning_runs_once_and_a_new_process_reuses_it() -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    module = kernel.module(interpreted=True)
    timer = FakeTimer()
    tuner = Tuner(kernel.ir, kernel.path.stem, timer)
    assert tuner.chosen(_inputs(40), False) is None  # nothing ran yet: the default
    chosen = tuner.config(module, _inputs(40), {}, False)
    timed = timer.calls
    assert tuner.chosen(_inputs(40), False) == chosen and timer.calls == timed  # a lookup
    assert timer.calls == TUNING_ROUNDS * FP32_CANDIDATES and tuner.tuned == 1
    assert chosen == {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "tma": 1}
    assert tuner.config(module, _inputs(40), {}, False) == chosen  # same shapes: a lookup
    assert tuner.config(module, _inputs(50), {}, False) == chosen  # same length bucket
    assert tuner.tuned == 1 and timer.calls == TUNING_ROUNDS * FP32_CANDIDATES
    # a new process (a fresh tuner) finds the result on disk and does not tune
    fresh_timer = FakeTimer()
    fresh = Tuner(kernel.ir, kernel.path.stem, fresh_timer)
    assert fresh.config(module, _inputs(40), {}, False) == chosen
    assert fresh.tuned == 0 and fresh_timer.calls == 0
    stored = json.loads(tuner.path.read_text())
    (key,) = stored
    assert all(part in key for part in ("float32", "D=32", "M<=64", "N<=64", "P<=2"))


def test_another_length_bucket_tunes_again() -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    module = kernel.module(interpreted=True)
    tuner = Tuner(kernel.ir, kernel.path.stem, FakeTimer())
    tuner.config(module, _inputs(40), {}, False)
    tuner.config(module, _inputs(100), {}, False)
    assert tuner.tuned == 2 and len(json.loads(tuner.path.read_text())) == 2


def test_another_batch_bucket_tunes_again() -> None:
    # decode at B=1 and at B=8 fill the GPU with different split counts: tuned apart
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    module = kernel.module(interpreted=True)
    tuner = Tuner(kernel.ir, kernel.path.stem, FakeTimer())
    tuner.config(module, _inputs(40), {}, False)
    wider = {name: torch.cat([t] * 4) for name, t in _inputs(40).items()}
    tuner.config(module, wider, {}, False)
    assert tuner.tuned == 2 and len(json.loads(tuner.path.read_text())) == 2


def test_each_candidate_keeps_its_best_round() -> None:
    # the first round runs while the GPU's clocks rise: a candidate slow only then still wins
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    seen: list[int] = []

    def timer(fn: Any, config: dict[str, int]) -> float:
        first_candidate = config == tuner.candidates({"M": 40, "N": 40, "D": 32})[0]
        seen.append(int(first_candidate))
        if first_candidate:
            return 3.0 if seen.count(1) == 1 else 0.5  # slow in round one, fastest in two
        return 1.0

    tuner = Tuner(kernel.ir, kernel.path.stem, timer)
    chosen = tuner.config(kernel.module(True), _inputs(40), {}, False)
    assert chosen == tuner.candidates({"M": 40, "N": 40, "D": 32})[0]
    assert sum(seen) == TUNING_ROUNDS


def test_float32_prefill_also_tries_narrow_tiles() -> None:
    tuner = Tuner(attncc.compile(EXAMPLES / "causal.attn").ir, "causal", FakeTimer())
    sizes = {"B": 1, "H": 2, "M": 40, "N": 40, "D": 32}
    half = tuner.candidates(sizes, torch.float16)
    single = tuner.candidates(sizes, torch.float32)
    assert single[: len(half)] == half and len(single) == len(half) + 2
    assert {(c["BLOCK_M"], c["BLOCK_N"]) for c in single[len(half) :]} == {(32, 64), (32, 32)}
    decode = Tuner(attncc.compile(EXAMPLES / "decode.attn").ir, "decode", FakeTimer())
    one_query = {dim: 16 for dim in decode.kernel.dims}
    assert decode.candidates(one_query, torch.float32) == decode.candidates(one_query)


def test_configurations_that_fail_are_skipped() -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn")

    def timer(fn: Any, config: dict[str, int]) -> float:
        if config["BLOCK_M"] == 128:
            raise RuntimeError("out of resource: shared memory")
        return 1.0

    tuner = Tuner(kernel.ir, kernel.path.stem, timer)
    assert tuner.config(kernel.module(True), _inputs(40), {}, False)["BLOCK_M"] == 64


@pytest.mark.parametrize("setting", ["0", None])
def test_without_autotune_1_calls_take_the_table_and_write_nothing(
    monkeypatch: pytest.MonkeyPatch, setting: str | None
) -> None:
    if setting is None:
        monkeypatch.delenv("ATTNCC_AUTOTUNE")
    else:
        monkeypatch.setenv("ATTNCC_AUTOTUNE", setting)
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    timer = FakeTimer()
    tuner = Tuner(kernel.ir, kernel.path.stem, timer)
    module = kernel.module(True)
    table = heuristics.config_for(
        kernel.ir, {"B": 1, "H": 2, "M": 40, "N": 40, "D": 32}, torch.float32, torch.device("cpu")
    )
    assert tuner.config(module, _inputs(40), {}, False) == table
    assert timer.calls == 0 and tuner.tuned == 0 and not tuner.path.exists()


class RecordingModule:
    """A generated module whose launches are recorded, not run; 128-row tiles fail."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.launches: list[dict[str, int]] = []

    def _check(self, tensors: Any, params: Any) -> Any:
        return self.module._check(tensors, params)

    def _forward(self, tensors: Any, params: Any, return_lse: bool, launch: Any) -> None:
        if launch["BLOCK_M"] == 128:
            raise RuntimeError("out of resource: shared memory")
        self.launches.append(launch)


def test_warming_launches_every_candidate_once_and_times_nothing() -> None:
    # `attncc bench --warm` (benchmarks/matrix.py) fills Triton's disk cache this way in
    # parallel processes; the tuning that follows only times
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    timer = FakeTimer()
    tuner = Tuner(kernel.ir, kernel.path.stem, timer)
    module = RecordingModule(kernel.module(interpreted=True))
    ran = tuner.warm(module, _inputs(40), {}, False)  # type: ignore[arg-type]
    sizes = {"M": 40, "N": 40, "B": 1, "H": 2, "D": 32}
    expected = tuner.candidates(sizes, torch.float32)
    assert len(expected) == FP32_CANDIDATES
    assert module.launches == [c for c in expected if c["BLOCK_M"] != 128]
    assert ran == len(module.launches) > 0
    assert timer.calls == 0 and tuner.tuned == 0 and not tuner.path.exists()
