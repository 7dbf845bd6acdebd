"""Pick a launch configuration per (GPU, dtype, head dims, length bucket) by timing candidates.

Results live in ``<cache>/tuning/<module>.json`` (the module name carries the content hash of
the generated source: spec IR, options, attncc version, template text), keyed inside by GPU,
Triton version, dtype, head dims and power-of-two length buckets, so a second process reuses
them without tuning. ``ATTNCC_AUTOTUNE=0`` skips tuning and uses the default configuration.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from attncc.cache import atomic_write, cache_dir
from attncc.ir.nodes import AttentionKernel, TileConfig
from attncc.runtime.timing import cold_copies

# prefill tiles, some with K/V tiles as TMA copies (where the layout allows); from
# benchmarks/sweep.py on an H200 (docs/performance.md). 128x128x8x2 with TMA is left out:
# ptxas (CUDA 13.0) crashes on it.
PREFILL_CANDIDATES = (
    TileConfig(64, 64, 4, 3, tma=True),
    TileConfig(128, 128, 8, 3, tma=True),
    TileConfig(128, 64, 8, 4),
    TileConfig(128, 64, 8, 3),
    TileConfig(128, 128, 8, 3),
    TileConfig(64, 64, 4, 3),
    TileConfig(128, 64, 4, 3, tma=True),
    TileConfig(64, 128, 4, 3, tma=True),
)
# split-KV (decode): tile and `waves`, how many times over the key-axis splits fill the GPU
SPLIT_CANDIDATES = (
    (TileConfig(16, 64, 4, 3), 1),
    (TileConfig(16, 64, 4, 4), 1),
    (TileConfig(16, 128, 4, 3), 1),
    (TileConfig(16, 64, 4, 3), 2),
    (TileConfig(16, 128, 4, 2), 1),
    (TileConfig(16, 32, 4, 3), 2),
    (TileConfig(16, 128, 4, 2), 8),
    (TileConfig(16, 64, 4, 3), 8),
)


TUNING_ROUNDS = 2


def enabled() -> bool:
    return os.environ.get("ATTNCC_AUTOTUNE", "1") != "0"


def _as_launch(config: TileConfig, **extra: int) -> dict[str, int]:
    return {
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
        **extra,
    }


def _do_bench(fn: Callable[[], Any], config: dict[str, int]) -> float:
    import triton.testing

    if "waves" in config:  # split-KV calls are launch-bound: time CUDA-graph replays
        return float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=10, rep=25, return_mode="median"))


def _shapes(tensors: dict[str, Any], return_lse: bool) -> tuple[Any, ...]:
    """A call's key in the per-process table: its tensors' shapes and dtypes."""
    return (*((t.shape, t.dtype) for t in tensors.values()), return_lse)


def _bucket(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


class Tuner:
    """Per-kernel tuner; ``config`` is on the launch path, so repeats are one dict lookup."""

    def __init__(
        self,
        kernel: AttentionKernel,
        module_stem: str,
        timer: Callable[[Callable[[], Any], dict[str, int]], float] | None = None,
    ) -> None:
        """``timer(run, config)`` times ``run``, a launch with ``config``, in milliseconds
        (default: Triton's do_bench median)."""
        self.kernel = kernel
        self.timer = timer or _do_bench
        self.path = cache_dir() / "tuning" / f"{module_stem}.json"
        self._by_shapes: dict[tuple[Any, ...], dict[str, int]] = {}
        self.tuned = 0  # how many tunings this process ran (tests and the bench read it)

    def key(self, sizes: dict[str, int], dtype: torch.dtype, device: torch.device) -> str:
        import triton

        k = self.kernel
        rows = sizes[k.query_axis.dim] if k.query_axis is not None else 1
        # programs along the batch axes (batch x heads): with few of them (decode at B=1)
        # the split count and tile that fill the GPU differ from those at B=8
        programs = math.prod(sizes[a.dim] for a in k.batch_axes)
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        return "|".join(
            [
                gpu,
                f"triton {triton.__version__}",
                str(dtype).removeprefix("torch."),
                f"D={sizes[k.head_axis.dim]}",
                f"DV={sizes[k.value_axis.dim]}",
                f"M<={_bucket(rows)}",
                f"N<={_bucket(sizes[k.key_axis.dim])}",
                f"P<={_bucket(programs)}",
            ]
        )

    def _load(self) -> dict[str, dict[str, int]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def config(
        self, module: ModuleType, tensors: dict[str, Any], params: dict[str, Any], return_lse: bool
    ) -> dict[str, int] | None:
        if not enabled():
            return None
        shapes = _shapes(tensors, return_lse)
        found = self._by_shapes.get(shapes)
        if found is not None:
            return found
        sizes, dtype, device = module._check(tensors, params)
        key = self.key(sizes, dtype, device)
        stored = self._load().get(key)
        if stored is None:
            candidates = self.candidates(sizes)
            stored = self._tune(module, tensors, params, return_lse, candidates)
            merged = self._load()
            merged[key] = stored
            atomic_write(self.path, json.dumps(merged, indent=1, sort_keys=True))
        self._by_shapes[shapes] = stored
        return stored

    def chosen(self, tensors: dict[str, Any], return_lse: bool) -> dict[str, int] | None:
        """The configuration calls of these shapes ran with in this process (None: the
        default, or no such call yet); looks up, never tunes."""
        return self._by_shapes.get(_shapes(tensors, return_lse)) if enabled() else None

    def candidates(self, sizes: dict[str, int]) -> list[dict[str, int]]:
        """The launch configurations tuning tries for calls of these sizes."""
        rows = sizes[self.kernel.query_axis.dim] if self.kernel.query_axis else 1
        if self.kernel.schedule == "split_kv" or rows <= self.kernel.split_max_queries:
            return [_as_launch(tile, waves=waves) for tile, waves in SPLIT_CANDIDATES]
        return [_as_launch(tile, tma=int(tile.tma)) for tile in PREFILL_CANDIDATES]

    def warm(
        self, module: ModuleType, tensors: dict[str, Any], params: dict[str, Any], return_lse: bool
    ) -> int:
        """Launch every candidate once, untimed: their compiles land in Triton's disk cache,
        so a later tuning (another process) only times them. Returns how many ran."""
        sizes = module._check(tensors, params)[0]
        ran = 0
        for launch in self.candidates(sizes):
            try:
                module._forward(tensors, params, return_lse, launch)
                ran += 1
            except Exception:  # tuning skips a configuration this GPU cannot run, too
                continue
        return ran

    def _tune(
        self,
        module: ModuleType,
        tensors: dict[str, Any],
        params: dict[str, Any],
        return_lse: bool,
        candidates: list[dict[str, int]],
    ) -> dict[str, int]:
        self.tuned += 1
        # split-KV calls read a cache that may fit in L2: time a rotation over copies
        split = "waves" in candidates[0]
        on_gpu = all(getattr(t, "is_cuda", False) for t in tensors.values())
        copies = cold_copies(tensors) if split and on_gpu else [tensors]
        # Every candidate is timed in TUNING_ROUNDS rounds and keeps its best time: in the
        # first round the GPU's clocks are still rising, which once made the first candidate
        # (the best tile, in a sweep) lose to slower ones by 10%.
        best_ms: dict[int, float] = {}
        failed: set[int] = set()
        for _ in range(TUNING_ROUNDS):
            for i, launch in enumerate(candidates):
                if i in failed:
                    continue

                def run(launch: dict[str, int] = launch) -> None:
                    for c in copies:
                        module._forward(c, params, return_lse, launch)

                try:
                    ms = self.timer(run, launch) / len(copies)
                except Exception:  # a configuration this GPU cannot run (shared memory): skip it
                    failed.add(i)
                    continue
                best_ms[i] = min(best_ms.get(i, math.inf), float(ms))
        if not best_ms:
            raise RuntimeError(f"attncc: no launch configuration of '{self.kernel.name}' ran")
        return candidates[min(best_ms, key=lambda i: (best_ms[i], i))]
