"""The benchmark's CPU-side pieces (timing itself needs a GPU: benchmarks/gpu_suite.sh)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from script_module import load_script

import attncc
from attncc.bench import (
    Row,
    RunPlan,
    Shape,
    Startup,
    bench_inputs,
    default_shapes,
    format_rows,
    sizes_for,
    time_rounds,
)
from attncc.runtime.jit import interpreter

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_shapes_parse_with_and_without_kv_heads() -> None:
    assert Shape.parse("4,16,4096,128") == Shape(4, 16, None, 4096, 128)
    assert Shape.parse("2,32:8,4096,128") == Shape(2, 32, 8, 4096, 128)
    assert str(Shape.parse("2,32:8,4096,128")) == "B=2 H=32:8 S=4096 D=128"
    assert Shape.parse("4,16,4096,192:128") == Shape(4, 16, None, 4096, 192, 128)
    assert str(Shape.parse("4,16,4096,192:128")) == "B=4 H=16 S=4096 D=192 DV=128"


def test_sizes_for_a_value_dim_of_its_own() -> None:
    """D:DV sizes the value head dim of a spec that has one; a spec whose values share the
    head dim refuses a different one rather than ignore it."""
    mla = attncc.optimise(EXAMPLES / "mla_causal.attn")[1]
    sizes = sizes_for(mla, Shape(4, 16, None, 4096, 192, 128))
    assert (sizes["D"], sizes["E"]) == (192, 128)
    assert sizes_for(mla, Shape(4, 16, None, 4096, 64))["E"] == 64
    causal = attncc.optimise(EXAMPLES / "causal.attn")[1]
    with pytest.raises(ValueError, match="take no value dim of their own"):
        sizes_for(causal, Shape(4, 16, None, 4096, 192, 128))


def test_fp8_inputs_are_what_quantize_makes() -> None:
    """The FP8 example's bench inputs: descale tables of ceil(S / 128) entries (they held one,
    and the kernel read past it), e4m3 q, k and v with v key-major (its P·V in FP8), float32
    descales as declared; the kernel runs on them and agrees with its bfloat16 reading."""
    kernel = attncc.compile(EXAMPLES / "fp8_block.attn", target="triton")
    sizes = sizes_for(kernel.ir, Shape(1, 2, None, 300, 64))
    assert (sizes["MB"], sizes["NB"]) == (3, 3)
    inputs = bench_inputs(kernel.ir, sizes, torch.bfloat16, 4, device="cpu")
    assert {inputs[n].dtype for n in ("q", "k", "v")} == {torch.float8_e4m3fn}
    assert inputs["v"].stride(-2) == 1 and inputs["q"].stride(-1) == 1
    assert inputs["q_descale"].dtype == torch.float32 and inputs["q_descale"].shape == (1, 2, 3)
    with interpreter(True):
        out = kernel(*(inputs[n] for n in kernel.input_names))
    bf16 = {
        n: t.to(torch.bfloat16) if t.dtype == torch.float8_e4m3fn else t for n, t in inputs.items()
    }
    q, k, v = (bf16[n].float() for n in ("q", "k", "v"))
    rows = torch.arange(300) // 128
    scores = q @ k.transpose(-1, -2) / 8.0
    scores = scores * bf16["q_descale"][..., rows, None] * bf16["k_descale"][..., None, rows]
    want = torch.softmax(scores, -1) @ (v * bf16["v_descale"][..., rows, None])
    assert torch.allclose(out.float(), want, atol=0.05, rtol=0.1)


def test_default_shapes_hold_16k_tokens() -> None:
    kernel = attncc.optimise(EXAMPLES / "gqa_causal.attn")[1]
    shapes = default_shapes(kernel)
    assert [s.batch * s.seq for s in shapes] == [16384] * 5
    assert {(s.heads, s.kv_heads) for s in shapes} == {(32, 8)}


def test_sizes_for_gqa_and_a_paged_cache() -> None:
    gqa = attncc.optimise(EXAMPLES / "gqa_causal.attn")[1]
    assert sizes_for(gqa, Shape(2, 32, 8, 4096, 128)) == {
        "B": 2, "H": 32, "KVH": 8, "M": 4096, "N": 4096, "D": 128,
    }  # fmt: skip
    paged = attncc.optimise(EXAMPLES / "paged_decode.attn")[1]
    sizes = sizes_for(paged, Shape(8, 32, 8, 8192, 128))
    assert sizes["PAGE"] == 16 and sizes["NP"] == 512 and sizes["N"] == 8192
    assert sizes["P"] == 8 * 512  # a page per slot of the table
    sizes = sizes_for(paged, Shape(1, 32, 8, 8192, 128), page=256)
    assert sizes["PAGE"] == 256 and sizes["NP"] == 32 and sizes["P"] == 32


def test_rows_and_startup_print() -> None:
    row = Row("causal", "B=4 H=16 S=4096 D=128", "bf16", 0.5, 400.0, None, {"flex": 320.0})
    tuned = Row("causal", "B=1 H=16 S=16384 D=128", "bf16", 8.0, 400.0, None, {"flex": 400.0})
    tuned.config = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "tma": 1}
    table = format_rows([row, tuned], ["flex"])
    assert "x flex" not in table and "xflex" in table.splitlines()[0]
    assert table.splitlines()[1].split()[-3:] == ["320.0", "1.25", "default"]
    assert table.splitlines()[2].split()[-3:] == ["400.0", "1.00", "64x64/w4/s3/tma"]
    startup = Startup(0.21, [("B=1", 2.8, 1), ("B=2", 0.01, 0)])
    assert (
        str(startup) == "attncc.compile 0.210 s; first calls: B=1: 2.80 s (autotuned), B=2: 0.01 s"
    )


def test_run_plan_resumes_from_its_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "bench.jsonl"
    first = RunPlan(str(path))
    first.record(Row("causal", "B=4 H=16 S=4096 D=128", "bf16", 0.6, 420.0, None))
    first.record(Row("decode [cuda]", "B=8 H=32:8 S=8192 D=128", "bf16", 0.3, 3.3, 0.8))
    assert len(path.read_text().splitlines()) == 2  # appended as measured
    resumed = RunPlan(str(path), resume=True)
    assert resumed.done == {
        ("causal", "B=4 H=16 S=4096 D=128", "bf16"),
        ("decode [cuda]", "B=8 H=32:8 S=8192 D=128", "bf16"),
    }
    assert RunPlan(str(path)).done == set()  # without --resume every shape runs
    assert RunPlan(str(tmp_path / "absent.jsonl"), resume=True).done == set()


def _matrix_module() -> Any:
    path = EXAMPLES.parent / "benchmarks" / "matrix.py"
    return load_script(path, "matrix_script")


def test_the_matrix_is_the_issues_and_warms_each_group_first() -> None:
    matrix = _matrix_module()
    jobs = matrix.matrix(["bf16", "fp16"])
    specs = {(j.spec, j.dtype) for j in jobs}
    # 7 prefill variants in two dtypes, the FP8 column (full and causal), two decode specs
    assert len(specs) == 2 * 7 + 2 + 2
    fp8 = [j for j in jobs if j.spec.startswith("fp8_")]
    assert {(j.spec, j.dtype) for j in fp8} == {("fp8_block", "bf16"), ("fp8_causal", "bf16")}
    assert all(Shape.parse(s).head_dim == 128 for j in fp8 for s in j.shapes)
    for job in jobs:
        assert (EXAMPLES / f"{job.spec}.attn").exists()
        for shape in map(Shape.parse, job.shapes):
            if job.spec not in ("decode", "paged_decode") and shape.head_dim in (64, 128):
                assert shape.batch * shape.seq == 16384  # 16k tokens a batch
    prefill = [Shape.parse(s) for j in jobs if j.spec == "causal" for s in j.shapes]
    assert {s.head_dim for s in prefill} == {64, 96, 128, 256}
    assert {s.seq for s in prefill} == {1024, 2048, 4096, 8192, 16384}
    warm = matrix.warm_jobs(jobs)
    assert sorted(s for j in warm for s in j.shapes) == sorted(s for j in jobs for s in j.shapes)
    for job in warm:  # one (spec, dtype, head dim) a process: candidates compile once
        assert len({s.rsplit(",", 1)[1] for s in job.shapes}) == 1
    assert "--warm" in warm[0].command("m.jsonl", True)
    assert "--warm" not in jobs[0].command("m.jsonl", False)
    # the CUDA column: every variant and decode once (FP8 has no CUDA kernel), bf16, labelled
    # as `attncc bench` does
    cuda = [j for j in jobs if j.target == "cuda"]
    assert {j.spec for j in cuda} == {j.spec for j in jobs} - {"fp8_block", "fp8_causal"}
    assert {j.dtype for j in cuda} == {"bf16"}
    assert cuda[0].label == f"{cuda[0].spec} [cuda]"
    assert cuda[0].command("m.jsonl", False)[-2:] == ["--target", "cuda"]


def test_the_matrix_skips_jobs_whose_rows_are_in_the_file(tmp_path: Path) -> None:
    matrix = _matrix_module()
    jobs = matrix.matrix(["bf16"])
    path = tmp_path / "m.jsonl"
    assert matrix.pending(jobs, str(path)) == jobs
    causal = next(j for j in jobs if j.spec == "causal")
    plan = RunPlan(str(path))
    for shape in causal.shapes[1:]:
        plan.record(Row("causal", str(Shape.parse(shape)), "bf16", 1.0, 1.0, None))
    left = matrix.pending(jobs, str(path))
    assert len(left) == len(jobs)
    assert next(j for j in left if j.spec == "causal").shapes == causal.shapes[:1]
    for shape in causal.shapes[:1]:
        plan.record(Row("causal", str(Shape.parse(shape)), "bf16", 1.0, 1.0, None))
    assert [j.spec for j in matrix.pending(jobs, str(path))] == [j.spec for j in jobs[1:]]


def test_copy_anchor_moves_as_many_bytes_as_the_kernel_reads() -> None:
    import torch

    from attncc.bench import ANCHORS, copy_runner

    assert "copy" in ANCHORS
    dst = copy_runner(1000, torch.device("cpu"))()
    # half read, half written: 1000 bytes of traffic
    assert dst.numel() * dst.element_size() == 500


def test_the_cuda_column_alone_pairs_each_cuda_job_with_triton_on_its_shapes() -> None:
    matrix = _matrix_module()
    column = matrix.cuda_column()
    cuda = {(j.spec, j.shapes) for j in column if j.target == "cuda"}
    assert cuda == {(j.spec, j.shapes) for j in column if j.target == "triton"}
    in_matrix = {(j.spec, j.shapes) for j in matrix.matrix(["bf16"]) if j.target == "cuda"}
    assert cuda == in_matrix


def test_time_rounds_interleaves_contenders_and_keeps_each_best() -> None:
    order: list[str] = []
    times = {"attncc": iter([1.0, 3.0, 2.0, 2.5]), "flex": iter([1.0, 4.0, 5.0, 3.5])}

    def timer(name: str) -> Callable[[], float]:
        def time_one() -> float:
            order.append(name)
            return next(times[name])

        return time_one

    def broken() -> float:
        order.append("cudnn")
        raise RuntimeError("no kernel for this shape")

    best = time_rounds(
        {"attncc": timer("attncc"), "flex": timer("flex"), "cudnn": broken}, 3, "attncc"
    )
    # the first round is untimed (its 1.0s are not anyone's best)
    assert best == {"attncc": 2.0, "flex": 3.5, "cudnn": None}
    # in turn, every other round reversed; a contender that failed is not timed again
    assert order == [
        "attncc",
        "flex",
        "cudnn",
        "flex",
        "attncc",
        "attncc",
        "flex",
        "flex",
        "attncc",
    ]
    with pytest.raises(RuntimeError, match="no kernel"):
        time_rounds({"attncc": broken}, 2, required="attncc")


def test_bench_spec_rows_come_from_interleaved_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_spec's plumbing on the CPU (the kernel runs in the interpreter; timings and
    anchors are stand-ins): attncc and every anchor that warms up are timed in turn each
    round, a row keeps each one's best, and an anchor that fails its warm-up is reported as
    None, not timed."""
    import torch

    import attncc.bench as bench

    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)

    def cpu_inputs(kernel: Any, sizes: dict[str, int], dtype: Any, documents: int) -> Any:
        gen = torch.Generator().manual_seed(0)
        return {
            t.name: torch.randn([sizes[d] for d in t.dims], generator=gen) for t in kernel.tensors
        }

    def flex() -> None:
        pass

    def cudnn() -> None:
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(bench, "bench_inputs", cpu_inputs)
    monkeypatch.setattr(
        bench, "anchor_runners", lambda *a: {"sdpa-flash": None, "sdpa-cudnn": cudnn, "flex": flex}
    )
    order: list[str] = []
    times = {"attncc": iter([0.5, 2.0, 1.0]), "flex": iter([0.5, 4.0, 2.5])}

    def fake_median_ms(fns: list[Callable[[], Any]], graphed: bool) -> float:
        name = "flex" if fns[0] is flex else "attncc"
        fns[0]()  # attncc's call runs the generated kernel in the interpreter
        order.append(name)
        return next(times[name])

    monkeypatch.setattr(bench, "median_ms", fake_median_ms)
    against = ["sdpa-flash", "sdpa-cudnn", "flex"]
    shape = Shape(1, 2, None, 32, 16)
    (row,) = bench.bench_spec(str(EXAMPLES / "fused.attn"), [shape], "bf16", against, rounds=2)
    # an untimed round first (its 0.5s count for no one), then every other round reversed
    assert order == ["attncc", "flex", "flex", "attncc", "attncc", "flex"]
    flops = 4 * 1 * 2 * 32 * 32 * 16
    assert row.ms == 1.0 and row.tflops == pytest.approx(flops / 1e-3 / 1e12)
    assert row.anchors == {
        "sdpa-flash": None,
        "sdpa-cudnn": None,
        "flex": pytest.approx(flops / 2.5e-3 / 1e12),
    }
    # the configuration the call ran: the heuristic table's, as nothing was tuned
    assert row.config is not None and {"BLOCK_M", "BLOCK_N", "num_warps"} <= set(row.config)
    assert set(row.seconds) == {"first_call", "anchors", "measure"}


def test_source_variant_applies_each_replacement_and_rejects_a_missing_one() -> None:
    from attncc.bench import source_variant

    assert source_variant("a + b * c", "v", [["b", "x"], ["c", "y"]]) == "a + x * y"
    with pytest.raises(SystemExit, match="variant v: 'z' is not in the generated source"):
        source_variant("a + b", "v", [["z", "w"]])


def test_the_default_targets_matrix_takes_rows_of_either_backend(tmp_path: Path) -> None:
    """`--target auto`: every job runs `attncc bench --target auto` (no separate CUDA
    column), and a shape is done whichever backend's label its row has."""
    matrix = _matrix_module()
    jobs = matrix.matrix(["bf16"], "auto")
    assert {j.target for j in jobs} == {"auto"}
    assert jobs[0].command("m.jsonl", False)[-2:] == ["--target", "auto"]
    path = tmp_path / "m.jsonl"
    causal = next(j for j in jobs if j.spec == "causal")
    plan = RunPlan(str(path))
    plan.record(Row("causal [cuda]", str(Shape.parse(causal.shapes[0])), "bf16", 1.0, 1.0, None))
    plan.record(Row("causal", str(Shape.parse(causal.shapes[1])), "bf16", 1.0, 1.0, None))
    left = next(j for j in matrix.pending(jobs, str(path)) if j.spec == "causal")
    assert left.shapes == causal.shapes[2:]


def test_matrix_table_puts_cuda_rows_beside_triton_or_on_their_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A "[cuda]" row fills the CUDA columns of the Triton row on its shape (the Triton
    matrix with its CUDA column); with no Triton row there (the default target's matrix,
    `matrix.py --target auto`) it is a row of its own, with its ratios to the anchors."""
    path = EXAMPLES.parent / "benchmarks" / "matrix_table.py"
    table = load_script(path, "matrix_table_script")
    anchors = {"sdpa-flash": 100.0, "sdpa-cudnn": 200.0, "flex": 150.0}

    def bench_row(name: str, seq: int, tflops: float) -> str:
        shape = f"B=1 H=16 S={seq} D=128"
        fields = {"spec": name, "shape": shape, "dtype": "bf16", "tflops": tflops}
        return json.dumps({**fields, "tbps": None, "anchors": anchors})

    rows_in = [bench_row("causal", 4096, 300.0), bench_row("causal [cuda]", 4096, 450.0)]
    rows_in += [bench_row("causal [cuda]", 2048, 180.0), bench_row("document_mask", 4096, 165.0)]
    (tmp_path / "m.jsonl").write_text("\n".join(rows_in) + "\n")
    table.main(str(tmp_path / "m.jsonl"))
    lines = capsys.readouterr().out.splitlines()[2:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines]
    # name, TFLOP/s, TB/s, x FA2, x cuDNN, x Flex, x copy, CUDA TFLOP/s, CUDA / Triton
    assert [row[:1] + row[3:] for row in rows] == [
        ["causal [cuda]", "180", "-", "1.80", "0.90", "1.20", "-", "-", "-"],
        ["causal", "300", "-", "3.00", "1.50", "2.00", "-", "450", "1.50"],
        ["document_mask", "165", "-", "1.65", "0.82", "1.10", "-", "-", "-"],
    ]
    assert [row[1] for row in rows] == [f"B=1 H=16 S={s} D=128" for s in (2048, 4096, 4096)]


def _script(name: str) -> Any:
    path = EXAMPLES.parent / "benchmarks" / f"{name}.py"
    return load_script(path, f"{name}_script")


def test_plot_ratios_group_rows_into_tables_per_anchor_and_variant() -> None:
    """plot.py's data: attncc's throughput over each anchor's, a prefill table per (dtype, head
    dim) over the length, a decode table over (batch, cache length); anchors that did not run
    a shape and head dims measured at one length only are left out."""
    plot = _script("plot")

    def row(spec: str, shape: str, tflops: float, **anchors: float | None) -> dict[str, Any]:
        return {"spec": spec, "shape": shape, "dtype": "bf16", "tflops": tflops, "anchors": anchors}

    rows = [
        row("causal [cuda]", "B=4 H=16 S=4096 D=128", 500.0, flex=400.0, sdpa_cudnn=None),
        row("causal [cuda]", "B=8 H=16 S=2048 D=128", 450.0, flex=300.0),
        row("fused [cuda]", "B=8 H=16 S=2048 D=128", 480.0, flex=320.0),
        row("fused", "B=4 H=16 S=4096 D=256", 300.0, flex=200.0),  # one length: no line
        row("decode", "B=8 H=32:8 S=32768 D=128", 2.9, copy=3.0),
        row("decode", "B=1 H=32:8 S=8192 D=128", 1.7, copy=2.5),
    ]
    tables = plot.ratios(rows)
    assert list(tables) == [("decode", "bf16", 0), ("prefill", "bf16", 128)]
    prefill = tables[("prefill", "bf16", 128)]
    assert list(prefill) == ["flex"]
    assert prefill["flex"]["causal"] == [(2048, "2k", 1.5), (4096, "4k", 1.25)]
    assert prefill["flex"]["fused"] == [(2048, "2k", 1.5)]
    decode = tables[("decode", "bf16", 0)]["copy"]["decode"]
    assert [(label, round(ratio, 3)) for _, label, ratio in decode] == [
        ("B=1 8k", 0.68),
        ("B=8 32k", 0.967),
    ]
    assert plot.file_name("matrix_h100", ("prefill", "bf16", 128)) == (
        "matrix_h100_prefill_bf16_d128.png"
    )
    assert plot.file_name("matrix_h100", ("decode", "bf16", 0)) == "matrix_h100_decode_bf16.png"


def test_ab_runs_the_configuration_a_call_runs_with() -> None:
    """ab.py times the Triton target at the configuration a user's call gets (the heuristic
    table's), not the generated module's own default: at paged decode B=1 32k those ran 44.9
    and 59.6 us (H200), so an A/B at the module's default measured another kernel."""
    import torch

    import attncc
    from attncc.bench import Shape, bench_inputs, sizes_for

    ab = _script("ab")
    kernel = attncc.compile(EXAMPLES / "paged_decode.attn", target="triton")
    sizes = sizes_for(kernel.ir, Shape.parse("1,4:2,64,16"))
    inputs = bench_inputs(kernel.ir, sizes, torch.float32, documents=1, device="cpu")
    table = kernel.launch_config(*(inputs[name] for name in kernel.input_names))
    assert ab.call_config(kernel, inputs, None) == table and "waves" in table
    pinned = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2, "waves": 1}
    assert ab.call_config(kernel, inputs, pinned) is pinned
    cuda = attncc.compile(EXAMPLES / "causal.attn", target="cuda")
    assert ab.call_config(cuda, inputs, None) is None  # the CUDA host's own tiles


def test_ab_variants_apply_to_the_kernel_source_else_the_host_module(tmp_path: Path) -> None:
    """ab.py: a replacement whose text is in the kernel source changes the kernel source, even
    where the host module holds the text too (it embeds the sources, one line of them as a
    string literal: a variant mixing one-line and multi-line replacements lost the one-line
    ones, and timed the baseline's compares beside dead code); otherwise it changes the host
    (its tables); text in neither is an error naming the variant, not a variant that
    silently equals the baseline."""
    ab = _script("ab")
    kernel = "const int kv = ids[n];\nif (rv == kv) s = x;\n"
    host = f"_CUDA_SOURCES = {{'hopper': {kernel!r}}}\n"
    new_host, new_kernel = ab.split_replacements(
        host, kernel, "mixed", [["const int kv = ids[n];\n", ""], ["rv == kv", "bit"]]
    )
    assert (new_host, new_kernel) == (host, "if (bit) s = x;\n")
    host = "_WGMMA_PERSISTENT = 1\n_CUDA_SOURCE = '...'\n"
    kernel = "for (int j = 0; j < BN; ++j) {\n    s = fmaxf(s, x);\n}\n"
    new_host, new_kernel = ab.split_replacements(
        host,
        kernel,
        "static",
        [["_WGMMA_PERSISTENT = 1", "_WGMMA_PERSISTENT = 0"], ["s = fmaxf(s, x);", "s = x;"]],
    )
    assert new_host == "_WGMMA_PERSISTENT = 0\n_CUDA_SOURCE = '...'\n"
    assert new_kernel == kernel.replace("s = fmaxf(s, x);", "s = x;")
    with pytest.raises(SystemExit, match="variant typo: 'absent text' is not in the generated"):
        ab.split_replacements(host, kernel, "typo", [["absent text", "x"]])
    # the host module embeds the other families' sources too: a text only they hold would
    # change a kernel the A/B does not time
    other = "if (rv == kv) s = y;\n"
    host = f"_CUDA_SOURCES = {{'hopper': {kernel!r}, 'mma': {other!r}}}\n"
    with pytest.raises(SystemExit, match="variant stale: 's = y;' is in another family's"):
        ab.split_replacements(host, kernel, "stale", [["s = y;", "s = z;"]], other)
    path = tmp_path / "variants.json"
    path.write_text(json.dumps({"control": [], "static": [["a", "b"]]}))
    assert ab.load_variants(str(path)) == {"unchanged": [], "control": [], "static": [["a", "b"]]}
    path.write_text(json.dumps({"bad": [["only old"]]}))
    with pytest.raises(SystemExit, match="variant 'bad' is not a list of"):
        ab.load_variants(str(path))


def test_ab_keeps_a_source_the_host_module_patched() -> None:
    """ab.py --target cuda: a replacement whose text the host module also holds (it embeds
    the CUDA sources) patches the module's copy; only a replacement made to the kernel
    source itself replaces it, else the variant would time the baseline."""
    ab = _script("ab")

    class Nvrtc:
        @staticmethod
        def source_key(source: str, headers: Any) -> str:
            return f"key of {source}"

    module = type("Host", (), {})()
    module._CUDA_SOURCES = {"hopper": "patched in the host", "mma": "m"}
    module._SOURCE_KEYS = {"hopper": "key of patched in the host", "mma": "key of m"}
    module._CUDA_HEADERS = {}
    module._nvrtc = Nvrtc
    ab.use_family_source(module, "hopper", "original", "original")
    assert module._CUDA_SOURCES["hopper"] == "patched in the host"
    ab.use_family_source(module, "hopper", "original", "patched kernel source")
    assert module._CUDA_SOURCES == {"hopper": "patched kernel source", "mma": "m"}
    assert module._SOURCE_KEYS["hopper"] == "key of patched kernel source"


def test_ab_random_documents_replace_the_ids_along_the_keys() -> None:
    """ab.py --document-mean: document ids of random lengths, rising, over every key."""
    import torch

    ab = _script("ab")
    kernel = attncc.compile(EXAMPLES / "document_mask.attn", target="triton").ir
    inputs = {"doc": torch.zeros(2, 1000, dtype=torch.int32), "q": torch.zeros(1)}
    ab.random_documents(inputs, kernel, 1000, 64)
    doc = inputs["doc"]
    assert doc.dtype == torch.int32 and doc.shape == (2, 1000) and torch.equal(doc[0], doc[1])
    lengths = torch.unique_consecutive(doc[0], return_counts=True)[1]
    assert bool((doc[0, 1:] >= doc[0, :-1]).all()) and int(lengths.max()) <= 127
    assert len(lengths) >= 4 and inputs["q"].shape == (1,)


VARIANT_FILES = sorted((EXAMPLES.parent / "benchmarks" / "variants").glob("*.json"))


@pytest.mark.parametrize("path", VARIANT_FILES, ids=lambda p: p.stem)
def test_variants_files_match_the_generated_source(path: Path) -> None:
    """benchmarks/variants/<example>_<what>_<target>.json, the A/Bs kept for rerunning: every
    replacement's text is in the example's generated source for that target (for CUDA, the
    hopper family's source or the host module), so a file has not gone stale since the
    templates changed, which ab.py would find only on the GPU."""
    ab = _script("ab")
    target = path.stem.rsplit("_", 1)[-1]
    assert target in ("triton", "cuda"), f"{path.name}: name the target last"
    specs = [p for p in EXAMPLES.glob("*.attn") if path.stem.startswith(p.stem + "_")]
    assert specs, f"{path.name}: name the example first"
    kernel = attncc.compile(max(specs, key=lambda p: len(p.stem)), target=target)
    host = kernel.path.read_text()
    sources = kernel.module(False)._CUDA_SOURCES if target == "cuda" else {}
    cuda = sources.get("hopper", "")
    others = "".join(text for family, text in sources.items() if family != "hopper")
    for name, replacements in ab.load_variants(str(path)).items():
        # SystemExit names a stale one
        ab.split_replacements(host, cuda, name, replacements, others)


def test_side_by_side_takes_example_names_or_spec_paths() -> None:
    """side_by_side.py's entries name an example (examples/NAME.attn) or a spec file."""
    side = _script("side_by_side")
    assert side.spec_path("softcap") == EXAMPLES / "softcap.attn"
    assert side.spec_path("softcap").is_file()
    assert side.spec_path("elsewhere/my.attn") == Path("elsewhere/my.attn")


def test_ab_takes_param_values_as_numbers() -> None:
    """ab.py's --param NAME=VALUE: ints where the text is one, floats else, one clear error
    for anything but a number."""
    ab = _script("ab")
    assert ab.param_values(["cap=50", "scale=0.125"]) == {"cap": 50, "scale": 0.125}
    assert isinstance(ab.param_values(["cap=50"])["cap"], int)
    for bad in ("cap", "=3", "cap=fifty"):
        with pytest.raises(SystemExit, match="--param"):
            ab.param_values([bad])
