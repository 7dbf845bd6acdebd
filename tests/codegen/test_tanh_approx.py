"""tanh.approx.f32 for the dtypes of plan.TANH_APPROX_DTYPES, the exact tanh elsewhere.

The decision rests on an error model checked here without a GPU: every tanh of a float64
evaluation of the soft-capping specs off by the PTX ISA's bound on tanh.approx.f32's relative
error (2^-10.987; all one sign, or a random sign per score), on `attncc check`'s draws, must
pass the tolerance rule exactly for the dtypes that use it. Then the code: the forward kernels
of both targets reach tanh.approx.f32 for those dtypes only (Triton compiled for sm_90 on the
CPU, CUDA through nvcc's front end), the backward and the interpreter never.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import attncc
import attncc.reference as reference_module
from attncc import checking
from attncc.codegen import backward as backward_codegen
from attncc.codegen import cuda as cuda_backend
from attncc.codegen import plan
from attncc.reference import reference, round_to
from attncc.runtime.jit import load_module
from attncc.tolerance import compare

ROOT = Path(__file__).resolve().parents[2]
SPECS = (ROOT / "examples" / "softcap.attn", ROOT / "attncc" / "specs" / "hf_causal_softcap.attn")
PTX_BOUND = 2.0**-10.987  # tanh.approx.f32's maximum relative error (PTX ISA)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def approx_tanh(sign: str, rng: np.random.Generator) -> Any:
    """np.tanh off by the bound, as the kernels' approximate tanh is at worst: every score
    the same way ("+" or "-") or each its own way ("random"); exactly +-1 from the
    saturation point on."""

    def tanh(x: Any) -> Any:
        t = np.tanh(x)
        error = rng.choice([-PTX_BOUND, PTX_BOUND], np.shape(t)) if sign == "random" else PTX_BOUND
        off = t * (1.0 - error if sign == "-" else 1.0 + error)
        return np.where(np.abs(x) < plan.TANH_APPROX_SATURATION, off, np.sign(x))

    return tanh


def failures(
    spec: Path, dtype: str, sign: str, trials: int, seed: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, int]:
    """(output, log-sum-exp) verdicts failed by the error model on `attncc check`'s draws:
    float64 math with the approximate tanh, the output stored in ``dtype`` and the
    log-sum-exp in float32, as the kernel stores them, against the float64 reference."""
    kernel = attncc.compile(spec, target="triton").ir
    out_failed = lse_failed = 0
    for i, case in enumerate(checking.cases(kernel, trials, seed, (DTYPES[dtype],))):
        rng = np.random.default_rng(i)
        inputs = checking.make_inputs(kernel, case.sizes, case.dtype, "cpu", rng)
        exact, exact_lse = reference(spec)(**inputs, **case.params, return_lse=True)
        naive, naive_lse = reference(spec, rounding=dtype)(**inputs, **case.params, return_lse=True)
        with monkeypatch.context() as m:
            m.setitem(reference_module._FUNCTIONS, "tanh", approx_tanh(sign, rng))
            out, lse = reference(spec)(**inputs, **case.params, return_lse=True)
        out_failed += not compare(round_to(out, dtype), exact, naive, dtype).ok
        lse_failed += not compare(round_to(lse, "float32"), exact_lse, naive_lse, "float32").ok
    return out_failed, lse_failed


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_error_model_for_each_dtype(spec: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """60 draws, each score's error at the bound with a random sign. bfloat16 (uses it): no
    output fails, at most one log-sum-exp does: a row of one visible score whose naive bf16
    rounding happened to be 20x below its typical size (softcap, draw 53: lse -0.164, naive
    error 2.4e-5, the model's 8.1e-5, bound 5.8e-5). float16: 6 (softcap) and 16 (hf) of 60
    log-sum-exps fail; float32: every output. Those two keep the exact formula."""
    counts = {d: failures(spec, d, "random", 60, 3, monkeypatch) for d in DTYPES}
    assert "bfloat16" in plan.TANH_APPROX_DTYPES and len(plan.TANH_APPROX_DTYPES) == 1
    assert counts["bfloat16"][0] == 0 and counts["bfloat16"][1] <= 1, counts
    assert counts["float16"][1] >= 5, counts
    assert counts["float32"][0] >= 50, counts


def test_one_signed_error_keeps_bfloat16_outputs_within_the_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every score off the same way (a systematic bias): bfloat16 outputs still pass; a
    log-sum-exp fails in 1 of 60 draws of each spec, as with random signs."""
    for spec in SPECS:
        for sign in ("+", "-"):
            out_failed, lse_failed = failures(spec, "bfloat16", sign, 60, 3, monkeypatch)
            assert out_failed == 0 and lse_failed <= 1, (spec.stem, sign, lse_failed)


def test_exact_saturation_keeps_bfloat16_log_sum_exps_within_the_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why scores of |x| >= 8 must give exactly +-1 (as tanh.approx.f32 does by itself:
    tests/gpu/test_gpu_tanh_approx.py): where every score of a row saturates at a small cap
    (the hf spec draws caps down to 0.1), the naive bf16 log-sum-exp error is one rounding of
    the cap, which a one-signed approximation error passes (1 of these 60 draws; up to 2.6x
    the bound in 200); saturated exactly, none."""
    assert failures(SPECS[1], "bfloat16", "+", 60, 11, monkeypatch)[1] == 0
    monkeypatch.setattr(plan, "TANH_APPROX_SATURATION", np.inf)
    assert failures(SPECS[1], "bfloat16", "+", 60, 11, monkeypatch)[1] >= 1


# ----------------------------------------------------------------------------- the code


def test_triton_forward_picks_tanh_by_the_output_dtype_and_backward_stays_exact() -> None:
    kernel = attncc.compile(SPECS[0], target="triton")
    source = kernel.path.read_text()
    # the cap joins the scale and log2(e) (plan.scaled_score_mods, outer_factors)
    assert "qk_scale = (p_scale / p_cap)" in source
    assert "s2 = (_tanh_as(s, t_o.dtype.element_ty)) * score_out" in source
    assert "if _INLINE_PTX and (float_type == tl.bfloat16):" in source
    assert '"tanh.approx.f32 $0, $1;"' in source
    assert "_INLINE_PTX = tl.constexpr(not _INTERPRETED)" in source
    backward = backward_codegen.render(kernel.ir).source
    assert "_tanh(" in backward and "_tanh_as" not in backward and "tanh.approx" not in backward
    # a spec without tanh gets neither helper
    plain = attncc.compile(ROOT / "examples" / "causal.attn", target="triton").path.read_text()
    assert "_tanh" not in plain and "_INLINE_PTX" not in plain


def test_interpreted_module_keeps_the_exact_tanh() -> None:
    kernel = attncc.compile(SPECS[0], target="triton")
    assert not bool(kernel.module(interpreted=True)._INLINE_PTX)


def _triton_ptx(dtype: str) -> str:
    """The softcap forward kernel compiled for sm_90 (on the CPU: Triton needs no GPU to
    compile), small tiles."""
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = attncc.compile(SPECS[0], target="triton")
    fn = load_module(kernel.path, interpreted=False)._attncc_softcap_fwd
    constexprs: dict[str, Any] = {
        "HEAD_D": 64,
        "HEAD_DV": 64,
        "BLOCK_M": 32,
        "BLOCK_N": 32,
        "BLOCK_D": 64,
        "BLOCK_DV": 64,
        "STORE_LSE": True,
        "DOT_PRECISION": "ieee" if dtype == "fp32" else "tf32",
        "USE_TMA": False,
        "desc_k": None,
        "desc_v": None,
    }
    signature = {}
    for p in fn.params:
        if p.name in constexprs:
            signature[p.name] = "constexpr"
        elif p.name.startswith("t_"):
            signature[p.name] = f"*{dtype}"
        elif p.name == "lse_ptr":
            signature[p.name] = "*fp32"
        else:
            signature[p.name] = "fp32" if p.name.startswith("p_") else "i32"
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return str(triton_compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"])


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_triton_compiles_tanh_approx_for_bfloat16_only(dtype: str) -> None:
    ptx = _triton_ptx(dtype)
    assert ("tanh.approx.f32" in ptx) == (dtype == "bf16")
    assert "ex2.approx" in ptx  # the softmax's exponential, either way


NVCC = shutil.which("nvcc")


def test_cuda_header_specialises_tanh_for_bfloat16_only() -> None:
    header = dict(cuda_backend.headers())["attncc_cuda.cuh"]
    assert "float attncc_tanh_as(float x) { return attncc_tanh(x); }" in header
    assert "float attncc_tanh_as<bf16_t>(float x)" in header
    assert "attncc_tanh_as<f16_t>" not in header and "attncc_tanh_as<float>" not in header
    # tanh.approx.f32 saturates by itself (tests/gpu/test_gpu_tanh_approx.py): no clamp
    assert "fabsf(x)" not in header.split("attncc_tanh_as<bf16_t>")[1].split("}")[0]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA sources are rendered, not compiled")
@pytest.mark.parametrize("element", ["bf16_t", "f16_t", "float"])
def test_cuda_compiles_tanh_approx_for_bfloat16_only(element: str, tmp_path: Path) -> None:
    checked, kernel = attncc.optimise(SPECS[0])
    rendered = cuda_backend.render(kernel, checked.spec)
    for name, text in rendered.headers:
        (tmp_path / name).write_text(text)
    source = tmp_path / "softcap.fma.cu"
    source.write_text(dict(rendered.sources)["fma"])
    out = tmp_path / f"{element}.ptx"
    cmd = [str(NVCC), "-arch=sm_90", "-std=c++17", "--ptx", f"-DATTNCC_ELEM={element}"]
    done = subprocess.run([*cmd, str(source), "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("tanh.approx.f32" in out.read_text()) == (element == "bf16_t")
