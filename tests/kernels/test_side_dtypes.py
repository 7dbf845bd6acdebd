"""Float side inputs (not q, k or v) in another float dtype: an fp32 bias or ALiBi slopes beside
bf16 q/k/v, as FlexAttention users pass captured tensors. They were refused ("use one float
dtype"); the kernels read them as float32, and the results match the float64 reference."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attncc
from attncc.reference import reference
from attncc.runtime import launch_plan

from ._support import DEVICE, compiled, evaluate, example_path

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)

B, H, M, N, D = 2, 3, 9, 21, 16


def side_inputs(name: str, dtype: torch.dtype, side: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen)

    given = {"q": randn(B, H, M, D), "k": randn(B, H, N, D), "v": randn(B, H, N, D)}
    given = {k: t.to(DEVICE, dtype) for k, t in given.items()}
    if name == "alibi":
        given["slopes"] = (torch.rand(H, generator=gen) * 2).to(DEVICE, side)
    else:
        given["bias"] = (randn(B, H, M, N) * 3).to(DEVICE, side)
    return given


@pytest.mark.parametrize(
    ("dtype", "side"),
    [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.bfloat16),
        (torch.float32, torch.float16),
        (torch.bfloat16, torch.float64),
    ],
    ids=["bf16+fp32", "fp16+bf16", "fp32+fp16", "bf16+fp64"],
)
@pytest.mark.parametrize("schedule", ["fused", "naive", "split_kv"])
@pytest.mark.parametrize("name", ["alibi", "bias"])
def test_side_inputs_of_another_float_dtype(
    name: str, schedule: str, dtype: torch.dtype, side: torch.dtype
) -> None:
    kernel = compiled(name, schedule)
    given = side_inputs(name, dtype, side)
    out_verdict, lse_verdict, out, _ = evaluate(kernel, given, {}, dtype)
    assert out.dtype == dtype  # the output takes q's dtype, not the side input's
    assert out_verdict.ok, out_verdict
    assert lse_verdict.ok, lse_verdict


def test_an_fp32_bias_is_read_as_fp32() -> None:
    """The log-sum-exp (float32) shows whether the bias was rounded to bf16 on the way: read
    as fp32, it is closer to the reference than the same call with the bias in bf16."""
    kernel = compiled("bias", "fused")
    given = side_inputs("bias", torch.bfloat16, torch.float32)
    rounded = {**given, "bias": given["bias"].to(torch.bfloat16)}
    _, exact_verdict, _, _ = evaluate(kernel, given, {}, torch.bfloat16)
    assert exact_verdict.ok, exact_verdict
    host = {name: t.cpu() for name, t in given.items()}
    expected = torch.from_numpy(reference(kernel.spec)(**host, return_lse=True)[1])
    _, as_given = kernel(**given, return_lse=True)
    _, as_rounded = kernel(**rounded, return_lse=True)
    error = (as_given.double().cpu() - expected).abs().max()
    assert error < 0.5 * (as_rounded.double().cpu() - expected).abs().max(), error


def test_side_inputs_must_still_be_floats() -> None:
    kernel = compiled("bias", "fused")
    given = side_inputs("bias", torch.bfloat16, torch.float32)
    with pytest.raises(
        TypeError,
        match=r"input 'bias' must be float16, bfloat16, float32 or float64, got torch\.int32",
    ):
        kernel(**{**given, "bias": given["bias"].to(torch.int32)})
    # q, k and v still take one float dtype
    with pytest.raises(TypeError, match=r"input 'k' is torch\.float32 but 'q' is torch\.bfloat16"):
        kernel(**{**given, "k": given["k"].float()})


def test_cuda_host_sends_other_side_dtypes_to_triton_or_converts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA kernels read a side input through a pointer of their float type: an auto
    kernel hands such calls to Triton (``_takes_wgmma``), target "cuda" converts them."""
    module: Any = attncc.compile(example_path("bias"), target="cuda").module(False)
    monkeypatch.setattr(module, "_has_wgmma", lambda device: True)
    cuda = torch.device("cuda", 0)
    q = torch.zeros(1, 2, 200, 64, dtype=torch.bfloat16)
    bias = torch.zeros(1, 2, 200, 200, dtype=torch.bfloat16)
    sizes = {"B": 1, "H": 2, "M": 200, "N": 200, "D": 64}
    tensors, _ = module._bind([q, q, q, bias], {})
    assert module._takes_wgmma(tensors, sizes, torch.bfloat16, cuda)
    assert module._conversions(tensors, torch.bfloat16) == ()
    tensors["bias"] = bias.float()
    assert not module._side_floats_fit(tensors, torch.bfloat16)
    assert not module._takes_wgmma(tensors, sizes, torch.bfloat16, cuda)
    assert module._conversions(tensors, torch.bfloat16) == (("bias", torch.bfloat16),)
    converted = launch_plan.convert(tensors, module._conversions(tensors, torch.bfloat16))
    assert converted["bias"].dtype == torch.bfloat16
