"""Shared pytest set-up."""

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# `make` installs attncc editable; this lets a bare `.venv/bin/pytest` in a fresh checkout import
# it too (pytest puts tests/, not the repository root, on sys.path).
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Tests name the target they test, and call the Triton one by leaving it out. "auto", the
# default, would send fused prefill to the CUDA target on an sm_90 machine with cuda-python,
# and with it CPU-tensor and Triton-only tests; this makes "auto" mean "triton" for the
# suite (subprocesses included). tests/test_target.py unsets it to test the rule itself;
# ATTNCC_TARGET=auto runs the suite under the rule.
os.environ.setdefault("ATTNCC_TARGET", "triton")


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """GPU tests skip cleanly, with a reason, where no CUDA device is present."""
    import pytest
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run benchmarks/gpu_suite.sh on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Hypothesis profiles: "fast" (default, CI on the CPU interpreter) and "gpu" (many more examples,
# for a machine with a GPU). Pick one with HYPOTHESIS_PROFILE=gpu.
settings.register_profile(
    "fast",
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "gpu",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))
