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
from codegen.test_golden import assert_every_variable_required

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NAMES = sorted(p.stem for p in EXAMPLES.glob("*.attn"))
NVCC = shutil.which("nvcc")

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
# the variants the runtime picks (see templates/cuda/host.py.jinja), as ATTNCC_* macros
VARIANTS: dict[str, dict[str, object]] = {
    "bf16-128": {},
    "fp32-rows": {"ATTNCC_ELEM": "float", "ATTNCC_MMA": 0, "ATTNCC_DP": 64, "ATTNCC_DVP": 64},
    "fp16-64": {"ATTNCC_ELEM": "f16_t", "ATTNCC_DP": 64, "ATTNCC_DVP": 64},
    "bf16-256": {
        "ATTNCC_DP": 256,
        "ATTNCC_DVP": 256,
        "ATTNCC_WARPS": 4,
        "ATTNCC_M_TILES": 1,
        "ATTNCC_BLOCK_N": 32,
        "ATTNCC_SPLIT_WARPS": 2,
        "ATTNCC_SPLIT_STAGES": 1,
    },
    "split-64-stages": {
        "ATTNCC_DP": 64,
        "ATTNCC_DVP": 128,
        "ATTNCC_SPLIT_WARPS": 2,
        "ATTNCC_SPLIT_STAGES": 2,
        "ATTNCC_FUSED": 0,
    },
    # the fused kernel's sm_90a variant (hopper.cu.jinja): warp-group MMAs
    "wgmma-bf16-128": {
        "ATTNCC_WGMMA": 1,
        "ATTNCC_M_TILES": 1,
        "ATTNCC_WARPS": 8,
        "ATTNCC_BLOCK_N": 128,
    },
    "wgmma-fp16-64": {
        "ATTNCC_WGMMA": 1,
        "ATTNCC_ELEM": "f16_t",
        "ATTNCC_DP": 64,
        "ATTNCC_DVP": 64,
        "ATTNCC_M_TILES": 1,
        "ATTNCC_WARPS": 4,
        "ATTNCC_BLOCK_N": 64,
    },
    "wgmma2-bf16-64": {
        "ATTNCC_WGMMA": 2,
        "ATTNCC_M_TILES": 1,
        "ATTNCC_WARPS": 8,
        "ATTNCC_BLOCK_N": 64,
        "ATTNCC_PRODUCER_REGISTERS": 32,
        "ATTNCC_MMA_REGISTERS": 232,
    },
    "wgmma2-one-group-bf16-64": {
        "ATTNCC_WGMMA": 2,
        "ATTNCC_M_TILES": 1,
        "ATTNCC_WARPS": 4,
        "ATTNCC_BLOCK_N": 64,
        "ATTNCC_TMA": 1,
        "ATTNCC_BLOCKS": 2,
        "ATTNCC_PRODUCER_REGISTERS": 24,
        "ATTNCC_MMA_REGISTERS": 232,
        "ATTNCC_Q_BUFFERS": 2,
    },
    "wgmma2-three-groups-bf16-64": THREE_GROUPS_64,
    "wgmma2-tma-bf16-128": {
        "ATTNCC_WGMMA": 2,
        "ATTNCC_M_TILES": 1,
        "ATTNCC_WARPS": 8,
        "ATTNCC_BLOCK_N": 128,
        "ATTNCC_TMA": 1,
        "ATTNCC_STAGES": 3,
    },
    # the default at head dim 64 without the log-sum-exp: the row sums from the P V MMAs
    "wgmma2-row-sums-bf16-64": {**THREE_GROUPS_64, "ATTNCC_ROW_SUMS_MMA": 1},
    # the default at head dim 128: two Q buffers, two stages, ping-pong
    "wgmma2-two-q-bf16-128": {
        "ATTNCC_WGMMA": 2,
        "ATTNCC_M_TILES": 1,
        "ATTNCC_WARPS": 8,
        "ATTNCC_BLOCK_N": 128,
        "ATTNCC_TMA": 1,
        "ATTNCC_STAGES": 2,
        "ATTNCC_Q_BUFFERS": 2,
        "ATTNCC_PINGPONG": 1,
    },
}
FULL_COMPILE = [("gqa_causal", variant) for variant in VARIANTS] + [("paged_decode", "bf16-128")]
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
    )
]


def arch_flag(variant: str) -> str:
    """sm_90a for the warp-group MMA variants (their instructions need its features)."""
    return "-gencode=arch=compute_90a,code=sm_90a" if variant.startswith("wgmma") else "-arch=sm_90"


def schedule_of(name: str) -> str:
    """The schedule an example renders for (fused sources hold the split-KV kernels of
    their few-query path too); the naive example runs fused on CUDA."""
    _, kernel = attncc.optimise(EXAMPLES / f"{name}.attn")
    return "fused" if kernel.schedule == "naive" else (kernel.schedule or "fused")


@cache
def cuda_source(name: str) -> str:
    schedule = schedule_of(name)
    return build(EXAMPLES / f"{name}.attn", target="cuda", schedule=schedule).source  # type: ignore[arg-type]


def compile_jobs() -> list[tuple[str, str, str]]:
    """(example, variant, mode): "ptx" runs the front end, "full" ptxas too."""
    variants = ("bf16-128", "fp32-rows", "wgmma-bf16-128")
    jobs = [(name, variant, "ptx") for name in NAMES for variant in variants]
    jobs += [(name, variant, "full") for name, variant in FULL_COMPILE]
    return jobs


@cache
def nvcc_results(tmp: str) -> dict[tuple[str, str, str], tuple[int, str]]:
    def run(job: tuple[str, str, str]) -> tuple[int, str]:
        name, variant, mode = job
        path = Path(tmp) / f"{name}.cu"
        defines = [f"-D{k}={v}" for k, v in VARIANTS[variant].items()]
        out = Path(tmp) / f"{name}.{variant}.{mode}"
        # ptxas reports (-v) whether it had to serialize warp-group MMAs
        flag = ["--ptx"] if mode == "ptx" else ["-c", "-Xptxas", "-v"]
        cmd = [NVCC or "nvcc", arch_flag(variant), "-std=c++17", *flag, str(path), "-o", str(out)]
        done = subprocess.run([*cmd, *defines], capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout + done.stderr

    jobs = compile_jobs()
    for name in {job[0] for job in jobs}:  # render serially: one Jinja environment
        (Path(tmp) / f"{name}.cu").write_text(cuda_source(name))
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
    if variant.startswith("wgmma") and mode == "ptx" and schedule_of(name) == "fused":
        ptx = (Path(nvcc_dir) / f"{name}.{variant}.{mode}").read_text()
        assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in ptx


JINJA_LEFTOVER = re.compile(r"\{\{ |\{% |\{#")


@pytest.mark.parametrize("name", NAMES)
def test_every_example_renders_for_cuda(name: str) -> None:
    _, kernel = attncc.optimise(EXAMPLES / f"{name}.attn")
    wanted = ["fused", "split_kv"] if not split_kv_blocker(kernel) else ["fused"]
    for schedule in wanted:
        built = build(EXAMPLES / f"{name}.attn", target="cuda", schedule=schedule)  # type: ignore[arg-type]
        assert built.target == "cuda"
        assert f"attncc_{name}_" in built.source
        assert not JINJA_LEFTOVER.search(built.source)
        compile(built.host, f"{name}.{schedule}.host.py", "exec")  # valid Python


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


def test_wgmma_tiles_by_head_dim_and_tile_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sm_90a tiles the host picks: two MMA groups with ping-pong, three on 192-row tiles
    for head dims up to 64 (their register budget holds only narrow outputs), with a tile
    index too (each group reads its own tiles' bits); a config asking for three groups at
    head dim 128 is refused by name."""
    causal = attncc.compile(EXAMPLES / "causal.attn", target="cuda").module(False)
    documents = attncc.compile(EXAMPLES / "document_mask.attn", target="cuda").module(False)
    for module in (causal, documents):
        monkeypatch.setattr(module, "_has_wgmma", lambda device: True)
    vec = (1, 1, 1)
    assert causal._wgmma_tiles(None, 128, 128, vec, None) == (2, 8, 128, 1)
    assert causal._wgmma_tiles(None, 64, 64, vec, None) == (2, 12, 128, 1)
    assert causal._wgmma_tiles(None, 64, 128, vec, None) == (2, 8, 128, 1)
    assert documents._wgmma_tiles(None, 64, 64, vec, None) == (2, 12, 128, 1)
    assert documents._wgmma_tiles(None, 128, 128, vec, None) == (2, 8, 128, 1)
    assert causal._wgmma_tiles({"wgmma": 2, "num_warps": 12}, 64, 64, vec, None) == (
        2,
        12,
        128,
        0,
    )
    with pytest.raises(ValueError, match="12 with wgmma 2 and head dims up to 64"):
        causal._wgmma_tiles({"wgmma": 2, "num_warps": 12}, 128, 128, vec, None)
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
    on an sm_90 GPU with head dims up to 128 and 16-byte loads, enough queries for the
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
    assert not takes(causal, torch.bfloat16, 256)
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
    assert cuda_expr(tanh, env()) == "attncc_tanh(attncc_div(s, p_cap))"
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


def test_document_mask_partial_tiles_read_each_document_id_once() -> None:
    """Partial tiles compare precomputed document ids: the row's once a row, the key's once a
    key of the thread's fragment (per score, each was a global load), and only where the
    tile index says a tile is not one document's whole. In every loop of the fused kernel:
    mma.sync's and the two sm_90a ones (#if ATTNCC_WGMMA)."""
    source = build(EXAMPLES / "document_mask.attn", target="cuda").source
    fused = source.split("attncc_document_mask_fwd(", 1)[1].split("attncc_document_mask_rows(")[0]
    loops = fused.split("#if ATTNCC_WGMMA == 2\n", 1)[1]
    pipelined, rest = loops.split("\n#else\n    const int item = (int)blockIdx.x;\n", 1)
    hopper, mma_sync = rest.split("\n#if ATTNCC_WGMMA\n", 1)[1].split("\n#else\n", 1)
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
    assert {"kernels.cu.jinja", "host.py.jinja", "attend.cu.jinja"} <= set(CUDA_TEMPLATES)


@pytest.mark.parametrize("template", ["kernels.cu.jinja", "host.py.jinja"])
def test_rendering_without_any_variable_raises(template: str) -> None:
    checked, kernel = attncc.optimise(EXAMPLES / "gqa_causal.attn")
    values = cuda_backend._Context(kernel, checked.spec.source).values()
    values["cuda_source"] = "// source"
    assert_every_variable_required(cuda_backend.environment(), template, values)


# ----------------------------------------------------------------------------- Hopper primitives


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA sources are rendered, not compiled")
def test_wgmma_probe_compiles_for_sm90a_and_traps_without_its_features(tmp_path: Path) -> None:
    """The warp-group MMA primitives (templates/cuda/wgmma.cu.jinja) compile for sm_90a to
    the probes' wgmma instructions (8 for Q * K^T, 4 for P * V) with their fences; built for
    plain sm_90 (no wgmma) an MMA is a trap, never silent zeros. tests/gpu/test_gpu_cuda.py
    checks the numbers on an H100/H200."""
    source = tmp_path / "probe.cu"
    source.write_text(cuda_backend.render_wgmma_probe())
    ptx = {}
    for arch in ("sm_90a", "sm_90"):
        out = tmp_path / f"probe_{arch}.ptx"
        cmd = [NVCC or "nvcc", f"-arch={arch}", "-std=c++17", "--ptx", str(source), "-o", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-4000:]
        ptx[arch] = out.read_text()
    assert ptx["sm_90a"].count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") == 8
    assert ptx["sm_90a"].count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 4
    fences = ("wgmma.fence", "wgmma.commit_group", "wgmma.wait_group", "fence.proxy.async")
    assert all(fence in ptx["sm_90a"] for fence in fences)
    assert "wgmma.mma_async" not in ptx["sm_90"] and "trap;" in ptx["sm_90"]
    cubin = tmp_path / "probe.cubin"
    cmd = [NVCC or "nvcc", "-arch=sm_90a", "-std=c++17", "-cubin", str(source), "-o", str(cubin)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
