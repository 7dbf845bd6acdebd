"""Host cost of one attention-layer call in the transformers integration, kernel excluded.

A tiny random Llama-like model (CPU) prefills and decodes once per implementation while the
attention function's arguments are recorded; each recorded call is then replayed in a loop
with the kernel itself stubbed out (attncc: ``Kernel._launch`` returns a preallocated output,
so ``Kernel.__call__``'s binding stays in; sdpa: ``scaled_dot_product_attention`` returns one),
and the mask function of a forward likewise. What is left is the Python each layer pays on
top of its kernel: on a GPU it adds to decode's time per token (decode is host-bound).

    python3 benchmarks/hf_overhead.py [--calls 2000] [--profile]

CPU numbers; a GPU machine's slower single-thread CPU scales them up.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attncc.integrations import transformers as attncc_hf
from attncc.runtime.kernel import Kernel

CONFIG = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=128,
    max_position_embeddings=512,
)


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    for _ in range(max(calls // 10, 10)):
        fn()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - began) / calls * 1e6


@contextmanager
def stubbed_kernels() -> Iterator[None]:
    """attncc's and sdpa's kernels return a preallocated output of the right shape."""
    outs: dict[tuple[int, ...], torch.Tensor] = {}

    def out_like(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if shape not in outs:
            outs[shape] = torch.zeros(shape, dtype=dtype)
        return outs[shape]

    def launch(self: Kernel, tensors: dict[str, Any], params: Any, return_lse: bool) -> Any:
        q = tensors["q"]
        b, h, m, _ = q.shape
        return out_like((b, m, h, tensors["v"].shape[-1]), q.dtype), None

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **_: Any) -> torch.Tensor:
        return out_like((*q.shape[:-1], v.shape[-1]), q.dtype)

    real_launch, real_sdpa = Kernel._launch, torch.nn.functional.scaled_dot_product_attention
    Kernel._launch = launch  # type: ignore[method-assign]
    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        Kernel._launch = real_launch  # type: ignore[method-assign]
        torch.nn.functional.scaled_dot_product_attention = real_sdpa


def recorded_calls(impl: str) -> dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict]]:
    """The last attention call of a prefill (12 tokens) and of a decode step, and the mask
    function's call of each, as (function, args, kwargs)."""
    from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)).eval()
    model.set_attn_implementation(impl)
    calls: dict[str, Any] = {}
    phase = ["prefill"]
    attend, make_mask = ALL_ATTENTION_FUNCTIONS[impl], ALL_MASK_ATTENTION_FUNCTIONS[impl]

    def attend_spy(*args: Any, **kwargs: Any) -> Any:
        calls[f"{phase[0]} attention"] = (attend, args, kwargs)
        return attend(*args, **kwargs)

    def mask_spy(*args: Any, **kwargs: Any) -> Any:
        calls[f"{phase[0]} mask"] = (make_mask, args, kwargs)
        return make_mask(*args, **kwargs)

    ALL_ATTENTION_FUNCTIONS._global_mapping[impl] = attend_spy
    ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[impl] = mask_spy
    try:
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            prompt = torch.randint(0, CONFIG["vocab_size"], (1, 12))  # type: ignore[call-overload]
            model(prompt, cache=cache, use_cache=True)
            phase[0] = "decode"
            model(prompt[:, :1], cache=cache, use_cache=True)
    finally:
        ALL_ATTENTION_FUNCTIONS._global_mapping[impl] = attend
        ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[impl] = make_mask
    return calls


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--profile", action="store_true", help="cProfile attncc's decode call")
    args = ap.parse_args(argv)
    attncc_hf.register()
    results: dict[str, float] = {}
    with torch.no_grad(), stubbed_kernels():
        for impl in ("sdpa", "attncc"):
            for name, (fn, a, kw) in sorted(recorded_calls(impl).items()):
                us = per_call_us(lambda fn=fn, a=a, kw=kw: fn(*a, **kw), args.calls)
                results[f"{impl} {name}"] = us
                print(f"{impl:>7} {name:<18} {us:7.1f} us a call (CPU, kernel stubbed)")
        if args.profile:
            fn, a, kw = recorded_calls("attncc")["decode attention"]
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(args.calls):
                fn(*a, **kw)
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    return results


if __name__ == "__main__":
    main()
