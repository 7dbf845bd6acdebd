"""What ``attncc check`` draws: params without defaults, side inputs in their declared dtype,
every dim in a realistic range, and the dims and params fixed by ``--dims`` / ``--param``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import attncc
from attncc import cli
from attncc.checking import cases, check_dims, check_params, draw_sizes, make_inputs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# softcap without a default cap: every call must pass it
NO_DEFAULT = (
    (EXAMPLES / "softcap.attn").read_text().replace("param cap: f32 = 30", "param cap: f32")
)

# keys and values of sequence b are rows start[b] .. start[b] + N - 1 of a packed pool of T rows
PACKED = """\
attention packed

dims  B, H, KVH, N, T, D
in    q[B, H, N, D]
in    kp[T, KVH, D]
in    vp[T, KVH, D]
in    start[B]: i32
param scale: f32 = 1 / sqrt(D)

let g = h / (H / KVH)
view kc[b: B, n: N, j: KVH, d: D] = kp[start[b] + n, j, d]
view vc[b: B, n: N, j: KVH, d: D] = vp[start[b] + n, j, d]

s[b, h, m, n] = q[b, h, m, d] * kc[b, n, g, d] * scale
mask n <= m
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * vc[b, n, g, d]
out o
"""

# a relative-position bias from a table of NB buckets (clamped distances)
BUCKETS = """\
attention buckets

dims  B, H, N, D, NB
in    q[B, H, N, D]
in    k[B, H, N, D]
in    v[B, H, N, D]
in    table[H, NB]
param scale: f32 = 1 / sqrt(D)

s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] * scale
s = s + table[h, min(m - n, NB - 1)]
mask m >= n
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""


def spec_file(tmp_path: Path, text: str, name: str = "spec.attn") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def rows(out: str) -> list[str]:
    """The table rows of ``attncc check``'s output (no title, header or summary)."""
    return out.strip().splitlines()[2:-1]


# ----------------------------------------------------------------------------- params


def test_a_param_without_a_default_is_drawn_in_every_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It crashed the harness (KeyError 'cap' from the first trial's call)."""
    spec = spec_file(tmp_path, NO_DEFAULT)
    args = ["check", spec, "--trials", "3", "--max-len", "24", "--dtypes", "fp32"]
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert len(rows(captured.out)) == 3
    assert all("cap=" in row for row in rows(captured.out))
    assert captured.out.rstrip().endswith("3 passed, 0 failed")


def test_param_fixes_a_param_in_every_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_file(tmp_path, NO_DEFAULT)
    args = ["check", spec, "--trials", "3", "--max-len", "24", "--dtypes", "fp32"]
    assert cli.main([*args, "--param", "cap=5", "--param", "scale=0.25"]) == 0
    out = capsys.readouterr().out
    assert all("scale=0.25,cap=5" in row or "cap=5,scale=0.25" in row for row in rows(out))


def test_drawn_params_are_in_a_realistic_range() -> None:
    _, kernel = attncc.optimise(NO_DEFAULT)
    drawn = [c.params["cap"] for c in cases(kernel, 40, 0, [torch.float32], max_len=32)]
    assert all(0.1 <= cap <= 10.0 for cap in drawn)
    assert max(drawn) / min(drawn) > 10  # spread over the range, not one value


def test_param_values_are_checked_against_the_spec() -> None:
    _, kernel = attncc.optimise(EXAMPLES / "sliding_window.attn")
    check_params(kernel, {"window": 4, "scale": 0.5})
    with pytest.raises(ValueError, match="no param 'cap'; its params: scale, window"):
        check_params(kernel, {"cap": 1.0})
    with pytest.raises(ValueError, match=r"param window is i32: give an integer, not 2\.5"):
        check_params(kernel, {"window": 2.5})


# ----------------------------------------------------------------------------- dtypes


def test_a_side_input_declared_f32_stays_f32_beside_bf16_operands() -> None:
    spec = (EXAMPLES / "bias.attn").read_text().replace("bias[B, H, M, N]", "bias[B, H, M, N]: f32")
    _, kernel = attncc.optimise(spec)
    rng = np.random.default_rng(0)
    sizes = draw_sizes(kernel, rng, max_len=16)
    inputs = make_inputs(kernel, sizes, torch.bfloat16, "cpu", rng)
    assert inputs["bias"].dtype == torch.float32
    assert {inputs[n].dtype for n in ("q", "k", "v")} == {torch.bfloat16}


# a per-head temperature the scores are divided by, and a per-head weight taken the log of
DOMAINS = (
    (EXAMPLES / "alibi.attn")
    .read_text()
    .replace("in    slopes[H]", "in    slopes[H]\nin    temp[H]\nin    w[H]")
    .replace("s = s - slopes[h] * (m - n)", "s = s / temp[h] + log(w[h]) - slopes[h] * (m - n)")
)


def test_inputs_a_spec_divides_by_or_takes_the_log_of_are_drawn_inside_their_domain() -> None:
    """N(0, 1) would put a log's argument below zero in half the draws (NaN: every trial
    fails) and a divisor near zero in some (scores of hundreds, a problem no 32-bit
    evaluation conditions well); those inputs are drawn from [0.5, 2], the others as before."""
    _, kernel = attncc.optimise(DOMAINS)
    rng = np.random.default_rng(0)
    sizes = draw_sizes(kernel, rng, max_len=16)
    sizes["H"] = 4096  # many draws of each
    inputs = make_inputs(kernel, sizes, torch.float32, "cpu", rng)
    for name in ("temp", "w"):
        assert inputs[name].min().item() >= 0.5 and inputs[name].max().item() <= 2.0
    assert inputs["slopes"].min().item() < 0  # N(0, 1)


def test_a_spec_with_a_log_and_a_divisor_passes_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "domains.attn"
    spec.write_text(DOMAINS)
    argv = ["check", str(spec), "--device", "cpu", "--trials", "3", "--max-len", "24"]
    assert cli.main([*argv, "--target", "triton"]) == 0, capsys.readouterr()
    assert cli.main([*argv, "--target", "triton", "--backward"]) == 0, capsys.readouterr()


def test_operands_declared_in_one_dtype_are_drawn_in_it() -> None:
    spec = (EXAMPLES / "causal.attn").read_text()
    for name in ("q", "k", "v"):
        spec = spec.replace(f"in    {name}[B, H, {'M' if name == 'q' else 'N'}, D]", "&")
        spec = spec.replace("&", f"in    {name}[B, H, {'M' if name == 'q' else 'N'}, D]: bf16")
    _, kernel = attncc.optimise(spec)
    drawn = {c.dtype for c in cases(kernel, 4, 0, [torch.float32, torch.float16], max_len=16)}
    assert drawn == {torch.bfloat16}


# ----------------------------------------------------------------------------- dims


def test_a_packed_cache_holds_every_row_it_is_read_at() -> None:
    """T was drawn at 1..3, whatever the sequences read from the pool."""
    _, kernel = attncc.optimise(PACKED)
    rng = np.random.default_rng(1)
    tokens = []
    for _ in range(30):
        sizes = draw_sizes(kernel, rng, max_len=64)
        # start[b] is drawn in 0..N and a sequence reads N rows from it
        assert 2 * sizes["N"] <= sizes["T"] <= 4 * sizes["N"]
        inputs = make_inputs(kernel, sizes, torch.float32, "cpu", rng)
        assert int(inputs["start"].max()) + sizes["N"] <= sizes["T"]
        tokens.append(sizes["T"])
    assert max(tokens) > 64


def test_a_table_dim_is_drawn_over_a_table_sized_range() -> None:
    _, kernel = attncc.optimise(BUCKETS)
    rng = np.random.default_rng(2)
    buckets = [draw_sizes(kernel, rng, max_len=32)["NB"] for _ in range(40)]
    assert min(buckets) >= 1 and max(buckets) > 16


def test_a_packed_spec_passes_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_file(tmp_path, PACKED)
    assert cli.main(["check", spec, "--trials", "3", "--max-len", "16"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("3 passed, 0 failed")


def test_dims_fixes_sizes_in_every_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["check", str(EXAMPLES / "gqa_causal.attn"), "--trials", "3", "--dtypes", "fp32"]
    assert cli.main([*args, "--dims", "N=40,D=16", "--dims", "H=4"]) == 0
    table = rows(capsys.readouterr().out)
    assert len(table) == 3
    for row in table:
        assert "N=40" in row and "D=16" in row and "H=4" in row
        kv = int(row.split("KVH=")[1].split()[0])
        assert 4 % kv == 0


def test_a_pool_fixed_too_small_is_a_failed_trial_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reference refuses reads past the pool: each trial says so, and the run goes on."""
    spec = spec_file(tmp_path, PACKED)
    args = ["check", spec, "--trials", "2", "--max-len", "8", "--dims", "T=1,N=4"]
    assert cli.main(args) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    table = rows(captured.out)
    assert len(table) == 2
    assert all("error: reference: ValueError:" in row and "'kp'" in row for row in table)
    assert captured.out.rstrip().endswith("0 passed, 2 failed")


def test_dims_are_checked_against_the_spec() -> None:
    _, paged = attncc.optimise(EXAMPLES / "paged_decode.attn")
    with pytest.raises(ValueError, match=r"dim N is derived \(N = NP \* PAGE\)"):
        check_dims(paged, {"N": 64})
    with pytest.raises(ValueError, match="no dim 'X'"):
        check_dims(paged, {"X": 64})
    with pytest.raises(ValueError, match="H=6 is not a multiple of KVH=4"):
        check_dims(paged, {"H": 6, "KVH": 4})
    check_dims(paged, {"H": 8, "KVH": 4, "PAGE": 16})


def test_fixed_page_sizes_are_kept() -> None:
    _, paged = attncc.optimise(EXAMPLES / "paged_decode.attn")
    rng = np.random.default_rng(3)
    for _ in range(10):
        sizes = draw_sizes(paged, rng, max_len=200, fixed={"PAGE": 16, "KVH": 2})
        assert sizes["PAGE"] == 16 and sizes["KVH"] == 2 and sizes["H"] % 2 == 0
        assert sizes["N"] == sizes["NP"] * 16


def test_demo_draws_a_param_without_a_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its reference step called the spec without the param (TypeError)."""
    assert cli.main(["demo", spec_file(tmp_path, NO_DEFAULT), "--trials", "1"]) == 0
    out = capsys.readouterr().out
    assert ", cap=" in out and out.rstrip().endswith("1 passed, 0 failed")
