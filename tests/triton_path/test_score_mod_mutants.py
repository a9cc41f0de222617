"""The score-modification checks shown to fail on deliberately broken kernels.

Each mutant is ``exactattn.torch.triton_kernels`` with one bug, loaded from a patched copy of its
source, and one test of ``test_score_mod`` (which passes on the real kernels) run against
it must raise AssertionError. A patch whose text no longer occurs in the source fails the
test too, so the mutants follow the code.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from . import test_score_mod as checks

SOFTCAP_FACTOR = "if HAS_SOFTCAP:  # d(cap tanh(s / cap))/ds = 1 - t^2"
CAP = """    t = s
    if HAS_SOFTCAP:
        t = _tanh(s / softcap)
        s = softcap * t
"""
ATOMIC_TILE = "if ATOMIC:\n            tl.atomic_add(ptrs, value, mask=in_range)"
ADD_BIAS = "        s = s + tl.load(ptrs, mask=in_range, other=0.0).to(tl.float32)\n"

# name -> (patches [(old, new, occurrences)], the check that must fail)
MUTANTS = {
    "softcap-derivative-dropped": (
        [(SOFTCAP_FACTOR, "if False:", 2)],
        lambda tk, device: checks.test_softcap_alone(tk, device, None),
    ),
    "dbias-times-softcap-derivative": (
        [
            (
                "= _dbias_add(DB, gamma_t, db_rows,",
                "= _dbias_add(DB, gamma_t * ((1.0 - t_t) * (1.0 + t_t)), db_rows,",
                1,
            )
        ],
        lambda tk, device: checks.test_softcap_and_bias_with_masks_and_gqa(
            tk, device, "causal-top-left", False
        ),
    ),
    "softcap-after-bias": (
        [(CAP, "", 1), (ADD_BIAS, ADD_BIAS + CAP, 1)],
        lambda tk, device: checks.test_softcap_and_bias_with_masks_and_gqa(
            tk, device, "causal-top-left", False
        ),
    ),
    "forward-bias-only-on-edge-blocks": (
        [
            (
                "        s, _ = _modify(s, BIAS, offs_m, offs_n, stride_bm, stride_bn, n_q, n_k, "
                "softcap,\n                       HAS_BIAS, HAS_SOFTCAP)",
                "        s, _ = _modify(s, BIAS, offs_m, offs_n, stride_bm, stride_bn, n_q, n_k, "
                "softcap,\n                       MASKED, HAS_SOFTCAP)",
                1,
            )
        ],
        lambda tk, device: checks.test_bias_shapes_with_neg_inf_entries(
            tk, device, "(B,H,n_q,n_k)"
        ),
    ),
    "dbias-stored-not-added-across-batch": (
        [(ATOMIC_TILE, ATOMIC_TILE.replace("ATOMIC", "False"), 1)],
        lambda tk, device: checks.test_bias_shapes_with_neg_inf_entries(
            tk, device, "(1,H,n_q,n_k)"
        ),
    ),
    "dbias-rows-not-summed-over-query-blocks": (
        [("db_rows += tl.sum(gamma_t, 1)", "db_rows = tl.sum(gamma_t, 1)", 1)],
        lambda tk, device: checks.test_bias_shapes_with_neg_inf_entries(tk, device, "(B,H,1,n_k)"),
    ),
}


def load_mutant(tk, name, patches, directory: Path):
    source = Path(tk.__file__).read_text()
    for old, new, occurrences in patches:
        assert source.count(old) == occurrences, f"{name}: patch text not found as expected"
        source = source.replace(old, new)
    path = directory / f"mutant_{name.replace('-', '_')}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[path.stem]
    return module


@pytest.mark.parametrize("name", list(MUTANTS))
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # -inf + inf in a mutant
def test_mutant_is_caught(tk, device, name, tmp_path):
    patches, check = MUTANTS[name]
    mutant = load_mutant(tk, name, patches, tmp_path)
    with pytest.raises(AssertionError):
        check(mutant, device)
