"""``target="auto"`` without a GPU: the rule of ``attncc.target`` under a faked CUDA device
(capability, availability, cuda-python), and what ``build`` / ``compile`` return with it.

The suite's conftest sets ATTNCC_TARGET=triton; every test here unsets it first.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch

import attncc
from attncc.api import build
from attncc.ir import nodes as ir
from attncc.ir.nodes import Schedule
from attncc.runtime import nvrtc
from attncc.target import TARGET_ENV, auto_target, resolve_target

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# full, causal and GQA prefill: where the CUDA target was measured 1.15-1.25x Triton
FUSED_PREFILL = ["fused", "causal", "gqa_causal"]


@pytest.fixture(autouse=True)
def no_target_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TARGET_ENV, raising=False)


def fake_device(
    monkeypatch: pytest.MonkeyPatch,
    capability: tuple[int, int] | None = (9, 0),
    cuda_bindings: bool = True,
) -> None:
    """Make this process see a CUDA device of ``capability`` (None: no device), and
    cuda-python's bindings importable or not."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: capability is not None)

    def device_capability(device: object = None) -> tuple[int, int]:
        assert capability is not None, "asked for the capability with no CUDA device"
        return capability

    monkeypatch.setattr(torch.cuda, "get_device_capability", device_capability)
    monkeypatch.setattr(nvrtc, "_find_bindings", lambda: cuda_bindings)


@cache
def optimised(name: str, schedule: Schedule | None = None) -> ir.AttentionKernel:
    return attncc.optimise(EXAMPLES / f"{name}.attn", schedule)[1]


@pytest.mark.parametrize("name", FUSED_PREFILL)
def test_fused_prefill_on_sm90_with_cuda_python_is_cuda(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_device(monkeypatch, (9, 0))
    assert optimised(name).schedule == "fused"
    assert auto_target(optimised(name)) == "cuda"


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0), (12, 0)])
def test_other_gpus_are_triton(
    capability: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_device(monkeypatch, capability)
    assert auto_target(optimised("causal")) == "triton"


def test_without_cuda_python_is_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_device(monkeypatch, (9, 0), cuda_bindings=False)
    assert auto_target(optimised("causal")) == "triton"


def test_without_a_cuda_device_is_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_device(monkeypatch, None)
    assert auto_target(optimised("causal")) == "triton"


@pytest.mark.parametrize(
    ("name", "schedule"),
    [
        ("decode", None),  # decode specs choose split_kv
        ("paged_decode", None),
        ("causal", "split_kv"),  # asked for
        ("naive", None),  # no CUDA kernels
        ("causal", "naive"),
    ],
)
def test_schedules_other_than_fused_are_triton(
    name: str, schedule: Schedule | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_device(monkeypatch, (9, 0))
    kernel = optimised(name, schedule)
    assert kernel.schedule != "fused"
    assert auto_target(kernel) == "triton"


def test_a_tile_index_is_cuda_on_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_device(monkeypatch, (9, 0))
    kernel = optimised("document_mask")
    assert kernel.schedule == "fused" and kernel.tile_index is not None
    assert auto_target(kernel) == "cuda"
    fake_device(monkeypatch, (8, 0))
    assert auto_target(kernel) == "triton"


def test_what_target_cuda_refuses_and_fp8_are_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Specs target cuda cannot render (sinks, value scales read by key) stay on Triton, as
    FP8 specs do for now; asked for by name, target cuda refuses such a spec in one line."""
    fake_device(monkeypatch, (9, 0))
    for name in ("sinks", "fp8_block", "fp8_causal"):
        assert auto_target(optimised(name)) == "triton"
    by_key = (
        (EXAMPLES / "fp8_block.attn")
        .read_text()
        .replace("v_descale[b, h, n / block_n]", "v_descale[b, h, n]")
        .replace("v_descale[B, H, NB]", "v_descale[B, H, N]")
    )
    kernel = attncc.optimise(by_key)[1]
    assert kernel.fp8 and auto_target(kernel) == "triton"
    with pytest.raises(ValueError, match="value scale read by key blocks"):
        attncc.compile(by_key, target="cuda")


def test_the_ir_decides_before_the_device_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode kernels never initialise CUDA or look for cuda-python to be told "triton"."""

    def untouchable(*args: object) -> object:
        raise AssertionError("the rule asked the device")

    monkeypatch.setattr(torch.cuda, "is_available", untouchable)
    monkeypatch.setattr(torch.cuda, "get_device_capability", untouchable)
    monkeypatch.setattr(nvrtc, "_find_bindings", untouchable)
    for name in ("decode", "naive"):
        assert auto_target(optimised(name)) == "triton"


# ----------------------------------------------------------------------------- resolve, build


def test_explicit_targets_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_device(monkeypatch, None)
    monkeypatch.setenv(TARGET_ENV, "triton")  # read for "auto" only
    assert resolve_target("cuda", optimised("decode")) == "cuda"
    fake_device(monkeypatch, (9, 0))
    assert resolve_target("triton", optimised("causal")) == "triton"


@pytest.mark.parametrize(
    ("env", "expected"), [("triton", "triton"), ("auto", "cuda"), ("", "cuda")]
)
def test_the_environment_says_what_auto_means(
    env: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_device(monkeypatch, (9, 0))
    monkeypatch.setenv(TARGET_ENV, env)
    assert resolve_target("auto", optimised("causal")) == expected


def test_the_environment_can_ask_for_cuda_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_device(monkeypatch, None)
    monkeypatch.setenv(TARGET_ENV, "cuda")
    assert resolve_target("auto", optimised("causal")) == "cuda"


def test_a_bad_environment_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TARGET_ENV, "CUDA")
    with pytest.raises(ValueError, match="ATTNCC_TARGET='CUDA' is not a target; set it to one"):
        resolve_target("auto", optimised("causal"))


def test_an_unknown_target_lists_the_targets() -> None:
    message = "unknown target 'hip'; available: auto, triton, cuda"
    with pytest.raises(ValueError, match=message):
        build(EXAMPLES / "causal.attn", target="hip")
    with pytest.raises(ValueError, match=message):
        attncc.compile(EXAMPLES / "causal.attn", target="hip")
    with pytest.raises(ValueError, match=message):  # before the spec is read
        build(EXAMPLES / "no_such_spec.attn", target="hip")


def test_build_defaults_to_auto_and_returns_the_concrete_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_device(monkeypatch, (9, 0))
    causal = build(EXAMPLES / "causal.attn")
    assert causal.target == "cuda" and "__global__" in causal.source
    documents = build(EXAMPLES / "document_mask.attn", target="auto")
    assert documents.target == "cuda" and "__global__" in documents.source
    decode = build(EXAMPLES / "decode.attn", target="auto")
    assert decode.target == "triton" and "@triton.jit" in decode.source
    fake_device(monkeypatch, (8, 0))
    assert build(EXAMPLES / "causal.attn").target == "triton"


def test_compile_without_a_gpu_gives_a_triton_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():  # this machine's own answer where it has none
        fake_device(monkeypatch, None)
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    assert kernel.target == "triton"
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    assert kernel(q, k, v).shape == (1, 2, 9, 16)  # the CPU call path works with the default


def test_compile_on_a_faked_sm90_gives_a_cuda_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_device(monkeypatch, (9, 0))
    kernel = attncc.compile(EXAMPLES / "gqa_causal.attn")
    assert kernel.target == "cuda" and "__global__" in kernel.source


def test_an_auto_cuda_kernel_runs_other_calls_on_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel auto resolved to CUDA sends the calls its sm_90a kernels cannot take (here CPU
    tensors) to the spec's Triton kernel, built on the first such call; an explicit target
    "cuda" keeps refusing them by name."""
    from attncc.reference import reference

    fake_device(monkeypatch, (9, 0))
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    assert kernel.target == "cuda" and kernel.fallback is not None
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=gen) for _ in range(3))
    expected = torch.from_numpy(reference(kernel.spec)(q, k, v))
    assert kernel.backend_for(q, k, v) == "triton"
    assert (kernel(q, k, v).double() - expected).abs().max() < 1e-4
    # params and the row log-sum-exp pass through the fallback
    expected, expected_lse = reference(kernel.spec)(q, k, v, scale=0.3, return_lse=True)
    out, lse = kernel(q, k, v, scale=0.3, return_lse=True)
    assert (out.double() - torch.from_numpy(expected)).abs().max() < 1e-4
    assert (lse.double() - torch.from_numpy(expected_lse)).abs().max() < 1e-4
    # a repeated call of a geometry handed over goes to the fallback directly: the CUDA host
    # module's own entry is not called again
    host_calls: list[int] = []
    forward = kernel._host._forward
    monkeypatch.setattr(kernel._host, "_forward", lambda *a: host_calls.append(1) or forward(*a))
    q2, k2, v2 = (t * 0.5 for t in (q, k, v))
    again = kernel(q2, k2, v2, scale=0.3, return_lse=True)
    assert host_calls == []
    torch.testing.assert_close(
        again, kernel._fallback_kernel(q2, k2, v2, scale=0.3, return_lse=True)
    )
    kernel(q, k[:, :, :8], v[:, :, :8])  # a geometry not handed over yet: the host decides
    assert host_calls == [1]
    with pytest.raises(ValueError, match="target 'cuda' needs CUDA tensors"):
        attncc.compile(EXAMPLES / "causal.attn", target="cuda")(q, k, v)
    monkeypatch.setenv(TARGET_ENV, "")  # unset in effect: the rule, with its fallback
    assert attncc.compile(EXAMPLES / "causal.attn").fallback is not None
    monkeypatch.setenv(TARGET_ENV, "cuda")  # asked for by name: no fallback
    assert attncc.compile(EXAMPLES / "causal.attn").fallback is None
