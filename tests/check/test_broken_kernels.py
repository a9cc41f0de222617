"""``exactattn check`` kills deliberately broken kernels and passes the correct one.

:mod:`.kernels` holds a FlashAttention-2-style tiled kernel in torch and ten ways to break
it (see :data:`kernels.BUGS`). Each broken kernel must fail
:func:`exactattn.testing.assert_attention_close` with a counterexample naming the output,
the shapes and the worst element; the correct kernel must pass under the same claim. The
kill rate over all ten is asserted to be 10/10 (docs/check.md reports it).
"""

from __future__ import annotations

import re

import pytest

from exactattn.testing import assert_attention_close
from tests.optional import requires

requires("torch")

from . import kernels

# bug -> (convention, dtypes, examples, max_n, output the counterexample must name)
SETTINGS = {
    "causal-off-by-one": ("sdpa", ("float32",), 60, 12, "y"),
    "dropped-tail-block": ("sdpa", ("float32",), 60, 12, "y"),
    "no-max-subtraction": ("sdpa", ("float32",), 300, 12, "y"),
    "wrong-scale": ("sdpa", ("float32",), 60, 12, "y"),
    "gqa-head-mapping": ("sdpa", ("float32",), 200, 8, "y"),
    "mask-ignored-on-partial-blocks": ("sdpa", ("float32",), 60, 12, "y"),
    "rescale-skipped": ("sdpa", ("float32",), 60, 12, "y"),
    "fp16-accumulation": ("sdpa", ("float32",), 60, 12, "y"),
    "dq-scale-in-backward": ("sdpa", ("float32",), 60, 12, "dq"),
    "lse-without-max": ("flash", ("float32",), 60, 12, "lse"),
}


def _check(bug, convention, dtypes, examples, max_n):
    fn = kernels.flash(bug) if convention == "flash" else kernels.sdpa(bug)
    return assert_attention_close(
        fn,
        convention=convention,
        claim=kernels.CLAIM,
        supports="dropout=no,lse=yes" if convention == "flash" else "dropout=no",
        examples=examples,
        dtypes=dtypes,
        max_n=max_n,
        dropout_probe=False,
    )


def test_every_bug_is_listed():
    assert set(SETTINGS) == set(kernels.BUGS) and len(kernels.BUGS) >= 8


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("convention", ["sdpa", "flash"])
def test_the_correct_kernel_passes(convention):
    result = _check(None, convention, ("float32", "float16"), 80, 16)
    assert sum(c["ok"] for c in result.report.counts.values()) > 15


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("bug", list(SETTINGS))
def test_a_broken_kernel_is_killed_with_a_counterexample(bug):
    convention, dtypes, examples, max_n, output = SETTINGS[bug]
    with pytest.raises(AssertionError) as caught:
        _check(bug, convention, dtypes, examples, max_n)
    text = str(caught.value)
    assert text.startswith("FAIL ")
    assert "case: q (" in text and "mask " in text
    if bug != "dropped-tail-block":  # its shrunk case has no key block left: y is detached
        assert re.search(rf"\b{output}\w*\[", text), text
        if "for finite inputs" not in text:  # a NaN / inf has no worst error to locate
            assert "worst element:" in text and "certified" in text
