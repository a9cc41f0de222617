"""The CPU benchmark runs end to end (tiny sizes, CPU); the device check is tests/check/."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from tests.optional import requires

torch = requires("torch")

from exactattn.commands import bench_torch

ROOT = Path(__file__).resolve().parents[2]


def test_bench_torch_reports_every_case_and_pass(tmp_path, capsys):
    md, table = tmp_path / "bench.md", tmp_path / "bench.csv"
    argv = ["--shape", "1", "2", "64", "8", "--repeats", "1", "--threads", "1", "--no-memory"]
    argv += ["--no-flex", "--small", "--small-repeats", "1"]
    assert bench_torch.main([*argv, "--md", str(md), "--csv", str(table)]) == 0
    rows = list(csv.DictReader(table.open()))
    assert [(r["causal"], r["pass_"]) for r in rows] == [
        ("False", "fwd"), ("False", "fwd+bwd"), ("True", "fwd"), ("True", "fwd+bwd")
    ]  # fmt: skip
    for r in rows:
        ratio = float(r["exactattn_wall_s"]) / float(r["sdpa_wall_s"])
        assert abs(ratio - float(r["exactattn_wall_ratio"])) < 1e-9
        assert r["flex_wall_s"] == "nan"  # --no-flex
    text = md.read_text()
    assert text == capsys.readouterr().out
    for case in (
        "| tiny | fwd |",
        "| decode | fwd |",
        "| self-256 | fwd+bwd |",
        "| 1x2x64x8 | yes |",
    ):
        assert case in text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread-local profiler state")
def test_profiled_peak_counts_what_a_call_holds_at_once():
    """Two live 1 MiB buffers, one freed, a third: 2 MiB at most at once (a few bytes of
    scalars aside); the inputs made before the call do not count, its output does."""
    inputs = torch.ones(1 << 20)

    def call():
        a = torch.empty(1 << 18)  # 1 MiB of float32
        b = torch.empty(1 << 18)
        del a
        c = torch.empty(1 << 18)
        return b, c

    assert 2 << 20 <= bench_torch.profiled_peak(call) < (2 << 20) + 4096
    assert 4 << 20 <= bench_torch.profiled_peak(lambda: inputs * 2) < (4 << 20) + 4096  # y only


def test_peak_memory_sees_the_output():
    """The forward's peak is at least its (N, D) output and below half an n×n matrix."""
    n, d = 2048, 64
    for impl in ("sdpa", "exactattn"):
        peak = bench_torch.peak_memory(impl, "fwd", (1, 1, n, d), "float32")
        assert n * d * 4 <= peak < n * n * 4 / 2, impl
