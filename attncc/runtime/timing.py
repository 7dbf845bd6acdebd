"""GPU timing shared by the autotuner and ``attncc bench``.

Decode-sized calls (a few queries) take microseconds, less than their Python launch path, and
read a K/V cache that may fit in L2 (B=1 at 8k tokens is 34 MB; an H200 has 50 MB of L2).
Repeating one call would then time L2, not memory. So they are timed as CUDA-graph replays of
one call per copy of the inputs, with enough copies that a rotation moves 3x the L2 size; in
serving, the other layers evict a layer's cache between its calls the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch


def cold_copies(inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """The inputs plus enough clones that a rotation through them moves 3x the L2 cache."""
    total = sum(t.numel() * t.element_size() for t in inputs.values())
    device = next(iter(inputs.values())).device
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    count = max(1, math.ceil(3 * l2 / max(total, 1)))
    return [inputs] + [{n: t.clone() for n, t in inputs.items()} for _ in range(count - 1)]


def median_ms(fns: list[Callable[[], Any]], graphed: bool) -> float:
    """Median milliseconds of one call: graphed, a CUDA-graph replay of every ``fns`` in turn
    (one call per input copy); otherwise ``do_bench`` of the first, which clears L2 itself."""
    import triton.testing

    if graphed:

        def rotation() -> None:
            for fn in fns:
                fn()

        ms = triton.testing.do_bench_cudagraph(rotation, rep=50, return_mode="median")
        return float(ms) / len(fns)
    return float(triton.testing.do_bench(fns[0], return_mode="median"))


def graphed(fn: Callable[[], Any], warmups: int = 3) -> Callable[[], None]:
    """``fn`` captured in a CUDA graph, after ``warmups`` calls on a side stream (first calls
    compile and record launches outside the capture): its replay."""
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay
