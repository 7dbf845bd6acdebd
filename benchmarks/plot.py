"""Plots of a bench JSON-lines file (``attncc bench --json``, ``matrix.py``): one PNG per table,
attncc's speed over each anchor's (timed in the same process) per variant and length, with
the 1.0 line where attncc and the anchor are even.

    python3 benchmarks/plot.py benchmarks/results/matrix_h100.jsonl [--out docs/img]

Writes ``<file stem>_prefill_<dtype>_d<head dim>.png`` per prefill table (head dims measured
at more than one length) and ``<file stem>_decode_<dtype>.png``. Needs matplotlib (the
``bench`` extra: ``pip install attncc[bench]``); without it, says so and writes nothing.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

ANCHORS = {
    "sdpa-flash": "FlashAttention-2 (SDPA)",
    "sdpa-cudnn": "cuDNN (SDPA)",
    "flex": "FlexAttention",
    "copy": "a copy of the same bytes",
}
VARIANTS = {
    "fused": "full",
    "causal": "causal",
    "gqa_causal": "GQA 32/8 causal",
    "sliding_window": "sliding window 1024",
    "alibi": "causal + ALiBi",
    "softcap": "causal + softcap 30",
    "document_mask": "document mask",
    "decode": "decode",
    "paged_decode": "paged decode (page 16)",
}
DECODE = ("decode", "paged_decode")

# table key -> anchor -> variant -> [(x, label, ratio)], x the sort key of the label
Tables = dict[tuple[str, str, int], dict[str, dict[str, list[tuple[int, str, float]]]]]


def _fields(shape: str) -> dict[str, str]:
    """{"B": "4", "H": "32:8", "S": "4096", "D": "128"} of "B=4 H=32:8 S=4096 D=128"."""
    return dict(part.split("=", 1) for part in shape.split())


def _length(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def ratios(rows: list[dict[str, Any]]) -> Tables:
    """attncc's throughput over each anchor's, grouped into tables: ("prefill", dtype, head
    dim) over the sequence length, ("decode", dtype, 0) over batch and cache length. Anchors
    that did not run a shape (None) are left out; so are prefill head dims measured at one
    length only (no line to draw)."""
    tables: Tables = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for row in rows:
        spec = row["spec"].removesuffix(" [cuda]")
        fields = _fields(row["shape"])
        seq, batch = int(fields["S"]), int(fields["B"])
        if spec in DECODE:
            key, x, label = (
                ("decode", row["dtype"], 0),
                seq * 1024 + batch,
                f"B={batch} {_length(seq)}",
            )
        else:
            key, x, label = ("prefill", row["dtype"], int(fields["D"])), seq, _length(seq)
        for anchor, value in row["anchors"].items():
            if value:
                tables[key][anchor][spec].append((x, label, row["tflops"] / value))
    for key in [k for k in tables if k[0] == "prefill"]:
        lengths = {
            x for lines in tables[key].values() for line in lines.values() for x, _, _ in line
        }
        if len(lengths) < 2:
            del tables[key]
    return {
        key: {
            anchor: {spec: sorted(points) for spec, points in by_spec.items()}
            for anchor, by_spec in by_anchor.items()
        }
        for key, by_anchor in sorted(tables.items())
    }


def file_name(stem: str, key: tuple[str, str, int]) -> str:
    kind, dtype, head_dim = key
    return f"{stem}_{kind}_{dtype}" + (f"_d{head_dim}" if kind == "prefill" else "") + ".png"


def draw(tables: Tables, stem: str, out: Path, title: str) -> list[Path]:
    """One PNG per table: a panel per anchor, a line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {spec: f"C{i}" for i, spec in enumerate(VARIANTS)}  # one color a variant throughout
    written = []
    for key, by_anchor in tables.items():
        anchors = [a for a in ANCHORS if a in by_anchor]
        fig, axes = plt.subplots(1, len(anchors), figsize=(4.2 * len(anchors), 3.8), squeeze=False)
        for ax, anchor in zip(axes[0], anchors, strict=True):
            for spec, points in by_anchor[anchor].items():
                ax.plot([p[1] for p in points], [p[2] for p in points], marker="o",
                        color=colors.get(spec), label=VARIANTS.get(spec, spec))  # fmt: skip
            ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
            ax.set_title(f"x {ANCHORS[anchor]}", fontsize=10)
            ax.set_xlabel("batch, cache length" if key[0] == "decode" else "sequence length")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("attncc / anchor (throughput)")
        legend: dict[str, Any] = {}  # every variant once, whichever panels it is in
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                legend.setdefault(label, handle)
        fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=4, fontsize=8,
                   frameon=False)  # fmt: skip
        kind, dtype, head_dim = key
        what = f"prefill, {dtype}, head dim {head_dim}" if kind == "prefill" else f"decode, {dtype}"
        fig.suptitle(f"{title}: {what}", fontsize=11)
        fig.tight_layout(rect=(0, 0.1, 1, 1))
        path = out / file_name(stem, key)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jsonl")
    parser.add_argument("--out", default=".", help="folder for the PNGs")
    parser.add_argument("--title", default=None, help="the plots' title (default: the file stem)")
    args = parser.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot.py: matplotlib is not installed (pip install attncc[bench]); no plots written")
        return
    path = Path(args.jsonl)
    with path.open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for written in draw(ratios(rows), path.stem, out, args.title or path.stem):
        print(f"wrote {written}")


if __name__ == "__main__":
    main()
