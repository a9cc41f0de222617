"""The CPU benchmark runs end to end (tiny sizes, CPU); the device check is tests/check/."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from tests.optional import requires

requires("torch")

from exactattn.commands import bench_torch

ROOT = Path(__file__).resolve().parents[2]


def test_bench_torch_reports_both_implementations(tmp_path, capsys):
    md, table = tmp_path / "bench.md", tmp_path / "bench.csv"
    argv = ["--shape", "1", "2", "64", "8", "--repeats", "1", "--threads", "1", "--no-memory"]
    assert bench_torch.main([*argv, "--md", str(md), "--csv", str(table)]) == 0
    rows = list(csv.DictReader(table.open()))
    assert [r["pass_"] for r in rows] == ["fwd", "fwd+bwd"]
    for r in rows:
        ratio = float(r["exactattn_wall_s"]) / float(r["sdpa_wall_s"])
        assert abs(ratio - float(r["ratio_wall"])) < 1e-9
    assert "| fwd+bwd |" in md.read_text() and "| fwd+bwd |" in capsys.readouterr().out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_memory_sees_the_output():
    """The forward's peak is at least its (N, D) output and below half an n×n matrix."""
    n, d = 2048, 64
    for impl in ("sdpa", "exactattn"):
        peak = bench_torch.peak_memory(impl, "fwd", (1, 1, n, d), "float32", 1, None)
        assert n * d * 4 <= peak < n * n * 4 / 2, impl
