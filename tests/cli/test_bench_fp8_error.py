"""benchmarks/fp8_error.py's study, small enough for the CPU test run."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from script_module import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fp8_error.py"


@pytest.fixture(scope="module")
def fp8_error() -> ModuleType:
    return load_script(SCRIPT, "fp8_error_script")


def test_outlier_distribution_has_rare_large_entries(fp8_error: ModuleType) -> None:
    g = torch.Generator().manual_seed(0)
    x = fp8_error.draw("outliers", (1000, 1000), g)
    normal = fp8_error.draw("normal", (1000, 1000), g)
    assert normal.abs().max() < 6.5
    share = (x.abs() > 6.5).double().mean().item()  # about 0.001 * P(|N(0, 101)| > 6.5)
    assert 3e-4 < share < 1e-3
    with pytest.raises(ValueError, match="unknown distribution 'uniform'"):
        fp8_error.draw("uniform", (2,), g)


def test_study_orders_the_schemes(fp8_error: ModuleType) -> None:
    rows = fp8_error.study([256], batch=1, heads=2, head_dim=128, block=(64, 64))
    assert len(rows) == len(fp8_error.DISTRIBUTIONS) * len(fp8_error.SCHEMES)
    rmse = {(r.distribution, r.scheme): r.rmse for r in rows}
    for distribution in fp8_error.DISTRIBUTIONS:
        # bf16's 8 mantissa bits against e4m3's 4: an order of magnitude apart
        fp8 = [rmse[(distribution, s)] for s in fp8_error.SCHEMES if s != "bf16"]
        assert 5 * rmse[(distribution, "bf16")] < min(fp8)
        assert all(r.max_error >= r.rmse > 0 for r in rows)
    # the rotation helps where there are outliers
    assert rmse[("outliers", "block+H")] < 0.9 * rmse[("outliers", "per-tensor")]
    ratios = fp8_error.target_ratios(rows)
    assert ratios == {256: rmse[("outliers", "block+H")] / rmse[("outliers", "per-tensor")]}
    table = fp8_error.format_table(rows)
    assert table.count("\n") == 1 + len(fp8_error.DISTRIBUTIONS)
    assert all(s in table.splitlines()[0] for s in fp8_error.SCHEMES)


def test_main_prints_the_table_and_the_target(
    fp8_error: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    status = fp8_error.main(["--seqlens", "128", "--heads", "1", "--head-dim", "64"])
    out = capsys.readouterr().out
    assert "| outliers | 128 |" in out and "block+H / per-tensor RMSE on outliers: S=128:" in out
    assert status == (0 if "target <= 0.5: met" in out else 1)


def test_error_sources_add_up_to_the_whole(fp8_error: ModuleType) -> None:
    """Each input's share of block+H's error is below the whole, and the three add in squares
    to about it (independent errors); finer descale blocks are listed beside."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (fp8_error.draw("outliers", (1, 2, 256, 128), g) for _ in range(3))
    found = fp8_error.error_sources(q, k, v, (128, 128))
    whole = float(
        (
            fp8_error.scheme_output("block+H", q, k, v, (128, 128)).double()
            - fp8_error.attention64(q, k, v)
        )
        .pow(2)
        .mean()
        .sqrt()
    )
    shares = [found["q, k"], found["v"], found["p"]]
    assert all(0 < s < whole for s in shares)
    assert 0.8 < sum(s * s for s in shares) ** 0.5 / whole < 1.2
    assert {f"block+H {m}x{n}" for m, n in fp8_error.FINER_BLOCKS} <= set(found)
    spread = fp8_error.ratio_spread(256, 2, (128, 128), heads=1)
    assert len(spread) == 2 and all(0 < r < 1.5 for r in spread)
