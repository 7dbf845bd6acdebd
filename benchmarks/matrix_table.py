"""Markdown table of a bench JSON-lines file (``attncc bench --json``): one row per measured
shape with TFLOP/s (TB/s for decode) and the ratio to each anchor measured in the same run;
where the CUDA target was measured on the same shape ("spec [cuda]" rows), its TFLOP/s and
its ratio to the Triton row fill the last two columns.

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
    cuda = {(r["spec"].removesuffix(" [cuda]"), r["shape"], r["dtype"]): r for r in rows}
    cuda = {key: r for key, r in cuda.items() if r["spec"].endswith(" [cuda]")}
    # x copy: the time of a copy moving the same bytes over the kernel's (decode rows)
    head = "| spec | shape | dtype | TFLOP/s | TB/s | x FA2 | x cuDNN | x Flex | x copy |"
    print(head + " CUDA TFLOP/s | CUDA / Triton |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["spec"].endswith(" [cuda]"):
            continue
        ratios = []
        for name in ANCHORS:
            anchor = row["anchors"].get(name)  # absent in files older than the anchor
            ratios.append(f"{row['tflops'] / anchor:.2f}" if anchor else "-")
        tbps = f"{row['tbps']:.2f}" if row.get("tbps") is not None else "-"
        cells = [row["spec"], row["shape"], row["dtype"], f"{row['tflops']:.0f}", tbps, *ratios]
        other = cuda.get((row["spec"], row["shape"], row["dtype"]))
        if other is None:
            cells += ["-", "-"]
        else:
            cells += [f"{other['tflops']:.0f}", f"{other['tflops'] / row['tflops']:.2f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
