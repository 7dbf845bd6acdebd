"""The on-disk cache: generated modules and tuning results, keyed by content hashes.

Writes are atomic (write a temporary file, then ``os.replace``), so concurrent processes
never see a half-written entry.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """``$ATTNCC_CACHE_DIR`` or ``~/.cache/attncc``."""
    root = os.environ.get("ATTNCC_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "attncc"


def content_key(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def atomic_write(path: Path, text: str) -> None:
    _atomic_write(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    _atomic_write(path, data)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
