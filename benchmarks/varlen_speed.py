"""attncc.varlen against the document-mask kernel and FlexAttention on the same packed data.

Per mean sequence length (random lengths, uniform on [1, 2 * mean - 1], packed to --total
tokens) and per mask (causal within each sequence, or full within each): the same q, k, v
run as

- ``varlen``: ``attncc.varlen`` of examples/causal.attn (or examples/fused.attn) on
  flash-attn's packed layout ``[total, H, D]`` with ``cu_seqlens`` (its sequence ids are
  computed inside the call, as a flash-attn caller's would be: they are timed);
- ``docmask``: the document-mask spec (examples/document_mask.attn, or the same without
  ``m >= n``) on ``[1, H, total, D]`` with a document id per token, as the matrix's
  document_mask variant runs it;
- ``flex``: ``torch.compile(flex_attention)`` with the block mask of the same documents.

Each is a do_bench median with L2 flushed (``attncc.runtime.timing.median_ms``), in
alternating rounds keeping each one's best. TFLOP/s counts only the (query, key) pairs inside
a sequence (4 * H * D per pair), so a kernel that skips every cross-sequence tile and one
that visits them compare on the work that matters. The outputs must agree (bf16 tolerance).

    python3 benchmarks/varlen_speed.py [--means 128,512,2048] [--total 16384] [--heads 16]
                                       [--head-dim 128] [--rounds 3] [--json FILE]

``--tiles`` runs on the CPU instead and prints, per case, how many (query tile, key tile)
pairs each kernel's tile index lists and how many of those run masked (partial), for the
tile sizes of ``--blocks`` (the GPU's time follows these counts): varlen with one offset
table (``cu_seqlens_q is cu_seqlens_k``), varlen with two (equal values, different tensors)
and the document-mask kernel. The builders run in the Triton interpreter.

    python3 benchmarks/varlen_speed.py --tiles [--means 512] [--total 4096] [--blocks 64x64]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
IMPLS = ("varlen", "docmask", "flex")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
AGREE = 0.05  # the largest output difference from the first implementation that agrees
# examples/document_mask.attn without causality: each token sees its whole document
DOCUMENT_FULL = """\
attention document_full

dims  B, H, N, D
in    q[B, H, N, D]
in    k[B, H, N, D]
in    v[B, H, N, D]
in    doc[B, N]: i32
param scale: f32 = 1 / sqrt(D)

s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] * scale
mask doc[b, m] == doc[b, n]
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--means", default="128,512,2048", help="mean sequence lengths")
    ap.add_argument("--total", type=int, default=16384, help="packed tokens per call")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--masks", default="causal,full", help="causal and/or full")
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"some of {','.join(IMPLS)}")
    ap.add_argument("--target", default="auto", help="attncc's target (auto, triton, cuda)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="append one JSON line per case")
    ap.add_argument(
        "--tiles", action="store_true", help="count the listed and masked tiles (CPU) instead"
    )
    ap.add_argument("--blocks", default="64x64", help="--tiles: BLOCK_MxBLOCK_N, comma-separated")
    args = ap.parse_args(argv)
    try:
        args.blocks = [tuple(int(x) for x in b.split("x")) for b in args.blocks.split(",")]
    except ValueError:
        ap.error(f"--blocks: {args.blocks!r} is not like 64x64,128x64")
    if any(len(b) != 2 or min(b) < 16 or max(b) & (max(b) - 1) for b in args.blocks):
        ap.error(f"--blocks: {args.blocks} are not pairs of powers of 2 >= 16")
    args.means = [int(m) for m in args.means.split(",")]
    args.masks = args.masks.split(",")
    args.impls = args.impls.split(",")
    for mask in args.masks:
        if mask not in ("causal", "full"):
            ap.error(f"--masks: {mask!r} is neither causal nor full")
    for impl in args.impls:
        if impl not in IMPLS:
            ap.error(f"--impls: {impl!r} is not one of {', '.join(IMPLS)}")
    if any(m < 1 or m > args.total for m in args.means):
        ap.error(f"--means must lie in 1..--total ({args.total})")
    return args


def sequence_lengths(mean: int, total: int, generator: torch.Generator) -> list[int]:
    """Random lengths, uniform on [1, 2 * mean - 1] (mean ``mean``), summing to ``total``
    (the last one cut short)."""
    lengths: list[int] = []
    while sum(lengths) < total:
        draw = int(torch.randint(1, 2 * mean, (1,), generator=generator))
        lengths.append(min(draw, total - sum(lengths)))
    return lengths


def visible_pairs(lengths: list[int], causal: bool) -> int:
    """(query, key) pairs inside a sequence (and, causal, at or before the query)."""
    return sum(n * (n + 1) // 2 if causal else n * n for n in lengths)


def runners(
    args: argparse.Namespace, lengths: list[int], causal: bool
) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, str]]:
    """Per implementation, a call on the case's data returning the output as
    ``[total, H, D]``; and the implementations that could not be set up, with why."""
    import attncc

    device, dtype = torch.device("cuda"), DTYPES[args.dtype]
    total, heads, dim = sum(lengths), args.heads, args.head_dim
    generator = torch.Generator(device=device).manual_seed(args.seed)
    q, k, v = (
        torch.randn(total, heads, dim, device=device, dtype=dtype, generator=generator)
        for _ in range(3)
    )
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.cumsum(torch.tensor(lengths, device=device), 0)
    doc = torch.repeat_interleave(
        torch.arange(len(lengths), device=device, dtype=torch.int32),
        torch.tensor(lengths, device=device),
    )[None]
    # [1, H, total, D], contiguous: the layout the document-mask kernel and Flex are
    # benchmarked in by the matrix (the same values as the packed tensors)
    qb, kb, vb = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))
    scale = dim**-0.5
    longest = max(lengths)
    calls: dict[str, Callable[[], torch.Tensor]] = {}
    failed: dict[str, str] = {}
    for impl in args.impls:
        try:
            if impl == "varlen":
                spec = EXAMPLES / ("causal.attn" if causal else "fused.attn")
                packed = attncc.varlen(spec, target=args.target)
                calls[impl] = lambda packed=packed: packed(
                    q, k, v, cu, cu, longest, longest, scale=scale
                )
            elif impl == "docmask":
                source = EXAMPLES / "document_mask.attn" if causal else DOCUMENT_FULL
                kernel = attncc.compile(source, target=args.target)  # type: ignore[arg-type]
                calls[impl] = lambda kernel=kernel: kernel(qb, kb, vb, doc, scale=scale)[
                    0
                ].transpose(0, 1)
            else:
                calls[impl] = flex_runner(qb, kb, vb, doc, causal, scale)
        except Exception as error:  # an implementation that cannot run is a row, not a crash
            failed[impl] = f"{type(error).__name__}: {str(error).strip()[:200]}"
    return calls, failed


def flex_runner(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc: torch.Tensor, causal: bool, scale: float
) -> Callable[[], torch.Tensor]:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    ids = doc[0]

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        same = ids[q_idx] == ids[kv_idx]
        return same & (q_idx >= kv_idx) if causal else same

    size = ids.shape[0]
    block_mask = create_block_mask(mask_mod, None, None, size, size, device="cuda")
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda: compiled(q, k, v, block_mask=block_mask, scale=scale)[0].transpose(0, 1)


TILE_IMPLS = ("varlen", "varlen, two tables", "docmask")


def tile_counts(
    lengths: list[int], causal: bool, block_m: int, block_n: int
) -> dict[str, tuple[int, int]]:
    """Per kernel of ``TILE_IMPLS``: (listed tiles, partial tiles) of its tile index over
    every query tile, for sequences of ``lengths`` packed, built on the CPU."""
    import attncc
    from attncc.runtime.jit import interpreter
    from attncc.varlen import sequence_ids

    total, heads, dim = sum(lengths), 1, 16  # the index reads neither heads nor head dim
    q, k, v = (torch.zeros(total, heads, dim) for _ in range(3))
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths), 0)
    seq = sequence_ids(cu, total)
    spec = EXAMPLES / ("causal.attn" if causal else "fused.attn")
    packed = attncc.varlen(spec, target="triton")
    docmask = attncc.compile(
        EXAMPLES / "document_mask.attn" if causal else DOCUMENT_FULL,  # type: ignore[arg-type]
        target="triton",
    )
    cases = {
        "varlen": (packed.same_packing_kernel, {"seq_q": seq, "cu_seqlens_q": cu}),
        "varlen, two tables": (
            packed.kernel,
            {"seq_q": seq, "cu_seqlens_q": cu, "cu_seqlens_k": cu.clone()},
        ),
        "docmask": (docmask, {"doc": seq[None]}),
    }
    counts: dict[str, tuple[int, int]] = {}
    for impl, (kernel, tables) in cases.items():
        if impl == "docmask":
            inputs = {"q": q.transpose(0, 1)[None], "k": k.transpose(0, 1)[None]}
            inputs["v"] = v.transpose(0, 1)[None]
        else:
            inputs = {"q": q, "k": k, "v": v}
        inputs.update(tables)
        module = kernel.module(interpreted=True)
        sizes, dtype, device = module._check(inputs, {})
        params = module._param_defaults(sizes, {})
        out, lse = module._allocate(sizes, dtype, device, False)
        query_tiles = -(-total // block_m)
        with interpreter(True):
            _, listed, _ = module._tile_index(
                inputs, params, sizes, out, lse, query_tiles, block_m, block_n
            )
        partial, full = int(listed[0].sum()), int(listed[1].sum())
        counts[impl] = (partial + full, partial)
    return counts


def print_tile_counts(args: argparse.Namespace) -> list[dict[str, Any]]:
    generator = torch.Generator().manual_seed(args.seed)
    print(
        f"tile index counts (CPU), total {args.total} tokens; per kernel: listed tiles / "
        "partial (masked) tiles"
    )
    print(
        f"{'mean':>5} {'mask':>6} {'seqs':>5} {'blocks':>8} "
        + " ".join(f"{impl:>20}" for impl in TILE_IMPLS)
    )
    rows = []
    for mean in args.means:
        for mask in args.masks:
            lengths = sequence_lengths(mean, args.total, generator)
            for block_m, block_n in args.blocks:
                counts = tile_counts(lengths, mask == "causal", block_m, block_n)
                cells = [f"{c[0]:>10} / {c[1]:>7}" for c in counts.values()]
                print(
                    f"{mean:>5} {mask:>6} {len(lengths):>5} {f'{block_m}x{block_n}':>8} "
                    + " ".join(cells)
                )
                rows.append(
                    {"mean": mean, "mask": mask, "blocks": [block_m, block_n], "counts": counts}
                )
    return rows


def one_case(
    args: argparse.Namespace, mean: int, causal: bool, generator: torch.Generator
) -> dict[str, Any]:
    from attncc.runtime.timing import median_ms

    lengths = sequence_lengths(mean, args.total, generator)
    torch._dynamo.reset()  # each case's mask_mod is a new function: no recompile limit
    calls, failed = runners(args, lengths, causal)
    outputs: dict[str, torch.Tensor] = {}
    for impl, call in list(calls.items()):
        try:
            outputs[impl] = call()  # compiles, tunes: out of the timing
        except Exception as error:
            failed[impl] = f"{type(error).__name__}: {str(error).strip()[:200]}"
            del calls[impl]
    torch.cuda.synchronize()
    best = {impl: float("inf") for impl in calls}
    for _ in range(args.rounds):
        for impl, call in calls.items():
            best[impl] = min(best[impl], median_ms([call], graphed=False))
    pairs = visible_pairs(lengths, causal)
    flops = 4 * args.heads * args.head_dim * pairs
    row: dict[str, Any] = {
        "mean": mean,
        "mask": "causal" if causal else "full",
        "sequences": len(lengths),
        "longest": max(lengths),
        "total": args.total,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "dtype": args.dtype,
        "target": args.target,
        "device": torch.cuda.get_device_name(),
        # the share of the [total, total] score matrix inside sequences
        "visible_fraction": pairs / args.total**2,
    }
    first = next(iter(outputs.values()), None)
    for impl in args.impls:
        if impl in failed:
            row[f"{impl}_error"] = failed[impl]
            continue
        ms = best[impl]
        row[f"{impl}_ms"] = ms
        row[f"{impl}_tflops"] = flops / (ms * 1e-3) / 1e12
        assert first is not None
        diff = (outputs[impl].float() - first.float()).abs().max().item()
        row[f"{impl}_max_diff"] = diff
        # outputs of order 1 in bf16 (8 bits of mantissa): a wrong mask moves them by far more
        row[f"{impl}_agrees"] = diff < AGREE
    return row


def table_line(row: dict[str, Any], impls: list[str]) -> str:
    cells = [f"{row['mean']:>5}", f"{row['mask']:>6}", f"{row['sequences']:>5}"]
    for impl in impls:
        ms = row.get(f"{impl}_ms")
        cells.append(f"{'error':>16}" if ms is None else f"{ms:8.3f} {row[f'{impl}_tflops']:7.1f}")
    for anchor in ("docmask", "flex"):
        if anchor in impls and "varlen_ms" in row and f"{anchor}_ms" in row:
            cells.append(f"{row[f'{anchor}_ms'] / row['varlen_ms']:>10.2f}")
        elif anchor in impls:
            cells.append(f"{'':>10}")
    return " ".join(cells)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    if args.tiles:
        return print_tile_counts(args)
    if not torch.cuda.is_available():
        raise SystemExit("varlen_speed.py times GPU kernels: no CUDA device here")
    generator = torch.Generator().manual_seed(args.seed)
    header = ["mean", "mask", "seqs"] + [f"{impl} ms TFLOP/s" for impl in args.impls]
    header += [f"x {a}" for a in ("docmask", "flex") if a in args.impls]
    print(
        f"{torch.cuda.get_device_name()}, {args.dtype}, total {args.total} tokens, "
        f"H={args.heads}, D={args.head_dim}, target {args.target}; x ANCHOR = anchor ms / "
        "varlen ms (above 1: varlen faster); TFLOP/s over in-sequence pairs only"
    )
    print(" ".join(f"{h:>16}" if "ms" in h else f"{h:>10}" if "x " in h else h for h in header))
    rows = []
    for mean in args.means:
        for mask in args.masks:
            row = one_case(args, mean, mask == "causal", generator)
            rows.append(row)
            print(table_line(row, args.impls))
            for impl in args.impls:
                if f"{impl}_error" in row:
                    print(f"  {impl}: {row[f'{impl}_error']}")
                elif not row[f"{impl}_agrees"]:
                    print(f"  {impl} DISAGREES: output off by {row[f'{impl}_max_diff']:.3g}")
            if args.json is not None:
                with args.json.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    main()
