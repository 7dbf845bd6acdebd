"""gpt-oss's attention at its own sizes on a GPU: 64 query heads over 8 KV heads of dim 64,
a 128-key window on alternate layers, a learned sink per head, 2k-token prefill in
transformers' layouts (q, k, v [B, H, S, D] views of a [B, S, H, D] projection), each
spec's first call (recorded) and a repeated call (replayed launch plan) against a float64
torch evaluation. Small random checks (``attncc check``) never reach these tile counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attncc

SPECS = Path(attncc.__file__).parent / "specs"

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def expected(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    scale: float,
    window: int | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The attention evaluated by torch in ``dtype`` (float64: the reference; the inputs'
    own dtype: the eager error the tolerance rule scales)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.to(dtype).repeat_interleave(group, 1), v.to(dtype).repeat_interleave(group, 1)
    s = q.to(dtype) @ k.transpose(-1, -2) * scale
    m = torch.arange(q.shape[2], device=q.device)[:, None]
    n = torch.arange(k.shape[2], device=q.device)[None, :]
    keep = m >= n if window is None else (m >= n) & (m - n < window)
    s = s.masked_fill(~keep, float("-inf"))
    sink = sinks.to(dtype)[None, :, None, None].expand(*s.shape[:-1], 1)
    p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1].to(dtype)
    return (p @ v).transpose(1, 2)  # [B, S, H, D], as the specs write o


@pytest.mark.parametrize("window", [128, None])
@pytest.mark.parametrize("seq", [2048, 333])
def test_gpt_oss_sizes_match_the_reference(window: int | None, seq: int) -> None:
    torch.manual_seed(seq)
    b, h, kvh, d = 1, 64, 8, 64
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(b, seq, h, d, device=dev, dtype=dt).transpose(1, 2)
    k = torch.randn(b, seq, kvh, d, device=dev, dtype=dt).transpose(1, 2)
    v = torch.randn(b, seq, kvh, d, device=dev, dtype=dt).transpose(1, 2)
    sinks = torch.randn(h, device=dev, dtype=dt)
    name = "hf_causal_window_sinks" if window is not None else "hf_causal_sinks"
    kernel = attncc.compile(SPECS / f"{name}.attn")
    params = {"scale": d**-0.5, "offset": 0, **({"window": window} if window else {})}
    exact = expected(q, k, v, sinks, d**-0.5, window, torch.float64)
    eager = (expected(q, k, v, sinks, d**-0.5, window, dt) - exact).abs().max().item()
    for call in ("first", "repeated"):
        err = (kernel(q, k, v, sinks, **params).double() - exact).abs().max().item()
        # the house rule: within 3x the eager error in the inputs' dtype (a floor of 1e-3)
        assert err <= 3 * eager + 1e-3, (name, seq, call, err, eager)
