"""The interface fields of the case model: drawn where kernels break, read by the conventions.

``seqlens``, ``splits``, ``pages`` and ``sinks`` (:mod:`exactattn.cases.interface_fields`): the
check's strategy draws them only for interface conventions and last (the other draws keep
their seeds); a block table from its definition; shared pages hold equal keys; the
conventions read the fields and the certified reference judges them (zero-length
sequences, empty splits, shared pages, sinks above the row's lse).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from exactattn.cases import Case, Draw, build_case, interface_fields, mask_kinds, paths
from exactattn.testing.search import seed_only
from tests.optional import requires


def _draws(n: int, **keywords) -> list[Draw]:
    out: list[Draw] = []

    @settings(max_examples=n, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(paths.check_draws(max_n=12, dtypes=("float32",), modify=True, **keywords))
    def collect(draw):
        out.append(draw)

    with seed_only():  # the draws depend on the seed alone, not on what was imported
        collect()
    return out


def test_the_fields_are_drawn_only_for_interface_conventions():
    assert all(d.splits is d.pages is d.seqlens is d.sinks is None for d in _draws(30))
    assert all(d.splits is not None and d.pages is not None for d in _draws(30, interface=True))


def test_the_shares_aim_where_kernels_break():
    drawn = _draws(300, interface=True)
    seen = Counter(key for d in drawn for key in interface_fields.coverage(build_case(d)))
    sizes = Counter(d.pages["size"] for d in drawn)
    share = {key: seen[key] / len(drawn) for key in seen}
    assert share["zero-length seq"] >= 0.03
    assert share["empty split"] >= 0.03 and share["split at block edge"] >= 0.1
    assert share["shared pages"] >= 0.03 and share["sink above lse"] >= 0.1
    assert sizes[1] / len(drawn) >= 0.05
    assert sum(n for size, n in sizes.items() if size & (size - 1)) / len(drawn) >= 0.2
    assert max(len(d.splits) - 1 for d in drawn) >= 6 and min(len(d.splits) for d in drawn) >= 3


def test_a_block_table_from_its_definition():
    pages = interface_fields.fill_pages(3, shared=2, order=7, B=3, n_k=10)
    table = np.asarray(pages["table"])
    assert table.shape == (3, 4)  # ceil(10 / 3) pages per sequence
    assert (table[1:, :2] == table[0, :2]).all()  # the shared prefix is sequence 0's pages
    own = table[:, 2:].reshape(-1).tolist() + table[0, :2].tolist()
    assert len(set(own)) == len(own)  # every other page is one sequence's alone
    assert pages["pool"] == len(own) + 1 and max(own) < pages["pool"]  # one spare page


def test_pages_have_one_schema_drawn_built_and_derived():
    """A drawn paged cache is the case's (``size, pool, table, shared``), and so is the one a
    case without pages gets from its keys (page sizes of the one drawn distribution)."""
    from exactattn.targets.interface_conventions import InterfaceDraw

    schema = {"size", "pool", "table", "shared"}
    drawn = _draws(30, interface=True)
    assert all(set(d.pages) == schema and build_case(d).pages == d.pages for d in drawn)
    case = dataclasses.replace(build_case(drawn[0]), pages=None)
    derived = InterfaceDraw.pages(case, B=case.batch[0] if case.batch else 1)
    assert set(derived) == schema
    sizes = {s for s in interface_fields.PAGE_SIZES if isinstance(s, int)}
    assert derived["size"] in sizes | {case.block_size, case.sizes["n_k"]}


def test_shared_pages_hold_equal_keys_and_the_case_replays():
    draw = Draw(batch=(3, 2), n_q=4, n_k=10, d=4, v=3, block_size=4, data_seed=5,
                pages=interface_fields.fill_pages(3, 2, 1, B=3, n_k=10), splits=(0, 4, 4, 10),
                seqlens=(0, 10, 5), sinks=(2.0, -20.0))  # fmt: skip
    case = build_case(draw)
    for x in (case.k, case.v):
        assert (x[1:, :, :6] == x[:1, :, :6]).all() and not (x[1:, :, 6:] == x[:1, :, 6:]).all()
    assert case.mask == {"kind": "padding", "lengths": [0, 10, 5]}
    assert case.empty_rows == "zero"  # the zero-length sequence's rows have no key
    again = Case.from_json(case.to_json())
    for name in ("seqlens", "splits", "pages", "sinks"):
        assert getattr(again, name) == getattr(case, name)
    old = Case.from_json(dataclasses.replace(case, seqlens=None, splits=None, pages=None,
                                             sinks=None).to_json())  # fmt: skip
    assert old.pages is None and old.sinks is None
    assert "pages of 3" in case.describe() and "splits [0, 4, 4, 10]" in case.describe()


def _judged(fn, convention, case, supports):
    from exactattn import targets
    from exactattn.testing.case_check import check_case

    target = targets.from_callable(
        fn, convention=convention,
        claim=targets.Claim.parse("scores=fp32,stats=fp32,acc=fp32"),
        supports=targets.Capabilities.parse(supports, targets.user_capabilities(convention)),
    )  # fmt: skip
    variant = targets.Variant(target, "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        (finding,) = check_case(case, [variant])
    return finding


FLASH = "masks=none+causal+window+padding+and,dropout=no,lse=yes,empty_rows=yes"
MERGE = "dropout=no,lse=yes,empty_rows=yes"


def _field_case(**fields) -> Case:
    draw = Draw(batch=(3, 2), n_q=5, n_k=10, d=4, v=3, block_size=4, data_seed=3,
                dtype="float32", **fields)  # fmt: skip
    return build_case(draw)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_conventions_read_the_fields_and_broken_copies_are_caught():
    requires("torch")
    import exactattn.torch as et
    from exactattn.layouts import flash_attn as fa

    from . import broken_interfaces as broken

    case = _field_case(pages=interface_fields.fill_pages(3, 2, 1, B=3, n_k=10),
                       splits=(0, 4, 4, 7, 10), seqlens=(6, 10, 0), sinks=(2.0, 1.0))  # fmt: skip
    runs = [
        (fa.flash_attn_with_kvcache, broken.kvcache_wrong_page, "flash-kvcache", FLASH),
        (fa.flash_attn_varlen_func, broken.varlen_wrong_offset, "flash-varlen", FLASH),
        (fa.flash_attn_combine, broken.combine_without_max, "fa4-combine", MERGE),
        (et.attention_with_lse, broken.sink_in_numerator, "exactattn-sinks", MERGE),
    ]
    for correct, wrong, convention, supports in runs:
        assert _judged(correct, convention, case, supports).status == "ok", convention
        assert _judged(wrong, convention, case, supports).status == "fail", convention


def test_the_sink_convention_judges_large_scores():
    """Every sink value is judged: scores of ±30 and a sink above the row's lse (no skip)."""
    requires("torch")
    import exactattn.torch as et

    from . import broken_interfaces as broken

    case = _field_case(sinks=(2.0, -0.5))
    case.q *= 30 / np.abs(case.q).max()
    assert _judged(et.attention_with_lse, "exactattn-sinks", case, MERGE).status == "ok"
    assert _judged(broken.sink_in_numerator, "exactattn-sinks", case, MERGE).status == "fail"


@pytest.mark.slow  # several seconds: the default run stays within its budget
def test_a_varlen_batchs_query_lengths_live_in_its_query_padding_alone():
    """The drawn ``q_seqlens`` become the mask's ``query_padding`` (the kind JAX's ragged
    batches use) and the causal / window leaf's offsets ``ℓ^k_b − ℓ^q_b``; the case keeps no
    second copy: :attr:`Case.q_seqlens` reads the mask, through a JSON round trip too."""
    drawn = [d for d in _draws(200, interface=True, ragged=True) if d.q_seqlens is not None]
    assert drawn
    for d in drawn:
        case = build_case(d)
        assert "q_seqlens" not in {f.name for f in dataclasses.fields(Case)}
        parts = mask_kinds.conjuncts(case.mask)
        padded = [p["lengths"] for p in parts if p["kind"] == "query_padding"]
        assert padded in ([list(d.q_seqlens)], []), case.mask
        assert case.q_seqlens == (list(d.q_seqlens) if padded else None)
        for leaf in (p for p in parts if "offsets" in p):
            assert leaf["offsets"] == [k - q for q, k in zip(d.q_seqlens, d.seqlens, strict=True)]
        assert Case.from_json(case.to_json()).q_seqlens == case.q_seqlens


# --- the kvcache field ---------------------------------------------------------------------
def _spec(**changes):
    spec = dict(append="one", few=3, paged=False, leftpad=False, batch_idx=False, slack=0,
                rotary=None, num_splits=0, seed=5)  # fmt: skip
    return spec | changes


def test_a_kvcache_append_fits_every_sequence_and_aims_at_page_boundaries():
    pages = interface_fields.fill_pages(4, 0, 1, 2, 11)
    at = lambda kind: interface_fields.resolve_kvcache(  # noqa: E731
        _spec(append=kind, paged=True), [10, 7], pages, 8
    )["append"]
    assert at("all") == 7 and at("one") == 1  # the shortest sequence bounds every append
    assert (10 - at("page-edge")) % 4 == 0  # sequence 0's appends start a page
    start = 10 - at("cross-page")
    assert start // 4 != 9 // 4  # ... or one key before it: they cross a boundary
    shared = interface_fields.fill_pages(4, 1, 1, 2, 11)
    field = interface_fields.resolve_kvcache(_spec(append="all", paged=True), [10, 7], shared, 8)
    assert field["append"] == 7 - 4  # nothing is appended into the shared prefix page


def test_a_contiguous_kvcache_draws_its_rows_and_left_padding():
    field = interface_fields.resolve_kvcache(
        _spec(leftpad=True, batch_idx=True, slack=3), [5, 2, 6], None, 8
    )
    rows, idx, pad = field["rows"], field["batch_idx"], field["leftpad"]
    assert rows > 3 and len(set(idx)) == 3 and all(0 <= r < rows for r in idx)
    assert field["length"] == max(p + n for p, n in zip(pad, [5, 2, 6])) + 3


def test_rotary_dims_follow_flash_attn_and_need_an_append():
    rotary = {"fraction": 0.5, "interleaved": True}
    resolve = interface_fields.resolve_kvcache
    assert resolve(_spec(rotary=rotary), [4], None, 64)["rotary"]["dim"] == 32
    assert resolve(_spec(rotary=rotary | {"fraction": 0.25}), [4], None, 80)["rotary"]["dim"] == 16
    assert resolve(_spec(rotary=rotary), [4], None, 6)["rotary"]["dim"] == 2  # small heads
    assert resolve(_spec(rotary=rotary, append="none"), [4], None, 64)["rotary"] is None


@pytest.mark.parametrize("interleaved", [True, False])
def test_quarter_turns_rotate_exactly_and_invert(interleaved):
    cos, sin = interface_fields.quarter_turns(3, 9, 3)
    assert set(np.unique(cos)) | set(np.unique(sin)) <= {-1.0, 0.0, 1.0}
    assert np.array_equal(cos**2 + sin**2, np.ones_like(cos))
    x = np.random.default_rng(0).normal(size=(2, 4, 1, 8)).astype(np.float16).astype(float)
    at = np.arange(8).reshape(2, 4)
    turned = interface_fields.rotated(x, cos, sin, at, interleaved, 1)
    assert np.array_equal(interface_fields.rotated(turned, cos, sin, at, interleaved, -1), x)
    assert np.array_equal(turned[..., 6:], x[..., 6:])  # rotary_dim 6 of 8: the rest untouched
    pairs = (
        [(2 * u, 2 * u + 1) for u in range(3)] if interleaved else [(u, u + 3) for u in range(3)]
    )
    for u, (a, b) in enumerate(pairs):  # the definition, entry by entry
        c, s = cos[at][..., u][..., None], sin[at][..., u][..., None]
        assert np.array_equal(turned[..., a], x[..., a] * c - x[..., b] * s)
        assert np.array_equal(turned[..., b], x[..., b] * c + x[..., a] * s)


def test_kvcache_coverage_names_page_crossings_and_rotary():
    field = {"append": 3, "paged": True, "rotary": {"dim": 4, "interleaved": False, "seed": 1},
             "num_splits": 2}  # fmt: skip
    keys = interface_fields.kvcache_coverage(field, [9, 6], page=4, d=8)
    assert {"append 3", "paged cache", "append crosses page", "rotary halves", "rotary partial",
            "num_splits 2"} <= set(keys)  # fmt: skip
    assert "append at page edge" not in keys  # starts 6 and 3: neither on a page's first row
    assert "append at page edge" in interface_fields.kvcache_coverage(field, [7], page=4, d=8)
