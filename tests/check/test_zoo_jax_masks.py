"""JAX's own mask arguments: the ``jax`` convention (:mod:`exactattn.targets.jax_convention`)
and the ``jax-xla-native`` target.

* a short check passes, and its calls carry each native argument (a window with
  ``n_q ≠ n_k``, key lengths, query lengths);
* the lowering is JAX's definitions (``_get_window_mask``, ``_get_causal_mask``,
  ``_get_padding_mask_logits``, written out here) of the case's allowed set;
* padded query rows are judged exactly: JAX's 0 passes, the smallest subnormal there fails;
* broken wrappers fail: the window off by one, its sides swapped, key lengths or query
  lengths off by one;
* a row with no allowed key that is no padded query row is a skip with the reason.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exactattn import targets
from exactattn.cases import Draw, build_case, mask_kinds
from exactattn.testing import session
from exactattn.testing.case_check import Options, check_case
from tests.optional import requires

requires("torch", "jax")

from exactattn.targets import jax_attention, jax_convention

EXACT = Options(sampled=False, fast_reference=True)
SHORT = session.Settings(
    examples=40, max_n=12, max_d=4, budget=1 << 9, dtypes=("float32",), determinism=False,
    baselines=False, probes=False,
)  # fmt: skip
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _target(fn) -> targets.Target:
    return dataclasses.replace(targets.get("jax-xla-native"), loader=lambda: fn)


def _case(mask, n_q=6, n_k=11, batch=(2, 2)):
    return build_case(Draw(batch, n_q, n_k, 4, 4, 512, dtype="float32", data_seed=3, mask=mask))


@pytest.mark.slow  # several seconds: the default run stays within its budget
def test_a_short_check_passes_with_each_native_argument_drawn():
    calls = []

    def recording(query, key, value, bias=None, mask=None, **arguments):
        calls.append((query.shape[-2], key.shape[-2], arguments))
        return jax_attention.xla_native(query, key, value, bias, mask, **arguments)

    result = session.run([_target(recording)], SHORT)
    assert result.report.failures == [], result.report.failures[:1]
    # small dims draw v != d in about half the cases: JAX's refusal ("value shape should be")
    assert sum(c["ok"] for c in result.report.counts.values()) >= SHORT.examples // 3
    window = [a for n_q, n_k, a in calls if "local_window_size" in a and n_q != n_k]
    assert window and any(a.get("is_causal") for _, _, a in calls)
    assert any("key_value_seq_lengths" in a for _, _, a in calls)
    assert any("query_seq_lengths" in a for _, _, a in calls)


def _jax_allowed(lowering, B: int, n_q: int, n_k: int) -> np.ndarray:
    """JAX's mask from its source's definitions (jax/_src/nn/functions.py), (B, n_q, n_k)."""
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    out = np.ones((B, n_q, n_k), dtype=bool)
    if lowering.is_causal:
        out &= j <= i  # _get_causal_mask: tril
    if lowering.window is not None:
        left, right = lowering.window  # _get_window_mask
        out &= (i <= j + left) & (i >= j - right)
    if lowering.key_lengths is not None:  # _get_padding_mask_logits
        out &= j[None] < lowering.key_lengths[:, None, None]
    if lowering.query_lengths is not None:
        out &= i[None] < lowering.query_lengths[:, None, None]
    return out


@pytest.mark.parametrize(
    "mask, n_q, n_k",
    [
        ({"kind": "window", "left": 2, "right": 1, "align": "top-left"}, 6, 11),
        ({"kind": "window", "left": 7, "right": 0, "align": "bottom-right"}, 6, 11),
        ({"kind": "window", "left": None, "right": 6, "align": "bottom-right"}, 11, 6),
        ({"kind": "causal", "align": "bottom-right"}, 6, 11),
        ({"kind": "causal", "align": "top-left"}, 11, 6),
        ({"kind": "and", "parts": [
            {"kind": "causal", "align": "top-left"},
            {"kind": "window", "left": 3, "right": None, "align": "top-left"},
            {"kind": "padding", "lengths": [4, 9]},
            {"kind": "query_padding", "lengths": [5, 0]}]}, 6, 11),
    ],
)  # fmt: skip
def test_the_lowering_is_jax_definitions_of_the_allowed_set(mask, n_q, n_k):
    case = _case(mask, n_q, n_k, batch=(2,))
    lowering = jax_convention.lowered(case)
    assert not lowering.rest  # every conjunct native
    assert (_jax_allowed(lowering, 2, n_q, n_k) == case.allowed()).all()


def test_a_window_that_is_no_window_size_goes_to_the_mask_argument():
    """Bottom-right with n_q > n_k shifts the right side below 0 (a causal mask there)."""
    case = _case({"kind": "causal", "align": "bottom-right"}, 6, 4)
    lowering = jax_convention.lowered(case)
    assert lowering.window is None and lowering.rest == [case.mask]


def test_padded_query_rows_are_judged_exactly():
    case = _case({"kind": "query_padding", "lengths": [4, 0]})
    tiny = float(np.finfo(np.float32).smallest_subnormal)

    def subnormal_rows(query, key, value, bias=None, mask=None, **arguments):
        y = jax_attention.xla_native(query, key, value, bias, mask, **arguments)
        lengths = arguments["query_seq_lengths"]
        padded = np.arange(y.shape[-2])[None, :] >= lengths.numpy()[:, None]
        return y + tiny * __import__("torch").from_numpy(padded)[:, None, :, None]

    good = targets.Variant(targets.get("jax-xla-native"), "float32")
    bad = targets.Variant(_target(subnormal_rows), "float32")
    found = check_case(case, [good, bad], EXACT)
    assert [f.status for f in found] == ["ok", "fail"], [f.detail for f in found]


def _shifted(name: str, change):
    def broken(query, key, value, bias=None, mask=None, **arguments):
        arguments[name] = change(arguments[name])
        return jax_attention.xla_native(query, key, value, bias, mask, **arguments)

    return broken


BROKEN = {
    "window off by one": (
        _shifted("local_window_size", lambda w: (w[0] + 1, w[1])),
        {"kind": "window", "left": 7, "right": 1, "align": "bottom-right"},  # JAX's (2, 6)
    ),
    "window sides swapped": (
        _shifted("local_window_size", lambda w: (w[1], w[0])),
        {"kind": "window", "left": 2, "right": 1, "align": "top-left"},
    ),
    "key lengths off by one": (
        _shifted("key_value_seq_lengths", lambda t: t + 1),
        {"kind": "padding", "lengths": [3, 9]},
    ),
    "query lengths off by one": (
        _shifted("query_seq_lengths", lambda t: t + 1),
        {"kind": "query_padding", "lengths": [4, 2]},
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_wrapper_is_caught(name):
    fn, mask = BROKEN[name]
    case = _case(mask)
    good = targets.Variant(targets.get("jax-xla-native"), "float32")
    found = check_case(case, [good, targets.Variant(_target(fn), "float32")], EXACT)
    assert [f.status for f in found] == ["ok", "fail"], [f.detail for f in found]
    assert found[1].detail.startswith(("y[", "dq[", "dk[", "dv[")), found[1].detail


def test_an_empty_row_that_is_no_padded_query_is_a_skip_with_the_reason():
    case = _case({"kind": "padding", "lengths": [0, 5]})  # a sequence with no key
    assert case.empty_rows == "zero"
    (found,) = check_case(case, [targets.Variant(targets.get("jax-xla-native"), "float32")], EXACT)
    assert found.status == "skip" and found.detail == jax_convention.EMPTY_ROWS, found.detail


def test_the_query_padding_kind_is_rows_with_no_key():
    allowed = mask_kinds.allowed({"kind": "query_padding", "lengths": [2, 0]}, (2,), 3, 4)
    assert allowed.shape == (2, 3, 4)
    assert allowed[0, :2].all() and not allowed[0, 2:].any() and not allowed[1].any()


def test_jax_cudnn_native_is_skipped_here_with_its_reason():
    why = targets.unavailable(targets.get("jax-cudnn-native"))
    if why is None:
        pytest.skip("a CUDA device and JAX's GPU backend are here")
    assert "CUDA" in why or "GPU" in why
