"""attncc.fp8.quantize's Triton kernel, run by the Triton interpreter on the CPU, against the
torch path (``quantize_torch``): bit for bit without the rotation, and with it within the
float32 summation bound of the rotation on top of the round-trip rule of tests/test_fp8.py."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

import attncc.fp8
from attncc.fp8 import FP8_MAX, Fp8Inputs, hadamard_transform, quantize, quantize_torch
from attncc.runtime import triton_plan
from attncc.runtime.jit import interpreter
from attncc.runtime.launch_plan import Plans

FIELDS = ("q", "k", "v", "q_descale", "k_descale", "v_descale")


@pytest.fixture
def kernel_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """quantize under the interpreter, made to fail where the torch path would take a
    tensor: a result is the kernel's. quantize_torch, called outside, is unaffected."""
    takes = attncc.fp8._kernel_takes
    quantize_all = attncc.fp8._quantize

    def kernel_or_fail(  # type: ignore[no-untyped-def]
        q, k, v, block: tuple[int, int] | None, hadamard: bool, kernel: bool
    ):
        if kernel:
            assert block is not None
            assert takes(q, block[0], hadamard) and takes(k, block[1], hadamard)
            assert takes(v, block[1], False)
        return quantize_all(q, k, v, block, hadamard, kernel)

    monkeypatch.setattr(attncc.fp8, "_quantize", kernel_or_fail)
    yield


def kernel_quantize(*args: object, **kwargs: object) -> Fp8Inputs:
    with interpreter(True):
        return quantize(*args, **kwargs)  # type: ignore[arg-type]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == attncc.fp8.FP8_DTYPE else t.view(torch.int32)


def assert_identical(got: Fp8Inputs, want: Fp8Inputs) -> None:
    assert got.scheme == want.scheme
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        assert (a.shape, a.dtype) == (b.shape, b.dtype), name
        assert torch.equal(bits(a), bits(b)), f"{name}: {(bits(a) != bits(b)).sum()} differ"


def randn(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.usefixtures("kernel_only")
@pytest.mark.parametrize(
    ("m", "n", "d", "dv", "block", "dtype"),
    [
        (300, 200, 64, 48, (128, 64), torch.float32),  # ragged last blocks, Dv not a power of 2
        (200, 130, 128, 128, (64, 32), torch.bfloat16),
        (100, 77, 64, 64, (96, 40), torch.float16),  # blocks that are not powers of two
    ],
)
def test_kernel_is_the_torch_path_bit_for_bit(
    m: int, n: int, d: int, dv: int, block: tuple[int, int], dtype: torch.dtype
) -> None:
    q = randn((2, 3, m, d), 0, dtype) * 3
    k = randn((2, 3, n, d), 1, dtype)
    v = randn((2, 3, n, dv), 2, dtype) / 5
    assert_identical(kernel_quantize(q, k, v, block=block), quantize_torch(q, k, v, block=block))


@pytest.mark.usefixtures("kernel_only")
@pytest.mark.parametrize("hadamard", [False, True])
def test_strided_and_other_ranks(hadamard: bool) -> None:
    # [B, S, H, D] memory read as [B, H, S, D]; 5-d k and v (leading axes merged), v's
    # transposed (merged by a copy); then 2-d and 3-d tensors
    q = randn((2, 150, 4, 64), 3, torch.bfloat16).transpose(1, 2)
    k = randn((2, 2, 3, 90, 64), 4, torch.bfloat16)
    v = randn((2, 2, 3, 90, 32), 5, torch.bfloat16).transpose(0, 1)
    # integer-valued q and k: the rotation's sums are exact in any order
    q, k = q.round(), (k * 4).round()
    got = kernel_quantize(q, k, v, block=(64, 32), hadamard=hadamard)
    assert_identical(got, quantize_torch(q, k, v, block=(64, 32), hadamard=hadamard))
    assert got.q.is_contiguous() and got.q_descale.shape == (2, 4, 3)
    assert got.k_descale.shape == (2, 2, 3, 3)
    q, k, v = q[0, 0], k[0, 0], v[0, 0]
    got = kernel_quantize(q, k, v, block=(64, 32), hadamard=hadamard)
    assert_identical(got, quantize_torch(q, k, v, block=(64, 32), hadamard=hadamard))


@pytest.mark.usefixtures("kernel_only")
@pytest.mark.parametrize("d", [8, 64, 128, 256])
def test_rotation_of_exact_sums_is_bit_for_bit(d: int) -> None:
    """Integer inputs: every partial sum of the rotation is an exact float32, so the matmul
    and the butterfly must agree to the bit (D=8 pads the matmul to 16). D=256 in bf16 (its
    integers exact too): float32 operands of that rotation exceed shared memory."""
    dtype = torch.bfloat16 if d == 256 else torch.float32
    q = (randn((1, 2, 70, d), 6, torch.float32) * 20).round().to(dtype)
    k = (randn((1, 2, 50, d), 7, torch.float32) * 20).round().to(dtype)
    v = randn((1, 2, 50, 16), 8, torch.float32)
    got = kernel_quantize(q, k, v, block=(32, 16), hadamard=True)
    assert_identical(got, quantize_torch(q, k, v, block=(32, 16), hadamard=True))


def rotation_error(x: torch.Tensor) -> torch.Tensor:
    """The most a float32 rotation ``x @ H / sqrt(D)`` (exact products +-x_i, D-term sum in
    any order, then one product) can be off the exact one, per row: recursive summation's
    (D - 1) u sum|x_i| plus the product's u |y|, below (D + 1) u sum|x_i| / sqrt(D)."""
    d = x.shape[-1]
    u = 2.0**-24
    return (d + 1) * u * x.double().abs().sum(-1, keepdim=True) / math.sqrt(d)


@pytest.mark.usefixtures("kernel_only")
@pytest.mark.parametrize("d", [64, 128])
def test_rotation_within_the_summation_bound(d: int) -> None:
    block = (64, 32)
    q = randn((1, 2, 150, d), 9, torch.float32) * torch.linspace(0.01, 30, d)  # wide exponents
    k = randn((1, 2, 100, d), 10, torch.float32)
    v = randn((1, 2, 100, d), 11, torch.float32)
    got = kernel_quantize(q, k, v, block=block, hadamard=True)
    want = quantize_torch(q, k, v, block=block, hadamard=True)
    assert torch.equal(bits(got.v), bits(want.v)) and torch.equal(got.v_descale, want.v_descale)
    for x, x8, descale, want_descale, rows in (
        (q, got.q, got.q_descale, want.q_descale, block[0]),
        (k, got.k, got.k_descale, want.k_descale, block[1]),
    ):
        exact = hadamard_transform(x.double())
        err_rot = rotation_error(x)  # [..., S, 1]
        per_row = descale.double().repeat_interleave(rows, -1)[..., : x.shape[-2], None]
        # tests/test_fp8.py's round-trip rule, applied to the kernel's rotated values, which
        # are within err_rot of the exact ones
        err = (x8.double() * per_row - exact).abs()
        allowed = torch.maximum((exact.abs() + err_rot) * 2.0**-4, per_row * 2.0**-10)
        assert (err <= allowed * (1 + 1e-6) + err_rot).all()
        # a block's maximum moves by at most its rows' err_rot; the descale is that over 448,
        # rounded (half an ulp of float32 each side)
        block_err = torch.nn.functional.pad(err_rot[..., 0], (0, -x.shape[-2] % rows))
        block_err = block_err.unflatten(-1, (-1, rows)).amax(-1) / FP8_MAX
        slack = want_descale.double() * 2.0**-23
        assert ((descale.double() - want_descale.double()).abs() <= block_err + slack).all()
        # float32 rounding, not a different answer: nearly every FP8 value is the same
        assert (bits(x8) != bits(getattr(want, "q" if x is q else "k"))).float().mean() < 0.01


@pytest.mark.usefixtures("kernel_only")
def test_rounding_ties_subnormals_zeros_and_nan() -> None:
    """Rows whose block maximum is 448 (descale exactly 1): e4m3's ties to even, a mantissa
    carry into an odd exponent, subnormals and their ties, negative zero; then a block of
    zeros (descale 1) and a block with a NaN: its descale is that of its other values (the
    GPU's max.f32 skips NaN), and the NaN stays NaN."""
    values = [448.0, 1.0625, 1.1875, -1.96875, 3.9375, 2.0**-10, 1.5 * 2.0**-9, -0.0]
    values += [2.0**-7, 5 * 2.0**-11, 447.9, 300.0, -(2.0**-12), 0.0, 7.5 * 2.0**-9, 1e-30]
    q = torch.zeros(1, 1, 48, 16)
    q[0, 0, :16, :] = torch.tensor(values)
    q[0, 0, 32, 3] = float("nan")
    q[0, 0, 33:, :] = randn((15, 16), 12, torch.float32)
    got = kernel_quantize(q, q, q, block=(16, 16))
    want = quantize_torch(q, q, q, block=(16, 16))
    assert_identical(got, want)
    nan_block = q[0, 0, 32:].nan_to_num(0.0)
    assert got.q_descale[0, 0, :2].tolist() == [1.0, 1.0]
    assert got.q_descale[0, 0, 2] == nan_block.abs().amax() / torch.tensor(FP8_MAX)
    assert got.q[0, 0, 32, 3].float().isnan() and not got.q[0, 0, 33:].float().isnan().any()
    assert got.q[0, 0, 0, 1].float().item() == 1.0 and got.q[0, 0, 0, 3].float().item() == -2.0


@pytest.mark.usefixtures("kernel_only")
def test_a_repeated_geometry_replays_its_recorded_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A geometry's first call is recorded, later ones replay it with their own tensors
    (attncc.runtime.triton_plan) and skip the checks; another layout or dtype of the same
    shape records its own. Every call gives the torch path's bits."""
    monkeypatch.setattr(attncc.fp8, "_PLANS", Plans())
    recorded: list[tuple[int, ...]] = []
    record = triton_plan.record

    def counted(module, launch, tensors, compiled):  # type: ignore[no-untyped-def]
        recorded.append(tuple(tensors["q"].stride()))
        return record(module, launch, tensors, compiled)

    monkeypatch.setattr(triton_plan, "record", counted)
    checked: list[bool] = []
    quantize_all = attncc.fp8._quantize

    def full_path(*args, kernel: bool):  # type: ignore[no-untyped-def]
        checked.append(kernel)
        return quantize_all(*args, kernel=kernel)

    monkeypatch.setattr(attncc.fp8, "_quantize", full_path)
    calls = [
        (
            randn((1, 2, 100, 64), seed, torch.float32),
            randn((1, 2, 80, 64), seed + 1, torch.float32),
        )
        for seed in (20, 22)
    ]
    strided = randn((1, 100, 2, 64), 24, torch.float32).transpose(1, 2)
    calls += [(strided, calls[0][1]), (calls[0][0].bfloat16(), calls[0][1].bfloat16())]
    records = []
    for q, kv in calls:
        got = kernel_quantize(q, kv, kv * 2, block=(32, 32))
        assert_identical(got, quantize_torch(q, kv, kv * 2, block=(32, 32)))
        records.append(len(recorded))
    # q, k and key-major v in one plan; then none; q's new layout; bfloat16
    assert records == [1, 1, 2, 3]
    # the repeated geometry replayed without the checks and job choices of a full call
    assert checked.count(True) == 3


def test_torch_path_outside_the_kernel_cases() -> None:
    """Per tensor, float64, and blocks too large for one program stay on the torch path,
    also under the interpreter; quantize and quantize_torch agree there too."""
    q = randn((1, 2, 40, 64), 13, torch.float32)
    for kwargs, x in (
        ({"block": None, "hadamard": True}, q),
        ({"block": (16, 16)}, q.double()),
        ({"block": (1024, 16)}, q),
    ):
        got = kernel_quantize(x, x, x, **kwargs)
        assert_identical(got, quantize_torch(x, x, x, **kwargs))  # type: ignore[arg-type]
    assert not attncc.fp8._kernel_takes(q, 1024, False)
    assert not attncc.fp8._kernel_takes(q.double(), 16, False)
    # the rotation's operands in shared memory: float32 at D=256 (384 KiB) does not fit an
    # H100/H200 block (Triton's OutOfResources on the GPU); 16-bit (192 KiB) does
    wide = randn((1, 2, 128, 256), 14, torch.float32)
    with interpreter(True):
        assert not attncc.fp8._kernel_takes(wide, 128, True)
        assert attncc.fp8._kernel_takes(wide, 128, False)
        assert attncc.fp8._kernel_takes(wide.to(torch.bfloat16), 128, True)
    # loads in flight as shared memory allows: one at D=256 in 16 bits (the GPU's
    # OutOfResources at three), three at D=128, two in float32
    assert attncc.fp8._rotation_stages(wide.to(torch.bfloat16), 128) == 1
    assert attncc.fp8._rotation_stages(wide[..., :128].to(torch.bfloat16), 128) == 3
    assert attncc.fp8._rotation_stages(wide[..., :128], 128) == 2
