"""HuggingFace transformers (5.x) runs its attention layers on attncc kernels.

    import attncc.integrations.transformers as attncc_hf
    attncc_hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attncc")

``register()`` adds ``"attncc"`` to transformers' ``AttentionInterface`` (the attention
function) and ``AttentionMaskInterface`` (the mask function). The mask function does not
build the ``[B, 1, S, T]`` mask sdpa gets: it hands the attention function an ``AttnccMask``
saying what the mask is (causal or not, the sliding window, the query's offset into the keys,
the 2-D key-padding mask), and the attention function picks the packaged spec
(``attncc/specs/hf_*.attn``) stating exactly that, so the kernels skip masked key tiles and
read no dense mask. A mask pattern no spec states (packed sequences, multimodal overlays,
custom mask functions) is materialised as a dense boolean mask and run by ``hf_dense``: slower,
never wrong. Each spec is compiled once per process and shared by every layer.

transformers is imported here only, never by ``import attncc``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from attncc.api import compile as compile_spec
from attncc.runtime.kernel import Kernel

NAME = "attncc"
SPECS = Path(__file__).resolve().parents[1] / "specs"


@dataclass(frozen=True, slots=True)
class AttnccMask:
    """The mask of one attention call, as the attention function needs it.

    Query ``m`` sits at position ``m + offset`` of the key sequence (``offset`` is the number
    of cached keys before the first query, for a cache that keeps every key). ``key_padding``
    is ``[B, T]``, True where a key is a real token; ``dense`` is ``[B, S, T]``, True where a
    query may see a key, for patterns the flags cannot state (it already holds causality,
    window and padding, and the flags are then unused)."""

    causal: bool
    window: int | None
    offset: int | torch.Tensor  # a tensor only on the way to `dense` (a compiled static cache)
    key_padding: torch.Tensor | None = None
    dense: torch.Tensor | None = None
    # generate() builds the mask ahead of the forward for static caches and passes it back in
    # as the model's attention_mask; transformers' mask preprocessing then reads .ndim (2 for
    # a padding mask to build on) before handing it to attention_mask() below, which returns it
    ndim: ClassVar[int] = 4


@dataclass(frozen=True, slots=True)
class Features:
    """What a call needs of its spec: the key of ``SPEC_TABLE``."""

    mask: str  # "causal", "full", "dense" (boolean [B, S, T]) or "bias" (additive [B, S, T])
    window: bool = False
    softcap: bool = False
    padded: bool = False
    sinks: bool = False


# One row per spec. A call whose features have no row runs under a dense mask (hf_dense, or
# hf_dense_sinks with attention sinks); soft-capping with sinks has no spec and is refused.
SPEC_TABLE: dict[Features, str] = {
    Features("causal"): "hf_causal",
    Features("causal", padded=True): "hf_causal_padded",
    Features("causal", window=True): "hf_causal_window",
    Features("causal", window=True, padded=True): "hf_causal_window_padded",
    Features("causal", softcap=True): "hf_causal_softcap",
    Features("causal", softcap=True, padded=True): "hf_causal_softcap_padded",
    Features("causal", window=True, softcap=True): "hf_causal_window_softcap",
    Features("causal", window=True, softcap=True, padded=True): "hf_causal_window_softcap_padded",
    Features("full"): "hf_full",
    Features("full", padded=True): "hf_full_padded",
    Features("dense"): "hf_dense",
    Features("dense", softcap=True): "hf_dense_softcap",
    Features("bias"): "hf_bias",
    Features("bias", softcap=True): "hf_bias_softcap",
    # attention sinks (gpt-oss: layers alternate a sliding window and full causal attention)
    Features("causal", sinks=True): "hf_causal_sinks",
    Features("causal", padded=True, sinks=True): "hf_causal_sinks_padded",
    Features("causal", window=True, sinks=True): "hf_causal_window_sinks",
    Features("causal", window=True, padded=True, sinks=True): "hf_causal_window_sinks_padded",
    Features("dense", sinks=True): "hf_dense_sinks",
    Features("bias", sinks=True): "hf_bias_sinks",
}
# SPEC_TABLE by (mask, window, softcap, padded, sinks): a tuple hashes and compares in a
# fraction of the ~2 us that building and hashing a Features costs every layer of every call
_SPEC_BY_FLAGS: dict[tuple[str, bool, bool, bool, bool], str] = {
    (f.mask, f.window, f.softcap, f.padded, f.sinks): name for f, name in SPEC_TABLE.items()
}


# the packaged specs compiled so far, and their places in _KERNELS by name
_KERNELS: list[Kernel] = []
_KERNEL_INDEX: dict[str, int] = {}


def _kernel_index(spec_name: str) -> int:
    """Where ``kernel`` finds the compiled spec, compiling it on its first call. torch.compile
    calls this while it traces, as a constant (a spec's compile reads files: traced, it broke
    every attention layer's graph), and takes the kernel from the list by that index."""
    index = _KERNEL_INDEX.get(spec_name)
    if index is None:
        _KERNELS.append(compile_spec(SPECS / f"{spec_name}.attn"))
        index = _KERNEL_INDEX[spec_name] = len(_KERNELS) - 1
    return index


# (marks the function itself, returning it)
torch.compiler.assume_constant_result(_kernel_index)  # type: ignore[no-untyped-call]


def kernel(spec_name: str) -> Kernel:
    """The compiled packaged spec ``attncc/specs/<spec_name>.attn``, once per process."""
    return _KERNELS[_kernel_index(spec_name)]


def register() -> None:
    """Add ``"attncc"`` to transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, attention_mask)
    _import_masking_utils()


# -- the mask function -------------------------------------------------------------------


def _closure(fn: Any) -> dict[str, Any]:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells, strict=True)}


_WINDOW_OVERLAY = "sliding_window_overlay.<locals>.inner_mask"


# transformers.masking_utils, imported by register() (never by ``import attncc``), not by
# each call: a function-level import costs ~2 us, paid by each forward's mask. A module
# global rather than a functools.cache, which torch.compile traces around with a warning
_MASKING_UTILS: Any = None


def _masking_utils() -> Any:
    if _MASKING_UTILS is None:
        _import_masking_utils()
    return _MASKING_UTILS


def _import_masking_utils() -> None:
    global _MASKING_UTILS
    from transformers import masking_utils

    _MASKING_UTILS = masking_utils


def _pattern(mask_function: Any) -> tuple[bool, int | None] | None:
    """(causal, window) when ``mask_function`` is one of transformers' plain causal,
    bidirectional or sliding-window-causal functions, else None (run it densely)."""
    mu = _masking_utils()
    if mask_function is mu.causal_mask_function:
        return True, None
    if mask_function is mu.bidirectional_mask_function:
        return False, None
    # sliding_window_causal_mask_function(w) is and_masks(sliding_window_overlay(w), causal)
    if getattr(mask_function, "__qualname__", "") == "and_masks.<locals>.and_mask":
        parts = _closure(mask_function).get("mask_functions", ())
        if (
            len(parts) == 2
            and parts[1] is mu.causal_mask_function
            and getattr(parts[0], "__qualname__", "") == _WINDOW_OVERLAY
        ):
            window = _closure(parts[0]).get("sliding_window")
            if type(window) is int and window > 0:
                return True, window
    return None


def attention_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | AttnccMask | None = None,
    **kwargs: Any,
) -> AttnccMask:
    """transformers' mask-interface function for ``"attncc"`` (see ``sdpa_mask`` for the
    arguments): the mask's pattern, offsets and key-padding mask, not a materialised mask."""
    mu = _masking_utils()
    if isinstance(attention_mask, AttnccMask):
        return attention_mask  # built by generate() for this very step (see AttnccMask.ndim)
    # a static cache passes its query offset as a tensor so compiled graphs do not break:
    # read here, except under torch.compile, where the mask is built from it on the device
    # (below; reading it would break the graph). An int stays as given: under torch.compile
    # it may be symbolic (a dynamic cache's length), and int() would pin the graph to it
    if isinstance(q_offset, torch.Tensor) and not torch.compiler.is_compiling():
        q_offset = int(q_offset)
    q_start = q_offset
    if mask_function is None:
        mask_function = mu.causal_mask_function
    pattern = _pattern(mask_function)
    if pattern is None:
        dense = mu.sdpa_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_start,
            kv_offset=kv_offset,
            mask_function=mask_function,
            attention_mask=attention_mask,
            allow_is_causal_skip=False,
            use_vmap=kwargs.get("use_vmap", False),
            device=kwargs.get("device", "cpu"),
        )
        assert dense is not None  # no skip was allowed
        return AttnccMask(True, None, q_start - kv_offset, dense=dense[:, 0])
    causal, window = pattern
    padding = None
    if attention_mask is not None:
        # the 2-D mask covers positions 0.. of the whole sequence; the keys start at kv_offset
        padded = mu.prepare_padding_mask(attention_mask, kv_length, kv_offset)
        assert padded is not None
        padding = padded[:, kv_offset : kv_offset + kv_length]
        # a mask of no padding runs the unpadded spec; a compiled model keeps the padded
        # one, as reading the mask's values would break its graph
        if not torch.compiler.is_compiling() and bool(padding.all()):
            padding = None
    mask = AttnccMask(causal, window, q_start - kv_offset, key_padding=padding)
    if isinstance(q_start, torch.Tensor):
        dense = _dense_from_flags(mask, batch_size, q_length, kv_length, q_start.device)
        return AttnccMask(True, None, 0, dense=dense)
    return mask


# -- the attention function --------------------------------------------------------------


def _mask_of(
    module: Any,
    mask: Any,
    q_len: int,
    kv_len: int,
    sliding_window: int | None,
    is_causal: bool | None,
) -> AttnccMask:
    if isinstance(mask, AttnccMask):
        return mask
    if mask is None:
        # no mask function ran (a model that builds none): transformers' is_causal, and the
        # queries are the last q_len keys (decode and prefill alike)
        causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))
        return AttnccMask(causal, sliding_window if causal else None, kv_len - q_len)
    if isinstance(mask, torch.Tensor) and mask.ndim == 4:
        # a 4-D mask the caller built: [B or 1, 1, S, T] (per-head masks have no spec)
        if mask.shape[1] != 1:
            raise NotImplementedError(
                f"attncc: a 4-D attention_mask with {mask.shape[1]} heads; attncc takes masks "
                "shared by all heads ([B, 1, S, T])"
            )
        # boolean: True where a query may see a key; float: added to the scores
        return AttnccMask(False, None, 0, dense=mask[:, 0])
    raise TypeError(
        f"attncc: attention_mask must be what attncc's mask function returns, None or a 4-D "
        f"tensor, got {type(mask).__name__}"
        + (f" of shape {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else "")
        + " (was the model loaded with attn_implementation='attncc' after register()?)"
    )


def _dense_from_flags(mask: AttnccMask, batch: int, q_len: int, kv_len: int, device: Any) -> Any:
    m = torch.arange(q_len, device=device)[:, None] + mask.offset
    n = torch.arange(kv_len, device=device)[None, :]
    allowed = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if mask.causal:
        allowed &= m >= n
        if mask.window is not None:
            allowed &= m - n < mask.window
    dense = allowed.expand(batch, q_len, kv_len)
    if mask.key_padding is not None:
        dense = dense & mask.key_padding[:, None, :]
    return dense


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface function for ``"attncc"``: query ``[B, H, S, D]``,
    key and value ``[B, KVH, T, D]`` (any strides), returns ``([B, S, H, D], None)``."""
    if dropout:
        raise NotImplementedError(
            f"attncc: attention dropout ({dropout}) is not supported; set the config's "
            "attention_dropout to 0 or call model.eval()"
        )
    if kwargs.get("output_attentions"):
        raise NotImplementedError(
            "attncc: output_attentions=True needs the attention weights, which attncc's "
            "kernels never materialise; use attn_implementation='eager' for them"
        )
    batch, _, q_len, head_dim = query.shape
    kv_len = key.shape[2]
    mask = _mask_of(module, attention_mask, q_len, kv_len, sliding_window, is_causal)
    extras: dict[str, Any] = {}
    params: dict[str, Any] = {"scale": float(scaling) if scaling is not None else head_dim**-0.5}
    window = padded = False
    if mask.dense is not None:
        dense = mask.dense.expand(batch, q_len, kv_len)
        if dense.dtype == torch.bool:
            kind = "dense"
            extras["allowed"] = dense
        else:
            kind = "bias"
            extras["bias"] = dense.to(query.dtype)
    else:
        kind = "causal" if mask.causal else "full"
        if mask.causal:
            params["offset"] = mask.offset
            if mask.window is not None:
                window = True
                params["window"] = mask.window
        if mask.key_padding is not None:
            padded = True
            extras["kpm"] = mask.key_padding
    if softcap is not None:
        params["cap"] = float(softcap)
    if s_aux is not None:
        extras["sinks"] = s_aux
    spec_name = _SPEC_BY_FLAGS.get((kind, window, softcap is not None, padded, s_aux is not None))
    if spec_name is None and kind in ("causal", "full"):
        # a combination no spec states: the same mask, materialised
        dense = _dense_from_flags(mask, batch, q_len, kv_len, query.device)
        spec_name = _SPEC_BY_FLAGS.get(
            ("dense", False, softcap is not None, False, s_aux is not None)
        )
        extras = {"allowed": dense, **({"sinks": s_aux} if s_aux is not None else {})}
        params = {k: params[k] for k in ("scale", "cap") if k in params}
    if spec_name is None:
        raise NotImplementedError(
            "attncc: logit soft-capping together with attention sinks (s_aux) has no attncc "
            "spec; run this model with attn_implementation='eager'"
        )
    # q, k and v by position: every hf_* spec declares them first, and a keyword costs
    # the generated _bind a lookup each
    out = kernel(spec_name)(query, key, value, **extras, **params)
    return out, None
