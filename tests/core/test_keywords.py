"""The public functions' keywords are declared once (:class:`exactattn.api.Keywords`): every
function's signature and ``help()`` list each one with its default and documentation, a
misspelt one is a TypeError naming it, and ``block_size=None`` has one policy."""

from __future__ import annotations

import inspect
import pydoc
from pathlib import Path

import numpy as np
import pytest

import exactattn as ea
from exactattn import api

FUNCTIONS = (
    ea.attention,
    ea.attention_backward,
    ea.naive_attention,
    ea.naive_attention_backward,
    ea.self_attention,
    ea.self_attention_backward,
)
OWN = {"return_stats", "bias_grad", "grad_lse"}  # a function's own keywords
SHARED = dict(  # what the functions took before the declaration was shared
    block_size=None,
    scale=None,
    mask=None,
    dropout_p=0.0,
    seed=None,
    bias=None,
    softcap=None,
    score_mod=None,
    enable_gqa=False,
    backend=None,
    empty_rows="error",
    check_finite=True,
    sinks=None,
    key_range=None,
)


def _keywords(fn) -> dict:
    parameters = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is p.KEYWORD_ONLY}


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda fn: fn.__name__)
def test_each_signature_lists_every_shared_keyword_with_its_default(fn):
    found = _keywords(fn)
    assert {name: found[name] for name in found.keys() - OWN} == SHARED
    assert list(found)[-len(SHARED) :] == list(SHARED)  # in the declaration's order


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda fn: fn.__name__)
def test_help_lists_every_keyword_with_its_default_and_documentation(fn):
    text = pydoc.render_doc(fn, renderer=pydoc.plaintext)
    hints = inspect.get_annotations(api.Keywords, eval_str=True)
    for name, default in SHARED.items():
        assert f"{name}: " in text.splitlines()[2]  # the signature line
        assert f"\n    {name}={default!r}\n" in text
        assert " ".join(hints[name].__metadata__[0].split()[:4]) in " ".join(text.split())


def test_each_keyword_is_documented_once():
    """In the source once (its declaration), and in no function's own docstring."""
    source = Path(api.__file__).read_text()
    hints = inspect.get_annotations(api.Keywords, eval_str=True)
    for name in SHARED:
        start = hints[name].__metadata__[0][:30]
        assert source.count(start) == 1, name
        assert not any(start in inspect.getdoc(fn.__wrapped__) for fn in FUNCTIONS)


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((3, 2)) for _ in range(3))
    y, stats = ea.attention(q, k, v, return_stats=True)
    return {
        ea.attention: (q, k, v),
        ea.naive_attention: (q, k, v),
        ea.self_attention: (q,),
        ea.attention_backward: (q, k, v, y, stats, y),
        ea.naive_attention_backward: (q, k, v, y, stats, y),
        ea.self_attention_backward: (q, y, stats, y),
    }


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda fn: fn.__name__)
def test_a_misspelt_keyword_is_a_type_error_naming_it(fn, problem):
    message = rf"^{fn.__name__}\(\) got an unexpected keyword argument 'blocksize'$"
    with pytest.raises(TypeError, match=message):
        fn(*problem[fn], blocksize=2)
    with pytest.raises(TypeError, match=rf"^{fn.__name__}\(\) too many positional arguments"):
        fn(*problem[fn], 2)


def test_block_size_none_is_the_default_block_size_for_the_tiled_functions(monkeypatch):
    seen = []
    forward = api.algorithm.forward

    def spy(*args, block_size, **keywords):
        seen.append(block_size)
        return forward(*args, block_size=block_size, **keywords)

    monkeypatch.setattr(api.algorithm, "forward", spy)
    x = np.random.default_rng(1).standard_normal((300, 2))
    ea.self_attention(x)
    ea.attention(x, x, x, block_size=7)
    assert seen == [api.DEFAULT_BLOCK_SIZE, 7] and api.DEFAULT_BLOCK_SIZE == 256


def test_the_naive_functions_check_block_size_and_use_one_block(problem):
    q, k, v = problem[ea.naive_attention]
    assert np.array_equal(ea.naive_attention(q, k, v), ea.naive_attention(q, k, v, block_size=1))
    with pytest.raises(ValueError, match="block_size must be a positive integer; got 0"):
        ea.naive_attention(q, k, v, block_size=0)
