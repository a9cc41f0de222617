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
