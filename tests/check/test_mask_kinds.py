"""The table of mask kinds: every drawn kind has its entry, and an entry alone makes a kind.

:data:`exactattn.cases.mask_kinds.MASK_KINDS` is the one place a mask kind is known: its
definition, its library mask, how the conventions lower it. These tests hold that every kind
the case strategies draw is in it, that a toy kind registered there and nowhere else is
drawn, described, judged and skipped with the convention's reason (and a wrong library mask
for it fails the check), and that the definitions never import the library they judge.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pickle
import warnings

import numpy as np

from exactattn import targets
from exactattn.cases import Draw, build_case, mask_kinds, paths, spec, strategies
from exactattn.core import masks
from exactattn.infra import loading
from exactattn.testing.case_check import check_case
from exactattn.testing.search import draw
from tests.optional import requires

PROGRAM = "tests/check/program_mods.py:document_mask"


def _kinds(template: dict) -> set[str]:
    """Every kind a spec names, compositions nested at any depth included."""
    return {template["kind"]}.union(*(_kinds(part) for part in template.get("parts", ())))


def test_the_table_covers_every_kind_the_strategies_draw():
    drawn = [
        *draw(paths.check_draws(max_n=64, modify=True, interface=True), 300, 0),
        *draw(strategies.draws(), 300, 0),
        *draw(strategies.draws(program=(PROGRAM, None)), 20, 0),
    ]
    kinds = set().union(*(_kinds(d.mask) for d in drawn))
    assert kinds <= set(mask_kinds.MASK_KINDS), sorted(kinds - set(mask_kinds.MASK_KINDS))
    assert {"none", "causal", "window", "padding", "dense", "document", "mask_mod"} <= kinds
    assert {"and", "or"} <= kinds


def _stripes(spec_: dict, at: spec.Strip) -> np.ndarray:
    """The toy kind's definition: the keys ``j ≡ 0 (mod period)`` (key 0 in every row)."""
    return np.broadcast_to(at.j % spec_["period"] == 0, (at.rows, at.n_k))


def _register(monkeypatch, library) -> None:
    kind = mask_kinds.MaskKind(
        "stripes", _stripes, library, lambda spec_: f"stripes({spec_['period']})"
    )
    monkeypatch.setitem(mask_kinds.MASK_KINDS, "stripes", kind)


def _judged(case, variant) -> tuple[str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        (finding,) = check_case(case, [variant])
    return finding.status, finding.detail


def test_a_kind_in_the_table_alone_reaches_check(monkeypatch):
    """Registered in the table and nowhere else, a kind is filled, described, read by the
    reference, lowered by exactattn's own convention (its library mask) and by SDPA's (its
    allowed set as a boolean mask), and skipped by flash-attn's with its reason; a library
    mask that is not the definition fails the check."""
    requires("torch")
    from exactattn.layouts import flash_attn as fa

    _register(monkeypatch, lambda spec_, at: masks.dense(at.array(at.table(spec_), "bool")))
    template = {"kind": "stripes", "period": 3}
    case = build_case(Draw((2, 2), 5, 11, 4, 3, 4, mask=template, data_seed=1, dtype="float32"))
    assert case.mask == template and case.masked and "mask stripes(3)" in case.describe()
    assert case.allowed()[..., ::3].all() and not case.allowed()[..., 1::3].any()
    assert _judged(case, targets.variant("np-fp32"))[0] == "ok"
    assert _judged(case, targets.variant("sdpa", dtype="float32"))[0] == "ok"
    flash = targets.Variant(
        targets.from_callable(fa.flash_attn_func, convention="flash"), "float32"
    )
    assert _judged(case, flash) == (
        "skip",
        "the flash convention expresses causal / sliding-window masks only",
    )

    _register(monkeypatch, lambda spec_, at: masks.causal())  # not the kind's allowed set
    assert _judged(case, targets.variant("np-fp32"))[0] == "fail"


def _library_imports(source: str) -> list[str]:
    """The imports of :mod:`exactattn.core.masks` or :mod:`exactattn.core.dropout` in
    ``source`` (relative ones included, lazy ones too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = {alias.name for alias in node.names}
            if module.endswith("core") and names & {"masks", "dropout"}:
                found.append(f"from {module} import {sorted(names)}")
            elif module.endswith(("core.masks", "core.dropout")):
                found.append(f"from {module}")
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.endswith(("masks", "dropout"))]
    return found


def test_the_definitions_never_import_the_library():
    assert _library_imports(inspect.getsource(spec)) == []
    assert _library_imports("def f():\n    from ..core import masks\n") != []  # it can fail


def test_a_case_loads_and_tabulates_its_mask_mod_once(monkeypatch):
    """However often its allowed set and library mask are read, and in the copies a run makes
    (another dtype, another block size), a case loads a user's mask_mod once and tabulates it
    once per grid; a pickled case arrives without its memo and computes the same table."""
    requires("torch")
    counts = {"load": 0, "tabulate": 0}
    load, tabulated = loading.load_callable, spec.tabulated

    def counted(name, fn):
        def call(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(loading, "load_callable", counted("load", load))
    monkeypatch.setattr(spec, "tabulated", counted("tabulate", tabulated))
    mask = {"kind": "and", "parts": [{"kind": "mask_mod", "fn": PROGRAM}, {"kind": "window"}]}
    case = build_case(Draw((1, 2), 6, 9, 2, 2, 3, mask=mask, dtype="float32"))
    table = case.allowed()
    for copy in (case, dataclasses.replace(case, dtype="float16", block_size=2)):
        for _ in range(3):
            assert np.array_equal(copy.allowed(), table)
            assert np.array_equal(copy.allowed_rows(2, 5), table[..., 2:5, :])
            copy.mask_object()
    assert counts == {"load": 1, "tabulate": 1}
    fewer = dataclasses.replace(case, q=case.q[..., :4, :], g=case.g[..., :4, :])
    assert np.array_equal(fewer.allowed(), mask_kinds.allowed(mask, (1, 2), 4, 9))
    assert counts == {"load": 2, "tabulate": 3}  # its grid once more; and without a case
    again = pickle.loads(pickle.dumps(case))
    assert not again.programs.tables and np.array_equal(again.allowed(), table)
