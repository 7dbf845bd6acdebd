"""Markdown table of a bench JSON-lines file (``attncc bench --json``): one row per measured
shape with TFLOP/s (TB/s for decode) and the ratio to each anchor measured in the same run.

    python3 benchmarks/matrix_table.py benchmarks/results/matrix.jsonl
"""

from __future__ import annotations

import json
import sys

ANCHORS = ("sdpa-flash", "sdpa-cudnn", "flex", "copy")


def _dims(shape: str) -> tuple[int, int]:
    """(head dim, sequence length) of "B=4 H=16 S=4096 D=128"."""
    fields = dict(part.split("=") for part in shape.split())
    return int(fields["D"]), int(fields["S"])


def main(path: str) -> None:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    # rows arrive interleaved from several GPUs: group them by spec, dtype, head dim, length
    rows.sort(key=lambda r: (r["spec"], r["dtype"], _dims(r["shape"])))
    # x copy: the time of a copy moving the same bytes over the kernel's (decode rows)
    print("| spec | shape | dtype | TFLOP/s | TB/s | x FA2 | x cuDNN | x Flex | x copy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        ratios = []
        for name in ANCHORS:
            anchor = row["anchors"].get(name)  # absent in files older than the anchor
            ratios.append(f"{row['tflops'] / anchor:.2f}" if anchor else "-")
        tbps = f"{row['tbps']:.2f}" if row.get("tbps") is not None else "-"
        cells = [row["spec"], row["shape"], row["dtype"], f"{row['tflops']:.0f}", tbps, *ratios]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
