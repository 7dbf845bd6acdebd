"""``attncc.flash_attn_func``: flash-attn's call, run by a kernel compiled from a spec.

``flash_attn_func(q, k, v, causal=..., window_size=..., softcap=..., alibi_slopes=...)`` takes
flash-attn's ``[B, S, H, D]`` tensors (grouped-query heads by head counts) and runs the spec
that ``flash_attn_spec`` writes for the options asked for: one spec, and one compile per
process, per combination. The semantics are flash-attn's: causal and window masks aligned to
the bottom-right corner (query ``i`` sits at key position ``i + N - M``), a window
``(left, right)`` keeping keys ``[i + N - M - left, i + N - M + right]`` (``-1``: unbounded),
soft-capping of the scaled scores, then ALiBi's ``-slope * |i + N - M - j|``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

__all__ = ["flash_attn_func", "flash_attn_spec"]


def flash_attn_spec(
    causal: bool = False,
    window: tuple[bool, bool] = (False, False),
    softcap: bool = False,
    alibi: str | None = None,
) -> str:
    """Spec text for one combination of flash-attn's options.

    ``window`` says which sides of the window are bounded (the sizes are the ``i32`` params
    ``window_left``/``window_right``); ``causal`` bounds the right side at 0 itself.
    ``softcap`` adds the ``f32`` param ``softcap``; ``alibi`` is ``"H"`` (slopes ``[H]``) or
    ``"BH"`` (``[B, H]``). Every spec takes ``q[B, M, H, D]``, ``k``/``v[B, N, KVH, D]``,
    the param ``scale`` (default ``1 / sqrt(D)``) and returns ``o[B, M, H, D]``."""
    left, right = window
    name = "flash_attn" + "".join(
        suffix
        for on, suffix in (
            (causal, "_causal"),
            (left, "_left"),
            (right and not causal, "_right"),
            (softcap, "_softcap"),
            (alibi is not None, f"_alibi{(alibi or '').lower()}"),
        )
        if on
    )
    lines = [
        f"attention {name}",
        "dims B, M, N, H, KVH, D",
        "in q[B, M, H, D]",
        "in k[B, N, KVH, D]",
        "in v[B, N, KVH, D]",
    ]
    if alibi == "H":
        lines.append("in alibi_slopes[H]")
    elif alibi == "BH":
        lines.append("in alibi_slopes[B, H]")
    elif alibi is not None:
        raise ValueError(f"alibi must be 'H', 'BH' or None, got {alibi!r}")
    lines.append("param scale: f32 = 1 / sqrt(D)")
    if softcap:
        lines.append("param softcap: f32")
    if left:
        lines.append("param window_left: i32")
    if right and not causal:
        lines.append("param window_right: i32")
    lines += [
        "let g = h / (H / KVH)",
        "s[b, h, m, n] = q[b, m, h, d] * k[b, n, g, d] * scale",
    ]
    if softcap:
        lines.append("s = softcap * tanh(s / softcap)")
    if alibi is not None:
        slope = "alibi_slopes[h]" if alibi == "H" else "alibi_slopes[b, h]"
        lines.append(f"s = s - {slope} * abs(m + N - M - n)")
    # the query's diagonal is key m + N - M (bottom-right alignment, as flash-attn)
    if causal:
        lines.append("mask n <= m + N - M")
    elif right:
        lines.append("mask n <= m + N - M + window_right")
    if left:
        lines.append("mask n >= m + N - M - window_left")
    lines += [
        "p = softmax(s, n)",
        "o[b, m, h, d] = p[b, h, m, n] * v[b, n, g, d]",
        "out o",
    ]
    return "\n".join(lines) + "\n"


@cache
def _kernel(
    causal: bool, window: tuple[bool, bool], softcap: bool, alibi: str | None, target: str
) -> Any:
    from attncc.api import compile as compile_spec

    return compile_spec(flash_attn_spec(causal, window, softcap, alibi), target)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    target: str = "auto",
) -> torch.Tensor:
    """flash-attn's ``flash_attn_func`` (``[B, S, H, D]``), with flash-attn's semantics (the
    module docstring). ``return_attn_probs=True`` returns ``(out, lse)`` with the lse
    ``[B, H, S_q]``, not the probabilities. Dropout is not supported (``dropout_p`` must be
    0); ``deterministic`` is accepted and has no effect (the forward, and the backward of
    the specs this wrapper builds, use no atomics)."""
    if dropout_p != 0.0:
        raise ValueError(f"flash_attn_func: dropout is not supported, got dropout_p={dropout_p}")
    if len(window_size) != 2:
        raise ValueError(f"window_size must be (left, right), got {window_size!r}")
    left, right = (int(w) for w in window_size)
    alibi = None
    if alibi_slopes is not None:
        alibi = "H" if alibi_slopes.dim() == 1 else "BH"
        if alibi_slopes.dim() not in (1, 2):
            raise ValueError(
                f"alibi_slopes must be [H] or [B, H], got shape {tuple(alibi_slopes.shape)}"
            )
    kernel = _kernel(bool(causal), (left >= 0, right >= 0), softcap > 0.0, alibi, target)
    params: dict[str, Any] = {}
    if softmax_scale is not None:
        params["scale"] = float(softmax_scale)
    if softcap > 0.0:
        params["softcap"] = float(softcap)
    if left >= 0:
        params["window_left"] = left
    if right >= 0 and not causal:
        params["window_right"] = right
    if alibi_slopes is not None:
        params["alibi_slopes"] = alibi_slopes
    result = kernel(q, k, v, return_lse=return_attn_probs, **params)
    return result  # type: ignore[no-any-return]
