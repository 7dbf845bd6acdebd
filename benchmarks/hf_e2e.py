"""End-to-end tokens/s of a transformers model with attn_implementation attncc, sdpa, flex.

A randomly initialised Llama-like model (default: 8 layers, hidden 2048, 16 heads, 8 kv
heads, bf16; ~0.5 B parameters, nothing downloaded) prefills a batch of prompts through its
KV cache, then decodes greedily one token at a time. Per implementation it prints and (with
--json) appends one JSON line: prefill tokens/s, decode tokens/s, and how far its prefill
logits and greedy tokens are from the first implementation's (same weights, same prompts).

    python3 benchmarks/hf_e2e.py [--impls sdpa,attncc,flex_attention] [--prefill 2048]
                                 [--decode 64] [--batch 1] [--json FILE]
    python3 benchmarks/hf_e2e.py --tiny     # CPU, seconds: the same code at toy sizes

Each implementation runs once untimed (compiling attncc's kernels and flex's graphs), then
--rounds timed rounds, keeping each phase's best.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attncc.integrations import transformers as attncc_hf

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
REALISTIC = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=8,
    vocab_size=32000,
    max_position_embeddings=8192,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="toy sizes on the CPU, fp32")
    ap.add_argument(
        "--impls",
        default=None,
        help="default sdpa,attncc,flex_attention (tiny: no flex); the first is the reference",
    )
    ap.add_argument("--prefill", type=int, default=None, help="prompt tokens (default 2048)")
    ap.add_argument("--decode", type=int, default=None, help="greedy steps (default 64)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="append one JSON line per impl")
    args = ap.parse_args(argv)
    if args.tiny:
        args.impls = args.impls or "sdpa,attncc"
        args.prefill = args.prefill or 12
        args.decode = args.decode or 3
        args.dtype = args.dtype or "fp32"
        args.rounds = 1
    args.impls = (args.impls or "sdpa,attncc,flex_attention").split(",")
    args.prefill = args.prefill or 2048
    args.decode = args.decode or 64
    args.dtype = args.dtype or "bf16"
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(
    model: Any, prompt: torch.Tensor, steps: int
) -> tuple[float, float, torch.Tensor, torch.Tensor]:
    """(prefill seconds, decode seconds, last-position prefill logits, greedy tokens)."""
    from transformers import DynamicCache

    device = prompt.device
    cache = DynamicCache(config=model.config)
    sync(device)
    start = time.perf_counter()
    out = model(prompt, cache=cache, use_cache=True, logits_to_keep=1)
    sync(device)
    prefill_s = time.perf_counter() - start
    prefill_logits = out.logits[:, -1].float()
    token = prefill_logits.argmax(-1, keepdim=True)
    tokens = [token]
    start = time.perf_counter()
    for _ in range(steps):
        out = model(token, cache=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
    sync(device)
    decode_s = time.perf_counter() - start
    return prefill_s, decode_s, prefill_logits, torch.cat(tokens, dim=1)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    from transformers import AutoModelForCausalLM, LlamaConfig

    attncc_hf.register()
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    dtype = DTYPES[args.dtype]
    config = LlamaConfig(**(TINY if args.tiny else REALISTIC))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    prompt = torch.randint(
        0, config.vocab_size, (args.batch, args.prefill), generator=torch.Generator().manual_seed(1)
    ).to(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows: list[dict[str, Any]] = []
    first: tuple[torch.Tensor, torch.Tensor] | None = None
    print(
        f"device {gpu}, {args.dtype}, batch {args.batch}, "
        f"prefill {args.prefill}, decode {args.decode}"
    )
    print(f"{'impl':>15} {'prefill tok/s':>14} {'decode tok/s':>13} {'logit diff':>11} same tokens")
    for impl in args.impls:
        model.set_attn_implementation(impl)
        with torch.no_grad():
            _, _, logits, tokens = run_once(model, prompt, args.decode)  # untimed: compiles
            best_prefill = best_decode = float("inf")
            for _ in range(args.rounds):
                prefill_s, decode_s, _, _ = run_once(model, prompt, args.decode)
                best_prefill = min(best_prefill, prefill_s)
                best_decode = min(best_decode, decode_s)
        if first is None:
            first = (logits, tokens)
        logit_diff = (logits - first[0]).abs().max().item()
        # greedy decoding in bf16 may part ways after a near tie; count the agreeing prefix
        agree = (tokens == first[1]).cumprod(dim=1).sum(dim=1).min().item()
        row = {
            "impl": impl,
            "device": gpu,
            "dtype": args.dtype,
            "batch": args.batch,
            "prefill": args.prefill,
            "decode": args.decode,
            "layers": config.num_hidden_layers,
            "hidden": config.hidden_size,
            "heads": f"{config.num_attention_heads}:{config.num_key_value_heads}",
            "prefill_tok_s": args.batch * args.prefill / best_prefill,
            "decode_tok_s": args.batch * args.decode / best_decode,
            "max_logit_diff_vs_first": logit_diff,
            "greedy_tokens_agreeing": int(agree),
            "reference": args.impls[0],
        }
        rows.append(row)
        print(
            f"{impl:>15} {row['prefill_tok_s']:>14.0f} {row['decode_tok_s']:>13.1f} "
            f"{logit_diff:>11.3g} {agree:>5}/{args.decode + 1:<6}"
        )
        if args.json is not None:
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    main()
