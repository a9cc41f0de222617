"""``exactattn check --profile long`` (:mod:`exactattn.testing.long`), at small sizes.

The profile's lengths are monkeypatched small so this runs in seconds; what is tested is
what the profile does at any length: SDPA passes on the judged strips, a kernel that ignores
the keys past the middle fails there (the strips reach them), a float64 target is skipped
with its reason, and a case whose memory estimate exceeds what is available is skipped
with how much it needed. The strips' reference and bound read only their own rows.
"""

from __future__ import annotations

import pytest

from exactattn import targets
from exactattn.testing import long
from tests.optional import requires

requires("torch", "flint")


def _small(monkeypatch, available=None):
    monkeypatch.setattr(long, "STRIP", 32)
    monkeypatch.setattr(long, "PROBE_N", 64)
    if available is not None:
        monkeypatch.setattr(long, "available_bytes", lambda: available)


def _lines(variants, sizes=(96, 160)):
    said: list[str] = []
    return long.run_long(variants, sizes=sizes, say=said.append), said


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_sdpa_passes_and_float64_is_skipped_with_its_reason(monkeypatch):
    _small(monkeypatch)
    sdpa = [targets.Variant(targets.get("sdpa"), d) for d in ("float64", "float32")]
    results, said = _lines(sdpa)
    assert {r.finding.status for r in results} == {"ok"}, [r.finding.detail for r in results]
    assert len(results) == 2 * len(long.PATHS) and all(r.rows == 3 * 32 for r in results)
    assert any("sdpa[float64] skipped" in line and "arb" in line for line in said)
    assert any("ETA" in line for line in said)
    assert any("naive baseline" in line and "n²" in line for line in said)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_keys_past_the_middle_ignored_fail_on_a_strip(monkeypatch):
    import torch
    import torch.nn.functional as F

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        half = k.shape[-2] // 2 + 8  # keys past n/2 + 8 are never read
        if is_causal:
            attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        mask = None if attn_mask is None else attn_mask[..., :half]
        return F.scaled_dot_product_attention(
            q, k[..., :half, :], v[..., :half, :], attn_mask=mask, scale=scale
        )

    _small(monkeypatch)
    claim = targets.Claim.parse("scores=fp32,stats=fp32,acc=fp32")
    target = targets.from_callable(attention, convention="sdpa", claim=claim)
    results, said = _lines([targets.Variant(target, "float32")], sizes=(160,))
    assert [r.finding.status for r in results] == ["fail", "fail"], said
    assert all("query rows" in r.finding.detail for r in results)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_case_beyond_the_memory_is_skipped_saying_how_much(monkeypatch):
    _small(monkeypatch)
    monkeypatch.setattr(long, "available_bytes", lambda: need + 1)
    need = long.needed_bytes(160, "causal-square", "float32")
    results, said = _lines([targets.Variant(targets.get("sdpa"), "float32")], sizes=(160,))
    skipped = [r for r in results if r.finding.status == "skip"]
    assert [r.path for r in skipped] == ["padding"], said  # its n × n table does not fit
    assert "GiB" in skipped[0].finding.detail and "needs" in skipped[0].finding.detail


def test_the_strips_cover_first_middle_last_and_merge():
    assert long.strips(10_000)[0] == (0, long.STRIP) and long.strips(10_000)[-1][1] == 10_000
    assert long.strips(long.STRIP) == [(0, long.STRIP)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gradients_are_judged_at_the_gradient_length_only(monkeypatch):
    from tests.check import kernels

    _small(monkeypatch)
    monkeypatch.setattr(long, "GRADIENT_N", 96)
    claim = targets.Claim.parse(kernels.CLAIM)
    for bug, statuses in ((None, ["ok"] * 4), ("dq-scale-in-backward", ["fail"] * 2 + ["ok"] * 2)):
        target = targets.from_callable(kernels.sdpa(bug), convention="sdpa", claim=claim)
        results, said = _lines([targets.Variant(target, "float32")], sizes=(96, 160))
        assert [r.finding.status for r in results] == statuses, said
        at_96 = [line for line in said if "n=96" in line and "ETA" not in line]
        if bug is None:
            assert all("dQ, dK, dV on every row" in line for line in at_96), at_96
        else:
            assert all("dq" in r.finding.detail for r in results[:2]), said
