"""``exactattn zoo``: every foreign target by default, check's verdicts per calling path on
one page, what could not run and why, and a failing kernel's rows and findings."""

from __future__ import annotations

import pytest

from exactattn.commands import zoo as zoo_command
from exactattn.testing import zoo_page
from tests.optional import requires

requires("torch", "flint")


def test_the_zoo_is_every_foreign_target_and_none_of_exactattns_own():
    names = zoo_page.targets()
    assert {"sdpa", "sdpa-math", "flex", "hf-sdpa", "flash-attn"} <= set(names)
    assert not any(n.startswith(("np-", "torch-", "mp")) for n in names)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_page_has_a_row_per_variant_and_path_and_says_what_did_not_run(tmp_path):
    out = tmp_path / "zoo.md"
    broken = "tests.check.refusing_kernels:ignores_scale"
    argv = ["sdpa-math", "sdpa-cudnn", broken, "--profile", "smoke", "--dtypes", "float32"]
    assert zoo_command.main([*argv, "--no-probes", "--zoo-out", str(out)]) == 1
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| sdpa-math[float32] |")]
    assert rows and all(line.endswith("| pass |") for line in rows)
    assert "- sdpa-cudnn: needs a CUDA device" in text
    assert f"| {broken}[float32] |" in text and "| FAIL |" in text
    assert f"- FAIL {broken}[float32]:" in text
    assert "exactattn zoo sdpa-math sdpa-cudnn" in text and "s CPU (load " in text


def test_a_gqa_case_counts_under_its_path_and_under_the_gqa_row():
    """The GQA row cuts across the drawn paths; the coverage table's paths still sum to the
    judged cases."""
    from types import SimpleNamespace

    from exactattn.testing import coverage

    counts = {}
    for group, worst in ((2, 0.5), (1, 0.25)):
        draw = SimpleNamespace(
            note="path decode", n_q=1, n_k=9, group=group, block_size=4, seqlens=None,
            splits=None, pages=None, sinks=None,
        )  # fmt: skip
        finding = SimpleNamespace(
            status="ok", target="t", block_size=4, worst=worst, expected=1.0, vacuous=False,
            reference="arb", quantised=False, covered=(),
        )  # fmt: skip
        coverage.tally(counts, finding, draw)
    (row,) = coverage.rows(counts, ["t"])
    assert row["paths"] == {"decode": 2} and row["gqa"] == 1
    assert counts["t"]["path view GQA"] == 1 and counts["t"]["worst view GQA"] == 0.5
    result = SimpleNamespace(
        variants=["t"],
        report=SimpleNamespace(coverage=counts),
        targets={"t": SimpleNamespace(convention="sdpa")},
    )
    assert [(r["path"], r["judged"]) for r in zoo_page.rows(result)] == [("decode", 2), ("GQA", 1)]
