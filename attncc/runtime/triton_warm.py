"""Triton's one-time start-up work, begun on threads of its own when a kernel is compiled.

A process's first Triton launch pays for work that has nothing to do with the kernel:
importing Triton (0.45 s), building its CUDA helper module (``driver.active``: a C compiler
run, 0.39 s on an H200 machine with an empty Triton cache), hashing Triton's installation
for its cache key (``triton_key()``: 0.43 s on an empty attncc cache,
attncc.runtime.triton_key) and asking ptxas its version. ``start``, called by
``attncc.compile`` for a kernel that may run Triton (target "triton", or "auto", which hands
Triton the calls its CUDA kernels cannot take), runs all of it beside the code generation,
the C build and the hash side by side (neither holds the GIL: a child process, SHA-256 of
large buffers); ``wait`` joins it before the first launch. Joining first also keeps two
threads from initialising Triton's driver at once, which would build the helper twice.
``ATTNCC_TRITON_WARM=0`` leaves all of it to the first launch.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_thread: threading.Thread | None = None


def enabled() -> bool:
    return os.environ.get("ATTNCC_TRITON_WARM", "1") != "0"


def start() -> None:
    """Begin the work (once per process; a no-op when disabled or already begun)."""
    global _thread
    if not enabled() or _thread is not None:
        return
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_warm, name="attncc-triton-warm", daemon=True)
            _thread.start()


def wait() -> None:
    """Return once the work begun by ``start`` is done (at once if none was begun)."""
    thread = _thread
    if thread is not None and thread.is_alive():
        thread.join()


def _warm() -> None:
    # Every step is one the first launch takes anyway; one that fails here fails there
    # again, with Triton's own message, so nothing is reported from these threads.
    try:
        import triton.runtime.cache as triton_cache

        from attncc.runtime import triton_key

        triton_key.install()
        # the driver's C build beside the hash: each 0.4 s on an empty cache (H200 machine)
        driver = threading.Thread(target=_driver, name="attncc-triton-driver", daemon=True)
        driver.start()
        triton_cache.triton_key()
        driver.join()
    except Exception:  # see above
        pass


def _driver() -> None:
    try:
        from triton.compiler.compiler import make_backend
        from triton.runtime import driver

        make_backend(driver.active.get_current_target()).hash()  # and ptxas --version
    except Exception:  # see _warm
        pass
