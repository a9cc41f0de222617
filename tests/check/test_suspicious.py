"""``SUSPICIOUS``: within the rigorous bound, far outside the expected error — never a failure.

:mod:`.rounding_kernels` holds a tiled kernel with bf16 statistics and two bugs the
rigorous bound passes at ``n/b = 256`` key blocks (its budget ``(1 + u)^{2n/b}`` is many
times Y's scale): ``rescale-l-skipped`` (a subtle kernel bug) and ``toward-zero`` (every
rounding truncates while the claim says round to nearest). Both must be ``ok`` and
suspicious; the correct twin must be ``ok`` and not suspicious; a suspicious case must reach
the report (table, report.md, report.json) without making the run fail.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from exactattn.cases import Case
from exactattn.targets import Claim, Variant, from_callable
from exactattn.testing import check_report
from exactattn.testing.case_check import Options, check_case
from exactattn.testing.search import Report, single_thread
from exactattn.testing.session import Result, Settings
from exactattn.testing.suspicion import FAR
from tests.optional import requires

requires("torch")

from . import rounding_kernels as kernels

BLOCKS = 256  # n / b: where the worst case is loose


def _case(seed: int, blocks: int = BLOCKS) -> Case:
    rng = np.random.default_rng(seed)
    n, d = blocks * kernels.BLOCK, 8
    q, k, v, g = (rng.standard_normal((1, 1, n, d)) for _ in range(4))
    return Case(q, k, v, g, block_size=kernels.BLOCK, dtype="bfloat16")


@functools.cache
def _seen(bug, seed: int):
    return _finding(bug, _case(seed))


def _finding(bug, case):
    target = from_callable(
        kernels.sdpa(bug), convention="sdpa", claim=Claim.parse(kernels.CLAIM), name=f"k-{bug}"
    )
    with single_thread():
        [found] = check_case(case, [Variant(target, "bfloat16")], Options(grads=False))
    return found


def test_the_correct_twin_is_neither_failed_nor_suspicious():
    found = _seen(None, 0)
    assert found.status == "ok", found.detail
    assert not found.suspicious and found.expected < 1.5


@pytest.mark.parametrize("bug", list(kernels.BUGS))
def test_a_bug_the_rigorous_bound_passes_is_suspicious(bug):
    found = _seen(bug, 0)
    assert found.status == "ok", found.detail  # the rigorous bound cannot see it
    assert found.expected > FAR and found.suspicious.startswith("y["), found.suspicious
    assert "within the rigorous bound" in found.suspicious


@pytest.mark.slow
@pytest.mark.parametrize("bug", [None, *kernels.BUGS])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_more_seeds(bug, seed):
    found = _finding(bug, _case(seed))
    assert found.status == "ok", found.detail
    assert bool(found.suspicious) == (bug is not None), (found.expected, found.suspicious)


def test_suspicious_is_reported_and_never_fails_the_run(tmp_path):
    findings = [_seen("toward-zero", 0), _seen(None, 0)]
    run = Report(examples=1)
    run.add(findings)
    result = Result(Settings(), run, [f.target for f in findings])
    assert not result.failed  # the exit code follows result.failed
    rows = check_report.summary(result)
    assert [r["suspicious"] for r in rows] == [1, 0]
    [line] = check_report.suspicious(rows)
    assert line.startswith("SUSPICIOUS k-toward-zero[bfloat16]: 1 of 1 cases"), line
    assert "exit code unchanged" in line
    md, js = check_report.write(result, tmp_path, [])
    assert "## Suspicious" in md.read_text() and "SUSPICIOUS k-toward-zero[" in md.read_text()
    assert "| /expected max | suspicious |" in md.read_text()
    data = json.loads(js.read_text())
    assert [v["suspicious"] for v in data["variants"]] == [1, 0]
    assert data["variants"][0]["suspicious_cases"] == [findings[0].suspicious]
