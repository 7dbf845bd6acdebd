"""A call's Triton kernels compiled side by side before the call launches them.

Triton compiles a kernel when a launch first needs it, so a call that launches several new
kernels waits for their compiles one after another: a Triton backward's first call compiles
two kernels, tuning compiles every candidate. Triton's compile releases the GIL in its
MLIR and LLVM passes and runs ptxas as a process, so compiles on threads overlap (two small
kernels 1.53 s one after the other, 0.85 s on two threads, on this repository's two-core CPU
machine for sm_90a). ``ahead(kernels, calls)`` runs each call with the launches of
``kernels`` turned into compile requests under Triton's ``AsyncCompileMode`` (a thread
pool), launching nothing, and returns when every compile it started has finished: the call
itself then finds its kernels compiled.

A call's pass only allocates, fills fresh allocations and reads tensor metadata (the host
work ahead of a generated module's launches, which ``triton_plan`` records too); any other
torch operation (reading a value, converting a tensor) ends the pass there, and so does an
error: the call compiles what is left as it always did, and raises its own errors.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from attncc.runtime import triton_plan

# compiles a call may run at once: each holds an LLVM module and a ptxas process
MAX_WORKERS = 8

_AHEAD = threading.local()


class _Stop(Exception):
    """A pass met a torch operation it may not run without its launches (the message)."""


class _HostWorkOnly(TorchFunctionMode):
    """Lets a pass allocate, fill and read metadata, and stops it at anything else."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        name = triton_plan.function_name(func)
        if name not in triton_plan.HOST_WORK:
            raise _Stop(name)
        return func(*args, **(kwargs or {}))


def ahead(kernels: Sequence[Any], calls: Sequence[Callable[[], Any]]) -> int:
    """Compile what ``calls`` would launch of ``kernels`` (Triton JIT functions), side by
    side; returns when every compile is done (each kernel then in its JIT cache), with how
    many it started (or found on disk): 0 where every kernel was compiled already."""
    try:
        from triton.runtime import _async_compile
    except ImportError:  # a Triton without asynchronous compiles: each call compiles its own
        return 0
    if not kernels or not calls or _async_compile.active_mode.get() is not None:
        return 0  # a caller's own asynchronous compile mode is active: Triton allows one
    workers = min(MAX_WORKERS, os.cpu_count() or 1)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="attncc-compile")
    # compile errors surface in the calls themselves, where they always did; leaving the
    # mode waits for every compile and puts each kernel in its JIT cache
    mode = _async_compile.AsyncCompileMode(pool, ignore_errors=True)
    with pool, mode, _diverted(kernels):
        for call in calls:
            try:
                with _HostWorkOnly():
                    call()
            except Exception:  # the call proper raises it again, or gets past it
                continue
    return len(getattr(mode, "future_kernels", ()))


class FirstCalls:
    """Which modules' recorded first calls still compile ahead: a module leaves once a pass
    over one of its calls found every kernel compiled (later call geometries, such as a
    decode cache one key longer each step, then need none, and a pass is the module's host
    work again: 100-300 us a call)."""

    def __init__(self) -> None:
        self._done: weakref.WeakSet[Any] = weakref.WeakSet()

    def ahead(self, module: Any, kernels: Sequence[Any], call: Callable[[], Any]) -> None:
        if module in self._done:
            return
        if ahead(kernels, [call]) == 0:
            self._done.add(module)


# the recorded first calls of every generated module (attncc.runtime.triton_plan.record)
FIRST_CALLS = FirstCalls()


@contextmanager
def _diverted(kernels: Sequence[Any]) -> Iterator[None]:
    """``kernels``' launches from this thread compile (Triton's warm-up) and launch nothing;
    other threads' launch as usual."""

    def divert(kernel: Any) -> Callable[..., Any]:
        original = kernel.run  # its own, not yet routed

        def run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            if not getattr(_AHEAD, "diverting", False):
                return original(*args, grid=grid, warmup=warmup, **kwargs)
            with torch._C.DisableTorchFunction():
                return original(*args, grid=grid, warmup=True, **kwargs)

        return run

    with triton_plan.routed_runs(list(kernels), divert):
        _AHEAD.diverting = True
        try:
            yield
        finally:
            _AHEAD.diverting = False
