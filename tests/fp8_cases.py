"""FP8 inputs with a known answer, shared by the CPU test of the Triton FP8 kernel
(tests/kernels/test_fp8.py) and the GPU test of both FP8 kernels (tests/gpu/test_gpu_cuda.py)."""

from __future__ import annotations

import math

import torch

# one dominant key and 255 keys each weighing e^-5.8125 (0.003) of it
SMALL_WEIGHT = math.exp(-5.8125)
SMALL_WEIGHT_OUT = 255 * SMALL_WEIGHT / (1 + 255 * SMALL_WEIGHT)  # column 0 of every row
SMALL_WEIGHT_LSE = 6.0 + math.log1p(255 * SMALL_WEIGHT)


def small_weight_rows(head_dim: int, device: str) -> list[torch.Tensor]:
    """examples/fp8_block.attn's inputs for 64 rows and 256 keys (one batch entry and head,
    descales of 1, V key-major), whose scores q.k * scale at scale = 0.125 (the caller
    passes it) are 6 for key 0 and 0.1875 for the others, and whose V has column 0 at 0 for
    key 0 and 1 for the others."""
    e4m3 = torch.float8_e4m3fn
    q = torch.zeros(1, 1, 64, head_dim, device=device)
    q[..., 0] = 8.0
    k = torch.zeros(1, 1, 256, head_dim, device=device)
    k[..., 0] = 0.1875
    k[:, :, 0, 0] = 6.0
    v = torch.zeros(1, 1, 256, head_dim, device=device)
    v[:, :, 1:, 0] = 1.0
    key_major = v.to(e4m3).transpose(-1, -2).contiguous().transpose(-1, -2)
    ones = torch.ones(1, 1, 2, device=device)
    return [q.to(e4m3), k.to(e4m3), key_major, ones[..., :1], ones, ones]
