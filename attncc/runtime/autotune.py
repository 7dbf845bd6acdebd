"""Launch configurations of Triton calls: tuned entries from disk, else the heuristic table.

A call never tunes by default. Its configuration is (a) the entry ``attncc tune`` wrote for
its (GPU, Triton version, dtype, head dims, length buckets), else (b) the checked-in table of
``attncc.runtime.heuristics``. ``ATTNCC_AUTOTUNE=1`` tunes inline on a GPU call with no tuned
entry (and stores it); ``ATTNCC_AUTOTUNE=0`` takes the table only, ignoring tuned entries
(reproducible runs: the GPU test suite).

Tuned entries live in ``<cache>/tuning/<module>.json`` (the module name carries the content
hash of the generated source: spec IR, options, attncc version, template text), keyed inside
by GPU, Triton version, dtype, head dims and power-of-two length buckets.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, TextIO

import torch

from attncc.cache import atomic_write, cache_dir
from attncc.ir.nodes import AttentionKernel, TileConfig
from attncc.runtime import compile_ahead, heuristics, triton_plan
from attncc.runtime.length_family import bucket
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
# float32 prefill tries these too: its best tiles are narrower (32 query rows) than the
# 16-bit ones (H200, `heuristic_check.py --graphed --dtype fp32`; attncc.runtime.heuristics)
FP32_PREFILL_CANDIDATES = (
    TileConfig(32, 64, 4, 3),
    TileConfig(32, 32, 4, 3),
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

Timer = Callable[[Callable[[], Any], dict[str, int]], float]
# progress(done, total, config): called before each candidate is timed (attncc tune's bar)
Progress = Callable[[int, int, dict[str, int]], None]


def mode() -> str:
    """``ATTNCC_AUTOTUNE``: "tune" (1: tune inline on a miss), "table" (0: the heuristic table
    only) or "cached" (unset, the default: tuned entries, else the table)."""
    value = os.environ.get("ATTNCC_AUTOTUNE", "")
    return {"1": "tune", "0": "table"}.get(value, "cached")


def enabled() -> bool:
    """Whether calls may tune inline (``ATTNCC_AUTOTUNE=1``)."""
    return mode() == "tune"


def _as_launch(config: TileConfig, **extra: int) -> dict[str, int]:
    return {
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
        **extra,
    }


def describe(config: dict[str, int]) -> str:
    """A configuration in one word: ``128x64/w8/s3[/tma][/x2]`` (x: waves)."""
    text = f"{config['BLOCK_M']}x{config['BLOCK_N']}/w{config['num_warps']}/s{config['num_stages']}"
    if config.get("tma"):
        text += "/tma"
    if "waves" in config:
        text += f"/x{config['waves']}"
    return text


def _do_bench(fn: Callable[[], Any], config: dict[str, int]) -> float:
    import triton.testing

    if "waves" in config:  # split-KV calls are launch-bound: time CUDA-graph replays
        return float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=10, rep=25, return_mode="median"))


def _shapes(tensors: dict[str, Any], return_lse: bool) -> tuple[Any, ...]:
    """A call's key in the record of chosen configurations: its tensors' shapes and dtypes."""
    return (*((t.shape, t.dtype) for t in tensors.values()), return_lse)


# the shapes whose chosen configuration ``Tuner.chosen`` answers for: the latest ones
_CHOSEN_KEPT = 256


def gpu_name(device: torch.device) -> str:
    """The device's name in tuning keys (tests replace it to stand in for a GPU)."""
    if device.type != "cuda":
        return device.type
    return _cuda_name(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_name(index: int) -> str:
    # asked once a device: torch's get_device_name reads every property of the device
    # (15 of a new call geometry's 146 us of profiled CPU, H200:
    # benchmarks/growing_cache.py --profile)
    return torch.cuda.get_device_name(index)


def triton_version() -> str:
    import triton

    return str(triton.__version__)


class Tuner:
    """Per-kernel configuration choice: tuned entries from disk, the heuristic table, or (on
    request) tuning. The kernel caches the choice per call geometry, so this runs once each."""

    def __init__(
        self, kernel: AttentionKernel, module_stem: str, timer: Timer | None = None
    ) -> None:
        """``timer(run, config)`` times ``run``, a launch with ``config``, in milliseconds
        (default: Triton's do_bench median)."""
        self.kernel = kernel
        self.timer = timer or _do_bench
        # Triton's do_bench needs a GPU; an injected timer (tests) times CPU calls too
        self._injected = timer is not None
        self.path = cache_dir() / "tuning" / f"{module_stem}.json"
        self._by_shapes: dict[tuple[Any, ...], dict[str, int]] = {}
        # choose's answers (and where each came from) by _memo_key
        self._made: dict[tuple[Any, ...], tuple[str, dict[str, int]]] = {}
        # the tuning file's entries as last read, with the (mtime, size) they were read at
        self._loaded: tuple[tuple[int, int], dict[str, dict[str, int]]] | None = None
        self.tuned = 0  # how many tunings this process ran (tests and the bench read it)
        self.sources: dict[str, int] = {"tuned": 0, "table": 0}  # where choices came from

    def key(self, sizes: dict[str, int], dtype: torch.dtype, device: torch.device) -> str:
        k = self.kernel
        rows = sizes[k.query_axis.dim] if k.query_axis is not None else 1
        # programs along the batch axes (batch x heads): with few of them (decode at B=1)
        # the split count and tile that fill the GPU differ from those at B=8
        programs = math.prod(sizes[a.dim] for a in k.batch_axes)
        return "|".join(
            [
                gpu_name(device),
                f"triton {triton_version()}",
                str(dtype).removeprefix("torch."),
                f"D={sizes[k.head_axis.dim]}",
                f"DV={sizes[k.value_axis.dim]}",
                f"M<={bucket(rows)}",
                f"N<={bucket(sizes[k.key_axis.dim])}",
                f"P<={bucket(programs)}",
            ]
        )

    def _load(self) -> dict[str, dict[str, int]]:
        """The tuning file's entries, read again only where the file changed since: each new
        call geometry looks them up, and reading and parsing the file took 58 us of a decode
        call whose cache grows a token a call (H200, benchmarks/growing_cache.py)."""
        stamp = self._stamp()
        if stamp is None:
            return {}
        if self._loaded is not None and self._loaded[0] == stamp:
            return self._loaded[1]
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        entries = data if isinstance(data, dict) else {}
        self._loaded = (stamp, entries)
        return entries

    def _store(self, key: str, config: dict[str, int]) -> None:
        merged = dict(self._load())
        merged[key] = config
        atomic_write(self.path, json.dumps(merged, indent=1, sort_keys=True))

    def choose(
        self,
        module: ModuleType,
        tensors: dict[str, Any],
        params: dict[str, Any],
        return_lse: bool,
        checked: tuple[dict[str, int], torch.dtype, torch.device],
    ) -> dict[str, int]:
        """The configuration for a call of this geometry (``checked``: ``module._check``'s
        sizes, dtype and device): see the module's docstring for the order."""
        sizes, dtype, device = checked
        how = mode()
        memo = self._memo_key(how, sizes, dtype, device)
        remembered = self._made.get(memo)
        if remembered is not None:
            self.sources[remembered[0]] += 1
            self._remember_shapes(tensors, return_lse, remembered[1])
            return remembered[1]
        found: dict[str, int] | None = None
        if how != "table":
            key = self.key(sizes, dtype, device)
            stored = self._load().get(key)
            if isinstance(stored, dict):
                found = stored
            elif how == "tune" and (device.type == "cuda" or self._injected):
                found = self._tune(
                    module, tensors, params, return_lse, self.candidates(sizes, dtype)
                )
                self._store(key, found)
        source = "tuned" if found is not None else "table"
        if found is None:
            found = heuristics.config_for(self.kernel, sizes, dtype, device)
        self.sources[source] += 1
        if how != "tune":  # (a tuning stored its entry: the file's stamp changed)
            self._made[memo] = (source, found)
            while len(self._made) > _CHOSEN_KEPT:
                del self._made[next(iter(self._made))]
        self._remember_shapes(tensors, return_lse, found)
        return found

    def _memo_key(
        self, how: str, sizes: dict[str, int], dtype: torch.dtype, device: torch.device
    ) -> tuple[Any, ...]:
        """What ``choose``'s answer depends on: the mode, the tuning file as it stands, the
        dtype, the GPU, and the sizes with the key length's power-of-two bucket for the key
        length (tuned entries are keyed by it, the table's length buckets are powers of two).
        A cache that grows a token a call keeps one answer a bucket: choosing took 17 us of
        CPU a new length (this repository's CPU machine)."""
        keys = self.kernel.key_axis.dim
        shape = tuple(bucket(n) if d == keys else n for d, n in sizes.items())
        return (how, self._stamp(), dtype, device, gpu_name(device), shape)

    def _stamp(self) -> tuple[int, int] | None:
        """The tuning file's (mtime, size), None where there is none."""
        try:
            status = self.path.stat()
        except OSError:
            return None
        return status.st_mtime_ns, status.st_size

    def _remember_shapes(
        self, tensors: dict[str, Any], return_lse: bool, found: dict[str, int]
    ) -> None:
        chosen = self._by_shapes
        chosen[_shapes(tensors, return_lse)] = found
        while len(chosen) > _CHOSEN_KEPT:  # a cache growing a token a call: a shape each
            del chosen[next(iter(chosen))]

    def config(
        self, module: ModuleType, tensors: dict[str, Any], params: dict[str, Any], return_lse: bool
    ) -> dict[str, int]:
        """``choose`` for a call not yet checked (benchmarks, tests)."""
        return self.choose(module, tensors, params, return_lse, module._check(tensors, params))

    def chosen(self, tensors: dict[str, Any], return_lse: bool) -> dict[str, int] | None:
        """The configuration the last call of these shapes ran with in this process (None: no
        such call yet, or a pinned tiling); looks up, never tunes."""
        return self._by_shapes.get(_shapes(tensors, return_lse))

    def candidates(
        self, sizes: dict[str, int], dtype: torch.dtype | None = None
    ) -> list[dict[str, int]]:
        """The launch configurations tuning tries for calls of these sizes and dtype."""
        if heuristics.splits(self.kernel, sizes):
            return [_as_launch(tile, waves=waves) for tile, waves in SPLIT_CANDIDATES]
        tiles = [*PREFILL_CANDIDATES, *(FP32_PREFILL_CANDIDATES if dtype == torch.float32 else ())]
        return [_as_launch(tile, tma=int(tile.tma)) for tile in tiles]

    def tune(
        self,
        module: ModuleType,
        tensors: dict[str, Any],
        params: dict[str, Any],
        progress: Progress | None = None,
    ) -> tuple[str, dict[str, int]]:
        """Tune a call of these inputs and store the pick (``attncc tune``); returns the
        tuning key and the pick. Always times, even where an entry exists."""
        sizes, dtype, device = module._check(tensors, params)
        key = self.key(sizes, dtype, device)
        best = self._tune(module, tensors, params, False, self.candidates(sizes, dtype), progress)
        self._store(key, best)
        return key, best

    def warm(
        self, module: ModuleType, tensors: dict[str, Any], params: dict[str, Any], return_lse: bool
    ) -> int:
        """Launch every candidate once, untimed: their compiles land in Triton's disk cache,
        so a later tuning (another process) only times them. Returns how many ran."""
        sizes, dtype, _ = module._check(tensors, params)
        candidates = self.candidates(sizes, dtype)
        _compile_ahead(module, tensors, params, return_lse, candidates)
        ran = 0
        for launch in candidates:
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
        progress: Progress | None = None,
    ) -> dict[str, int]:
        self.tuned += 1
        # split-KV calls read a cache that may fit in L2: time a rotation over copies
        split = "waves" in candidates[0]
        on_gpu = all(getattr(t, "is_cuda", False) for t in tensors.values())
        copies = cold_copies(tensors) if split and on_gpu else [tensors]
        total = TUNING_ROUNDS * len(candidates)
        if on_gpu:
            if progress is not None:  # the bar stands while every candidate compiles
                progress(0, total, candidates[0])
            _compile_ahead(module, tensors, params, return_lse, candidates)
        # Every candidate is timed in TUNING_ROUNDS rounds and keeps its best time: in the
        # first round the GPU's clocks are still rising, which once made the first candidate
        # (the best tile, in a sweep) lose to slower ones by 10%.
        best_ms: dict[int, float] = {}
        failed: set[int] = set()
        for round_ in range(TUNING_ROUNDS):
            for i, launch in enumerate(candidates):
                if progress is not None:
                    progress(round_ * len(candidates) + i, total, launch)
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
        best = candidates[min(best_ms, key=lambda i: (best_ms[i], i))]
        if progress is not None:
            progress(total, total, best)
        return best


def _compile_ahead(
    module: ModuleType,
    tensors: dict[str, Any],
    params: dict[str, Any],
    return_lse: bool,
    candidates: list[dict[str, int]],
) -> None:
    """Every candidate's kernels compiled side by side (GPU tensors), before the candidates
    run one by one: compiled one after another they were most of a tuning's time (a cold
    first call of gqa_causal 1,8:2,256,128 bf16 tuned inline in 11.7-12.6 s, side by side
    4.4-4.7 s; H200 machine with 16 CPU cores, docs/performance.md)."""
    if not all(getattr(t, "is_cuda", False) for t in tensors.values()):
        return
    calls = [
        functools.partial(module._forward, tensors, params, return_lse, launch)
        for launch in candidates
    ]
    compile_ahead.ahead(triton_plan.module_kernels(module), calls)


def progress_bar(stream: TextIO, label: str = "", width: int = 20) -> Progress:
    """``attncc tune``'s bar on ``stream``: ``tuning 3/8 [=====     ] 128x64/w8/s3``, one
    line rewritten in place (a new line when done)."""

    def show(done: int, total: int, config: dict[str, int]) -> None:
        filled = width * done // max(total, 1)
        bar = "=" * filled + " " * (width - filled)
        end = "\n" if done >= total else ""
        stream.write(f"\rtuning {label}{done}/{total} [{bar}] {describe(config)}{end}")
        stream.flush()

    return show


def tune_shapes(
    kernel: Any,
    shapes: list[Any],
    dtype: torch.dtype,
    make_inputs: Callable[[dict[str, int]], dict[str, torch.Tensor]] | None = None,
    timer: Timer | None = None,
    stream: TextIO | None = None,
) -> list[tuple[str, str, dict[str, int]]]:
    """Tune ``kernel`` (a Triton-target ``attncc.Kernel``) at each ``attncc.bench.Shape`` and
    store the picks where later calls (any process) find them; returns (shape, tuning key,
    pick) per shape. ``make_inputs(sizes)`` builds a call's inputs (default: the benchmark's,
    on the GPU); ``timer`` replaces Triton's do_bench (tests run this on CPU tensors)."""
    from attncc.bench import bench_inputs, sizes_for

    tuner = Tuner(kernel.ir, kernel.path.stem, timer)
    build = make_inputs or (lambda sizes: bench_inputs(kernel.ir, sizes, dtype, documents=4))
    picks = []
    for i, shape in enumerate(shapes):
        sizes = sizes_for(kernel.ir, shape)
        inputs = build(sizes)
        tensors = {name: inputs[name] for name in kernel.input_names}
        on_cpu = next(iter(tensors.values())).device.type == "cpu"
        module = kernel.module(interpreted=on_cpu)
        label = f"{shape} ({i + 1}/{len(shapes)}) " if len(shapes) > 1 else f"{shape} "
        show = progress_bar(stream, label) if stream is not None else None
        key, best = tuner.tune(module, tensors, {}, show)
        picks.append((str(shape), key, best))
    return picks
