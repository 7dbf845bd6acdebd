"""CPU time of decode calls over a cache that grows by a token a call (GPU).

A transformers DynamicCache or any contiguous cache that grows makes every decoding step a
call of a new length: a geometry attncc has not seen, which its C replay of repeated calls
cannot serve. This prints the CPU microseconds to issue one call (unsynchronised, as a
decode loop issues them) over `--steps` calls of lengths growing from the shape's, beside
the same number of calls at one length, for attncc and for SDPA's flash backend (FA2) on
the same views.

    python3 benchmarks/growing_cache.py [--shape 1,32:8,4096,128] [--steps 200] [--target auto]
"""

from __future__ import annotations

import argparse
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
    args = ap.parse_args()
    shape = Shape.parse(args.shape)
    b, h, n0, d = shape.batch, shape.heads, shape.seq, shape.head_dim
    kvh = shape.kv_heads or h
    kernel = attncc.compile(EXAMPLES / "decode.attn", target=args.target)
    gen = torch.Generator(device="cuda").manual_seed(0)
    total = n0 + args.steps * (args.rounds + 1)
    k = torch.randn(b, total, kvh, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    q = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    lengths = {n: torch.full((b,), n, device="cuda", dtype=torch.int32) for n in range(total + 1)}

    def attncc_call(n: int) -> Callable[[], object]:
        return lambda: kernel(q, k[:, :n], v[:, :n], lengths[n])

    def fa2_call(n: int) -> Callable[[], object]:
        qs = q[:, :, None]
        ks, vs = k[:, :n].transpose(1, 2), v[:, :n].transpose(1, 2)

        def call() -> object:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)

        return call

    print(f"decode {args.shape} bf16, {args.steps} calls, {torch.cuda.get_device_name()}")
    for name, make in (("attncc " + args.target, attncc_call), ("sdpa-flash", fa2_call)):
        make(n0)()  # compiles, records the first geometry
        best_fixed = best_growing = float("inf")
        start = n0
        for _ in range(args.rounds):
            best_fixed = min(best_fixed, cpu_us([make(n0) for _ in range(args.steps)]))
            growing = [make(start + i) for i in range(1, args.steps + 1)]
            best_growing = min(best_growing, cpu_us(growing))
            start += args.steps
        print(
            f"  {name:<14} one length {best_fixed:7.1f} us a call, "
            f"growing {best_growing:7.1f} us a call"
        )


if __name__ == "__main__":
    main()
