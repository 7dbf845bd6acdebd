"""A first call of a Triton-target kernel launches through attncc's launcher: Triton's own
launcher for the kernel (a C compiler run on an empty Triton cache) is never built, and the
output is exactly what Triton's launch of the same kernel gives.

Run on the device by benchmarks/gpu_suite.sh; without a GPU every test here is skipped."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import attncc
from attncc.runtime import compile_ahead, triton_plan
from attncc.runtime.launch_plan import Plans

pytestmark = pytest.mark.gpu

# a spec of its own: its kernels are launched by no other test in the process
SPEC = """
attention first_call_launch
dims  B, H, M, N, D
in    q[B, H, M, D]
in    k[B, H, N, D]
in    v[B, H, N, D]
param scale: f32 = 0.0917
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] * scale
mask m >= n
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""


@pytest.mark.parametrize(
    ("dtype", "queries"),
    [(torch.bfloat16, 200), (torch.float32, 200), (torch.bfloat16, 1)],
    ids=["bf16", "fp32", "bf16-one-query"],
)
def test_a_first_call_never_builds_tritons_launcher(dtype: torch.dtype, queries: int) -> None:
    kernel = attncc.compile(SPEC, target="triton")
    gen = torch.Generator().manual_seed(0)
    shapes = {"q": (2, 4, queries, 64), "k": (2, 4, 300, 64), "v": (2, 4, 300, 64)}
    inputs = {n: torch.randn(s, generator=gen).to("cuda", dtype) for n, s in shapes.items()}
    out = kernel(**inputs)
    geometry = kernel._geometry(Plans.key(inputs, {}, False, False, stream=False))
    plan = geometry.plan
    assert plan is not None and plan.issues is not None, plan.launcher_refusal
    assert all(step.compiled._run is None for step in plan.steps)  # no launcher built
    # the module's launches with the configuration the call chose, through Triton's launcher
    full, _ = geometry.launch(kernel.module(False), dict(inputs), False)
    assert all(step.compiled._run is not None for step in plan.steps)
    torch.testing.assert_close(out, full, rtol=0, atol=0)


@triton.jit
def _fill_first(out, value, BLOCK: tl.constexpr):
    tl.store(out + tl.arange(0, BLOCK), tl.full((BLOCK,), value, tl.float32))


@triton.jit
def _fill_second(out, value, BLOCK: tl.constexpr):
    tl.store(out + tl.arange(0, BLOCK), tl.full((BLOCK,), value + 1.0, tl.float32))


def test_kernels_compiled_ahead_are_compiled_and_not_launched() -> None:
    out = torch.full((64,), -1.0, device="cuda")

    def call() -> None:
        _fill_first[(1,)](out, 1.0, BLOCK=64)
        _fill_second[(1,)](out, 2.0, BLOCK=64)

    compile_ahead.ahead([_fill_first, _fill_second], [call])
    torch.cuda.synchronize()
    assert (out == -1.0).all()  # nothing ran
    device = torch.cuda.current_device()
    assert all(len(k.device_caches[device][0]) == 1 for k in (_fill_first, _fill_second))
    call()
    assert (out == 3.0).all()


def test_tuning_compiles_every_candidate_ahead() -> None:
    spec = SPEC.replace("first_call_launch", "tuning_compiles_ahead")
    kernel = attncc.compile(spec, target="triton")
    gen = torch.Generator().manual_seed(1)
    shapes = {"q": (1, 2, 256, 64), "k": (1, 2, 256, 64), "v": (1, 2, 256, 64)}
    inputs = {
        n: torch.randn(s, generator=gen).to("cuda", torch.bfloat16) for n, s in shapes.items()
    }
    module = kernel.module(False)
    kernels = triton_plan.module_kernels(module)
    device = torch.cuda.current_device()
    _, pick = kernel.tuner.tune(module, inputs, {})
    candidates = kernel.tuner.candidates(
        {"B": 1, "H": 2, "M": 256, "N": 256, "D": 64}, torch.bfloat16
    )
    assert pick in candidates
    compiled = sum(len(k.device_caches[device][0]) for k in kernels)
    assert compiled >= len({tuple(sorted(c.items())) for c in candidates})
