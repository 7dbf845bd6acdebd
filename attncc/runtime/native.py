"""attncc's C launcher (launcher.c), built once per machine with the system's C compiler.

A kernel launch issued from Python costs microseconds of CPU in argument handling alone:
ctypes converts each of cuLaunchKernel's eleven arguments, and writing a call's pointers
into the packed parameters takes a Python frame and a ``struct`` call each. On an H200
``driver.Launch`` in Python cost 6.8 us a launch, of which 4.6 us was the ctypes call
itself (benchmarks/call_parts.py). The C object does the same work in one call.

The shared object goes to ``$ATTNCC_CACHE_DIR/native/``, named by a hash of its source, the
Python version and the platform, so it is compiled once (0.2-0.3 s with gcc) and loaded
by later processes in microseconds. The compiler is ``$CC``, else ``cc``, ``gcc`` or
``clang`` (Triton's own launchers need one too). Where none builds it, ``launcher()``
returns None and says why in ``unavailable()``; attncc.runtime.driver then launches through
its Python implementation. ``ATTNCC_NATIVE_LAUNCH=0`` chooses that one on purpose.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from attncc.cache import cache_dir, content_key

_SOURCE = Path(__file__).with_name("launcher.c")
_MODULE = "attncc_launcher"
_why_not: str | None = None


def unavailable() -> str | None:
    """Why the C launcher is not in use (None: it is, or it was not asked for yet)."""
    return _why_not


def enabled() -> bool:
    return os.environ.get("ATTNCC_NATIVE_LAUNCH", "1") != "0"


_lock = threading.Lock()
_state: dict[str, ModuleType | None] = {}  # "module": the outcome, once tried


def launcher() -> ModuleType | None:
    """The built launcher module, or None (``unavailable()`` says why). Builds it on the
    first call (or waits for ``build_in_background``'s build)."""
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" not in _state:
            _state["module"] = _build()
    return _state["module"]


def built() -> ModuleType | None:
    """The launcher module if a build finished and succeeded, else None, never waiting for
    or starting one (for callers with a Python fallback that must not block on a build)."""
    return _state.get("module")


def build_in_background() -> None:
    """Start building the launcher on a thread of its own, if no build was tried yet: the
    compiler (a process of its own) then runs beside a first call's kernel compilation
    instead of before its first launch."""
    if "module" not in _state and enabled():
        threading.Thread(target=launcher, name="attncc-launcher-build", daemon=True).start()


def reset() -> None:
    """Forget the outcome (tests: after changing ATTNCC_NATIVE_LAUNCH)."""
    with _lock:
        _state.clear()


def _build() -> ModuleType | None:
    global _why_not
    if not enabled():
        _why_not = "ATTNCC_NATIVE_LAUNCH=0"
        return None
    try:
        module = _load(_built())
    except (OSError, ImportError, subprocess.SubprocessError, RuntimeError) as error:
        _why_not = f"the C launcher could not be built: {error}"
        return None
    _why_not = None
    return module


def _built() -> Path:
    source = _SOURCE.read_text()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = content_key(source, sys.version, platform.platform(), sysconfig.get_paths()["include"])
    target = cache_dir() / "native" / f"{_MODULE}_{key[:20]}{suffix}"
    if target.exists():
        return target
    compiler = _compiler()
    target.parent.mkdir(parents=True, exist_ok=True)
    # compiled beside the target and renamed: a concurrent process never loads half a file
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        command = [
            compiler, "-O2", "-shared", "-fPIC", "-std=c11",
            f"-I{sysconfig.get_paths()['include']}", str(_SOURCE), "-o", partial,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            raise RuntimeError(f"{compiler} failed: {first}")
        os.replace(partial, target)
    finally:
        Path(partial).unlink(missing_ok=True)
    return target


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise RuntimeError("no C compiler found (set CC, or install cc, gcc or clang)")


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(_MODULE, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
