"""The CUDA backend without a GPU: every example renders and compiles with nvcc (sm_90), the
expression renderer, the errors, the template rules and a golden source.

Every example's source goes through nvcc's front end and NVVM (``--ptx``) in the default
variant (bf16 tensor cores, head dims padded to 128) and the fp32 FMA variant: what a spec
changes is C++ text, and that is where it can go wrong. Shared memory and registers depend
on the variant macros only, so the full compile (ptxas included) runs per variant on the
GQA prefill example (fused and split-KV kernels), and once on the paged decode gather. Jobs run in
parallel; the CI time stays well under a minute.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import golden_files
import jinja2
import pytest
import torch

import attncc
from attncc.api import build
from attncc.codegen import cuda as cuda_backend
from attncc.codegen.cuda_exprs import CudaEnv, cuda_expr, float_literal
from attncc.ir import nodes as ir
from attncc.passes.schedule import split_kv_blocker
from attncc.varlen import varlen_source
from codegen.test_golden import assert_every_variable_required

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NAMES = sorted(p.stem for p in EXAMPLES.glob("*.attn"))
NVCC = shutil.which("nvcc")


def nvcc(source: Path, out: Path, output: str, arch: str = "sm_90a", timeout: int = 120) -> None:
    """nvcc of one source into `out` (`output`: "--ptx", "-c" or "-cubin"), asserted to pass."""
    cmd = [NVCC or "nvcc", f"-arch={arch}", "-std=c++17", output, str(source), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]


# three MMA groups on 192-row tiles: the default at head dim 64
THREE_GROUPS_64 = {
    "ATTNCC_WGMMA": 2,
    "ATTNCC_DP": 64,
    "ATTNCC_DVP": 64,
    "ATTNCC_M_TILES": 1,
    "ATTNCC_WARPS": 12,
    "ATTNCC_BLOCK_N": 128,
    "ATTNCC_TMA": 1,
    "ATTNCC_STAGES": 3,
    "ATTNCC_PRODUCER_REGISTERS": 32,
    "ATTNCC_MMA_REGISTERS": 160,
    "ATTNCC_Q_BUFFERS": 2,
    "ATTNCC_PINGPONG": 1,
}
# variant 2's tiles at head dims past 128 (_WGMMA_TILES_WIDE), at 256
WIDE_256 = {
    "ATTNCC_WGMMA": 2,
    "ATTNCC_M_TILES": 1,
    "ATTNCC_WARPS": 8,
    "ATTNCC_BLOCK_N": 64,
    "ATTNCC_TMA": 1,
    "ATTNCC_STAGES": 2,
    "ATTNCC_Q_BUFFERS": 1,
    "ATTNCC_PINGPONG": 0,
    "ATTNCC_DP": 256,
    "ATTNCC_DVP": 256,
}
# the variants the runtime picks (see templates/cuda/host.py.jinja): the kernel family's
# source (codegen/cuda.py FAMILIES) and its ATTNCC_* macros
VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "bf16-128": ("mma", {}),
    "fp32-rows": ("fma", {"ATTNCC_ELEM": "float", "ATTNCC_DP": 64, "ATTNCC_DVP": 64}),
    "fp32-rows-256": ("fma", {"ATTNCC_DP": 256, "ATTNCC_DVP": 256}),
    "fp16-64": ("mma", {"ATTNCC_ELEM": "f16_t", "ATTNCC_DP": 64, "ATTNCC_DVP": 64}),
    "bf16-256": (
        "mma",
        {
            "ATTNCC_DP": 256,
            "ATTNCC_DVP": 256,
            "ATTNCC_WARPS": 4,
            "ATTNCC_M_TILES": 1,
            "ATTNCC_BLOCK_N": 32,
        },
    ),
    "split-bf16-128": ("split", {}),
    "split-fp16-64": ("split", {"ATTNCC_ELEM": "f16_t", "ATTNCC_DP": 64, "ATTNCC_DVP": 64}),
    "split-bf16-256": (
        "split",
        {
            "ATTNCC_DP": 256,
            "ATTNCC_DVP": 256,
            "ATTNCC_SPLIT_WARPS": 2,
            "ATTNCC_SPLIT_STAGES": 1,
        },
    ),
    "split-64-stages": (
        "split",
        {"ATTNCC_DP": 64, "ATTNCC_DVP": 128, "ATTNCC_SPLIT_WARPS": 2, "ATTNCC_SPLIT_STAGES": 2},
    ),
    # the fused kernel's sm_90a variant 1 (hopper.cu.jinja's hopper_loop): warp-group MMAs
    "wgmma-bf16-128": (
        "mma",
        {"ATTNCC_WGMMA": 1, "ATTNCC_M_TILES": 1, "ATTNCC_WARPS": 8, "ATTNCC_BLOCK_N": 128},
    ),
    "wgmma-fp16-64": (
        "mma",
        {
            "ATTNCC_WGMMA": 1,
            "ATTNCC_ELEM": "f16_t",
            "ATTNCC_DP": 64,
            "ATTNCC_DVP": 64,
            "ATTNCC_M_TILES": 1,
            "ATTNCC_WARPS": 4,
            "ATTNCC_BLOCK_N": 64,
        },
    ),
    # the hopper family (variant 2) as the file stands: its defaults, head dim 128
    "wgmma2-default": ("hopper", {}),
    "wgmma2-bf16-64": (
        "hopper",
        {
            "ATTNCC_WGMMA": 2,
            "ATTNCC_M_TILES": 1,
            "ATTNCC_WARPS": 8,
            "ATTNCC_BLOCK_N": 64,
            "ATTNCC_TMA": 0,
            "ATTNCC_Q_BUFFERS": 1,
            "ATTNCC_PINGPONG": 0,
            "ATTNCC_PRODUCER_REGISTERS": 32,
            "ATTNCC_MMA_REGISTERS": 232,
        },
    ),
    "wgmma2-one-group-bf16-64": (
        "hopper",
        {
            "ATTNCC_WGMMA": 2,
            "ATTNCC_M_TILES": 1,
            "ATTNCC_WARPS": 4,
            "ATTNCC_BLOCK_N": 64,
            "ATTNCC_TMA": 1,
            "ATTNCC_BLOCKS": 2,
            "ATTNCC_PRODUCER_REGISTERS": 24,
            "ATTNCC_MMA_REGISTERS": 232,
            "ATTNCC_Q_BUFFERS": 2,
            "ATTNCC_PINGPONG": 0,
        },
    ),
    "wgmma2-three-groups-bf16-64": ("hopper", THREE_GROUPS_64),
    "wgmma2-tma-bf16-128": (
        "hopper",
        {
            "ATTNCC_WGMMA": 2,
            "ATTNCC_M_TILES": 1,
            "ATTNCC_WARPS": 8,
            "ATTNCC_BLOCK_N": 128,
            "ATTNCC_TMA": 1,
            "ATTNCC_STAGES": 3,
            "ATTNCC_Q_BUFFERS": 1,
            "ATTNCC_PINGPONG": 0,
        },
    ),
    # the default at head dim 64 without the log-sum-exp: the row sums from the P V MMAs
    "wgmma2-row-sums-bf16-64": ("hopper", {**THREE_GROUPS_64, "ATTNCC_ROW_SUMS_MMA": 1}),
    # the default at head dim 128: two Q buffers, two stages, ping-pong
    "wgmma2-two-q-bf16-128": (
        "hopper",
        {
            "ATTNCC_WGMMA": 2,
            "ATTNCC_M_TILES": 1,
            "ATTNCC_WARPS": 8,
            "ATTNCC_BLOCK_N": 128,
            "ATTNCC_TMA": 1,
            "ATTNCC_STAGES": 2,
            "ATTNCC_Q_BUFFERS": 2,
            "ATTNCC_PINGPONG": 1,
        },
    ),
    # the default at head dims past 128: 128 x 64 tiles, one Q buffer, two stages
    "wgmma2-wide-bf16-256": ("hopper", WIDE_256),
    # head dim 192 unpadded: 24 chunks a row, copied 64 columns at a time (RowCopies), with
    # cp.async and the two Q buffers 192 leaves room for
    "wgmma2-wide-bf16-192": (
        "hopper",
        {**WIDE_256, "ATTNCC_TMA": 0, "ATTNCC_Q_BUFFERS": 2, "ATTNCC_DP": 192, "ATTNCC_DVP": 128},
    ),
    # a softmax reference fixed from the scores' bound (soft-capping in bf16): head dim 128's
    # default, head dim 64's three groups, with the row sums from the MMAs, head dim 256's
    "wgmma2-fixed-reference-bf16-128": ("hopper", {"ATTNCC_FIXED_REFERENCE": 1}),
    "wgmma2-fixed-reference-bf16-64": (
        "hopper",
        {**THREE_GROUPS_64, "ATTNCC_FIXED_REFERENCE": 1},
    ),
    "wgmma2-fixed-reference-row-sums-bf16-64": (
        "hopper",
        {**THREE_GROUPS_64, "ATTNCC_ROW_SUMS_MMA": 1, "ATTNCC_FIXED_REFERENCE": 1},
    ),
    "wgmma2-fixed-reference-wide-bf16-256": ("hopper", {**WIDE_256, "ATTNCC_FIXED_REFERENCE": 1}),
    # the sm_90a backward: its defaults (head dim 128, bf16, dK and dV in bf16), head dim 64
    # in fp16 with float32 dK and dV (buffers summed afterwards), and those at head dim 128
    "backward-bf16-128": ("backward", {}),
    "backward-f16-64": (
        "backward",
        {"ATTNCC_ELEM": "f16_t", "ATTNCC_DP": 64, "ATTNCC_DVP": 64, "ATTNCC_DKV_F32": 1},
    ),
    "backward-bf16-128-dkv-f32": ("backward", {"ATTNCC_DKV_F32": 1}),
}
FULL_COMPILE = [
    ("gqa_causal", variant)
    for variant in VARIANTS
    if variant != "wgmma2-default" and "fixed-reference" not in variant  # no bound
]
FULL_COMPILE += [("softcap", variant) for variant in VARIANTS if "fixed-reference" in variant]
# a mask left residual by the key interval (prefix LM's union) in the backward
FULL_COMPILE += [("prefix_lm", variant) for variant in ("backward-bf16-128", "backward-f16-64")]
# the chain rule through a score modification (softcap's tanh; ALiBi's slopes, read per head)
FULL_COMPILE += [(name, "backward-bf16-128") for name in ("softcap", "alibi")]
# the tile index turned around (a block's key tile against every query tile's row ranges)
FULL_COMPILE += [("document_mask", v) for v in ("backward-bf16-128", "backward-f16-64")]
FULL_COMPILE += [("paged_decode", "split-bf16-128")]
FULL_COMPILE += [
    (name, wgmma)
    for name in ("document_mask", "softcap")
    for wgmma in (
        "wgmma-bf16-128",
        "wgmma2-bf16-64",
        "wgmma2-tma-bf16-128",
        "wgmma2-two-q-bf16-128",
        "wgmma2-one-group-bf16-64",
        "wgmma2-three-groups-bf16-64",
        "wgmma2-row-sums-bf16-64",
        "wgmma2-wide-bf16-256",
        "wgmma2-wide-bf16-192",
    )
]
# every example's every family in the front end: its default variant (and variant 1)
PTX_VARIANTS = {
    "hopper": ("wgmma2-default",),
    "mma": ("bf16-128", "wgmma-bf16-128"),
    "fma": ("fp32-rows",),
    "split": ("split-bf16-128",),
    "backward": ("backward-bf16-128",),
}


def arch_flag(family: str, variant: str) -> str:
    """sm_90a for the warp-group MMA variants (their instructions need its features)."""
    hopper = family in ("hopper", "backward") or variant.startswith("wgmma")
    return "-gencode=arch=compute_90a,code=sm_90a" if hopper else "-arch=sm_90"


def schedule_of(name: str) -> str:
    """The schedule an example renders for (fused sources hold the split-KV kernels of
    their few-query path too); the naive example runs fused on CUDA."""
    _, kernel = attncc.optimise(EXAMPLES / f"{name}.attn")
    return "fused" if kernel.schedule == "naive" else (kernel.schedule or "fused")


def has_schedule(name: str) -> bool:
    """Whether the example's default schedule renders for CUDA (the naive one does not)."""
    _, kernel = attncc.optimise(EXAMPLES / f"{name}.attn")
    return kernel.schedule != "naive"


@cache
def rendered(name: str) -> cuda_backend.Rendered:
    """The example's CUDA sources as `attncc compile --target cuda` renders them (the naive
    example's fused schedule)."""
    schedule = "fused" if schedule_of(name) == "fused" and not has_schedule(name) else None
    checked, kernel = attncc.optimise(EXAMPLES / f"{name}.attn", schedule)  # type: ignore[arg-type]
    return cuda_backend.render(kernel, checked.spec)


def families(name: str) -> list[str]:
    return [family for family, _ in rendered(name).sources]


def compile_jobs() -> list[tuple[str, str, str]]:
    """(example, variant, mode): "ptx" runs the front end, "full" ptxas too."""
    jobs = [
        (name, variant, "ptx")
        for name in NAMES
        # CUDA refuses sinks and FP8
        if attncc.optimise(EXAMPLES / f"{name}.attn")[1].sink is None
        and not attncc.optimise(EXAMPLES / f"{name}.attn")[1].fp8
        for family in families(name)
        for variant in PTX_VARIANTS[family]
    ]
    jobs += [(name, variant, "full") for name, variant in FULL_COMPILE]
    return jobs


@cache
def nvcc_results(tmp: str) -> dict[tuple[str, str, str], tuple[int, str]]:
    def run(job: tuple[str, str, str]) -> tuple[int, str]:
        name, variant, mode = job
        family, macros = VARIANTS[variant]
        path = Path(tmp) / f"{name}.{family}.cu"
        defines = [f"-D{k}={v}" for k, v in macros.items()]
        out = Path(tmp) / f"{name}.{variant}.{mode}"
        # ptxas reports (-v) whether it had to serialize warp-group MMAs
        flag = ["--ptx"] if mode == "ptx" else ["-c", "-Xptxas", "-v"]
        arch = arch_flag(family, variant)
        cmd = [NVCC or "nvcc", arch, "-std=c++17", *flag, str(path), "-o", str(out)]
        done = subprocess.run([*cmd, *defines], capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout + done.stderr

    jobs = compile_jobs()
    for name in {job[0] for job in jobs}:  # render serially: one Jinja environment
        for family, source in rendered(name).sources:
            (Path(tmp) / f"{name}.{family}.cu").write_text(source)
    for header, text in cuda_backend.headers():  # beside the sources, as -o DIR writes them
        (Path(tmp) / header).write_text(text)
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(zip(jobs, pool.map(run, jobs), strict=True))


@pytest.fixture(scope="module")
def nvcc_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuda"))


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA sources are rendered, not compiled")
@pytest.mark.parametrize(("name", "variant", "mode"), compile_jobs())
def test_example_compiles_with_nvcc(name: str, variant: str, mode: str, nvcc_dir: str) -> None:
    code, log = nvcc_results(nvcc_dir)[(name, variant, mode)]
    assert code == 0, f"nvcc failed on {name} ({variant}, {mode}):\n{log[-4000:]}"
    assert "warning" not in log, log[-4000:]
    # C7510-C7520: ptxas made the warp-group MMAs wait on each other (a branch or a register
    # write inside an MMA window), which costs the Hopper kernels their overlap
    assert "Potential Performance Loss" not in log, log[-4000:]
    if variant.startswith("wgmma") and mode == "ptx":
        ptx = (Path(nvcc_dir) / f"{name}.{variant}.{mode}").read_text()
        assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in ptx


JINJA_LEFTOVER = re.compile(r"\{\{ |\{% |\{#")


@pytest.mark.parametrize("name", NAMES)
def test_every_example_renders_for_cuda(name: str) -> None:
    _, kernel = attncc.optimise(EXAMPLES / f"{name}.attn")
    if kernel.sink is not None:
        with pytest.raises(ValueError, match="target cuda has no softmax sink yet"):
            build(EXAMPLES / f"{name}.attn", target="cuda")
        return
    if kernel.fp8:
        # the fused schedule alone, in the hopper family alone (the others' tiles are 16-bit)
        built = build(EXAMPLES / f"{name}.attn", target="cuda")
        assert families(name) == ["hopper"]
        assert "f8e4m3_t" in built.source and not JINJA_LEFTOVER.search(built.source)
        compile(built.host, f"{name}.host.py", "exec")
        with pytest.raises(ValueError, match="FP8 inputs run fused only"):
            build(EXAMPLES / f"{name}.attn", target="cuda", schedule="split_kv")
        return
    wanted = ["fused", "split_kv"] if not split_kv_blocker(kernel) else ["fused"]
    for schedule in wanted:
        built = build(EXAMPLES / f"{name}.attn", target="cuda", schedule=schedule)  # type: ignore[arg-type]
        assert built.target == "cuda"
        assert f"attncc_{name}_" in built.source
        assert not JINJA_LEFTOVER.search(built.source)
        compile(built.host, f"{name}.{schedule}.host.py", "exec")  # valid Python


FP8_SPEC = (EXAMPLES / "fp8_block.attn").read_text()


def _fp8_variant(**tables: str) -> str:
    """The FP8 example with each named descale table read as given (declared to match)."""
    text = FP8_SPEC
    dims = {"q_descale": "MB", "k_descale": "NB", "v_descale": "NB"}
    blocks = {"q_descale": "m / block_m", "k_descale": "n / block_n", "v_descale": "n / block_n"}
    for name, read in tables.items():
        declared = {"": "[B, H]", "n": "[B, H, N]"}[read]
        text = text.replace(
            f"in    {name}[B, H, {dims[name]}]: f32", f"in    {name}{declared}: f32"
        )
        subscript = f"{name}[b, h, {read}]" if read else f"{name}[b, h]"
        text = text.replace(f"{name}[b, h, {blocks[name]}]", subscript)
    assert text != FP8_SPEC
    for dim in ("MB", "NB"):  # a block count no table reads any more
        if f"{dim}]" not in text:
            text = text.replace(f", {dim}", "", 1)
    return text


def test_fp8_value_scale_without_key_blocks_is_applied() -> None:
    """Descales one a head (no key block anywhere): the kernel still weighs P·V by v's."""
    text = _fp8_variant(q_descale="", k_descale="", v_descale="")
    built = build(text, target="cuda")
    assert "const float v_scale = " in built.source and "t_v_descale[" in built.source


def test_fp8_value_scale_read_by_the_key_is_refused() -> None:
    """The CUDA kernel weighs a tile by one value scale: one a key is an error, not a guess."""
    with pytest.raises(ValueError, match="not by the key itself"):
        build(_fp8_variant(v_descale="n"), target="cuda")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA sources are rendered, not compiled")
def test_fp8_score_factor_read_by_the_key_stays_a_score_multiply(tmp_path: Path) -> None:
    """A descale one a key (k_descale[b, h, n]) is not a row's factor: each score reads its
    own, and the kernel compiles."""
    checked, kernel = attncc.optimise(_fp8_variant(k_descale="n"))
    rendered_ = cuda_backend.render(kernel, checked.spec)
    assert "score_factor" not in rendered_.source
    source = tmp_path / "fp8_key.cu"
    source.write_text(rendered_.standalone())
    nvcc(source, tmp_path / "o.ptx", "--ptx")


def test_fp8_score_factors_are_read_before_the_tiles_mmas() -> None:
    """Each tile's descales are loaded before its S = Q K^T is issued, so their latency runs
    under the MMAs (read after S's wait, they cost the kernel 15%), and each score reads its
    row's factor from a register."""
    source = build(EXAMPLES / "fp8_causal.attn", target="cuda").source
    # split where a seen tile's scores are declared: the group's first tile and each later one
    parts = source.split("float sc[M_TILES][BN / 8][4];")
    assert len(parts) == 3
    for before, tile in itertools.pairwise(parts):
        preamble = before[before.rindex("const int s = i % STAGES;") :]
        assert "score_factors[mt][h] = " in preamble and "t_k_descale[" in preamble
        assert preamble.index("score_factors[mt][h] = ") < preamble.index("named_barrier_sync")
        scores = tile[: tile.index("online softmax")]
        assert "wgmma_wait<" in scores and "t_k_descale[" not in scores
        assert "const float score_factor = score_factors[mt][h];" in scores


def test_fp8_value_scales_fold_into_the_exponent_where_no_largest_weight_rounds() -> None:
    """A tile's value scale folds into its weights' exponent (O keeps its scale: no multiply
    of O a tile beyond the softmax's own rescale, which multiplying O every tile cost the
    FP8 kernel 4.4-4.6%) where its ratio to O's is 2^-3 .. 2^0 exactly, or within [1/8, 7/4]
    in a tile that moves no row's max; decided after the max (``rescale``). Other tiles move
    O to their scale: folded there, a ratio of any mantissa would round the rows' new
    largest weights to e4m3."""
    source = build(EXAMPLES / "fp8_block.attn", target="cuda").source
    fold = "const bool v_fold = v_power_of_two || (v_near && !rescale);"
    assert source.count(fold) == 2
    assert source.count("((v_bits ^ v_acc_bits) & 0x807fffffu) == 0u && v_step >= -3") == 2
    for tile in source.split(fold)[:-1]:
        assert tile.rindex("const bool rescale = __any_sync") > tile.rindex("const bool v_near")
    assert source.count("exp_c - v_bias - FP8_WEIGHT_LOG2;") == 2
    assert source.count("l_i[mt][h] += (sum2[0] + sum2[1]) * v_unbias;") == 2
    for tile in source.split("if (v_fold) {")[1:]:
        folded, moved = tile.split("} else {", 1)
        assert "if (rescale) {" in folded and "v_scale_acc" not in folded
        assert "v_scale_acc = v_kept;" in moved[: moved.index("pending = s;")]
    plain = build(EXAMPLES / "gqa_causal.attn", target="cuda").source
    assert "v_bias" not in plain and "v_fold" not in plain


def test_fp8_weights_follow_every_tiles_max() -> None:
    """The FP8 kernel's reference max follows each tile's max (no slack: a row's largest
    weight is exactly 2^FP8_WEIGHT_LOG2, not a value rounded to e4m3's 3 mantissa bits) and
    its lse takes the weights' factor back out; 16-bit kernels keep the slack of 8."""
    fp8 = build(EXAMPLES / "fp8_block.attn", target="cuda").source
    assert fp8.count("constexpr float RESCALE_SLACK = 0.0f;") == 2
    assert "RESCALE_SLACK = 8.0f" not in fp8
    assert "m_i[0][h] -= FP8_WEIGHT_LOG2 * inv_c;" in fp8
    plain = build(EXAMPLES / "gqa_causal.attn", target="cuda").source
    assert "constexpr float RESCALE_SLACK = 8.0f;" in plain
    assert "RESCALE_SLACK = 0.0f" not in plain and "m_i[0][h] -= FP8_WEIGHT_LOG2" not in plain


def test_the_sm90a_kernel_takes_the_scores_bound_where_the_host_asks() -> None:
    """Soft-capping's hopper source holds the scores' bound as a softmax reference
    (ATTNCC_FIXED_REFERENCE: scores kept relative to it, no row max), which a spec without a
    bound refuses at compile time; the host's _defines names it only for a call that takes it."""
    softcap = dict(rendered("softcap").sources)["hopper"]
    bound = "(fabsf(p_cap) * 1.4426950408889634f)"
    ref = f"fminf({bound}, (100.0f - {bound}))"
    assert f"const float score_ref = {ref};" in softcap
    assert "s2 -= score_ref;" in softcap
    causal = dict(rendered("causal").sources)["hopper"]
    assert 'static_assert(!ATTNCC_FIXED_REFERENCE, "the spec\'s scores have no bound");' in causal
    module = attncc.compile(EXAMPLES / "softcap.attn", target="cuda").module(False)
    tiles = (torch.bfloat16, 64, 64, (12, 1, 128), None, True, 2, 1, (1, 3, 2), 0)
    assert dict(module._defines(*tiles, 1))["ATTNCC_FIXED_REFERENCE"] == 1
    assert "ATTNCC_FIXED_REFERENCE" not in dict(module._defines(*tiles, 0))


def test_golden_cuda_source() -> None:
    built = build(EXAMPLES / "gqa_causal.attn", target="cuda")
    golden_files.assert_golden(
        built.source, ROOT / "tests" / "golden" / "gqa_causal.fused.cu.txt", "generated now"
    )


def test_cuda_source_is_deterministic_and_names_the_spec() -> None:
    first = build(EXAMPLES / "decode.attn", target="cuda").source
    assert first == build(EXAMPLES / "decode.attn", target="cuda").source
    assert f"attncc {attncc.__version__}" in first.splitlines()[0]


def test_kernel_source_is_the_cuda_source() -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn", target="cuda")
    assert kernel.target == "cuda"
    assert 'extern "C" __global__' in kernel.source
    assert kernel.path.read_text() != kernel.source  # the loaded module is the host side
    assert kernel.input_names == ("q", "k", "v")


def test_fused_tiles_fit_registers_and_shared_memory() -> None:
    """The host's fused tiles (per padded head dims and GPU): two blocks of 4 warps x 32 rows
    (128 x 64) at D <= 128 on an H100/H200 (one of 8 warps where shared memory holds one
    block of 4 only), one row tile a warp where two would not fit, and a
    per-call override for sweeps that is checked like the defaults."""
    module = attncc.compile(EXAMPLES / "causal.attn", target="cuda").module(False)
    hopper, ampere, small = 227 * 1024, 163 * 1024, 99 * 1024
    assert module._fused_config(128, 128, hopper) == (4, 2, 64)
    assert module._fused_config(64, 64, hopper) == (4, 2, 64)
    assert module._fused_config(128, 128, ampere) == (8, 2, 64)
    assert module._fused_config(256, 256, hopper) == (4, 1, 32)
    assert module._fused_config(128, 128, small) == (4, 1, 32)
    dims = cuda_backend.PADDED_HEAD_DIMS
    for limit in (hopper, ampere, small):
        for dp in dims:
            for dvp in dims:
                warps, m_tiles, block_n = module._fused_config(dp, dvp, limit)
                block_m = 16 * warps * m_tiles
                assert module._fused_shared_bytes(block_m, block_n, dp, dvp) <= limit
                assert module._fused_accumulators(m_tiles, block_n, dp, dvp) <= 192
    sweep = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    assert module._fused_override(sweep, 128, 128, hopper) == (8, 1, 64)
    with pytest.raises(ValueError, match="16 or 32 rows a warp"):
        module._fused_override({"BLOCK_M": 48, "num_warps": 4}, 128, 128, hopper)
    with pytest.raises(ValueError, match="bytes of shared memory"):
        module._fused_override({"BLOCK_M": 256, "num_warps": 8}, 256, 256, hopper)


def test_tensor_copies_only_where_a_map_describes_the_tiles() -> None:
    """Variant 2's tensor copies (TMA) need each operand's keys on one axis of its own: not
    through a page table, and not bounded by lengths read from a tensor (a map zero-fills
    only past the axis's end)."""
    axes = {
        name: attncc.compile(EXAMPLES / f"{name}.attn", target="cuda").module(False)._TMA_AXES
        for name in ("causal", "gqa_causal", "paged_decode", "decode", "speculative_decode")
    }
    assert axes["causal"] == {"k": ("k", 2, 3), "v": ("v", 2, 3)}
    assert axes["gqa_causal"] == {"k": ("k", 2, 3), "v": ("v", 2, 3)}
    assert axes["paged_decode"] is None and axes["decode"] is None
    assert axes["speculative_decode"] is None


def test_wgmma_copies_take_config_and_fall_back_to_cp_async(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = attncc.compile(EXAMPLES / "causal.attn", target="cuda").module(False)

    def fits(stages: int, q_buffers: int) -> bool:
        return True

    def head_dim_128(stages: int, q_buffers: int) -> bool:  # two groups: 64 KB a stage, 32 a Q
        return 64 * stages + 32 * q_buffers <= 224

    assert module._wgmma_copies(None, fits) == (1, 3, 2)
    # the second Q buffer before the third stage, then the third stage alone
    assert module._wgmma_copies(None, head_dim_128) == (1, 2, 2)
    assert module._wgmma_copies({"stages": 3}, head_dim_128) == (1, 3, 1)
    assert module._wgmma_copies(None, lambda stages, q: stages + q <= 3) == (1, 2, 1)
    assert module._wgmma_copies({"tma": 0, "stages": 2, "q_buffers": 1}, fits) == (0, 2, 1)
    with pytest.raises(ValueError, match="tma 0 or 1, stages 2 or 3, q_buffers 1 or 2"):
        module._wgmma_copies({"stages": 4}, fits)
    with pytest.raises(ValueError, match="q_buffers 1 or 2"):
        module._wgmma_copies({"q_buffers": 3}, fits)
    paged = attncc.compile(EXAMPLES / "paged_decode.attn", target="cuda").module(False)
    assert paged._wgmma_copies({"tma": 1}, fits) == (0, 3, 2)
    # one MMA group: two blocks a multiprocessor, half the registers each
    one_group = dict(
        module._defines(torch.bfloat16, 128, 128, (4, 1, 64), None, True, 2, 0, (1, 2, 2))
    )
    assert one_group["ATTNCC_BLOCKS"] == 2 and one_group["ATTNCC_PRODUCER_REGISTERS"] == 24
    two_groups = dict(
        module._defines(torch.bfloat16, 128, 128, (8, 1, 128), None, True, 2, 1, (1, 3, 1))
    )
    assert two_groups["ATTNCC_BLOCKS"] == 1 and two_groups["ATTNCC_STAGES"] == 3
    three_groups = dict(
        module._defines(torch.bfloat16, 64, 64, (12, 1, 128), None, True, 2, 0, (1, 3, 2))
    )
    assert three_groups["ATTNCC_BLOCKS"] == 1
    assert (three_groups["ATTNCC_PRODUCER_REGISTERS"], three_groups["ATTNCC_MMA_REGISTERS"]) == (
        32,
        160,
    )

    def refuse(*args: object) -> bytes:
        raise module._tensor_map.TensorMapRefused("no")

    monkeypatch.setattr(module._tensor_map, "encode", refuse)
    q, k, v = (torch.randn(1, 2, 8, 64).bfloat16() for _ in range(3))
    tensors, _ = module._bind([q, k, v], {})
    sizes = {"B": 1, "H": 2, "M": 8, "N": 8, "D": 64}
    assert module._key_tile_maps(tensors, sizes, 128) is None


@pytest.mark.parametrize(
    ("programs", "rows", "tiles"),
    [
        # (B x H, query rows): the H200 A/B's shapes and which tiles ran faster there
        (16, 512, "single"),
        (16, 1024, "single"),
        (16, 2048, "single"),
        (16, 3072, "narrow"),  # 256 items of 192 rows: two rounds; of 64 rows: three
        (64, 4096, "narrow"),
        (1, 64, "single"),
    ],
)
def test_head_dim_64_takes_one_mma_group_where_its_items_fill_the_gpu_sooner(
    monkeypatch: pytest.MonkeyPatch, programs: int, rows: int, tiles: str
) -> None:
    causal = attncc.compile(EXAMPLES / "causal.attn", target="cuda").module(False)
    monkeypatch.setattr(causal, "_multiprocessors", lambda device: 132)
    expected = causal._WGMMA_TILES_SINGLE if tiles == "single" else causal._WGMMA_TILES_NARROW
    assert causal._narrow_or_single(rows, programs, None) == expected
    assert causal._WGMMA_TILES_SINGLE == (2, 4, 128, 0)  # one group: no ping-pong partner


def test_wgmma_tiles_by_head_dim_and_tile_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sm_90a tiles the host picks: two MMA groups with ping-pong, three on 192-row tiles
    for head dims up to 64 (their register budget holds only narrow outputs), with a tile
    index too (each group reads its own tiles' bits), 128 x 64 tiles past head dim 128 and
    for document masks at 128 (whose partial tiles read key ids; varlen's compare key
    indices and keep 128 keys); a config asking for three groups at head dim 128 is
    refused by name."""
    causal = attncc.compile(EXAMPLES / "causal.attn", target="cuda").module(False)
    documents = attncc.compile(EXAMPLES / "document_mask.attn", target="cuda").module(False)
    varlen = attncc.varlen(EXAMPLES / "causal.attn", target="cuda").kernel.module(False)
    for module in (causal, documents, varlen):
        monkeypatch.setattr(module, "_has_wgmma", lambda device: True)
    vec = (1, 1, 1)
    assert causal._wgmma_tiles(None, 128, 128, vec, None) == (2, 8, 128, 1)
    assert causal._wgmma_tiles(None, 64, 64, vec, None) == (2, 12, 128, 1)
    assert causal._wgmma_tiles(None, 64, 128, vec, None) == (2, 8, 128, 1)
    assert documents._wgmma_tiles(None, 64, 64, vec, None) == (2, 12, 128, 1)
    assert documents._wgmma_tiles(None, 128, 128, vec, None) == (2, 8, 64, 0)
    assert varlen._wgmma_tiles(None, 128, 128, vec, None) == (2, 8, 128, 1)
    assert causal._wgmma_tiles({"wgmma": 2, "num_warps": 12}, 64, 64, vec, None) == (
        2,
        12,
        128,
        0,
    )
    with pytest.raises(ValueError, match="12 with wgmma 2 and head dims up to 64"):
        causal._wgmma_tiles({"wgmma": 2, "num_warps": 12}, 128, 128, vec, None)
    # past 128: two groups on 128 x 64 tiles without ping-pong; variant 1 stops at 128, and
    # nothing takes head dims past 256
    assert causal._wgmma_tiles(None, 256, 256, vec, None) == (2, 8, 64, 0)
    assert causal._wgmma_tiles(None, 256, 128, vec, None) == (2, 8, 64, 0)
    assert documents._wgmma_tiles(None, 192, 192, vec, None) == (2, 8, 64, 0)
    with pytest.raises(ValueError, match="variant 1 takes head dims up to 128"):
        causal._wgmma_tiles({"wgmma": 1, "num_warps": 8}, 256, 256, vec, None)
    assert causal._wgmma_tiles(None, 320, 320, vec, None) is None
    # variant 2 pads to its 64-column blocks: 192 stays 192 (the others' padding: 256)
    assert [causal._wgmma_padded(d) for d in (40, 64, 96, 160, 192, 200, 256)] == [
        64,
        64,
        128,
        192,
        192,
        256,
        256,
    ]
    assert causal._padded(160, "head dim") == 256
    with pytest.raises(ValueError, match="12 with wgmma 2"):
        causal._wgmma_tiles({"wgmma": 1, "num_warps": 12}, 64, 64, vec, None)


def test_fused_grid_is_persistent_for_variant_two_without_a_tile_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fused launch's blocks: as many as the GPU holds at once (multiprocessors x blocks
    a multiprocessor) where the kernel loops over items (variant 2 without a tile index),
    else one an item; `config` turns it off, caps the blocks (tests: many items a block) and
    groups programs; a cap the kernel cannot honour is refused by name."""
    module = attncc.compile(EXAMPLES / "causal.attn", target="cuda").module(False)
    monkeypatch.setattr(module, "_multiprocessors", lambda device: 132)
    monkeypatch.setattr(module, "_key_tile_maps", lambda *args: None)
    assert module._fused_grid(None, 2048, 128, True, 1, None) == (132, 1)
    assert module._fused_grid(None, 2048, 128, True, 2, None) == (264, 1)
    assert module._fused_grid(None, 18, 3, True, 1, None) == (18, 1)
    assert module._fused_grid(None, 2048, 128, False, 1, None) == (2048, 1)
    assert module._fused_grid({"persistent": 0}, 2048, 128, True, 1, None) == (2048, 1)
    assert module._fused_grid({"blocks": 3, "group_programs": 4}, 18, 3, True, 1, None) == (3, 3)
    with pytest.raises(ValueError, match="needs the persistent kernel"):
        module._fused_grid({"blocks": 3}, 18, 3, False, 1, None)
    with pytest.raises(ValueError, match="persistent 0 or 1"):
        module._fused_grid({"persistent": 2}, 18, 3, True, 1, None)
    # the document mask's index builder: a block row per batch entry, so at most 65535
    documents = attncc.compile(EXAMPLES / "document_mask.attn", target="cuda").module(False)
    sizes = {"B": 70000, "H": 1, "N": 64, "D": 64}
    with pytest.raises(ValueError, match="at most 65535 index programs"):
        documents._tile_index_build(None, (), sizes, 1, 2, 64, 64, None)


def test_the_calls_that_take_the_wgmma_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_takes_wgmma`, which sends an auto kernel's other calls to Triton: 16-bit CUDA tensors
    on an sm_90 GPU with head dims up to 256 and 16-byte loads, enough queries for the
    fused kernel (speculative decode's one-query calls split the keys), and a document
    mask's batch entries within its index builder's grid."""
    causal = attncc.compile(EXAMPLES / "causal.attn", target="cuda").module(False)
    drafts = attncc.compile(EXAMPLES / "speculative_decode.attn", target="cuda").module(False)
    sm90 = {causal: True, drafts: True}
    for module in (causal, drafts):
        monkeypatch.setattr(module, "_has_wgmma", lambda device, m=module: sm90[m])
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")

    def takes(module: Any, dtype: torch.dtype, d: int, rows: int = 200, **kw: Any) -> bool:
        q, k, v = (torch.zeros(2, 4, rows, d, dtype=dtype) for _ in range(3))
        if kw.get("padded"):  # rows of d + 4 elements: no 16-byte loads
            k = torch.zeros(2, 4, rows, d + 4, dtype=dtype)[..., :d]
        tensors, _ = module._bind([q, k, v], {})
        sizes = {"B": 2, "H": 4, "M": rows, "N": rows, "D": d}
        return bool(module._takes_wgmma(tensors, sizes, dtype, kw.get("device", cuda)))

    assert takes(causal, torch.bfloat16, 128) and takes(causal, torch.float16, 64)
    assert not takes(causal, torch.bfloat16, 128, device=cpu)
    assert not takes(causal, torch.float32, 128)
    assert takes(causal, torch.bfloat16, 256) and takes(causal, torch.float16, 192)
    assert not takes(causal, torch.bfloat16, 288)
    assert not takes(causal, torch.bfloat16, 128, padded=True)
    sm90[causal] = False  # another GPU
    assert not takes(causal, torch.bfloat16, 128)
    tensors, sizes = few_query_call(drafts)
    assert drafts._splits_keys(sizes) and not drafts._takes_wgmma(
        tensors, sizes, torch.bfloat16, cuda
    )
    # a document mask with more batch entries than its index builder's grid takes: Triton
    documents = attncc.compile(EXAMPLES / "document_mask.attn", target="cuda").module(False)
    monkeypatch.setattr(documents, "_has_wgmma", lambda device: True)
    for batch, expected in ((65535, True), (65536, False)):
        q = torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16).expand(batch, 2, 64, 64)
        doc = torch.zeros(1, 64, dtype=torch.int32).expand(batch, 64)
        tensors, _ = documents._bind([q, q, q, doc], {})
        sizes = {"B": batch, "H": 2, "N": 64, "D": 64}
        assert documents._takes_wgmma(tensors, sizes, torch.bfloat16, cuda) == expected


def test_auto_hands_calls_with_fewer_query_tiles_than_multiprocessors_to_triton(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An auto kernel runs a call on the sm_90a kernels only with a 128-row query tile for
    every multiprocessor, two for a spec whose key interval follows the row at head dim 64,
    and where the keys grow with the row (causal: Triton pairs its tiles) four at head dim
    64, three at 128: full attention on 2 x 8 heads of 512 queries (32 tiles) goes to Triton
    on 132 SMs, of 1057 (144 tiles) stays; a sliding window at head dim 64 stays from 2 x 8 x
    17 tiles; causal at head dim 64 from 2 x 8 x 33, at head dim 128 from 2 x 8 x 25; a call
    the kernels cannot take never stays, nor one of soft-capping (a tanh a score) at head
    dim 64; at head dim 128 it stays, with the scores' bound as its softmax reference or
    not."""

    def module(name: str) -> Any:
        compiled = attncc.compile(EXAMPLES / f"{name}.attn", target="cuda").module(False)
        monkeypatch.setattr(compiled, "_has_wgmma", lambda device: True)
        monkeypatch.setattr(compiled, "_multiprocessors", lambda device: 132)
        return compiled

    full, causal, window = module("fused"), module("causal"), module("sliding_window")
    softcap = module("softcap")
    cuda = torch.device("cuda", 0)

    def stays(
        spec: Any,
        rows: int,
        head_dim: int = 64,
        dtype: torch.dtype = torch.bfloat16,
        params: dict[str, float] | None = None,
    ) -> bool:
        q = torch.zeros(2, 8, rows, head_dim, dtype=dtype)
        tensors, params = spec._bind([q, q, q], params or {})
        sizes = {"B": 2, "H": 8, "M": rows, "N": rows, "D": head_dim}
        full = spec._param_defaults(sizes, dict(params))
        return bool(spec._auto_takes_cuda(tensors, full, sizes, dtype, cuda))

    assert not stays(full, 512) and not stays(full, 64)
    assert stays(full, 2048) and stays(full, 1057)  # 2 x 8 x 9 tiles
    assert not stays(full, 1056 - 127)  # 2 x 8 x 8 = 128 tiles
    assert not stays(window, 2048) and stays(window, 2049)  # 256 and 2 x 8 x 17 = 272
    assert not stays(causal, 4096) and stays(causal, 4097)  # 512 and 2 x 8 x 33 = 528
    assert stays(causal, 3073, head_dim=128) and not stays(causal, 3072, head_dim=128)
    assert not stays(softcap, 16384) and stays(softcap, 16384, head_dim=128)
    assert stays(softcap, 16384, head_dim=128, dtype=torch.float16)
    assert stays(softcap, 16384, head_dim=128, params={"cap": 50.0})
    assert not stays(full, 4096, dtype=torch.float32)


def few_query_call(module: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """Speculative decode's inputs with one draft query (its split-KV path)."""
    q = torch.zeros(2, 8, 1, 64, dtype=torch.bfloat16)
    k, v = (torch.zeros(2, 300, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    lengths = torch.tensor([300, 200], dtype=torch.int32)
    tensors, params = module._bind([q, k, v, lengths], {})
    sizes, _, _ = module._check(tensors, params)
    return tensors, sizes


# ----------------------------------------------------------------------------- errors


def test_naive_schedule_is_refused_for_cuda() -> None:
    with pytest.raises(ValueError, match="not available for target cuda"):
        attncc.compile(EXAMPLES / "naive.attn", target="cuda")


def test_unknown_target_lists_cuda() -> None:
    with pytest.raises(ValueError, match="triton, cuda"):
        attncc.compile(EXAMPLES / "causal.attn", target="metal")


def test_cpu_tensors_are_refused_with_a_clear_error() -> None:
    kernel = attncc.compile(EXAMPLES / "causal.attn", target="cuda")
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    with pytest.raises(ValueError, match="target 'cuda' needs CUDA tensors; use target='triton'"):
        kernel(q, k, v)


def test_bad_tensors_get_the_same_errors_as_triton() -> None:
    cuda = attncc.compile(EXAMPLES / "gqa_causal.attn", target="cuda")
    triton = attncc.compile(EXAMPLES / "gqa_causal.attn")
    q, k, v = torch.randn(1, 3, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    for kernel in (cuda, triton):
        with pytest.raises(ValueError, match=r"H \(3\) must be a multiple of KVH \(2\)"):
            kernel(q, k, v)
        with pytest.raises(TypeError, match="missing input v"):
            kernel(q, k)
        with pytest.raises(ValueError, match="input 'k' must have 4 dims"):
            kernel(q, k[0], v)


def test_fake_tensor_shapes_match_triton() -> None:
    cuda = attncc.compile(EXAMPLES / "causal.attn", target="cuda")
    q, k, v = (torch.randn(2, 3, 5, 16) for _ in range(3))
    out, lse = cuda._fake(q, k, v, None, return_lse=True)
    assert out.shape == (2, 3, 5, 16) and lse.shape == (2, 3, 5)


# ----------------------------------------------------------------------------- expressions


def env(**bounded: bool) -> CudaEnv:
    tensors = {
        "doc": ir.TensorArg("doc", ("B", "N"), "i32", "aux"),
        "slopes": ir.TensorArg("slopes", ("H",), "float", "aux"),
    }
    indices = {"b": "i_b", "h": "i_h", "m": "i_m", "n": "i_n"}
    return CudaEnv(indices, tensors, frozenset(k for k, v in bounded.items() if v))


def test_integer_arithmetic_stays_integer_and_truncates() -> None:
    m, n = ir.Index("m"), ir.Index("n")
    expr = ir.BinOp("/", ir.BinOp("-", m, n, "int"), ir.Const(2, "int"), "int")
    assert cuda_expr(expr, env()) == "((i_m - i_n) / 2)"
    mod = ir.BinOp("%", n, ir.Dim("PAGE"), "int")
    assert cuda_expr(mod, env()) == "attncc_umod(i_n, d_PAGE, dmul_PAGE, dshift_PAGE)"
    page = ir.BinOp("/", n, ir.Dim("PAGE"), "int")
    assert cuda_expr(page, env()) == "attncc_udiv(i_n, dmul_PAGE, dshift_PAGE)"
    signed = ir.BinOp("%", ir.BinOp("-", m, n, "int"), ir.Dim("PAGE"), "int")
    assert cuda_expr(signed, env()) == "((i_m - i_n) % d_PAGE)"  # may be negative: C's %


def test_floats_promote_ints_and_use_float_functions() -> None:
    scale = ir.BinOp("/", ir.Const(1.0, "float"), ir.Call("sqrt", (ir.Dim("D"),), "float"), "float")
    # float division divides as Triton does (div.full.f32), not with C's IEEE `/`
    assert cuda_expr(scale, env()) == "attncc_div(1.0f, sqrtf(((float)d_D)))"
    tanh = ir.Call("tanh", (ir.BinOp("/", ir.Score(), ir.Param("cap", "float"), "float"),), "float")
    # tanh by the kernel's element type: tanh.approx.f32 for bf16 (plan.TANH_APPROX_DTYPES)
    assert cuda_expr(tanh, env()) == "attncc_tanh_as<elem_t>(attncc_div(s, p_cap))"
    fmod = ir.BinOp("%", ir.Score(), ir.Const(2.0, "float"), "float")
    assert cuda_expr(fmod, env()) == "fmodf(s, 2.0f)"


def test_logic_and_where() -> None:
    m, n = ir.Index("m"), ir.Index("n")
    both = ir.BinOp(
        "and",
        ir.BinOp(">=", m, n, "bool"),
        ir.Unary("not", ir.Const(False, "bool"), "bool"),
        "bool",
    )
    assert cuda_expr(both, env()) == "(((i_m >= i_n)) && ((!(false))))"
    pick = ir.Call("where", (ir.BinOp("<", m, n, "bool"), ir.Const(1, "int"), ir.Score()), "float")
    assert cuda_expr(pick, env()) == "(((i_m < i_n)) ? ((float)1) : s)"
    assert cuda_expr(ir.Call("max", (m, n), "int"), env()) == "max(i_m, i_n)"


def test_loads_are_bounded_only_through_row_and_key_indices() -> None:
    row = ir.Load("doc", (ir.Index("b"), ir.Index("m")), "int")
    assert cuda_expr(row, env()) == "(t_doc[(i_b) * s_doc_0 + (i_m) * s_doc_1])"
    guarded = cuda_expr(row, env(m=True))
    assert guarded == (
        "(((i_m) >= 0 && (i_m) < d_N) ? t_doc[(i_b) * s_doc_0 + (i_m) * s_doc_1] : 0)"
    )
    slope = ir.Load("slopes", (ir.Index("h"),), "float")
    assert cuda_expr(slope, env()) == "(to_float(t_slopes[(i_h) * s_slopes_0]))"


def test_precomputed_values_are_read_by_name() -> None:
    row = ir.Load("doc", (ir.Index("b"), ir.Index("m")), "int")
    key = ir.Load("doc", (ir.Index("b"), ir.Index("n")), "int")
    same = ir.BinOp("==", row, key, "bool")
    known = CudaEnv(env().indices, env().tensors, values={row: "rv0", key: "kv0[j][e]"})
    assert cuda_expr(same, known) == "(rv0 == kv0[j][e])"
    assert "t_doc" in cuda_expr(same, env())


def test_only_key_sides_that_read_memory_load_before_the_k_wait() -> None:
    """The sm_90a kernel loads a partial tile's document ids before waiting for its K (their
    latency passes under the wait). varlen's key sides are the key index itself: held
    across the MMAs they only cost registers (its kernel ran 15-25% slower with them)."""
    doc = dict(rendered("document_mask").sources)["hopper"]
    assert "(key_sides_early)" in doc and "KEYS_EARLY ? kv0_early[j][e]" in doc
    spec = varlen_source(EXAMPLES / "causal.attn", same_packing=True)
    checked, kernel = attncc.optimise(spec)
    varlen = dict(cuda_backend.render(kernel, checked.spec).sources)["hopper"]
    assert "mask n >= cu_seqlens_q[seq_q[m]]" in spec
    assert "(key_sides_early)" not in varlen and "KEYS_EARLY" not in varlen
    assert "const auto kv0 = i_n;" in varlen


def test_document_mask_partial_tiles_read_each_document_id_once() -> None:
    """Partial tiles compare precomputed document ids: the row's once a row, the key's once a
    key of the thread's fragment (per score, each was a global load), and only where the
    tile index says a tile is not one document's whole. In every loop of the fused kernel:
    mma.sync's and the two sm_90a ones (#if ATTNCC_WGMMA)."""
    sources = dict(rendered("document_mask").sources)
    fused = sources["hopper"].split("attncc_document_mask_fwd(", 1)[1]
    pipelined = fused.split("attncc_document_mask_tile_index(")[0]
    one_block = sources["mma"].split("attncc_document_mask_fwd(", 1)[1]
    hopper, mma_sync = one_block.split("\n#if ATTNCC_WGMMA\n", 1)[1].split("\n#else\n", 1)
    # the pipelined loop has its tile body twice: the first tile a group sees has no pending
    # P V to issue
    bodies = {"pipelined": 2, "hopper": 1, "mma_sync": 1}
    loops_by_name = {
        "pipelined": pipelined,
        "hopper": hopper,
        "mma_sync": mma_sync.split("\n#endif\n", 1)[0],
    }
    for name, loop in loops_by_name.items():
        assert "if (!(i_n < key_size && ((((rv0[mt][h] == kv0)) && ((i_m >= i_n)))))) s2" in loop
        assert loop.count("rv0[mt][h] = row_side0(wr0 + mt * 16 + g + 8 * h);") == bodies[name]
        assert loop.count("const auto kv0 = ") == bodies[name]
        # a tile whose full bit says one document holds it whole, on the diagonal: the causal
        # bound alone (the row's last visible key, less the thread's first column), no
        # document id read
        row_bound = "const int rel_hi = max(min((int)((i_m + 1)), key_size), 0) - (n0 + t4 * 2);"
        assert loop.count(row_bound) == bodies[name]
        assert loop.count("if (!(j * 8 + e < rel_hi)) s2 = -ATTNCC_INF;") == bodies[name]
        assert loop.count("} else if (n0 < mid_lo || n0 >= mid_hi) {") == bodies[name]


def test_partial_tiles_test_the_rows_key_interval() -> None:
    """Where every mask folded into the key interval (a sliding window: two bounds) and the
    scores are raw, a partial tile tests each score's column offset against the row's
    bounds less the thread's first column, computed once a row; a mask left residual
    (m - n != 3) or a score modification keeps the masks as written, every one a score."""
    source = build(EXAMPLES / "sliding_window.attn", target="cuda").source
    lines = {line.strip() for line in source.splitlines()}
    assert "const int rel_lo = max((int)(((i_m - p_window) + 1)), 0) - (n0 + t4 * 2);" in lines
    assert "const int rel_hi = max(min((int)((i_m + 1)), key_size), 0) - (n0 + t4 * 2);" in lines
    assert "if (!(j * 8 + e >= rel_lo && j * 8 + e < rel_hi)) s2 = -ATTNCC_INF;" in lines
    text = (
        (EXAMPLES / "causal.attn").read_text().replace("mask m >= n", "mask m >= n and m - n != 3")
    )
    residual = build(text, target="cuda").source
    assert "rel_hi" not in residual
    assert "if (!(i_n < key_size && ((((i_m >= i_n)) && (((i_m - i_n) != 3)))))) s2" in residual
    # with a score modification (soft-capping) the per-score tests stay: the per-row form
    # was 30% slower there
    softcap = build(EXAMPLES / "softcap.attn", target="cuda").source
    assert "rel_hi" not in softcap
    assert "if (!(i_n < key_size && ((i_m >= i_n)))) s2 = -ATTNCC_INF;" in softcap


def test_special_float_literals() -> None:
    assert float_literal(float("inf")) == "__int_as_float(0x7f800000)"
    assert float_literal(float("-inf")) == "__int_as_float(0xff800000)"
    assert float_literal(0.5) == "0.5f"
    assert float_literal(1e-30) == "1e-30f"


# ----------------------------------------------------------------------------- templates

CUDA_TEMPLATES = sorted(p.name for p in cuda_backend.CUDA_TEMPLATE_DIR.glob("*.jinja"))


def test_cuda_environment_follows_the_house_rules() -> None:
    env_ = cuda_backend.environment()
    assert env_.undefined is jinja2.StrictUndefined
    assert env_.trim_blocks and env_.lstrip_blocks
    assert {"family_hopper.cu.jinja", "host.py.jinja", "attend.cu.jinja"} <= set(CUDA_TEMPLATES)


FAMILY_TEMPLATES = [f"family_{family}.cu.jinja" for family in cuda_backend.FAMILIES]


@pytest.mark.parametrize("template", [*FAMILY_TEMPLATES, "host.py.jinja"])
def test_rendering_without_any_variable_raises(template: str) -> None:
    checked, kernel = attncc.optimise(EXAMPLES / "document_mask.attn")
    context = cuda_backend._Context(kernel, checked.spec.source)
    values = context.values()
    values["contents"] = context.contents("hopper", True, values["split"])
    values["includes"] = cuda_backend.HEADERS
    values["cuda_sources"] = [("hopper", "// source")]
    values["cuda_headers"] = [("attncc_cuda.cuh", "// header")]
    assert_every_variable_required(cuda_backend.environment(), template, values)


# ----------------------------------------------------------------------------- Hopper primitives


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA sources are rendered, not compiled")
def test_wgmma_probe_compiles_for_sm90a_and_traps_without_its_features(tmp_path: Path) -> None:
    """The warp-group MMA primitives (templates/cuda/wgmma.cu.jinja) compile for sm_90a to
    the probes' wgmma instructions (8 for Q * K^T, 4 for P * V, and 4 each in e4m3) with their
    fences; built for
    plain sm_90 (no wgmma) an MMA is a trap, never silent zeros. tests/gpu/test_gpu_cuda.py
    checks the numbers on an H100/H200."""
    source = tmp_path / "probe.cu"
    source.write_text(cuda_backend.render_wgmma_probe())
    ptx = {}
    for arch in ("sm_90a", "sm_90"):
        out = tmp_path / f"probe_{arch}.ptx"
        nvcc(source, out, "--ptx", arch)
        ptx[arch] = out.read_text()
    assert ptx["sm_90a"].count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") == 8
    assert ptx["sm_90a"].count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 4
    # the FP8 probes: 4 k32 steps of Q * K^T, 4 of P * V (P packed with 2 shuffles a row)
    assert ptx["sm_90a"].count("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3") == 8
    assert ptx["sm_90a"].count("cvt.rn.satfinite.e4m3x2.f32") == 32
    fences = ("wgmma.fence", "wgmma.commit_group", "wgmma.wait_group", "fence.proxy.async")
    assert all(fence in ptx["sm_90a"] for fence in fences)
    assert "wgmma.mma_async" not in ptx["sm_90"] and "trap;" in ptx["sm_90"]
    nvcc(source, tmp_path / "probe.cubin", "-cubin")


# ----------------------------------------------------------------------------- kernel families

KERNEL_NAME = re.compile(r'extern "C" __global__ void[^\n]*?(attncc_\w+)\(|^(attncc_\w+)\(', re.M)


def kernel_names(source: str) -> list[str]:
    return [a or b for a, b in KERNEL_NAME.findall(source)]


def test_each_family_holds_only_its_kernels_after_its_header() -> None:
    """One source per kernel family, the default one (the sm_90a fused kernel) first: each
    holds its own kernels only, opens with the spec and what it holds, includes the shipped
    helpers rather than spelling them out, and reads kernel first."""
    sources = dict(rendered("document_mask").sources)
    assert list(sources) == ["hopper", "mma", "fma", "split", "backward"]
    assert kernel_names(sources["hopper"]) == [
        "attncc_document_mask_fwd",
        "attncc_document_mask_tile_index",
    ]
    assert kernel_names(sources["mma"]) == ["attncc_document_mask_fwd"]
    assert kernel_names(sources["fma"]) == [
        "attncc_document_mask_rows",
        "attncc_document_mask_rows_split",
        "attncc_document_mask_combine",
    ]
    assert kernel_names(sources["split"]) == ["attncc_document_mask_split"]
    assert kernel_names(sources["backward"]) == [
        "attncc_document_mask_bwd",
        "attncc_document_mask_bwd_row_ranges",
        "attncc_document_mask_bwd_delta",
        "attncc_document_mask_bwd_dq",
    ]
    for family, source in sources.items():
        assert source.startswith("// Generated by attncc")
        assert f"// Kernel family '{family}'" in source
        assert "//     mask doc[b, m] == doc[b, n]" in source  # the spec, in the header
        assert "__device__ __forceinline__" not in source  # helpers live in the headers
        assert '#include "attncc_cuda.cuh"' in source
        assert ('#include "attncc_hopper.cuh"' in source) == (
            family in ("hopper", "mma", "backward")
        )
        # the spec's lines beside the code they become
        assert "// document_mask.attn:" in source, family
    assert "ATTNCC_MMA " not in sources["hopper"] and "mma_loop" not in sources["hopper"]
    assert "hopper_pipelined" not in sources["mma"] and "ATTNCC_WGMMA == 2" not in sources["mma"]
    # split-KV alone where every call splits the keys: no fused kernels rendered
    assert families("decode") == ["split", "fma"]
    assert kernel_names(dict(rendered("decode").sources)["fma"]) == [
        "attncc_decode_rows_split",
        "attncc_decode_combine",
    ]
    assert families("causal") == ["hopper", "mma", "fma", "split", "backward"]
    backward = kernel_names(dict(rendered("causal").sources)["backward"])
    assert backward == ["attncc_causal_bwd", "attncc_causal_bwd_delta", "attncc_causal_bwd_dq"]
    # the sm_90a backward takes score modifications (their chain rule in the kernel) and a
    # tile index (document masks, above: the query tiles' row ranges from a kernel of their own)
    assert "backward" in families("softcap") and "backward" in families("alibi")


def test_headers_are_spec_independent_and_guarded() -> None:
    headers = dict(cuda_backend.headers())
    assert list(headers) == ["attncc_cuda.cuh", "attncc_hopper.cuh"]
    assert "#ifndef ATTNCC_CUDA_CUH" in headers["attncc_cuda.cuh"]
    assert "__device__ __forceinline__ float attncc_tanh" in headers["attncc_cuda.cuh"]
    assert '#include "attncc_cuda.cuh"' in headers["attncc_hopper.cuh"]
    assert "wgmma.mma_async" in headers["attncc_hopper.cuh"]
    assert rendered("causal").headers == rendered("decode").headers
    standalone = rendered("causal").standalone()
    assert "#include" not in standalone
    assert standalone.count("#ifndef ATTNCC_CUDA_CUH") == 1  # inlined once


def test_the_host_compiles_the_family_each_call_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 calls compile the fma source, 16-bit ones the hopper source on an sm_90 GPU
    (variant 2, with its tile index builder) and the mma source elsewhere or for variant 1,
    few-query calls the split source; every compile gets the shipped headers."""
    documents = attncc.compile(EXAMPLES / "document_mask.attn", target="cuda").module(False)
    drafts = attncc.compile(EXAMPLES / "speculative_decode.attn", target="cuda").module(False)
    asked: list[tuple[str, tuple[str, ...], str]] = []
    by_source = {
        source: family
        for module in (documents, drafts)
        for family, source in module._CUDA_SOURCES.items()
    }

    def kernels(source: str, key: str, defines: Any, names: Any, device: Any, arch: str = "",
                headers: Any = ()) -> tuple[str, ...]:  # fmt: skip
        assert key == documents._nvrtc.source_key(source, documents._CUDA_HEADERS)
        assert headers == documents._CUDA_HEADERS
        asked.append((by_source[source], names, arch))
        return tuple(names)

    nvrtc_module = documents._nvrtc
    monkeypatch.setattr(nvrtc_module, "kernels", kernels)
    monkeypatch.setattr(nvrtc_module, "prepare", lambda *args, **kwargs: args)
    monkeypatch.setattr(nvrtc_module, "launch", lambda *args, **kwargs: None)
    monkeypatch.setattr(nvrtc_module, "resident_blocks", lambda *args: 4)
    for module in (documents, drafts):
        monkeypatch.setattr(module, "_shared_limit", lambda device: 227 * 1024)
        monkeypatch.setattr(module, "_multiprocessors", lambda device: 132)
        monkeypatch.setattr(module, "_key_tile_maps", lambda *args: None)
        monkeypatch.setattr(module, "_arrivals", lambda device, count: torch.zeros(count))
        monkeypatch.setattr(module, "_has_wgmma", lambda device: True)
    monkeypatch.setattr(documents._launch_plan, "FusedPlan", lambda *a, **kw: lambda t: None)
    device = torch.device("cpu")

    def run(module: Any, tensors: Any, params: Any, dtype: torch.dtype, config: Any) -> None:
        sizes, _, _ = module._check(tensors, params)
        params = module._param_defaults(sizes, dict(params))
        module._launch(tensors, params, False, sizes, dtype, device, config, None)

    def prefill(dtype: torch.dtype, sm90: bool = True, config: Any = None) -> None:
        monkeypatch.setattr(documents, "_has_wgmma", lambda device: sm90)
        q = torch.zeros(1, 2, 256, 64, dtype=dtype)
        doc = torch.zeros(1, 256, dtype=torch.int32)
        run(documents, *documents._bind([q, q, q, doc], {}), dtype, config)

    def decode(dtype: torch.dtype) -> None:
        q = torch.zeros(2, 8, 1, 64, dtype=dtype)
        k, v = (torch.zeros(2, 300, 2, 64, dtype=dtype) for _ in range(2))
        lengths = torch.tensor([300, 200], dtype=torch.int32)
        run(drafts, *drafts._bind([q, k, v, lengths], {}), dtype, None)

    prefill(torch.float32)
    prefill(torch.bfloat16)
    prefill(torch.bfloat16, sm90=False)
    prefill(torch.bfloat16, config={"wgmma": 1, "num_warps": 4, "BLOCK_N": 64})
    decode(torch.bfloat16)
    decode(torch.float32)
    fwd, index = "attncc_document_mask_fwd", "attncc_document_mask_tile_index"
    assert asked == [
        ("fma", ("attncc_document_mask_rows",), ""),
        ("hopper", (fwd, index), "a"),
        ("mma", (fwd,), ""),
        ("mma", (fwd,), "a"),
        ("split", ("attncc_speculative_decode_split",), ""),
        (
            "fma",
            ("attncc_speculative_decode_rows_split", "attncc_speculative_decode_combine"),
            "",
        ),
    ]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA sources are rendered, not compiled")
def test_compile_writes_a_standalone_file_or_every_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`attncc compile --target cuda` prints the default family's source; `-o FILE` writes it
    with the headers inlined (nvcc compiles it alone), `-o DIR` every family and the
    headers."""
    from attncc import cli

    spec = str(EXAMPLES / "causal.attn")
    assert cli.main(["compile", spec, "--target", "cuda"]) == 0
    printed = capsys.readouterr().out
    assert printed == rendered("causal").source
    out = tmp_path / "kernel.cu"
    assert cli.main(["compile", spec, "--target", "cuda", "-o", str(out)]) == 0
    assert capsys.readouterr().err == f"wrote {out} (target cuda)\n"
    assert out.read_text() == rendered("causal").standalone()
    nvcc(out, tmp_path / "k.o", "-c", timeout=600)
    folder = tmp_path / "all"
    folder.mkdir()
    assert cli.main(["compile", spec, "--target", "cuda", "-o", str(folder)]) == 0
    written = sorted(p.name for p in folder.iterdir())
    assert written == [
        "attncc_cuda.cuh",
        "attncc_hopper.cuh",
        "causal.backward.cu",
        "causal.fma.cu",
        "causal.hopper.cu",
        "causal.mma.cu",
        "causal.split.cu",
    ]
    assert (folder / "causal.hopper.cu").read_text() == printed
