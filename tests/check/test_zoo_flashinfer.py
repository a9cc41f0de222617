"""FlashInfer's targets on the CPU, through a stand-in library (``fake_flashinfer``).

* without flashinfer (or without CUDA) each target is unavailable with the reason, and
  ``exactattn check flashinfer-prefill`` says so rather than crashing;
* with the correct stand-in as ``flashinfer`` and the target moved to the CPU, a short check
  of each passes and judges enough cases;
* each broken stand-in fails the check of the target it breaks: causal aligned top-left, the
  lse in base e, decode leaving out the newest key, a page read one on, merge_state's lse
  read as natural.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import pytest

from exactattn import targets
from exactattn.commands.check import main
from exactattn.testing import session
from tests.optional import requires

requires("torch")

from . import fake_flashinfer

NAMES = ("flashinfer-prefill", "flashinfer-decode", "flashinfer-paged", "flashinfer-merge")
SHORT = session.Settings(
    examples=24, max_n=12, max_d=8, budget=1 << 9, determinism=False, baselines=False,
    probes=False,
)  # fmt: skip
BROKEN = [
    ("flashinfer-prefill", "top-left"),
    ("flashinfer-prefill", "lse-base-e"),
    ("flashinfer-decode", "decode-short"),
    ("flashinfer-paged", "page-off-by-one"),
    ("flashinfer-merge", "merge-base-e"),
]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _on_cpu(name: str) -> targets.Target:
    """The registered target, moved to the CPU (the stand-in runs there)."""
    target = targets.get(name)
    caps = dataclasses.replace(target.caps, devices=("cpu",))
    return dataclasses.replace(target, needs_cuda=False, caps=caps)


def _failures(name: str, flaw: str | None, monkeypatch, settings=SHORT) -> list[str]:
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.make(flaw))
    result = session.run([_on_cpu(name)], settings)
    assert result.variants and not result.unavailable, result.unavailable
    judged = sum(c["ok"] + c["fail"] for c in result.report.counts.values())
    # the rest are skips with their reasons: masks FlashInfer cannot express, empty rows, v ≠ d
    assert judged >= settings.examples // 5, result.report.counts
    return [text for _, text in result.report.failures]


@pytest.mark.parametrize("name", NAMES)
def test_without_the_package_each_target_is_unavailable_naming_it(name):
    if importlib.util.find_spec("flashinfer") is not None:
        pytest.skip("flashinfer is installed here")
    assert targets.unavailable(targets.get(name)) == "flashinfer is not installed"
    assert targets.unavailable(targets.get(name), quick=True) == "flashinfer is not installed"


@pytest.mark.parametrize("name", NAMES)
def test_with_the_package_but_no_cuda_each_target_is_unavailable(name, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.make())
    why = targets.unavailable(targets.get(name))
    assert why is not None and "CUDA" in why


def test_check_reports_the_target_unavailable(capsys):
    code = main(["flashinfer-prefill", "--profile", "smoke"])
    out = capsys.readouterr()
    assert "flashinfer-prefill" in out.out + out.err
    assert "not installed" in out.out + out.err or "CUDA" in out.out + out.err
    assert code != 0 or "unavailable" in (out.out + out.err).lower()


@pytest.mark.parametrize("name", NAMES)
def test_the_correct_stand_in_passes(name, monkeypatch):
    assert _failures(name, None, monkeypatch) == []


@pytest.mark.parametrize("name, flaw", BROKEN, ids=[flaw for _, flaw in BROKEN])
def test_each_broken_stand_in_fails(name, flaw, monkeypatch):
    settings = dataclasses.replace(SHORT, examples=40)
    assert _failures(name, flaw, monkeypatch, settings), f"{flaw}: {fake_flashinfer.FLAWS[flaw]}"


def test_prefill_is_called_per_request_with_its_own_query_length(monkeypatch):
    """A ragged batch reaches FlashInfer's prefill as each request's real rows (its padded
    rows are no call's, so they need no stated empty-row result), and is judged."""
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.make(None))
    settings = dataclasses.replace(SHORT, examples=60)
    result = session.run([_on_cpu("flashinfer-prefill")], settings)
    covered = set().union(*(c.keys() for c in result.report.coverage.values()))
    assert {"iface zero-length q seq", "iface varlen causal"} <= covered, covered
    assert not result.report.failures
