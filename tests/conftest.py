"""Shared pytest set-up."""

import sys
from pathlib import Path

# `make` installs attncc editable; this lets a bare `.venv/bin/pytest` in a fresh checkout import
# it too (pytest puts tests/, not the repository root, on sys.path).
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
