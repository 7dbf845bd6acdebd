"""Triton's installation hash, remembered on disk across processes.

The first kernel a process compiles, or loads from Triton's own cache, calls
``triton.runtime.cache.triton_key()``: a SHA-256 of Triton's Python sources and of its
~400 MB ``libtriton.so``. That was 0.35 s of every warm start on an H200 machine
(docs/performance.md), more than all of attncc's own start-up. The value changes only when
those files do, so attncc keeps it under ``<cache>/triton_key/``, keyed by the paths, sizes
and modification times of every file below the directories Triton hashes, and hands Triton
the remembered string: the same value, without reading 400 MB. A changed, added or removed
file changes the key and the hash is computed afresh (by Triton's own function).
``ATTNCC_TRITON_KEY_MEMO=0`` leaves Triton untouched.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import inspect
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attncc.cache import atomic_write, cache_dir, content_key

# below the Triton package: what triton_key() reads. Like the pkgutil.walk_packages it calls,
# only packages are entered and only module files counted: the ~200 headers and binaries
# beside them cost a stat each on every warm start (0.09 s on a fresh machine) and Triton
# never reads them. Still a superset (every module file, and all of _C): an extra file only
# makes the memo recompute more often, never return a stale value.
_HASHED_FILES = ("runtime/cache.py",)
_HASHED_PACKAGES = ("compiler", "backends", "language")
_HASHED_FOLDERS = ("_C",)
_MODULE_SUFFIXES = tuple(importlib.machinery.all_suffixes())
# install() runs on the first module load and on attncc.runtime.triton_warm's thread: one
# memo between them, so the hash is computed (or read) once
_install_lock = threading.Lock()


def _modules(folder: Path, top: bool) -> list[Path]:
    """Module files below ``folder`` that walk_packages finds (it enters packages only)."""
    entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    files = [Path(e.path) for e in entries if e.is_file() and e.name.endswith(_MODULE_SUFFIXES)]
    if not top and not any(inspect.getmodulename(path.name) == "__init__" for path in files):
        return []
    for entry in entries:
        if entry.is_dir() and entry.name != "__pycache__":
            files += _modules(Path(entry.path), top=False)
    return files


def hashed_files(root: Path) -> list[Path]:
    files = [root / name for name in _HASHED_FILES if (root / name).is_file()]
    for name in _HASHED_PACKAGES:
        if (root / name).is_dir():
            files += _modules(root / name, top=True)
    for name in _HASHED_FOLDERS:
        for folder, dirs, names in os.walk(root / name):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [Path(folder) / n for n in sorted(names)]
    return files


def stat_key(root: Path, version: str) -> str:
    parts = [version, str(root)]
    for path in hashed_files(root):
        stat = path.stat()
        parts.append(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}")
    return content_key(*parts)


def remembered(
    original: Callable[[], str], root: Path, version: str, directory: Path
) -> Callable[[], str]:
    """``original`` (Triton's triton_key) memoized in ``directory`` by ``stat_key``."""

    @functools.cache
    def triton_key() -> str:
        try:
            path = directory / f"{stat_key(root, version)}.txt"
        except OSError:  # a file vanished while listing: let Triton hash what is there
            return original()
        try:
            value = path.read_text()
            if value:
                return value
        except OSError:
            pass
        value = original()
        with contextlib.suppress(OSError):  # a read-only cache: correct, only not faster
            atomic_write(path, value)
        return value

    return triton_key


def install() -> None:
    """Give Triton the remembered hash (once per process; a no-op when disabled)."""
    if os.environ.get("ATTNCC_TRITON_KEY_MEMO", "1") == "0":
        return
    import triton
    import triton.runtime.autotuner as autotuner
    import triton.runtime.cache as triton_cache

    with _install_lock:
        if not getattr(triton_cache.triton_key, "attncc_memo", False):
            _install(triton, triton_cache, autotuner)


def _install(triton: Any, triton_cache: Any, autotuner: Any) -> None:
    root = Path(triton_cache.__file__).resolve().parents[1]
    memo = remembered(triton_cache.triton_key, root, triton.__version__, cache_dir() / "triton_key")
    memo.attncc_memo = True  # type: ignore[attr-defined]
    # get_cache_key() reads the module global; the autotuner imported the name itself
    triton_cache.triton_key = memo
    if hasattr(autotuner, "triton_key"):
        autotuner.triton_key = memo
