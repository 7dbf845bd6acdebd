"""Shared pytest set-up."""

import sys
from pathlib import Path

# `make` installs attncc editable; this lets a bare `.venv/bin/pytest` in a fresh checkout import
# it too (pytest puts tests/, not the repository root, on sys.path).
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


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
