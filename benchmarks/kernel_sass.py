"""What ptxas made of a CUDA kernel, without a GPU: registers, spills and the hot loops of
each kernel in one family of a spec's CUDA sources, for the working tree and for baseline
trees side by side, so a change to a template can be read at the machine-code level before
it takes device time.

    python3 benchmarks/kernel_sass.py SPEC [--family backward] [-D ATTNCC_DP=128 ...]
                                      [--baseline DIR ...] [--kernel REGEX]
                                      [--count FMUL,MUFU,...]

Each tree (the working tree, then every ``--baseline``: made with ``git archive REV attncc
templates grammars examples | tar -x -C DIR``) renders SPEC with ``attncc compile --target
cuda`` in a process of its own, nvcc compiles the family's source for sm_90a with the
defines (default: head dims of 128), and for each kernel the script prints ptxas's
registers and spill bytes, then every loop of the machine code longer than 64 instructions
(a conditional branch back; nested loops print each): where it starts and ends, its
instructions, and how many are warp-group MMAs (HGMMA; QGMMA in FP8), copies (LDGSTS),
local loads and stores (LDL / STL: spills inside a loop cost every trip) and barrier waits
(SYNCS), and of the opcodes ``--count`` names (a loop's static count: a branch's code
counts whether it runs or not).

Needs nvcc and cuobjdump (from the CUDA toolkit, or the copy Triton's wheel carries).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# a SASS line: /*0340*/  @P0 BRA 0x550 ;
SASS_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA(?:\.U\.ANY|\.DIV)?\s+(?:!?U?P\d,\s*)?0x([0-9a-f]+)")
PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
COUNTED = ("HGMMA", "QGMMA", "LDGSTS", "LDL", "STL", "SYNCS")
SHORTEST_LOOP = 64


@dataclass(frozen=True)
class Loop:
    start: int
    end: int
    counts: dict[str, int]


@dataclass(frozen=True)
class Kernel:
    name: str
    registers: int
    spill_stores: int
    spill_loads: int
    loops: tuple[Loop, ...]


def cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    import triton  # its wheel carries the CUDA binaries it needs

    bundled = glob.glob(
        os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    )
    if not bundled:
        sys.exit("kernel_sass.py: no cuobjdump on PATH or in Triton's wheel")
    return bundled[0]


def render(tree: Path, spec: Path, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "attncc", "compile", str(spec), "--target", "cuda", "-o"]
    cmd.append(f"{out}/")
    done = subprocess.run(cmd, env=env, cwd=out, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"kernel_sass.py: {tree}: {done.stderr.strip()}")


def loops(sass: str, counted: tuple[str, ...] = COUNTED) -> tuple[Loop, ...]:
    code = [(int(m.group(1), 16), m.group(2)) for m in map(SASS_LINE.match, sass.splitlines()) if m]
    found = []
    for at, text in code:
        branch = BRANCH.search(text)
        # a loop's back edge is conditional; an unconditional jump back returns from the
        # out-of-line retries of a barrier wait that ptxas places after the kernel's end
        if branch is None or int(branch.group(1), 16) >= at or not text.startswith("@"):
            continue
        start = int(branch.group(1), 16)
        body = [t for a, t in code if start <= a <= at]
        if len(body) < SHORTEST_LOOP:
            continue
        opcodes = [t.split()[1] if t.startswith("@") else t.split()[0] for t in body]
        counts = {"instructions": len(body)}
        counts.update({k: sum(op.split(".")[0] == k for op in opcodes) for k in counted})
        found.append(Loop(start, at, counts))
    return tuple(found)


def kernels(
    tree: Path,
    spec: Path,
    family: str,
    defines: list[str],
    work: Path,
    counted: tuple[str, ...] = COUNTED,
) -> list[Kernel]:
    work.mkdir(parents=True)
    render(tree, spec, work)
    source = work / f"{spec.stem}.{family}.cu"
    if not source.exists():
        sys.exit(f"kernel_sass.py: {tree} renders no {family} family for {spec.name}")
    cubin = work / f"{family}.cubin"
    cmd = ["nvcc", "-arch=sm_90a", "-cubin", "-O3", "-std=c++17", "-Xptxas", "-v"]
    done = subprocess.run(
        [*cmd, *(f"-D{d}" for d in defines), str(source), "-o", str(cubin)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"kernel_sass.py: nvcc failed on {source}:\n{done.stderr[-3000:]}")
    info: dict[str, list[int]] = {}
    name = ""
    for line in done.stderr.splitlines():
        if m := PTXAS_ENTRY.search(line):
            name = m.group(1)
            info[name] = [0, 0, 0]
        elif (m := PTXAS_SPILLS.search(line)) and name:
            info[name][1:] = [int(m.group(1)), int(m.group(2))]
        elif (m := PTXAS_REGISTERS.search(line)) and name:
            info[name][0] = int(m.group(1))
    dump = cuobjdump()
    result = []
    for entry, (registers, stores, loads) in info.items():
        sass = subprocess.run(
            [dump, "-sass", "-fun", entry, str(cubin)], capture_output=True, text=True
        ).stdout
        result.append(Kernel(entry, registers, stores, loads, loops(sass, counted)))
    return result


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument(
        "--family", default="backward", help="hopper, backward, mma, split, ... (default: backward)"
    )
    parser.add_argument(
        "-D",
        dest="defines",
        action="append",
        help="a macro for nvcc (default: ATTNCC_DP=128, ATTNCC_DVP=128)",
    )
    parser.add_argument(
        "--baseline", action="append", default=[], type=Path, help="a baseline tree (repeatable)"
    )
    parser.add_argument("--kernel", default="", help="only kernels whose names match this regex")
    parser.add_argument(
        "--count",
        default="",
        help="more opcodes to count in each loop, comma separated (FMUL,MUFU,F2FP,SHFL,PRMT: "
        "where a softmax's instructions go)",
    )
    args = parser.parse_args(argv)
    counted = COUNTED + tuple(op for op in args.count.split(",") if op and op not in COUNTED)
    if shutil.which("nvcc") is None:
        sys.exit("kernel_sass.py: no nvcc on PATH")
    defines = args.defines or ["ATTNCC_DP=128", "ATTNCC_DVP=128"]
    spec = args.spec.resolve()
    trees = [ROOT, *(b.resolve() for b in args.baseline)]
    with tempfile.TemporaryDirectory() as tmp:
        for i, tree in enumerate(trees):
            label = "working tree" if i == 0 else str(tree)
            print(f"== {label}: {spec.name}, {args.family}, {' '.join(defines)}")
            for k in kernels(tree, spec, args.family, defines, Path(tmp) / str(i), counted):
                if not re.search(args.kernel, k.name):
                    continue
                spills = f"{k.spill_stores} / {k.spill_loads} bytes stored / loaded"
                print(f"{k.name}: {k.registers} registers, spills {spills}")
                for loop in k.loops:
                    counts = ", ".join(f"{key} {n}" for key, n in loop.counts.items() if n)
                    print(f"  loop {loop.start:#06x}-{loop.end:#06x}: {counts}")


if __name__ == "__main__":
    main(sys.argv[1:])
