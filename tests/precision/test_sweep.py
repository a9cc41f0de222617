"""A tiny sweep end to end: well-formed outputs, resume, determinism, Dask equivalence."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest

from exactattn.commands import sweep as cli
from exactattn.precision.grid import KNOBS, expand, key_of
from exactattn.precision.presets import PRESETS
from tests.optional import requires

pd, *_ = requires("pandas", "flint", "matplotlib", "rich")

from exactattn.precision.sweep_run import COLUMNS, run_sweep

TIMING = ["seconds", "ref_seconds"]


def _frame(path) -> pd.DataFrame:
    df = pd.read_csv(path)
    df["key"] = [key_of(row) for row in df.to_dict("records")]
    return df.drop(columns=TIMING).sort_values(["key", "impl"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert cli.main(["--preset", "tiny", "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    return out


def test_tiny_sweep_writes_csv_plots_and_report(tiny_run):
    points = expand(PRESETS["tiny"])
    with (tiny_run / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0].keys()) == COLUMNS
    assert len(rows) == 2 * len(points)
    assert {row["status"] for row in rows} == {"ok"}
    assert sorted({key_of(r) for r in rows}) == sorted(p.key for p in points)
    for row in rows:
        assert float(row["y_rmse"]) > 0
        # the reference picks its precision: radius far below every error it measures
        assert float(row["ref_radius"]) < 1e-12 * float(row["y_max_abs"])
        assert int(row["ref_prec"]) >= 96
        assert row["v_numpy"] == np.__version__ and row["input_seed"].isdigit()
        assert 0 < float(row["bound_ratio"]) <= 1
        assert 0 < float(row["grad_bound_ratio"]) <= 1
        assert float(row["bound_vacuous"]) == 0
        if row["rounding"] == "nearest":  # every tiny point has gradients
            assert (
                0 < float(row["expected_grad_median"]) < 1 and float(row["expected_grad_max"]) < 3
            )
            assert float(row["expected_grad_entries"]) > float(row["expected_entries"])
    emulated = {row["config"]: (row["rounding"], row["granularity"]) for row in rows}
    assert emulated["emu8-rz"] == ("toward_zero", "op")
    assert emulated["emu8-rn"] == ("nearest", "op") and emulated["mp11"] == ("nearest", "scalar")
    assert emulated["np-fp16"] == ("nearest", "native")
    report = (tiny_run / "report.md").read_text()
    assert "What the numbers show" in report and "mp11" in report
    assert f"the bound held in {len(rows)} of {len(rows)} runs" in report
    assert "Expected error (dQ, dK, dV, " in report and "Expected error (Y, " in report
    pngs = sorted(p.name for p in tiny_run.glob("*.png"))
    assert {"tiled_vs_naive.png", "bound_ratio.png", "bound_hist.png"} <= set(pngs)
    assert all((tiny_run / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_resume_completes_a_partial_csv(tiny_run, tmp_path):
    full = (tiny_run / "results.csv").read_text().splitlines()
    partial = [*full[: 1 + 6], full[7][:40]]  # header, 3 points, a torn line
    (tmp_path / "results.csv").write_text("\n".join(partial) + "\n")
    seen = []
    result = run_sweep("tiny", tmp_path, resume=True, progress=False, on_row=seen.append)
    assert result.rows_kept == 6
    assert result.rows_written == len(full) - 1 - 6 == len(seen)
    pd.testing.assert_frame_equal(
        _frame(tmp_path / "results.csv"), _frame(tiny_run / "results.csv")
    )


def test_reruns_are_deterministic_with_two_workers(tiny_run, tmp_path):
    run_sweep("tiny", tmp_path, workers=2, progress=False)
    pd.testing.assert_frame_equal(
        _frame(tmp_path / "results.csv"), _frame(tiny_run / "results.csv")
    )


def test_dask_cluster_gives_the_local_results(tiny_run, tmp_path):
    distributed = requires("dask.distributed")
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        run_sweep("tiny", tmp_path, scheduler=cluster.scheduler_address, progress=False)
    pd.testing.assert_frame_equal(
        _frame(tmp_path / "results.csv"), _frame(tiny_run / "results.csv")
    )


@pytest.mark.slow  # several seconds: the default run stays within its budget
def test_golden_tiny_reports_their_claims_beside_ours(tmp_path):
    out = tmp_path / "golden"
    assert cli.main(["--preset", "golden-tiny", "--out", str(out), "--no-progress"]) == 0
    df = pd.read_csv(out / "results.csv")
    assert set(df["rounding"]) == {"nearest", "toward_zero"}
    assert (df["bound_ratio"] <= 1).all() and (df["grad_bound_ratio"].dropna() <= 1).all()
    report = (out / "report.md").read_text()
    assert "### Their claims beside ours" in report and "~10×" in report
    assert "the largest tiled/naive ratio on the block grid" in report
    for axis in ("mantissa bits", "sequence length", "block size"):
        assert f"### Against {axis}" in report
    assert {"golden_bits.png", "golden_n.png", "golden_block.png"} <= {
        p.name for p in out.glob("*.png")
    }


@pytest.mark.slow  # several seconds: the default run stays within its budget
def test_foreign_targets_land_in_the_same_csv(tmp_path, capsys):
    requires("torch")
    out = tmp_path / "foreign"
    names = ["sdpa-math[float32]", "np-fa2-fp16", "sdpa"]
    assert cli.main(["--preset", "tiny", "--out", str(out), "--targets", *names]) == 0
    df = pd.read_csv(out / "results.csv")
    assert set(df["config"]) == {
        "sdpa-math[float32]",
        "np-fa2-fp16",
        "sdpa[float16]",
        "sdpa[bfloat16]",
        "sdpa[float32]",
    }
    skipped = df["status"] != "ok"  # SDPA takes a bias (float mask) but has no soft-cap
    assert (df.loc[skipped, "score"] == "softcap").all()
    assert df.loc[skipped, "config"].str.startswith("sdpa").all()
    assert df.loc[skipped, "status"].str.contains("no soft-cap").all()
    assert (df.loc[df["score"] != "softcap", "status"] == "ok").all()
    ran = df[~skipped]
    assert (ran["bound_ratio"] <= 1).all() and (ran["grad_bound_ratio"] <= 1).all()
    foreign = df[df["config"] == "sdpa-math[float32]"]
    assert foreign["backend"].str.contains("sdpa convention").any()
    assert "sdpa[bfloat16]" in (out / "report.md").read_text()
    assert cli.main(["--preset", "tiny", "--out", str(out), "--targets", "no-such-kernel"]) == 2
    assert "unknown target 'no-such-kernel'" in capsys.readouterr().err


def test_time_reference_prints_one_line_per_reference(capsys):
    assert cli.main(["--time-reference", "16", "4", "--workers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    form = r"reference (arb|float64) n=16 d=4 fwd\+bwd: \d+\.\d\d s wall, radius \S+"
    assert [re.fullmatch(form, line).group(1) for line in lines] == ["arb", "float64"], lines
    assert all(float(line.rsplit(" ", 1)[1]) > 0 for line in lines)


def test_cli_rejects_bad_arguments(capsys):
    assert cli.main(["--preset", "nope"]) == 2
    assert "unknown preset" in capsys.readouterr().err
    assert cli.main(["--workers", "0"]) == 2
    assert cli.main(["--list"]) == 0
    assert "quick" in capsys.readouterr().out


def test_every_preset_expands_to_known_knobs():
    for name, preset in PRESETS.items():
        points = expand(preset)
        assert points, name
        assert len({p.key for p in points}) == len(points)
        assert all(set(KNOBS) <= set(p.__dataclass_fields__) for p in points[:1])


def test_the_gradient_summary_reads_results_without_its_columns():
    """Results written before the gradients' columns (or without gradients) have no
    gradient sentence; with them it pools the entries."""
    from exactattn.precision.sweep_report import expected_summary

    old = pd.DataFrame(
        {
            "status": ["ok"],
            "rounding": ["nearest"],
            "expected_median": [0.1],
            "expected_exceed": [0.0],
            "expected_max": [0.5],
            "expected_entries": [8],
        }
    )
    assert expected_summary(old, of="grad") == "" and expected_summary(old).startswith("Expected")
    new = old.assign(
        expected_grad_median=[0.2],
        expected_grad_exceed=[0.5],
        expected_grad_max=[1.5],
        expected_grad_entries=[24],
    )
    line = expected_summary(pd.concat([new, new.assign(expected_grad_exceed=0.0)]), of="grad")
    assert "(dQ, dK, dV, 2 runs rounding to nearest, 48 entries)" in line and "25% of" in line
    with pytest.raises(ValueError, match="of must be 'y' or 'grad'"):
        expected_summary(old, of="dq")
