"""Triton's one-time start-up work on a thread of its own (attncc.runtime.triton_warm): it
runs once, never raises (its steps fail again at the first launch, with Triton's message),
and is off with ATTNCC_TRITON_WARM=0. Its effect on a first call's time is measured on a
GPU (benchmarks/gpu_suite.sh firstcall)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attncc
from attncc.runtime import triton_warm

SCRIPT = (
    "import threading\n"
    "import triton.runtime.cache as c\n"
    "from attncc.runtime import triton_warm\n"
    "triton_warm.start()\n"
    "triton_warm.start()\n"
    "warming = [t for t in threading.enumerate() if t.name == 'attncc-triton-warm']\n"
    "triton_warm.wait()\n"
    "print(len(warming), getattr(c.triton_key, 'attncc_memo', False))\n"
)


def _run(tmp_path: Path, **env: str) -> list[str]:
    environment = {**os.environ, "ATTNCC_CACHE_DIR": str(tmp_path), **env}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=environment, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_work_runs_once_and_never_raises(tmp_path: Path) -> None:
    """Without a GPU Triton's driver cannot start: the thread ends quietly, the hash memo
    installed before that step."""
    assert _run(tmp_path) == ["1", "True"]


def test_the_switch_turns_it_off(tmp_path: Path) -> None:
    assert _run(tmp_path, ATTNCC_TRITON_WARM="0") == ["0", "False"]


def test_a_kernel_compiled_without_a_gpu_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not torch.cuda.is_available()
    monkeypatch.setattr(triton_warm, "_thread", None)  # another test may have started it
    attncc.compile("examples/causal.attn", target="triton")
    attncc.compile("examples/causal.attn")
    assert triton_warm._thread is None
