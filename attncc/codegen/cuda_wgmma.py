"""The Hopper warp-group MMAs (``wgmma.mma_async``) the CUDA target's sm_90a kernel issues, as
the inline-asm text ``templates/cuda/wgmma.cu.jinja`` places: one function per (A operand
source, element type, N). The operand lists are long (N / 2 accumulator registers a thread)
and numbered, so they are written here rather than spelled out or counted in a template."""

from __future__ import annotations

from typing import Any

# N of the m64nNk16 shapes: key tiles of Q * K^T and padded value dims of P * V, and (A from
# registers) 64 value dims with an 8-column block of row sums (ATTNCC_ROW_SUMS_MMA)
WIDTHS = (64, 128, 192, 256)
ROW_SUM_WIDTHS = (72,)
ELEMENTS = (("bf16_t", "bf16"), ("f16_t", "f16"))
# e4m3 (FP8): m64nNk32 shapes, both operands K-major (the PTX ISA allows no transposed FP8
# operand: V comes key-major), so no transpose flags; no row-sum width
FP8_ELEMENTS = (("f8e4m3_t", "e4m3"),)
# the backward's A-from-shared-memory MMA whose operands are both MN-major (transposed): dS K
# (wgmma_ss_tt: dS stored with the queries along the lines, K with its head dims), N = 64
TRANSPOSED = {"wgmma_ss_tt": "1, 1"}
TRANSPOSED_WIDTHS = (64,)


def _instruction(
    elem: str, ptx_type: str, n: int, a_in_registers: bool, transposed: str = ""
) -> dict[str, Any]:
    fp8 = ptx_type == "e4m3"
    regs = n // 2
    accumulators = ", ".join(f"%{i}" for i in range(regs))
    outputs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    if a_in_registers:
        a_operand = "{" + ", ".join(f"%{regs + i}" for i in range(4)) + "}"
        inputs = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)'
        b_index, tail = regs + 4, "1, 1, 1"  # scale A, scale B, B transposed (MN-major)
    else:
        a_operand = f"%{regs}"
        inputs = '"l"(desc_a), "l"(desc_b), "r"(accumulate)'
        b_index, tail = regs + 1, "1, 1, 0, 0"  # scale A, scale B, neither transposed
    if transposed:
        tail = f"1, 1, {TRANSPOSED[transposed]}"  # scale A, scale B, A and B transposed
    if fp8:
        tail = "1, 1"  # scale A, scale B: both operands K-major, no transpose flags
    k = 32 if fp8 else 16
    shape = f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ptx_type}.{ptx_type}"
    asm = (
        f"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{b_index + 1}, 0;\\n"
        f"{shape} {{{accumulators}}}, {a_operand}, %{b_index}, p, {tail};\\n}}\\n"
    )
    return {
        "fn": transposed or ("wgmma_rs" if a_in_registers else "wgmma_ss"),
        "elem": elem,
        "n": n,
        "regs": regs,
        "a_param": "const unsigned (&a)[4]" if a_in_registers else "unsigned long long desc_a",
        "asm": asm,
        "outputs": outputs,
        "inputs": inputs,
    }


def instructions() -> list[dict[str, Any]]:
    """Every (A source, element type, N) the sm_90a kernel and the probes use."""
    return (
        [
            _instruction(elem, ptx_type, n, a_in_registers)
            for a_in_registers in (False, True)
            for elem, ptx_type in ELEMENTS
            for n in WIDTHS + (ROW_SUM_WIDTHS if a_in_registers else ())
        ]
        + [
            _instruction(elem, ptx_type, n, a_in_registers)
            for a_in_registers in (False, True)
            for elem, ptx_type in FP8_ELEMENTS
            for n in WIDTHS
        ]
        + [
            _instruction(elem, ptx_type, n, False, transposed)
            for transposed in TRANSPOSED
            for elem, ptx_type in ELEMENTS
            for n in TRANSPOSED_WIDTHS
        ]
    )
