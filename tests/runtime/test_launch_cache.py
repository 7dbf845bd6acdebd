"""The Triton target's per-geometry launch cache (``Kernel._geometries``): a repeated call
skips the checks and the configuration choice; a changed stride, dtype, device, param or
return_lse never reuses a stale entry. Through the interpreter at tiny shapes, against SDPA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

import attncc
from attncc.runtime.launch_plan import Plans

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNCC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ATTNCC_AUTOTUNE", raising=False)


def _qkv(dtype: torch.dtype = torch.float32, s: int = 24, d: int = 16) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(s * d)
    return [torch.randn(1, 2, s, d, generator=gen).to(dtype) for _ in range(3)]


def _want(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> Any:
    out = sdpa(q.float(), k.float(), v.float(), is_causal=True, scale=scale)
    return out.to(q.dtype)


class CountingChecks:
    """Counts the generated module's ``_check`` calls (the full per-call path)."""

    def __init__(self, module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = module._check

        def check(tensors: Any, params: Any) -> Any:
            self.calls += 1
            return original(tensors, params)

        monkeypatch.setattr(module, "_check", check)


def test_a_repeated_call_skips_the_checks_and_the_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    checks = CountingChecks(kernel.module(True), monkeypatch)
    q, k, v = _qkv()
    first = kernel(q, k, v)
    for _ in range(3):
        torch.testing.assert_close(kernel(q, k, v), first, atol=0, rtol=0)
    torch.testing.assert_close(first, _want(q, k, v), atol=2e-5, rtol=2e-5)
    assert checks.calls == 1 and len(kernel._geometries) == 1
    assert kernel.tuner.sources == {"tuned": 0, "table": 1}
    # new data in the same geometry: the cached entry, and the new data's result
    q2, k2, v2 = (t + 1 for t in (q, k, v))
    torch.testing.assert_close(kernel(q2, k2, v2), _want(q2, k2, v2), atol=2e-5, rtol=2e-5)
    assert checks.calls == 1


def test_changed_strides_take_a_new_entry_and_stay_right() -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    q, k, v = _qkv()
    kernel(q, k, v)
    # the same shapes, other layouts: a permuted copy viewed back, and a sliced wider tensor
    kt = k.transpose(1, 2).contiguous().transpose(1, 2)
    wide = torch.randn(1, 2, 24, 32)
    vs = wide[..., :16]
    assert kt.shape == k.shape and kt.stride() != k.stride()
    torch.testing.assert_close(kernel(q, kt, vs), _want(q, kt, vs), atol=2e-5, rtol=2e-5)
    assert len(kernel._geometries) == 2
    torch.testing.assert_close(kernel(q, k, v), _want(q, k, v), atol=2e-5, rtol=2e-5)


def test_a_changed_dtype_takes_a_new_entry_and_its_own_output_dtype() -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    kernel(*_qkv(torch.float32))
    half = _qkv(torch.float16)
    out = kernel(*half)
    assert out.dtype == torch.float16 and len(kernel._geometries) == 2
    torch.testing.assert_close(out, _want(*half), atol=2e-3, rtol=2e-3)


def test_changed_params_and_return_lse_take_new_entries() -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    q, k, v = _qkv()
    kernel(q, k, v)
    torch.testing.assert_close(
        kernel(q, k, v, scale=0.5), _want(q, k, v, 0.5), atol=2e-5, rtol=2e-5
    )
    out, lse = kernel(q, k, v, return_lse=True)
    torch.testing.assert_close(out, _want(q, k, v), atol=2e-5, rtol=2e-5)
    assert lse.shape == (1, 2, 24) and torch.isfinite(lse).all()
    assert len(kernel._geometries) == 3


def test_the_key_separates_devices_and_refuses_tensor_params() -> None:
    cpu = dict(zip("qkv", _qkv(), strict=True))
    meta = {n: torch.empty(t.shape, device="meta") for n, t in cpu.items()}
    key = Plans.key(cpu, {}, False, False, stream=False)
    assert key is not None and key != Plans.key(meta, {}, False, False, stream=False)
    assert Plans.key(cpu, {"scale": torch.tensor(0.5)}, False, False, stream=False) is None


def test_a_tensor_param_is_refused_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn")
    q, k, v = _qkv()
    for _ in range(2):  # no entry is cached for a call the key refuses: it is checked again
        with pytest.raises(TypeError, match="param 'scale' must be a Python number"):
            kernel(q, k, v, scale=torch.tensor(0.5))
    assert len(kernel._geometries) == 0


def test_pinned_tiling_options_keep_the_module_defaults() -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn", block_n=32)
    q, k, v = _qkv()
    assert kernel.launch_config(q, k, v)["BLOCK_N"] == 32
    torch.testing.assert_close(kernel(q, k, v), _want(q, k, v), atol=2e-5, rtol=2e-5)
    assert kernel.tuner.sources == {"tuned": 0, "table": 0}
