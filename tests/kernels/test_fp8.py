"""FP8 (e4m3) q, k and v with per-block descales: the Triton fused kernel, `attncc check`'s
FP8 rule, and the refusals of what has no FP8 path yet."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from fp8_cases import SMALL_WEIGHT_LSE, SMALL_WEIGHT_OUT, small_weight_rows

import attncc
from attncc.checking import check, table
from attncc.fp8 import Fp8Inputs, emulate_attention, quantize
from attncc.reference import reference, round_to
from attncc.spec import SpecError

from ._support import DEVICE, compiled, example_path

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)

FP8 = example_path("fp8_block").read_text()


def attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    q, k, v = q.double(), k.double(), v.double()
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v


def test_check_passes_the_fp8_example_with_the_fp8_rule() -> None:
    results = check(compiled("fp8_block", "fused"), trials=3, seed=4, device=DEVICE, max_len=80)
    assert all(r.ok for r in results), table(results)
    assert {r.case.dtype for r in results} == {torch.float8_e4m3fn}
    # the rule's bound is plain per-tensor FP8's error, far above bfloat16's floor
    assert all(r.output.rms_bound > 1e-3 for r in results), table(results)


def test_check_fails_a_kernel_that_drops_the_value_scale() -> None:
    """The same kernel without v's descale, judged by the FP8 example's reference."""
    text = FP8.replace(" * v_descale[b, h, n / block_n]", " * (1.0 + 0 * v_descale[b, h, 0])")
    assert text != FP8
    wrong = dataclasses.replace(attncc.compile(text), spec=compiled("fp8_block", "fused").spec)
    results = check(wrong, trials=3, seed=4, device=DEVICE, max_len=80)
    assert not any(r.ok for r in results), table(results)


@pytest.mark.parametrize("hadamard", [False, True])
def test_quantized_inputs_through_the_kernel(hadamard: bool) -> None:
    """quantize() then the kernel: the FP8 error of the emulated kernel, not more."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, s, 64, generator=gen) for s in (150, 200, 200))
    x = quantize(q, k, v, block=(64, 32), hadamard=hadamard)
    kernel = compiled("fp8_block", "fused")
    args = [t.to(DEVICE) for t in (x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale)]
    out = kernel(*args, block_m=64, block_n=32)
    assert out.dtype == torch.bfloat16 and out.shape == (1, 2, 150, 64)
    exact = attention64(q, k, v)
    rmse = (out.cpu().double() - exact).pow(2).mean().sqrt().item()
    emulated = (emulate_attention(x).double() - exact).pow(2).mean().sqrt().item()
    # the kernel meets P in bfloat16 where the emulation rounds it to e4m3: no worse
    assert rmse <= 1.1 * emulated, (rmse, emulated)
    # wrong blocks for these descales are caught by the numbers, not silently close
    wrong = kernel(*args, block_m=64, block_n=64)
    assert (wrong.cpu().double() - exact).pow(2).mean().sqrt().item() > 3 * rmse


def test_value_scale_without_fp8() -> None:
    """A per-key value weight is a spec feature of its own: bf16 inputs, any weight."""
    text = (
        example_path("fused")
        .read_text()
        .replace("in    v[B, H, N, D]\n", "in    v[B, H, N, D]\nin    w[B, N]: f32\n")
        .replace("* v[b, h, n, d]", "* v[b, h, n, d] * w[b, n]")
    )
    assert "w[b, n]" in text and "in    w[B, N]" in text
    results = check(attncc.compile(text), trials=3, seed=2, device=DEVICE, max_len=64)
    assert all(r.ok for r in results), table(results)


def test_fp8_rounding_of_the_reference_is_e4m3() -> None:
    gen = np.random.default_rng(0)
    x = gen.standard_normal(4000) * 3.0
    got = round_to(x, "float8_e4m3")
    scale = np.abs(x).max() / 448.0
    want = (torch.from_numpy(x / scale).to(torch.float8_e4m3fn).double() * scale).numpy()
    np.testing.assert_array_equal(got, want)
    assert np.abs(got).max() == np.abs(x).max()  # the maximum is exact: 448 * scale


def test_fp8_naive_reference_rounds_inputs_and_probabilities() -> None:
    spec = compiled("fp8_block", "fused").spec
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 40, 16, generator=gen).to(torch.float8_e4m3fn) for _ in range(3))
    descales = [torch.rand(1, 1, 1, generator=gen) + 0.5 for _ in range(3)]
    exact = reference(spec)(q, k, v, *descales)
    naive = reference(spec, rounding="float8_e4m3")(q, k, v, *descales)
    err = np.sqrt(np.mean((naive - exact) ** 2))
    assert 1e-3 < err < 5e-2  # e4m3's rounding (2^-4 relative), not bfloat16's (2^-9)


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        (
            "in    k_descale[B, H, NB]: f32",
            "in    k_descale[B, H, NB]: f8e4m3",
            "input 'k_descale' is f8e4m3, but only the query, key and value may be FP8",
        ),
        (
            "in    v[B, H, N, D]: f8e4m3",
            "in    v[B, H, N, D]: bf16",
            "the query, key and value must all be f8e4m3 or none of them; 'v' is bf16",
        ),
        ("in    q[B, H, M, D]: f8e4m3", "in    q[B, H, M, D]: f8e5m2", "f8e5m2 inputs"),
        (
            "* v_descale[b, h, n / block_n]",
            "* v_descale[b, h, m / block_n]",
            "may use the key index 'n' and batch indices only, not 'm'",
        ),
    ],
)
def test_spec_errors(old: str, new: str, error: str) -> None:
    assert old in FP8
    with pytest.raises(SpecError, match=error) as info:
        attncc.compile(FP8.replace(old, new))
    line = next(i for i, text in enumerate(FP8.splitlines(), 1) if old in text)
    assert info.value.span.line == line


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"schedule": "naive"}, "cannot run naive: FP8 inputs run fused only"),
        ({"schedule": "split_kv"}, "cannot run split_kv: FP8 inputs run fused only"),
    ],
)
def test_what_has_no_fp8_path_refuses(options: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        attncc.compile(FP8, **options)  # type: ignore[arg-type]


def test_call_errors_name_the_input() -> None:
    kernel = compiled("fp8_block", "fused")
    q = torch.randn(1, 1, 8, 16, device=DEVICE)
    x = quantize(q, q, q, block=(128, 128))
    with pytest.raises(TypeError, match=r"input 'q' is declared f8e4m3, got torch\.float32"):
        kernel(q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale)
    descale = x.q_descale.clone().requires_grad_()
    with pytest.raises(Exception, match="FP8 inputs and value scales have no backward"):
        kernel(x.q, x.k, x.v, descale, x.k_descale, x.v_descale)


def test_attncc_check_runs_the_fp8_example(capsys: pytest.CaptureFixture[str]) -> None:
    from attncc import cli

    # on the device the kernels run on: the GPU machine's numpy cannot run the interpreter
    argv = ["check", str(example_path("fp8_block")), "--trials", "2", "--device", DEVICE]
    status = cli.main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.count("float8_e4m3") == 2 and "2 passed, 0 failed" in out


def test_check_sizes_descale_tables_for_any_drawn_block() -> None:
    """`k_descale[b, h, n / block_n]`: check draws block_n in 1..N + 1, so the table needs N
    entries (drawn at 1..64 regardless, a trial with block_n=1 read past it)."""
    from attncc.checking import draw_sizes

    kernel = compiled("fp8_block", "fused").ir
    for seed in range(20):
        sizes = draw_sizes(kernel, np.random.default_rng(seed), max_len=96)
        assert sizes["MB"] >= sizes["M"] and sizes["NB"] >= sizes["N"], sizes


def _fp8_args(x: Fp8Inputs, v: torch.Tensor | None = None) -> list[torch.Tensor]:
    v8 = x.v if v is None else v
    return [t.to(DEVICE) for t in (x.q, x.k, v8, x.q_descale, x.k_descale, x.v_descale)]


def _rmse(out: torch.Tensor, exact: torch.Tensor) -> float:
    return (out.cpu().double() - exact).pow(2).mean().sqrt().item()


@pytest.mark.parametrize("block_n", [64, 128, 32])
def test_fp8_pv_path_matches_the_emulation(block_n: int) -> None:
    """quantize's key-major v with key blocks a multiple of the key tile (64 keys at D=64):
    P meets V in FP8 (FP8_PV), with the error of the emulated FP8 kernel (which rounds P to
    e4m3 too); blocks of 32 keys split a tile, and P·V stays bfloat16. A row-major copy of
    v always takes bfloat16: the two outputs differ exactly where the FP8 path ran."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, s, 64, generator=gen) for s in (150, 260, 260))
    x = quantize(q, k, v, block=(64, block_n))
    assert x.v.stride(-2) == 1  # key-major
    kernel = compiled("fp8_block", "fused")
    key_major = kernel(*_fp8_args(x), block_m=64, block_n=block_n)
    row_major = kernel(*_fp8_args(x, x.v.contiguous()), block_m=64, block_n=block_n)
    exact = attention64(q, k, v)
    emulated = _rmse(emulate_attention(x), exact)
    assert _rmse(key_major, exact) <= 1.1 * emulated, (_rmse(key_major, exact), emulated)
    assert _rmse(row_major, exact) <= 1.1 * emulated
    fp8_pv = block_n % 64 == 0
    assert torch.equal(key_major, row_major) is not fp8_pv


def test_fp8_pv_zero_value_scale_adds_nothing() -> None:
    """A key block whose value descale is 0 contributes nothing to P·V (the FP8 path folds
    the scale into the accumulator's rescale, dividing by it where it is not 0) and still
    counts in the normaliser."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, s, 64, generator=gen) for s in (130, 256, 256))
    x = quantize(q, k, v, block=(64, 64))
    zeroed = dataclasses.replace(x, v_descale=x.v_descale.clone())
    zeroed.v_descale[:, :, 1] = 0.0
    zeroed.v_descale[:, 1, 0] = 0.0  # the first tile of a head: nothing to keep yet
    out = compiled("fp8_block", "fused")(*_fp8_args(zeroed), block_m=64, block_n=64)
    assert torch.isfinite(out).all()
    emulated = emulate_attention(zeroed).double()
    exact = attention64(
        q, k, v * zeroed.v_descale.repeat_interleave(64, -1)[..., None].bool().double()
    )
    assert _rmse(out, exact) <= 1.1 * _rmse(emulated, exact)


@pytest.mark.parametrize("block", [64, 128, 96])
def test_key_block_reads_per_tile_and_per_key(block: int) -> None:
    """A bias read by key blocks, ``n / block``: one value a tile where ``block`` is a
    multiple of the key tile (64 keys at D=64; KEY_BLOCKS_ALIGNED), one a key otherwise."""
    text = (
        example_path("fused")
        .read_text()
        .replace("in    v[B, H, N, D]\n", "in    v[B, H, N, D]\nin    bias[H, NB]: f32\n")
        .replace("dims  B, H, M, N, D", "dims  B, H, M, N, D, NB")
        .replace("param scale", "param blk: i32 = 64\nparam scale")
    )
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("s[b, h, m, n]"))
    lines.insert(at + 1, "s = s + bias[h, n / blk]")
    text = "\n".join(lines) + "\n"
    kernel = attncc.compile(text)
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 2, s, 64, generator=gen, dtype=torch.float32) for s in (70, 300, 300))
    bias = torch.randn(2, -(-300 // block), generator=gen)
    out = kernel(*(t.to(DEVICE) for t in (q, k, v, bias)), blk=block)
    scores = q.double() @ k.double().transpose(-1, -2) / 8.0
    scores = scores + bias.double().repeat_interleave(block, -1)[None, :, None, :300]
    exact = torch.softmax(scores, -1) @ v.double()
    assert (out.cpu().double() - exact).abs().max().item() < 1e-4


def test_interpreter_rounds_float32_to_e4m3_as_gpus() -> None:
    """Generated modules patch the interpreter's float32 -> e4m3 cast, which dropped a
    rounded-up mantissa's carry (0.123 became 0.0625, not 0.125)."""
    if DEVICE != "cpu":
        pytest.skip("the interpreter's cast; GPUs convert in hardware")
    import triton
    import triton.language as tl

    from attncc.runtime.jit import interpreter

    compiled("fp8_block", "fused")  # a generated module's import patches the interpreter
    x = torch.tensor([0.123, 0.001, 0.97, 300.0, 500.0, -0.0312, 1e-4, 2.5])
    y = torch.empty(8, dtype=torch.float8_e4m3fn)
    with interpreter(True):

        @triton.jit
        def to_e4m3(x_ptr, y_ptr, n: tl.constexpr):  # type: ignore[no-untyped-def]
            offs = tl.arange(0, n)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(tl.float8e4nv))

        to_e4m3[(1,)](x, y, n=8)
    assert torch.equal(y.float(), x.clamp(-448, 448).to(torch.float8_e4m3fn).float())


def test_fp8_pv_with_grouped_heads_and_a_causal_mask() -> None:
    """GQA (kv head h / 2) and a causal mask through the key-major V path: the kv head of the
    V tile, the partial tiles on the diagonal, at D=128, where the interpreter's tiles load
    K and V through tensor descriptors (the key-major one's coordinates). The row-major copy
    of v runs P·V in bfloat16; FP8 P adds e4m3's rounding of P, no more than half again its
    error."""
    text = FP8.replace("dims  B, H, M, N, D, MB, NB", "dims  B, H, KVH, M, N, D, MB, NB")
    for name in ("k", "v"):
        text = text.replace(f"in    {name}[B, H, N, D]", f"in    {name}[B, KVH, N, D]")
        text = text.replace(f"{name}_descale[B, H, NB]", f"{name}_descale[B, KVH, NB]")
        text = text.replace(
            f"{name}_descale[b, h, n / block_n]", f"{name}_descale[b, g, n / block_n]"
        )
    text = text.replace("k[b, h, n, d]", "k[b, g, n, d]").replace("v[b, h, n, d]", "v[b, g, n, d]")
    text = text.replace(
        "p = softmax(s, n)", "let g = h / (H / KVH)\nmask m >= n\np = softmax(s, n)"
    )
    kernel = attncc.compile(text)
    gen = torch.Generator().manual_seed(1)
    # 256 keys: a key-major V's key stride must be a multiple of 16 bytes for TMA
    q = torch.randn(1, 4, 256, 128, generator=gen)
    k, v = (torch.randn(1, 2, 256, 128, generator=gen) for _ in range(2))
    # key blocks of 128: a multiple of the key tile on the GPU (128) and the CPU (64)
    x = quantize(*(t.to(DEVICE) for t in (q, k, v)), block=(64, 128))
    blocks = {"block_m": 64, "block_n": 128}
    assert kernel.launch_config(*_fp8_args(x), **blocks)["tma"] == 1
    key_major = kernel(*_fp8_args(x), **blocks)
    row_major = kernel(*_fp8_args(x, x.v.contiguous()), **blocks)
    scores = q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(128)
    causal = torch.ones(256, 256, dtype=torch.bool).tril()
    weights = torch.softmax(scores.masked_fill(~causal, -math.inf), -1)
    exact = weights @ v.double().repeat_interleave(2, 1)
    assert not torch.equal(key_major, row_major)  # the FP8 path ran
    assert _rmse(key_major, exact) <= 1.5 * _rmse(row_major, exact)
    assert _rmse(row_major, exact) < 0.02


def test_fp8_pv_keys_past_a_cache_length_are_never_read() -> None:
    """A key bound read from a tensor (cache lengths): keys past it may be unwritten memory.
    The key-major V tiles, copied whole by TMA, zero them before P·V in FP8, so NaN there
    never meets a zero probability. (Only compiled runs see the NaN: Triton's interpreter
    reads e4m3's NaN code as a finite value.)"""
    text = FP8.replace(
        "in    v_descale[B, H, NB]: f32", "in    v_descale[B, H, NB]: f32\nin    lens[B]: i32"
    ).replace("p = softmax(s, n)", "mask n < lens[b]\np = softmax(s, n)")
    kernel = attncc.compile(text)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 256, 128, generator=gen) for _ in range(3))
    x = quantize(q, k, v, block=(64, 64))
    lens = torch.tensor([200, 77], dtype=torch.int32)
    poisoned = x.v.clone()  # keeps the key-major strides
    poisoned[0, :, 200:] = float("nan")
    poisoned[1, :, 77:] = float("nan")
    args = [*_fp8_args(x, poisoned), lens.to(DEVICE)]
    assert kernel.launch_config(*args, block_m=64, block_n=64)["tma"] == 1
    out = kernel(*args, block_m=64, block_n=64)
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(128)
    keep = torch.arange(256)[None, :] < lens[:, None].long()
    weights = torch.softmax(scores.masked_fill(~keep[:, None, None, :], -math.inf), -1)
    assert torch.isfinite(out).all()
    assert _rmse(out, weights @ v.double()) < 0.02


def test_fp8_pv_small_weights_stay_e4m3_normals() -> None:
    """A row with one dominant key and 255 keys each weighing e^-5.8125 (0.003) of it: in
    [0, 1] those weights are e4m3 subnormals of 2^-9 steps and round to 0.0039, 31% high;
    times 2^8 (the kernel's weights) they round to 0.75 / 256, 1% low."""
    args = [t.to(DEVICE) for t in small_weight_rows(64, "cpu")]
    kernel = compiled("fp8_block", "fused")
    out, lse = kernel(*args, scale=0.125, block_m=64, block_n=128, return_lse=True)
    assert abs(out[..., 0].float().cpu() - SMALL_WEIGHT_OUT).max().item() <= 0.03 * SMALL_WEIGHT_OUT
    # the lse without the weights' factor: log of the row's sum of exp(score)
    assert abs(lse.cpu() - SMALL_WEIGHT_LSE).max().item() <= 1e-5


FP8_SINK = FP8.replace("p = softmax(s, n)", "p = softmax(s, n, sinks[h])").replace(
    "in    v_descale[B, H, NB]: f32", "in    v_descale[B, H, NB]: f32\nin    sinks[H]: f32"
)


def test_fp8_with_a_sink() -> None:
    """A sink beside FP8 weights (which carry the factor 2^FP8_WEIGHT_LOG2, as the sink's
    term must): `attncc check`'s FP8 rule passes, and on quantize's key-major inputs (P·V in
    FP8) the lse is float64's of the dequantised inputs."""
    assert FP8_SINK.count("sinks") == 2
    kernel = attncc.compile(FP8_SINK)
    results = check(kernel, trials=3, seed=4, device=DEVICE, max_len=80)
    assert all(r.ok for r in results), table(results)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 150, 64, generator=gen) for _ in range(3))
    x = quantize(q, k, v, block=(64, 64))
    sinks = torch.tensor([0.5, 3.0])
    args = [t.to(DEVICE) for t in (*_fp8_args(x), sinks)]
    _, lse = kernel(*args, block_m=64, block_n=64, return_lse=True)

    def dequantised(codes: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
        return codes.double() * descale.double().repeat_interleave(64, -1)[..., :150, None]

    s = dequantised(x.q, x.q_descale) @ dequantised(x.k, x.k_descale).transpose(-1, -2) / 8
    with_sink = torch.cat([s, sinks.double()[None, :, None, None].expand(1, 2, 150, 1)], -1)
    assert (lse.cpu().double() - torch.logsumexp(with_sink, -1)).abs().max().item() <= 1e-5
