"""CPU time of decode calls over a cache that grows by a token a call (GPU).

A transformers DynamicCache or any contiguous cache that grows makes every decoding step a
call of a new length: a geometry attncc has not seen, which its C replay of repeated calls
cannot serve. This prints the CPU microseconds to issue one call (unsynchronised, as a
decode loop issues them) over `--steps` calls of lengths growing from the shape's, beside
the same number of calls at one length, for attncc and for SDPA's flash backend (FA2) on
the same views.

    python3 benchmarks/growing_cache.py [--shape 1,32:8,4096,128] [--steps 200] [--target auto]
                                        [--layout view|cat] [--layers 1] [--profile]

`--layout cat` gives each length a cache of its own (as torch.cat makes one, a transformers
DynamicCache's step): its strides change with the length too. `--layers L` calls each length
L times in a row, as a model's layers do (one kernel serves them all), and reports the time a
call. `--profile` prints where attncc's growing calls spend their CPU time (cProfile, the
functions of most own time).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import attncc
from attncc.bench import Shape

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def cpu_us(calls: list[Callable[[], object]]) -> float:
    """CPU microseconds a call over ``calls`` issued back to back, unsynchronised (the
    smaller of wall and process time, as benchmarks/calls.py's issue_us)."""
    torch.cuda.synchronize()
    began, cpu_began = time.perf_counter(), time.process_time()
    for call in calls:
        call()
    spent = min(time.perf_counter() - began, time.process_time() - cpu_began)
    torch.cuda.synchronize()
    return spent / len(calls) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1,32:8,4096,128", help="B,H:KVH,N,D at the first call")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--target", default="auto")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layout", choices=("view", "cat"), default="view")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    shape = Shape.parse(args.shape)
    b, h, n0, d = shape.batch, shape.heads, shape.seq, shape.head_dim
    kvh = shape.kv_heads or h
    kernel = attncc.compile(EXAMPLES / "decode.attn", target=args.target)
    gen = torch.Generator(device="cuda").manual_seed(0)
    total = n0 + args.steps * (args.rounds + 2)
    k = torch.randn(b, total, kvh, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    q = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    lengths = {n: torch.full((b,), n, device="cuda", dtype=torch.int32) for n in range(total + 1)}

    caches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def cache(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of length ``n``: views of one buffer, or tensors of their own."""
        if args.layout == "view":
            return k[:, :n], v[:, :n]
        if n not in caches:
            caches[n] = (k[:, :n].clone(), v[:, :n].clone())
        return caches[n]

    def attncc_call(n: int) -> Callable[[], object]:
        kn, vn = cache(n)
        return lambda: kernel(q, kn, vn, lengths[n])

    def fa2_call(n: int) -> Callable[[], object]:
        qs = q[:, :, None]
        kn, vn = cache(n)
        ks, vs = kn.transpose(1, 2), vn.transpose(1, 2)

        def call() -> object:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)

        return call

    gpu = torch.cuda.get_device_name()
    layers = range(args.layers)
    print(
        f"decode {args.shape} bf16, {args.layout} caches, {args.steps} lengths "
        f"x {args.layers} calls, {gpu}"
    )
    for name, make in (("attncc " + args.target, attncc_call), ("sdpa-flash", fa2_call)):
        make(n0)()  # compiles, records the first geometry
        best_fixed = best_growing = float("inf")
        start = n0
        for _ in range(args.rounds):
            best_fixed = min(best_fixed, cpu_us([make(n0) for _ in range(args.steps)]))
            growing = [make(start + i) for i in range(1, args.steps + 1) for _ in layers]
            best_growing = min(best_growing, cpu_us(growing))
            start += args.steps
        if args.profile and name.startswith("attncc"):
            growing = [make(start + i) for i in range(1, args.steps + 1) for _ in layers]
            start += args.steps
            profiler = cProfile.Profile()
            profiler.runcall(cpu_us, growing)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
        print(
            f"  {name:<14} one length {best_fixed:7.1f} us a call, "
            f"growing {best_growing:7.1f} us a call"
        )


if __name__ == "__main__":
    main()
