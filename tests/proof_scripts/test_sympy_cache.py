"""sympy's cache sized for a proof run (:mod:`exactattn.proofs.engine.sympy_cache`)."""

from __future__ import annotations

import sympy
from sympy.core import cache

from exactattn.proofs import proof_run
from exactattn.proofs.engine import sympy_cache


def test_widen_gives_every_cached_sympy_function_the_proof_size_once():
    sympy_cache.widen()
    sizes = [wrapper.cache_info().maxsize for wrapper in cache.CACHE]
    assert sizes and all(size is None or size >= sympy_cache.MAXSIZE for size in sizes)
    assert sympy_cache.widen() == 0  # already wide: nothing resized again


def test_the_widened_cache_still_memoises_construction():
    sympy_cache.widen()
    x = sympy.Symbol("widened_x", real=True)
    assert (x + 1) is (x + 1)  # the second Add came from the cache


def test_every_proof_task_widens_the_cache_before_it_checks(monkeypatch):
    calls = []
    monkeypatch.setattr(sympy_cache, "widen", lambda: calls.append("widen"))
    source = proof_run.Source("monoid", 1)
    verdict = proof_run.prove(source, 0, proof_run.key_of(proof_run._rebuilt(source)[0]))
    assert calls == ["widen"] and verdict.status == "PROVED"
