"""The softmax's exponential against the tensor cores: the roofline behind head dim 64.

Every (query, key) pair costs 4·D FLOPs on the tensor cores (S = Q K^T and O += P V) and one
2^x on the MUFU pipe. This measures both peaks on the GPU it runs on and prints, per head
dim, the time the exponentials take against the time the MMAs take, and the throughput
bounds that follow: with perfect overlap (the larger of the two) and with none (their sum).

    python3 benchmarks/exp_roofline.py [TFLOP/s of a kernel at D=64] ...

- ``ex2.approx.ftz.f32``: the instruction attncc's kernels issue (MUFU.EX2).
- ``ex2.approx.f16x2``: the packed form, which ptxas splits into two MUFU.EX2.F16 on sm_90a
  (it doubles no throughput; printed to show it on the device, not only in SASS).
- dense bf16 matmul (torch, 8192^3): the tensor-core peak the kernels' MMAs share.
"""

from __future__ import annotations

import sys

import cupy
import torch
import triton.testing

_SOURCE = r"""
extern "C" __global__ void ex2_f32(float* out, int iters) {
    float a[8];
    for (int j = 0; j < 8; ++j) a[j] = -0.001f * (threadIdx.x + j);
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j)  // eight independent chains: throughput, not latency
            asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(a[j]) : "f"(-a[j]));
    }
    float sum = 0.f;
    for (int j = 0; j < 8; ++j) sum += a[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

extern "C" __global__ void ex2_f16x2(unsigned* out, int iters) {
    unsigned a[8];
    for (int j = 0; j < 8; ++j) a[j] = 0xb800b800u + threadIdx.x + j;  // about -0.5, -0.5
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(a[j]) : "r"(a[j]));
            a[j] ^= 0x80008000u;  // negate both halves: the values stay in (-1, 0)
        }
    }
    unsigned sum = 0;
    for (int j = 0; j < 8; ++j) sum ^= a[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
"""

_THREADS, _ITERS, _CHAINS = 256, 4096, 8


def exponentials_per_second(name: str, per_instruction: int) -> float:
    module = cupy.RawModule(code=_SOURCE, options=("-arch=sm_90a",))
    kernel = module.get_function(name)
    blocks = cupy.cuda.Device().attributes["MultiProcessorCount"] * 8
    out = cupy.zeros(blocks * _THREADS, dtype=cupy.uint32)

    def launch() -> None:
        kernel((blocks,), (_THREADS,), (out, cupy.int32(_ITERS)))

    launch()
    cupy.cuda.Device().synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(10):
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    count = blocks * _THREADS * _ITERS * _CHAINS * per_instruction
    return count / sorted(times)[len(times) // 2]


def matmul_flops_per_second() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
    return 2 * 8192**3 / (ms * 1e-3)


def main() -> None:
    attributes = cupy.cuda.Device().attributes
    sms, clock_hz = attributes["MultiProcessorCount"], attributes["ClockRate"] * 1e3
    exp = exponentials_per_second("ex2_f32", 1)
    packed = exponentials_per_second("ex2_f16x2", 2)
    mma = matmul_flops_per_second()
    print(f"{torch.cuda.get_device_name()}: {sms} SMs, max SM clock {clock_hz / 1e9:.2f} GHz")
    print(
        f"ex2.approx.ftz.f32: {exp / 1e12:.2f} T/s "
        f"({exp / sms / clock_hz:.1f} a clock an SM at the max clock)"
    )
    print(f"ex2.approx.f16x2:   {packed / 1e12:.2f} T/s elements (two a packed instruction)")
    print(
        f"bf16 matmul 8192^3: {mma / 1e12:.0f} TFLOP/s "
        f"({mma / sms / clock_hz:.0f} FLOP a clock an SM)"
    )
    print("head dim | exp time / MMA time | bound, overlapped | bound, serial (TFLOP/s)")
    for head_dim in (64, 96, 128, 256):
        ratio = mma / (4 * head_dim * exp)  # seconds of 2^x per second of MMA, per pair
        print(
            f"{head_dim:8d} | {ratio:19.2f} | {mma / max(1.0, ratio) / 1e12:17.0f} | "
            f"{mma / (1 + ratio) / 1e12:.0f}"
        )
    for value in sys.argv[1:]:  # a kernel's D=64 TFLOP/s: how busy it keeps each pipe
        flops = float(value) * 1e12
        print(
            f"{value} TFLOP/s at D=64: tensor cores {flops / mma:.0%} of the matmul peak, "
            f"MUFU {flops / 256 / exp:.0%} of its peak"
        )


if __name__ == "__main__":
    main()
