"""ONNX Runtime's KV-cache paths (:mod:`exactattn.targets.ort_kvcache`): each target passes a
short check in which cases of its kind were judged (a past, ``n_q ≠ n_k``, GQA, a window, key
padding, a soft-cap); its broken twins fail (the present cache concatenated in the wrong
order, ``seqlens_k`` the total length instead of total − 1, the window one key wider); bad
inputs are errors naming the argument; ``is_causal`` with a past is aligned at the past
length and ``local_window_size = w`` is ``w`` keys, as the module says (measured here).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exactattn import targets
from exactattn.cases import Case
from exactattn.testing import session
from exactattn.testing.case_check import Options, check_case
from tests.optional import requires

requires("onnx", "onnxruntime", "torch", "flint")

from exactattn.targets import ort_kvcache

SHORT = session.Settings(
    examples=80, max_n=12, max_d=8, budget=1 << 10, dtypes=("float32", "float16"),
    determinism=False, baselines=False, probes=False,
)  # fmt: skip
BOTTOM_RIGHT = {"kind": "causal", "align": "bottom-right"}
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _target(name: str, fn=None) -> targets.Target:
    """The registered target in this process (calls recorded), or with another callable."""
    target = targets.get(name)
    options = dataclasses.replace(target.options, isolated=False)
    if fn is None:
        return dataclasses.replace(target, options=options)
    return dataclasses.replace(target, name=fn.__name__, loader=lambda: fn, options=options)


def _recording(name: str) -> tuple[targets.Target, list]:
    calls: list = []
    real = targets.get(name).load()

    def recorded(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    return _target(name, recorded), calls


def _case(n_q=3, n_k=7, mask=None, heads=(2, 2), d=8, v=8, dtype="float32", B=1, **kwargs):
    rng = np.random.default_rng(0)
    q, g = (rng.standard_normal((B, heads[0], n_q, x)) for x in (d, v))
    k, v_ = (rng.standard_normal((B, heads[1], n_k, x)) for x in (d, v))
    return Case(q, k, v_, g, 4, mask=mask or {"kind": "none"}, dtype=dtype, **kwargs)


def _status(case: Case, *found: targets.Target) -> list[str]:
    variants = [targets.Variant(t, case.dtype) for t in found]
    return [f"{f.status}: {f.detail}" for f in check_case(case, variants, Options())]


def _check(target: targets.Target) -> int:
    result = session.run([target], SHORT)
    assert result.variants and not result.unavailable, result.unavailable
    assert [text for _, text in result.report.failures] == []
    return sum(c["ok"] for c in result.report.counts.values())


def test_attention_kvcache_passes_a_short_check_with_pasts_gqa_and_softcaps():
    target, calls = _recording("ort-attention-kvcache")
    assert _check(target) >= 20
    past = [a[3].shape[2] for a, _ in calls]
    cross = [a[0].shape[2] != a[1].shape[2] + a[3].shape[2] for a, _ in calls]
    assert sum(p >= 1 for p in past) >= 10 and any(cross)
    assert any(a[0].shape[1] != a[1].shape[1] for a, _ in calls)  # GQA
    assert any(kw.get("is_causal") and a[3].shape[2] >= 1 for a, kw in calls)
    assert any(kw.get("softcap") for _, kw in calls) and any(
        kw.get("attn_mask") is not None for _, kw in calls
    )
    assert {a[0].dtype.name for a, _ in calls} == {"float32", "float16"}


def test_gqa_passes_a_short_check_with_pasts_windows_and_padding():
    """The short draw has pasts, several query rows and GQA; windows that cut and unequal
    sequence lengths in one batch are rare at its sizes, so they are cases of their own."""
    target, calls = _recording("ort-gqa")
    assert _check(target) >= 10
    past = [a[5] + 1 - a[0].shape[1] for a, _ in calls]
    assert any((p >= 1).all() for p in past) and any(a[0].shape[1] > 1 for a, _ in calls)
    assert any(kw["num_heads"] != kw["kv_num_heads"] for _, kw in calls)  # GQA
    for case in (_case(mask={"kind": "window", "left": 1, "right": 0, "align": "bottom-right"}),
                 _case(n_q=1, mask={"kind": "window", "left": 0, "right": 0,
                                    "align": "bottom-right"}, heads=(4, 1)),
                 _case(n_q=1, B=2, mask={"kind": "padding", "lengths": [3, 7]}),
                 _case(dtype="float16", d=5, v=3, softcap=2.0, mask=BOTTOM_RIGHT)):  # fmt: skip
        assert _status(case, target) == ["ok: "], case.mask
    assert {kw["local_window_size"] for _, kw in calls} >= {2, 1}  # left + 1 keys
    assert [2, 6] in [a[5].tolist() for a, _ in calls]  # seqlens_k = length - 1


def swapped_present(query, key, value, past_key, past_value, **kwargs):
    """The new keys fed as the past and the past as the new ones (a cache written in the
    wrong order): ``Y`` is the same without a mask, the present caches are not."""
    return ort_kvcache.ort_attention_kvcache(query, past_key, past_value, key, value, **kwargs)


def seqlens_total(query, key, value, past_key, past_value, seqlens_k, total, **kwargs):
    """``seqlens_k`` the total length, not total − 1."""
    return ort_kvcache.ort_group_query_attention(
        query, key, value, past_key, past_value, seqlens_k + 1, total, **kwargs
    )


def window_wider(*args, local_window_size, **kwargs):
    """``local_window_size`` one key wider than the case's window."""
    wider = local_window_size + 1 if local_window_size >= 0 else -1
    return ort_kvcache.ort_group_query_attention(*args, local_window_size=wider, **kwargs)


@pytest.mark.parametrize(
    ("name", "broken", "case", "says"),
    [
        ("ort-attention-kvcache", swapped_present, _case(n_q=2, n_k=6), "present_key is not"),
        ("ort-gqa", seqlens_total, _case(n_q=1, n_k=5, mask={"kind": "padding",
                                                           "lengths": [4]}), ""),
        ("ort-gqa", seqlens_total, _case(mask=BOTTOM_RIGHT, heads=(4, 2)), ""),
        ("ort-gqa", window_wider, _case(mask={"kind": "window", "left": 2, "right": 0,
                                              "align": "bottom-right"}), ""),
    ],
)  # fmt: skip
def test_a_broken_wrapper_is_caught(name, broken, case, says):
    ok, bad = _status(case, _target(name), _target(name, broken))
    assert ok == "ok: " and bad.startswith("fail") and says in bad, (ok, bad)


@pytest.mark.parametrize(("n_q", "past", "new"), [(3, 2, 3), (2, 3, 4), (4, 2, 2), (1, 2, 1)])
def test_is_causal_with_a_past_sees_the_keys_up_to_the_past_length(n_q, past, new):
    """ONNX's definition, ``j ≤ i + P`` (not bottom-right unless ``L = n_q``), against an
    explicit boolean mask of it."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, n_q, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, past + new, 8)).astype(np.float32) for _ in range(2))
    split = (k[:, :, past:], v[:, :, past:], k[:, :, :past], v[:, :, :past])
    causal, *_ = ort_kvcache.ort_attention_kvcache(q, *split, is_causal=True)
    allowed = np.arange(past + new)[None] <= np.arange(n_q)[:, None] + past
    masked, *_ = ort_kvcache.ort_attention_kvcache(q, *split, attn_mask=allowed)
    np.testing.assert_allclose(causal, masked, rtol=0, atol=2e-7)


@pytest.mark.parametrize("w", [0, 1, 2, 3])
def test_local_window_size_is_that_many_keys_with_the_diagonal(w):
    rng = np.random.default_rng(4)
    S, past, d = 3, 4, 8
    q = rng.standard_normal((1, S, d)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1, past + S, d)).astype(np.float32) for _ in range(2))
    new = [x[:, 0, past:] for x in (k, v)]
    lengths = np.array([past + S - 1], np.int32)
    y, *_ = ort_kvcache.ort_group_query_attention(
        q, *new, k[:, :, :past], v[:, :, :past], lengths, past + S, num_heads=1,
        kv_num_heads=1, local_window_size=w,
    )  # fmt: skip
    i, j = np.arange(S)[:, None] + past, np.arange(past + S)[None]
    allowed = (j <= i) & (j > i - w)
    s = np.where(allowed, q[0] @ k[0, 0].T / np.sqrt(d), -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.nan_to_num(np.exp(s - s.max(-1, keepdims=True)))
        expected = np.nan_to_num(p / p.sum(-1, keepdims=True)) @ v[0, 0]
    np.testing.assert_allclose(y[0], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"past_key": np.zeros((1, 3, 2, 8), np.float32)}, "past_key"),
        ({"value": np.zeros((1, 2, 4, 8))}, "value"),
        ({"key": np.zeros((1, 2, 0, 8), np.float32)}, "key"),
        ({"softcap": -1.0}, "softcap"),
        ({"attn_mask": np.zeros((1, 2, 3, 6), np.float16)}, "attn_mask"),
    ],
)
def test_bad_attention_inputs_name_the_argument(change, argument):
    x = np.zeros((1, 2, 3, 8), np.float32)
    kwargs = dict(query=x, key=x[:, :, :2], value=x[:, :, :2], past_key=x, past_value=x)
    with pytest.raises((ValueError, TypeError), match=argument):
        ort_kvcache.ort_attention_kvcache(**{**kwargs, **change})


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"seqlens_k": np.array([4])}, "seqlens_k"),
        ({"query": np.zeros((1, 2, 16, 1), np.float32)}, "query"),
        ({"past_key": np.zeros((1, 1, 5, 4), np.float32)}, "past_key"),
        ({"kv_num_heads": 3}, "kv_num_heads"),
        ({"local_window_size": -2}, "local_window_size"),
    ],
)
def test_bad_gqa_inputs_name_the_argument(change, argument):
    q, kv, cache = np.zeros((1, 2, 16), np.float32), np.zeros((1, 2, 8), np.float32), None
    cache = np.zeros((1, 1, 5, 8), np.float32)
    kwargs = dict(query=q, key=kv, value=kv, past_key=cache, past_value=cache,
                  seqlens_k=np.array([4], np.int32), total_sequence_length=5, num_heads=2,
                  kv_num_heads=1)  # fmt: skip
    with pytest.raises((ValueError, TypeError), match=argument):
        ort_kvcache.ort_group_query_attention(**{**kwargs, **change})


def test_what_the_conventions_cannot_express_is_a_skip_with_the_reason():
    kvcache, gqa = _target("ort-attention-kvcache"), _target("ort-gqa")
    (found,) = _status(_case(n_q=5, n_k=3, mask=BOTTOM_RIGHT), kvcache)
    assert found.startswith("skip") and "negative offset" in found
    for case, says in [
        (_case(), "causal"),
        (_case(n_q=2, n_k=5, mask={"kind": "padding", "lengths": [3]}), "one query row"),
        (_case(n_q=5, n_k=3, mask=BOTTOM_RIGHT), "n_q <= n_k"),
        (_case(mask={"kind": "causal", "align": "top-left"}), "bottom-right"),
    ]:
        (found,) = _status(case, gqa)
        assert found.startswith("skip") and says in found, found
