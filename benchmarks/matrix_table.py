"""Markdown table of a bench JSON-lines file (``attncc bench --json``): one row per measured
shape with TFLOP/s (TB/s for decode) and the ratio to each anchor measured in the same run;
where the CUDA target was measured on the same shape beside the Triton one ("spec [cuda]"
rows), its TFLOP/s and its ratio to the Triton row fill the last two columns; a "[cuda]" row
with no Triton row on its shape (the default target's matrix, `matrix.py --target auto`) is
a row of its own.

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


def _base(spec: str) -> str:
    """The spec's name without the backend label ("causal [cuda]" -> "causal")."""
    return spec.removesuffix(" [cuda]")


def main(path: str) -> None:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    # rows arrive interleaved from several GPUs: group them by spec, dtype, head dim, length
    rows.sort(key=lambda r: (_base(r["spec"]), r["dtype"], _dims(r["shape"])))
    triton = {(r["spec"], r["shape"], r["dtype"]) for r in rows if r["spec"] == _base(r["spec"])}
    cuda = {
        (_base(r["spec"]), r["shape"], r["dtype"]): r for r in rows if r["spec"] != _base(r["spec"])
    }
    # x copy: the time of a copy moving the same bytes over the kernel's (decode rows)
    head = "| spec | shape | dtype | TFLOP/s | TB/s | x FA2 | x cuDNN | x Flex | x copy |"
    print(head + " CUDA TFLOP/s | CUDA / Triton |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if (_base(row["spec"]), row["shape"], row["dtype"]) in triton and row["spec"] != _base(
            row["spec"]
        ):
            continue  # in the CUDA column of its Triton row
        ratios = []
        for name in ANCHORS:
            anchor = row["anchors"].get(name)  # absent in files older than the anchor
            ratios.append(f"{row['tflops'] / anchor:.2f}" if anchor else "-")
        tbps = f"{row['tbps']:.2f}" if row.get("tbps") is not None else "-"
        cells = [row["spec"], row["shape"], row["dtype"], f"{row['tflops']:.0f}", tbps, *ratios]
        other = (
            cuda.get((row["spec"], row["shape"], row["dtype"]))
            if row["spec"] == _base(row["spec"])
            else None
        )
        if other is None:
            cells += ["-", "-"]
        else:
            cells += [f"{other['tflops']:.0f}", f"{other['tflops'] / row['tflops']:.2f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
