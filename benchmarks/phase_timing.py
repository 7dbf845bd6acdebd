"""Wall-clock spans of a first call's phases (benchmarks/startup.py ``phases``): attncc's code
generation and module loads, Triton's start-up thread (attncc.runtime.triton_warm) and the
first call's wait for it, the configuration choice, Triton's compile and each of its stages.
Each phase's function is wrapped in place; a span records its name, start, end and thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

Span = tuple[str, float, float, str]


def _timed(name: str, function: Callable[..., Any], spans: list[Span]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            thread = threading.current_thread().name
            spans.append((name, begin, time.perf_counter(), thread))

    return timed


def watch_phases(spans: list[Span]) -> None:
    """Record the phases of every later call into ``spans``."""
    import triton.compiler as triton_compiler
    import triton.compiler.compiler as triton_compiler_module
    from triton.backends.nvidia.compiler import CUDABackend

    import attncc.api as api
    from attncc.runtime import kernel, triton_plan, triton_warm

    compile_ = _timed("triton.compile", triton_compiler_module.compile, spans)
    triton_compiler.compile = triton_compiler_module.compile = compile_  # JITFunction's, lazily
    add_stages = CUDABackend.add_stages

    def timed_stages(self: Any, stages: dict[str, Any], options: Any, language: Any) -> None:
        add_stages(self, stages, options, language)
        for stage in list(stages):
            stages[stage] = _timed(f"stage {stage}", stages[stage], spans)

    CUDABackend.add_stages = timed_stages
    triton_warm._warm = _timed("triton_warm thread", triton_warm._warm, spans)
    triton_warm._driver = _timed("Triton's driver", triton_warm._driver, spans)
    triton_warm.wait = _timed("wait for triton_warm", triton_warm.wait, spans)
    kernel.Kernel._config = _timed("configuration", kernel.Kernel._config, spans)
    kernel.Kernel.module = _timed("module load", kernel.Kernel.module, spans)
    triton_plan.TritonPlan.__init__ = _timed("launch plan", triton_plan.TritonPlan.__init__, spans)
    api.cuda_backend.render = _timed("render CUDA", api.cuda_backend.render, spans)
    api.triton_backend.render = _timed("render Triton", api.triton_backend.render, spans)
