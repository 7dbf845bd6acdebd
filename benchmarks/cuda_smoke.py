"""First contact of the CUDA target with a GPU: one small call per kernel kind, each timed
and compared with the float64 reference, each failure printed with its traceback (the
NVRTC log included) instead of stopping the run. `benchmarks/gpu_suite.sh cuda` runs it
before the full checks.

    python3 benchmarks/cuda_smoke.py
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

import torch

import attncc
from attncc.reference import reference

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def case(name: str, make: object, schedule: str | None = None) -> bool:
    began = time.perf_counter()
    try:
        kernel = attncc.compile(EXAMPLES / f"{name}.attn", target="cuda", schedule=schedule)  # type: ignore[arg-type]
        args = make()  # type: ignore[operator]
        out, lse = kernel(*args, return_lse=True)
        torch.cuda.synchronize()
        first = time.perf_counter() - began
        exp_out, exp_lse = reference(kernel.spec)(*(a.cpu() for a in args), return_lse=True)
        err = (out.double().cpu() - torch.from_numpy(exp_out)).abs().max().item()
        lse_err = (lse.double().cpu() - torch.from_numpy(exp_lse)).abs().max().item()
        dtype = args[0].dtype
        ok = err < (1e-4 if dtype == torch.float32 else 4e-2) and lse_err < 1e-3
        print(
            f"{'ok  ' if ok else 'FAIL'} {name:<14} {schedule or 'default':<8} {dtype!s:<15} "
            f"max|err| {err:.2e}  lse {lse_err:.2e}  first call {first:.2f} s"
        )
        return ok
    except Exception:
        print(f"FAIL {name:<14} {schedule or 'default':<8} raised:")
        traceback.print_exc()
        return False


def randn(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=dtype)


def main() -> int:
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    try:
        import cuda.core as core

        print(f"cuda.core {getattr(core, '__version__', '?')}")
    except ImportError as err:
        print(f"cuda.core missing: {err}")

    def qkv(q: tuple[int, ...], kv: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> Any:
        return lambda *extra: (
            randn(*q, dtype=dtype),
            randn(*kv, dtype=dtype),
            randn(*kv, dtype=dtype),
        )

    def lens() -> torch.Tensor:
        return torch.tensor([5, 300, 1000], device="cuda", dtype=torch.int32)

    def docs() -> torch.Tensor:
        return torch.arange(256, device="cuda", dtype=torch.int32)[None] // 50

    fp16, fp32 = torch.float16, torch.float32
    decode, decode32 = qkv((3, 32, 128), (3, 1000, 8, 128)), qkv((3, 8, 64), (3, 1000, 2, 64), fp32)
    spec = qkv((3, 32, 4, 128), (3, 1000, 8, 128))
    document = qkv((1, 2, 256, 64), (1, 2, 256, 64))
    results = [
        case("causal", qkv((2, 3, 200, 64), (2, 3, 200, 64))),
        case("causal", qkv((1, 2, 70, 128), (1, 2, 70, 128), fp16)),
        case("causal", qkv((1, 2, 70, 40), (1, 2, 70, 40), fp32)),
        case("gqa_causal", qkv((1, 8, 300, 128), (1, 2, 300, 128))),
        case("decode", lambda: (*decode(), lens())),
        case("decode", lambda: (*decode32(), lens())),
        case("document_mask", lambda: (*document(), docs())),
        case("softcap", qkv((1, 2, 129, 256), (1, 2, 129, 256))),
        case("speculative_decode", lambda: (*spec(), lens())),
    ]
    print(f"{sum(results)} of {len(results)} smoke cases passed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
