"""``gpu/check.py --dry-run`` runs the whole device check on the CPU (Triton interpreter)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exactattn.infra.optional import install_hint

# found, not imported (so not tests.optional.requires): triton must first be imported with
# TRITON_INTERPRET set (by whoever runs the kernels on the CPU), or its kernels are built for
# a GPU that is not here
for _module in ("torch", "triton", "flint"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"needs {_module}: {install_hint(_module)}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~13 s: a subprocess running the check, the tiny sweep and the bench
def test_gpu_check_dry_run(tmp_path):
    env = dict(os.environ, EXACTATTN_GPU_RESULTS=str(tmp_path), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(ROOT / "gpu" / "check.py"), "--dry-run"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "check" / "report.json").read_text())
    ran = {row["variant"]: row["run"] for row in report["variants"]}
    assert ran["exactattn-triton[float32]"] > 0 and ran["exactattn[float32]"] > 0
    assert not report["failures"]
    for name in ("flash-attn", "xformers", "jax-cudnn"):  # the zoo's GPU targets, listed
        assert report["unavailable"][name], report["unavailable"]
    bench = list(csv.DictReader((tmp_path / "bench.csv").open()))
    assert {r["impl"] for r in bench} == {"sdpa", "exactattn"}
    assert {r["causal"] for r in bench} == {"True", "False"}
    text = (tmp_path / "check.md").read_text()
    assert "## Check" in text and "## Benchmarks" in text and "## Precision sweep" in text
