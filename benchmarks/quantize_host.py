"""The CPU time a repeated ``attncc.fp8.quantize`` call costs, replayed by the C launcher
against the plan's own Python replay, in alternating rounds of one process (a GPU's host).

    python3 benchmarks/quantize_host.py [--shape 1,16,8192,128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys

import torch
from calls import issue_us  # benchmarks/: the script's own folder is on sys.path

from attncc.fp8 import quantize
from attncc.runtime import triton_plan


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="1,16,8192,128", help="B,H,S,D")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    b, h, s, d = (int(x) for x in args.shape.split(","))
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    native = triton_plan.TritonPlan.native_replay

    def python_replay(plan: triton_plan.TritonPlan, guard: object = None) -> None:
        return None

    for hadamard in (False, True):
        for round_ in range(args.rounds):
            for name, replay in (("C replay", native), ("plan's Python", python_replay)):
                triton_plan.TritonPlan.native_replay = replay  # type: ignore[method-assign]
                us = issue_us(lambda h=hadamard: quantize(q, k, v, block=(128, 128), hadamard=h))
                print(f"hadamard={hadamard} round {round_ + 1} {name}: {us:.1f} us of CPU a call")
    triton_plan.TritonPlan.native_replay = native  # type: ignore[method-assign]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
