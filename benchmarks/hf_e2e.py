"""End-to-end tokens/s of a transformers model with attn_implementation attncc, sdpa, flex.

A randomly initialised model of one family (``--family``: llama, qwen2, mistral, gemma2,
gemma3, gpt_oss; 0.4-0.7 B parameters, bf16, nothing downloaded; each keeps what sets its
attention apart: Mistral's sliding window, Gemma 2's windows and soft-capping, Gemma 3's 5:1
sliding:full layers, gpt-oss's sinks and windows) prefills a batch of prompts through its KV
cache, then decodes greedily one token at a time. Per implementation it prints and (with
--json) appends one JSON line: prefill tokens/s, decode tokens/s, and how far its prefill
logits and greedy tokens are from the reference's (the first implementation that ran: same
weights, same prompts). An implementation transformers refuses for a family (sdpa with
soft-capping or sinks, flex_attention where it has no support) is an error row, not a crash.

    python3 benchmarks/hf_e2e.py [--family llama] [--impls sdpa,attncc,flex_attention]
                                 [--prefill 2048] [--decode 64] [--batch 1] [--json FILE]
    python3 benchmarks/hf_e2e.py --tiny     # CPU, seconds: the same code at toy sizes
    python3 benchmarks/hf_e2e.py --compile reduce-overhead --cache static   # torch.compile
    python3 benchmarks/hf_e2e.py --table FILE   # a --json file's table, attncc beside the others

Each implementation runs once untimed (compiling attncc's kernels and flex's graphs), then
--rounds timed rounds, keeping each phase's best. ``--compile MODE`` runs the model's forward
through ``torch.compile(mode=MODE)`` (reset between implementations); its rows add the
graphs dynamo compiled and its graph breaks over the untimed and timed rounds. ``--cache
static`` decodes through a StaticCache of prefill + decode slots (transformers' cache for
compiled decoding) instead of a DynamicCache.
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
# the Llama-like model every family's sizes start from (~0.5 B parameters)
REALISTIC = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=32000,
    max_position_embeddings=8192,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    max_position_embeddings=256,
)
# the layer types of Gemma 3's 5:1 pattern (12 layers: two full ones)
GEMMA3_LAYERS = (["sliding_attention"] * 5 + ["full_attention"]) * 2
# per family: transformers' config class, its realistic sizes over REALISTIC (the attention
# shapes of a released model of the family, fewer layers, a 32k vocabulary), its tiny ones
# over TINY (windows of 4 tokens, under the tiny prompt's 12)
FAMILIES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}, {}),
    # Qwen2.5-1.5B's attention: 12 query heads over 2 kv heads, biased q/k/v projections
    "qwen2": (
        "Qwen2Config",
        dict(
            hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2
        ),
        {},
    ),
    # every layer slides a 1024-token window (shorter than the 2048-token prompt)
    "mistral": ("MistralConfig", dict(sliding_window=1024), dict(sliding_window=4)),
    # Gemma 2 2B's attention (head dim 256), layers alternating a 1024 window and full
    # attention, scores soft-capped at 50
    "gemma2": (
        "Gemma2Config",
        dict(
            hidden_size=2304,
            intermediate_size=9216,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=1024,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        ),
        dict(
            sliding_window=4,
            query_pre_attn_scalar=16,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=30.0,
        ),
    ),
    # Gemma 3 1B's attention (4 query heads over 1, head dim 256), 5 layers of a 512 window
    # to each full one
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            hidden_size=1152,
            intermediate_size=6912,
            num_hidden_layers=len(GEMMA3_LAYERS),
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=512,
            layer_types=GEMMA3_LAYERS,
        ),
        dict(
            sliding_window=4,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    # gpt-oss-20b's attention (64 query heads over 8, head dim 64, a learned sink per head),
    # layers alternating a 128 window and full attention; 4 experts, 2 per token
    "gpt_oss": (
        "GptOssConfig",
        dict(
            intermediate_size=2048,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            sliding_window=128,
            num_local_experts=4,
            num_experts_per_tok=2,
            # gpt-oss's context, which its YaRN factor (32 over 4096) is stated for
            max_position_embeddings=131072,
        ),
        dict(sliding_window=4, num_local_experts=2, num_experts_per_tok=1),
    ),
}
# the reference where sdpa cannot run the family (soft-capping, sinks): eager
REFERENCE = {"gemma2": "eager", "gpt_oss": "eager"}


def family_config(family: str, tiny: bool) -> Any:
    """The family's transformers config at realistic (or tiny) sizes."""
    import transformers

    class_name, realistic, toy = FAMILIES[family]
    sizes = {**TINY, **toy} if tiny else {**REALISTIC, **realistic}
    return getattr(transformers, class_name)(**sizes)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="toy sizes on the CPU, fp32")
    ap.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    ap.add_argument(
        "--impls",
        default=None,
        help="default sdpa,attncc,flex_attention, after eager for gemma2 and gpt_oss (tiny: "
        "the reference and attncc); the first that runs is the reference",
    )
    ap.add_argument("--prefill", type=int, default=None, help="prompt tokens (default 2048)")
    ap.add_argument("--decode", type=int, default=None, help="greedy steps (default 64)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--compile",
        default=None,
        metavar="MODE",
        help="torch.compile the model's forward in this mode (default, reduce-overhead, ...)",
    )
    ap.add_argument("--cache", choices=("dynamic", "static"), default="dynamic")
    ap.add_argument("--json", type=Path, default=None, help="append one JSON line per impl")
    ap.add_argument(
        "--table", type=Path, default=None, help="print the table of a --json file and stop"
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="after timing, torch.profiler tables (device time, then host time) of one "
        "prefill and of 4 decode steps per implementation",
    )
    args = ap.parse_args(argv)
    reference = REFERENCE.get(args.family)
    if args.tiny:
        args.impls = args.impls or f"{reference or 'sdpa'},attncc"
        args.prefill = args.prefill or 12
        args.decode = args.decode or 3
        args.dtype = args.dtype or "fp32"
        args.rounds = 1
    default = "sdpa,attncc,flex_attention"
    args.impls = (args.impls or (f"{reference},{default}" if reference else default)).split(",")
    args.prefill = args.prefill or 2048
    args.decode = args.decode or 64
    args.dtype = args.dtype or "bf16"
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(
    model: Any, prompt: torch.Tensor, steps: int, every_position: bool = False, static: bool = False
) -> tuple[float, float, torch.Tensor, torch.Tensor]:
    """(prefill seconds, decode seconds, prefill logits, greedy tokens); the logits of the
    last position [B, V], or with ``every_position`` of each [B, S, V]. ``static``: through a
    StaticCache of every position's slot."""
    from transformers import DynamicCache, StaticCache

    device = prompt.device
    if static:
        cache = StaticCache(config=model.config, max_cache_len=prompt.shape[1] + steps + 1)
    else:
        cache = DynamicCache(config=model.config)
    sync(device)
    start = time.perf_counter()
    out = model(prompt, cache=cache, use_cache=True, logits_to_keep=0 if every_position else 1)
    sync(device)
    prefill_s = time.perf_counter() - start
    prefill_logits = out.logits.float() if every_position else out.logits[:, -1].float()
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    tokens = [token]
    start = time.perf_counter()
    for _ in range(steps):
        out = model(token, cache=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
    sync(device)
    decode_s = time.perf_counter() - start
    return prefill_s, decode_s, prefill_logits, torch.cat(tokens, dim=1)


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def timed(
    model: Any, impl: str, prompt: torch.Tensor, args: argparse.Namespace
) -> tuple[float, float, torch.Tensor, torch.Tensor]:
    """(best prefill s, best decode s, prefill logits, greedy tokens) of one implementation."""
    model.set_attn_implementation(impl)
    static = args.cache == "static"
    if args.compile:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        model.forward = torch.compile(type(model).forward.__get__(model), mode=args.compile)
    try:
        with torch.no_grad():
            # untimed: compiles; every position's logits, for the agreement with the reference
            _, _, logits, tokens = run_once(
                model, prompt, args.decode, every_position=True, static=static
            )
            best_prefill = best_decode = float("inf")
            for _ in range(args.rounds):
                prefill_s, decode_s, _, _ = run_once(model, prompt, args.decode, static=static)
                best_prefill = min(best_prefill, prefill_s)
                best_decode = min(best_decode, decode_s)
    finally:
        if args.compile:
            del model.forward  # the class's again
    return best_prefill, best_decode, logits, tokens


def compile_counts() -> dict[str, int]:
    """The graphs dynamo compiled and the graph breaks it took since the last reset."""
    counters = torch._dynamo.utils.counters
    return {
        "compiled_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def table(path: Path) -> str:
    """One line per (family, batch, impl) of a --json file (the last run of each): tokens/s,
    and attncc's as a multiple of sdpa's and flex_attention's (above 1: attncc faster)."""
    rows: dict[tuple[str, int, str], dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows[(row.get("family", "llama"), row["batch"], row["impl"])] = row
    lines = [
        f"{'family':<8} {'B':>2} {'impl':>15} {'prefill tok/s':>14} {'decode tok/s':>13} "
        f"{'x sdpa (pre/dec)':>17} {'x flex (pre/dec)':>17}"
    ]
    for (family, batch, impl), row in rows.items():
        if "error" in row:
            lines.append(f"{family:<8} {batch:>2} {impl:>15} error: {row['error'][:90]}")
            continue
        ratios = []
        for anchor in ("sdpa", "flex_attention"):
            other = rows.get((family, batch, anchor), {})
            if impl != "attncc" or "prefill_tok_s" not in other:
                ratios.append("")
                continue
            ratios.append(
                f"{row['prefill_tok_s'] / other['prefill_tok_s']:.2f}/"
                f"{row['decode_tok_s'] / other['decode_tok_s']:.2f}"
            )
        lines.append(
            f"{family:<8} {batch:>2} {impl:>15} {row['prefill_tok_s']:>14.0f} "
            f"{row['decode_tok_s']:>13.1f} {ratios[0]:>17} {ratios[1]:>17}"
        )
    return "\n".join(lines)


def profile(model: Any, impl: str, prompt: torch.Tensor) -> None:
    """torch.profiler's top operators of one prefill and of 4 decode steps: where an
    implementation's time goes beyond its attention kernels (copies, masks, host work)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler
    from transformers import DynamicCache

    activities = [ProfilerActivity.CPU]
    if prompt.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    device_time = "cuda_time_total" if prompt.device.type == "cuda" else "cpu_time_total"
    model.set_attn_implementation(impl)
    with torch.no_grad():
        for phase in ("prefill", "decode"):
            cache = DynamicCache(config=model.config)
            if phase == "decode":
                model(prompt, cache=cache, use_cache=True, logits_to_keep=1)
            sync(prompt.device)
            with profiler(activities=activities) as prof:
                if phase == "prefill":
                    model(prompt, cache=cache, use_cache=True, logits_to_keep=1)
                else:
                    for _ in range(4):
                        model(prompt[:, -1:], cache=cache, use_cache=True)
                sync(prompt.device)
            averages = prof.key_averages()
            for order in (device_time, "self_cpu_time_total"):
                print(f"== {impl} {phase}, by {order}")
                print(averages.table(sort_by=order, row_limit=15, max_name_column_width=60))


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    if args.table is not None:
        print(table(args.table))
        return []
    from transformers import AutoModelForCausalLM

    attncc_hf.register()
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    dtype = DTYPES[args.dtype]
    config = family_config(args.family, args.tiny)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    prompt = torch.randint(
        0, config.vocab_size, (args.batch, args.prefill), generator=torch.Generator().manual_seed(1)
    ).to(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows: list[dict[str, Any]] = []
    first: tuple[str, torch.Tensor, torch.Tensor] | None = None
    print(
        f"{args.family} ({params / 1e9:.2f} B parameters), device {gpu}, {args.dtype}, "
        f"batch {args.batch}, prefill {args.prefill}, decode {args.decode}"
    )
    print(
        f"{'impl':>15} {'prefill tok/s':>14} {'decode tok/s':>13} {'logit diff':>11} "
        f"{'median diff':>11} same tokens"
    )
    for impl in args.impls:
        row: dict[str, Any] = {
            "family": args.family,
            "impl": impl,
            "device": gpu,
            "dtype": args.dtype,
            "batch": args.batch,
            "prefill": args.prefill,
            "decode": args.decode,
            "layers": config.num_hidden_layers,
            "hidden": config.hidden_size,
            "heads": f"{config.num_attention_heads}:{config.num_key_value_heads}",
            "head_dim": getattr(config, "head_dim", None)
            or config.hidden_size // config.num_attention_heads,
            "params": params,
            "cache": args.cache,
            "compile": args.compile,
        }
        try:
            best_prefill, best_decode, logits, tokens = timed(model, impl, prompt, args)
        except Exception as error:  # a refused implementation is a row, not a crash
            row["error"] = one_line(error)
            rows.append(row)
            print(f"{impl:>15} error: {row['error']}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            if first is None:
                first = (impl, logits, tokens)
            # per position, the largest difference over the vocabulary: the last position's
            # (what greedy decoding reads) and the median over every position. A model with
            # experts (gpt-oss) routes a token to other experts on a near tie in bf16, and
            # that position's logits then move by whole units under any implementation
            # (bf16 eager against fp32 eager too): the median says how close the rest is
            per_position = (logits - first[1]).abs().amax(-1)
            logit_diff = per_position[:, -1].max().item()
            median_diff = per_position.median().item()
            # greedy decoding in bf16 may part ways after a near tie; count the agreeing prefix
            agree = (tokens == first[2]).cumprod(dim=1).sum(dim=1).min().item()
            row |= {
                "prefill_tok_s": args.batch * args.prefill / best_prefill,
                "decode_tok_s": args.batch * args.decode / best_decode,
                "max_logit_diff_vs_first": logit_diff,
                "median_logit_diff_vs_first": median_diff,
                "greedy_tokens_agreeing": int(agree),
                "reference": first[0],
            }
            compiled = ""
            if args.compile:
                row |= compile_counts()
                compiled = f" {row['compiled_graphs']} graphs, {row['graph_breaks']} breaks"
            rows.append(row)
            print(
                f"{impl:>15} {row['prefill_tok_s']:>14.0f} {row['decode_tok_s']:>13.1f} "
                f"{logit_diff:>11.3g} {median_diff:>11.3g} {agree:>5}/{args.decode + 1:<6}"
                + compiled
            )
        if args.json is not None:
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")
    if args.profile:
        for row in rows:
            if "error" not in row:
                profile(model, row["impl"], prompt)
    return rows


if __name__ == "__main__":
    main()
