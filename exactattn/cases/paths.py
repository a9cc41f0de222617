"""``exactattn check``'s cases: drawn where kernels are called, sized where they break.

**Calling paths, each with a stated share** (:data:`PATHS`, percent of drawn cases): what
real code passes an SDPA- or flash-convention kernel far more often than anything else —

=================  =====  ============================================================
path               share  the case
=================  =====  ============================================================
``none``            18    no mask, ``n_q = n_k`` or not
``causal-square``   20    ``is_causal`` (top-left), ``n_q = n_k`` (training)
``causal-cross``     8    ``is_causal`` (top-left), ``n_q ≠ n_k``
``decode``          10    ``n_q = 1`` against many keys, no mask or key padding (KV cache)
``bool-mask``       12    one boolean mask: key padding, a dense table, document ids
``bias``             9    a float mask: ALiBi, T5 buckets, a dense bias with ``−∞``; or a
                          soft-cap (only when some target takes them; else ``none``)
``bottom-right``     8    causal aligned bottom-right, ``n_q ≠ n_k`` (flash's ``causal``)
``window``           8    a sliding window in either alignment (flash's ``window_size``)
``exotic``           7    and/or compositions up to depth 2 with any score modification
=================  =====  ============================================================

and, across paths, grouped heads in a quarter of the cases with two or more heads (GQA; MQA
when the group is every head), dropout in a tenth (when some target replays exactattn's
keep-bits), an explicit scale in a seventh (negative ones included). Where some target takes ragged
query batches (``ragged``: JAX's ``query_seq_lengths``), a third of the cases with a batch
axis and no ``seqlens`` pad their queries too: the mask is ``and(mask, query_padding)``
with one query length per sequence drawn as a key length is (:func:`_length`), drawn
last, so that every other draw keeps its seed.

**Sizes aimed at the key-block size** ``b`` a target claims (the ``blocks`` given; without a
claim, :data:`COMMON_BLOCKS`): ``n_k`` is small (≤ 64) in 28% of cases, ``b − 1, b, b + 1``
in 18%, ``k·b ± 1`` (``k = 2..5``) in 22%, ``k·b + r`` (``k = 3..6``, ``0 < r < b``) in 22%
and between ``max_n/2`` and ``max_n`` in 10% (long offsets whatever ``b``), and half the
decode cases (:data:`DECODE_LONG`) have such a long KV cache (``n_q = 1``: cheap; a cap
past 1024 reaches keys past 1024 with no mask in the way) — so at least 15%
of cases have ``n_k > 3b`` and at least 10% ``n_k mod b ≠ 0`` when ``max_n ≥ 4b``; float64
cases stay within :data:`FLOAT64_MAX_N` (their reference is arb); ``n_q`` follows the path
(equal, 1, or a different size). Every size is capped
at ``max_n``; a case whose ``B·H·n_q·n_k`` exceeds ``budget`` keeps ``n_k`` and shrinks
``n_q`` (a square path shrinks both), and large cases (``n_k > 3b`` or beyond ``budget/4``)
have ``B·H ≤ 2`` and ``d, v ≤ 64``. Head dims are the field's (:data:`HEAD_DIMS`, ``v ≠ d``
in a fifth) unless ``max_d`` caps them (a smoke run's small dims).

**Ill-conditioned cases** (where a derived bound reaches the output's certified scale:
little beyond finiteness is checked) are a labelled minority, their note saying so: logits
of 100 to 10⁴ in :data:`ILL_SHARE` percent of cases, and in float16 the tiny values, whose
entries (~10⁻⁶) are subnormal there so that the gradients' products underflow the format
(:data:`INPUTS_FLOAT16`: 2% of float16 cases). The other inputs are normal (63%),
outliers (7%: the dense ones of :mod:`.inputs` up to :data:`DENSE_OUTLIERS_MAX_N` keys,
FlashAttention-3's density of 0.001 beyond, where 5% made every row meet a key with an
outlier in the same coordinate, scores ~100, a one-hot softmax whose gradient no rounding
bound can certify: 2 of a default run's 39 float32 cases), tiny values, logits of 10–20
and small integers. Before these labels and shares a default run (``exactattn check sdpa``,
seeds 0–4) had up to 24% vacuous float16 cases and 5% float32 ones.

The difftest strategies (:mod:`.strategies`) are unchanged: their seeds keep their meaning.
"""

from __future__ import annotations

import zlib
from typing import Any

from hypothesis import strategies as st

from . import mask_kinds
from .case import Draw
from .interface_fields import APPENDS, ROTARY_FRACTIONS, fill_pages, page_size, weighted
from .strategies import masks as compositions
from .strategies import scores

PATHS = {
    "none": 18,
    "causal-square": 20,
    "causal-cross": 8,
    "decode": 10,
    "bool-mask": 12,
    "bias": 9,
    "bottom-right": 8,
    "window": 8,
    "exotic": 7,
}
COMMON_BLOCKS = (16, 32, 64, 128, 256, 512)
HEAD_DIMS = (64, 80, 96, 128, 192, 256)
SIZE_KINDS = {"small": 28, "edge": 18, "multiple": 22, "several": 22, "long": 10}
DECODE_LONG = 50  # percent of decode cases with n_k in [max_n/2, max_n] (a long KV cache)
DENSE_OUTLIERS_MAX_N = 64  # keys: the dense outliers beyond are FA3's density (see above)
ILL_SHARE = 2  # percent of cases with logits of 100 to 1e4 (labelled)
ILL_LOGITS = (100.0, 1e3, 1e4)
LOGITS = (10.0, 20.0)
INPUTS = {"normal": 63, "outliers": 7, "tiny": 10, "logits": 10, "uniform_int": 10}
# float16's normal range ends at 6.1e-5: its tiny cases are ill-conditioned (labelled), rare
INPUTS_FLOAT16 = INPUTS | {"normal": 71, "tiny": 2}
RAGGED_SHARE = 33  # percent of cases (with a batch axis) that pad their queries, when asked
UNDERFLOWS = ("float16", None)  # None: a case run in every dtype (float16 among them)
FLOAT64_MAX_N = 192  # float64 targets need the arb reference: their cases stay this small
LARGE_DIMS = 64
LARGE_HEADS = 2
ILL_LABEL = "ill-conditioned: logits up to {:g} (the bound may be vacuous)"
TINY_LABEL = "ill-conditioned: entries near 1e-6, subnormal in float16 (the gradients underflow)"


def _percent(draw: st.DrawFn, share: int) -> bool:
    """True with probability ``share`` percent (a uniform draw: hypothesis biases its
    ``integers`` and ``sampled_from`` towards their first values)."""
    return _uniform(draw) * 100 < share


def _uniform(draw: st.DrawFn) -> float:
    """A uniform number in ``[0, 1)``: a hash of an integer hypothesis draws (its own numbers
    lean towards simple values), so a seed draws the same case everywhere."""
    x = draw(st.integers(0, 2**64 - 1))
    return (zlib.crc32(x.to_bytes(8, "little")) ^ (x >> 32 & 0xFFFFFFFF)) / 2**32


def _between(draw: st.DrawFn, lo: int, hi: int) -> int:
    """A uniform integer in ``[lo, hi]`` (hypothesis's ``integers`` lean towards ``lo``: a
    long size drew ``max_n/2`` exactly, never past it, in many of a seed's cases)."""
    return min(hi, lo + int(_uniform(draw) * (hi - lo + 1)))


def _weighted(draw: st.DrawFn, table: dict[Any, int]) -> Any:
    """One key of ``table`` with probability proportional to its weight (the first key is
    where hypothesis shrinks to)."""
    return weighted(_uniform(draw), table)


@st.composite
def check_draws(
    draw: st.DrawFn,
    *,
    blocks: tuple[int, ...] = (),
    max_n: int = 2048,
    max_d: int | None = None,
    budget: int = 1 << 17,
    dtypes: tuple[str, ...] | None = None,
    layouts: tuple[str, ...] = ("contiguous",),
    dropout: bool = False,
    modify: bool = False,
    interface: bool = False,
    ragged: bool = False,
    kvcache: bool = False,
) -> Draw:
    """A check case (see the module docstring): ``blocks`` the key-block sizes the targets
    claim, ``max_n`` the size cap, ``budget`` the largest ``B·H·n_q·n_k``, ``max_d`` a cap
    on the head dims (None: the field's), ``dropout`` / ``modify`` whether some target
    replays exactattn's keep-bits / takes a bias or a soft-cap; ``interface``: some target
    is called through an interface convention, so the case also draws the interface fields
    (:func:`interface_fields`, drawn last: the other draws keep their seeds); ``ragged``:
    some target takes per-sequence query lengths, so a share of cases pads its queries
    (see the module docstring; drawn after everything else); ``kvcache``: some target is
    called through a KV-cache decode convention, so the interface fields include how the
    cache holds the keys (:func:`_kvcache`)."""
    dtype = draw(st.sampled_from(dtypes)) if dtypes else None
    cap = min(max_n, FLOAT64_MAX_N) if dtype == "float64" else max_n
    path = _weighted(draw, PATHS)
    if path == "bias" and not modify:
        path = "none"
    b = draw(st.sampled_from(_aimed(blocks, cap)))
    if path == "decode" and _percent(draw, DECODE_LONG):
        n_k = _between(draw, max(1, cap // 2), cap)  # a long KV cache: cheap at n_q = 1
    else:
        n_k = _keys(draw, b, cap)
    n_q = _queries(draw, path, n_k, b, cap)
    large = n_k > 3 * b or n_q * n_k > budget // 4
    batch = draw(st.sampled_from(((1, 1), (1, 2), (2, 1)) if large else _BATCHES))
    heads = batch[-1] if len(batch) == 2 else 1
    n_q, n_k = _within(path, n_q, n_k, batch, budget)
    d, v = _dims(draw, max_d, large)
    mask, score, softcap = _mask_and_score(draw, path, modify)
    group = 1
    if heads > 1 and _percent(draw, 25):
        group = draw(st.sampled_from([g for g in range(2, heads + 1) if heads % g == 0]))
    kind = _weighted(draw, INPUTS_FLOAT16 if dtype in UNDERFLOWS else INPUTS)
    ill = _percent(draw, ILL_SHARE)
    distribution, logit = kind, 0.0
    if kind == "outliers" and n_k > DENSE_OUTLIERS_MAX_N:
        distribution = "fa3-outliers"  # FA3's own density: many keys hold outliers already
    if kind == "logits" or ill:
        distribution = "large_logits"
        logit = draw(st.sampled_from(ILL_LOGITS if ill else LOGITS))
    dropout_p = draw(st.sampled_from((0.1, 0.5))) if dropout and _percent(draw, 10) else 0.0
    explicit_scale = _percent(draw, 14)
    seed = draw(st.integers(0, 2**64 - 1)) if dropout_p else 0
    data_seed = draw(st.integers(0, 2**32 - 1))
    layout = draw(st.sampled_from(layouts))  # the draws above keep their order: seeds replay
    fields = (
        draw(interface_fields(batch, n_q, n_k, b, mask, budget, ragged, kvcache))
        if interface
        else {}
    )
    batch = fields.pop("batch", batch)  # a varlen batch draws its own number of sequences
    if ragged and batch and "seqlens" not in fields and _percent(draw, RAGGED_SHARE):
        lengths = [_length(draw, n_q, b) for _ in range(batch[0])]
        mask = {"kind": "and", "parts": [mask, {"kind": "query_padding", "lengths": lengths}]}
    return Draw(
        batch=batch,
        n_q=n_q,
        n_k=n_k,
        d=d,
        v=v,
        block_size=b,
        distribution=distribution,
        logit=logit,
        explicit_scale=explicit_scale,
        mask=mask,
        dropout_p=dropout_p,
        seed=seed,
        data_seed=data_seed,
        group=group,
        dtype=dtype,
        layout=layout,
        score=score,
        softcap=softcap,
        note=_note(path, ill, logit, distribution, dtype),
        **fields,
    )


def _note(path: str, ill: bool, logit: float, distribution: str, dtype: str | None) -> str:
    """The case's label: its path, or why it is ill-conditioned."""
    if ill:
        return ILL_LABEL.format(logit)
    if distribution == "tiny" and dtype in UNDERFLOWS:
        return TINY_LABEL
    return f"path {path}"


_BATCHES = ((1, 1), (1, 2), (2, 1), (2, 2), (1, 4), (2, 4), (1, 8), (1,), ())


def _aimed(blocks: tuple[int, ...], cap: int) -> tuple[int, ...]:
    """The block sizes to aim at: the claimed ones within reach of ``cap`` (else the common
    ones), each at most ``cap``."""
    within = tuple(sorted({b for b in blocks if 1 <= b <= cap}))
    if within:
        return within
    common = tuple(b for b in COMMON_BLOCKS if b <= cap)
    return common or (max(1, cap // 2),)


def _keys(draw: st.DrawFn, b: int, cap: int) -> int:
    """``n_k`` aimed at block size ``b`` (see the module docstring), at most ``cap`` (a cap
    that is a multiple of ``b`` gives ``cap − 1``: the tail stays partial)."""
    kind = _weighted(draw, SIZE_KINDS)
    if kind == "small":
        n = draw(st.integers(1, min(64, cap)))
    elif kind == "edge":
        n = b + draw(st.sampled_from((-1, 0, 1)))
    elif kind == "multiple":
        n = draw(st.integers(2, 5)) * b + draw(st.sampled_from((-1, 1)))
    elif kind == "several":
        n = draw(st.integers(3, 6)) * b + draw(st.integers(1, max(1, b - 1)))
    else:  # long: up to the cap, whatever the block size (offsets past 1024, 4096 keys)
        n = _between(draw, max(1, cap // 2), cap)
    if n > cap:
        n = cap - 1 if cap % b == 0 and cap > 1 else cap
    return max(1, n)


def _queries(draw: st.DrawFn, path: str, n_k: int, b: int, cap: int) -> int:
    """``n_q`` for the path: equal to ``n_k`` (training), 1 (decode), or different."""
    if path == "decode":
        return 1
    if path == "causal-square":
        return n_k
    if path in ("causal-cross", "bottom-right"):
        other = draw(st.sampled_from(("short", "edge", "long")))
        n = {
            "short": draw(st.integers(1, max(1, min(64, cap)))),
            "edge": b + draw(st.sampled_from((-1, 1))),
            "long": n_k + draw(st.integers(1, max(1, b))),
        }[other]
        n = min(n, cap)
        return n if n != n_k else max(1, n_k - 1) if n_k > 1 else 2
    if draw(st.booleans()):
        return n_k
    return min(cap, draw(st.integers(1, max(1, min(cap, 2 * b)))))


def _within(path: str, n_q: int, n_k: int, batch: tuple[int, ...], budget: int):
    """``(n_q, n_k)`` with ``B·H·n_q·n_k ≤ budget``: ``n_q`` shrinks (a square path shrinks
    both, staying square)."""
    heads = 1
    for x in batch:
        heads *= x
    if heads * n_q * n_k <= budget:
        return n_q, n_k
    if path == "causal-square":
        n = max(1, int((budget / heads) ** 0.5))
        return n, n
    return max(1, budget // (heads * n_k)), n_k


def _dims(draw: st.DrawFn, max_d: int | None, large: bool) -> tuple[int, int]:
    """``(d, v)``: the field's head dims (≤ 64 for large cases), ``v ≠ d`` in a fifth; or
    small ones up to ``max_d``."""
    if max_d is not None:
        return draw(st.integers(1, max_d)), draw(st.integers(1, max_d))
    dims = tuple(x for x in HEAD_DIMS if x <= LARGE_DIMS) if large else HEAD_DIMS
    d = draw(st.sampled_from(dims))
    v = draw(st.sampled_from(dims)) if _percent(draw, 20) else d
    return d, v


def _mask_and_score(draw: st.DrawFn, path: str, modify: bool):
    """The mask template, the score template and the soft-cap of ``path``."""
    none: dict[str, Any] = {"kind": "none"}
    if path == "causal-square" or path == "causal-cross":
        return {"kind": "causal", "align": "top-left"}, none, None
    if path == "bottom-right":
        return {"kind": "causal", "align": "bottom-right"}, none, None
    if path == "window":
        align = draw(st.sampled_from(("bottom-right", "top-left")))
        left = draw(st.sampled_from((None, 0, 1, 16, 127, 256)))
        right = draw(st.sampled_from((0, 0, None, 3)))
        return {"kind": "window", "left": left, "right": right, "align": align}, none, None
    if path == "decode":
        return (none if draw(st.booleans()) else {"kind": "padding"}), none, None
    if path == "bool-mask":
        kind = draw(st.sampled_from(("padding", "dense", "document")))
        if kind == "dense":
            return {"kind": "dense", "density": 0.6, "empty_row": False}, none, None
        if kind == "document":
            return {"kind": "document", "docs": draw(st.integers(1, 3))}, none, None
        return {"kind": "padding"}, none, None
    if path == "bias":
        score, softcap = draw(scores())
        return none, score, softcap
    if path == "exotic":
        score, softcap = draw(scores()) if modify else (none, None)
        return draw(compositions()), score, softcap
    return none, none, None


# --- the interface fields (exactattn.cases.interface_fields), drawn last ----------------------
SPLIT_KINDS = {"block-edges": 30, "empty-part": 20, "single-keys": 15, "random": 35}
SINK_OFFSETS = {-20.0: 10, -2.0: 30, -0.5: 15, 0.0: 15, 1.0: 15, 2.0: 15}
MAX_SPLITS = 8
VARLEN_SHARE = 60  # percent of the cases a varlen call expresses drawn as a varlen batch
MAX_SEQUENCES = 16  # sequences per varlen batch (within the budget)
Q_UNEVEN = 75  # percent of varlen batches with a query length drawn per sequence


@st.composite
def interface_fields(
    draw: st.DrawFn,
    batch: tuple[int, ...],
    n_q: int,
    n_k: int,
    b: int,
    mask: dict[str, Any],
    budget: int = 1 << 17,
    ragged: bool = False,
    kvcache: bool = False,
) -> dict[str, Any]:
    """The interface fields of a :class:`~exactattn.cases.Draw`
    (:mod:`exactattn.cases.interface_fields`), and for a varlen batch its ``batch``.

    A varlen batch is drawn in :data:`VARLEN_SHARE` percent of the cases whose ``mask``
    template a varlen call expresses (every pair, key padding; with ``ragged`` causal and a
    window too, aligned within each sequence: :func:`.mask_kinds.varlen`): 1 to
    :data:`MAX_SEQUENCES` sequences (the batch's first dim redrawn while ``B·H·n_q·n_k``
    stays within a quarter of the ``budget``), each with its own key length (``seqlens``)
    and, where some convention takes query lengths (``ragged``: a varlen call's
    ``cu_seqlens_q``; the others would only skip the padded rows), in :data:`Q_UNEVEN`
    percent of the batches its own query length (``q_seqlens``, which the case turns into
    its mask's ``query_padding``, :func:`.mask_kinds.per_sequence`): zero-length sequences
    on either side and ``ℓ^q_b > ℓ^k_b`` included (:func:`_length`). Without ``ragged`` the
    batch is the case's and the draws come in main's order (splits, pages, then the varlen
    batch's key lengths), so those runs replay the draws they had before per-sequence query
    lengths. With ``kvcache`` a varlen batch's causal / window masks are aligned within each
    sequence too (a decode call aligns them to each cache's length), and the cache's layout
    is drawn last (:func:`_kvcache`)."""
    heads = batch[-1] if len(batch) == 2 else 1
    B = batch[0] if batch else 1
    out: dict[str, Any] = {}
    expressed = bool(batch) and mask_kinds.varlen(mask, ragged or kvcache)
    own_order = ragged or kvcache  # a varlen batch drawn first: its B decides the pages
    varlen = own_order and expressed and _percent(draw, VARLEN_SHARE)
    if varlen:
        most = min(MAX_SEQUENCES, max(B, budget // (4 * heads * n_q * n_k)))
        B = _between(draw, 1, most)
        out["batch"] = (B, *batch[1:])
    out["splits"] = _splits(draw, n_k, b)
    out["pages"] = _pages(draw, B, n_k, b)
    if not own_order:  # main's order
        varlen = expressed and _percent(draw, VARLEN_SHARE)
    if varlen:
        out["seqlens"] = tuple(_length(draw, n_k, b) for _ in range(B))
        if ragged and _percent(draw, Q_UNEVEN):
            out["q_seqlens"] = tuple(_length(draw, n_q, b) for _ in range(B))
    out["sinks"] = tuple(_weighted(draw, SINK_OFFSETS) for _ in range(heads))
    if kvcache:
        out["kvcache"] = _kvcache(draw)
    return out


def _kvcache(draw: st.DrawFn) -> dict[str, Any]:
    """How a KV-cache decode call holds the keys, to be resolved against the case's key
    lengths (:func:`~exactattn.cases.interface_fields.resolve_kvcache`): an append of
    :data:`~exactattn.cases.interface_fields.APPENDS`, a paged cache in half the cases, else
    a contiguous one with left padding and a permuted batch each in half, slack positions
    after the longest sequence, rotary in 60% (interleaved or not, a fraction of the head),
    ``num_splits`` 0 (the heuristic) in half, else 1 to 4."""
    rotary = None
    if _percent(draw, 60):
        fraction = draw(st.sampled_from(ROTARY_FRACTIONS))
        rotary = {"fraction": fraction, "interleaved": draw(st.booleans())}
    return {
        "append": _weighted(draw, APPENDS),
        "few": draw(st.integers(2, 5)),
        "paged": draw(st.booleans()),
        "leftpad": draw(st.booleans()),
        "batch_idx": draw(st.booleans()),
        "slack": draw(st.sampled_from((0, 1, 3))),
        "rotary": rotary,
        "num_splits": 0 if _percent(draw, 50) else draw(st.integers(1, 4)),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def _length(draw: st.DrawFn, n: int, b: int) -> int:
    """A sequence's length of at most ``n`` (its keys out of ``n_k``, or its queries out of
    ``n_q``): 0 (a zero-length sequence) in a fifth, ``n`` in a fifth, ``b − 1, b, b + 1`` in
    a fifth, else uniform."""
    kind = _weighted(draw, {"zero": 20, "full": 20, "edge": 20, "any": 40})
    if kind == "zero":
        return 0
    if kind == "full":
        return n
    if kind == "edge":
        return min(n, max(0, b + draw(st.sampled_from((-1, 0, 1)))))
    return draw(st.integers(0, n))


def _splits(draw: st.DrawFn, n_k: int, b: int) -> tuple[int, ...]:
    """Split-KV boundaries ``(0, …, n_k)``: two parts or more (one part is no merge)."""
    kind = _weighted(draw, SPLIT_KINDS)
    cuts = 1 + int(_uniform(draw) * (MAX_SPLITS - 1))  # inner boundaries: cuts + 1 parts
    edges_at_blocks = list(range(b, n_k, b))
    if kind == "block-edges" and edges_at_blocks:
        inner = draw(
            st.lists(
                st.sampled_from(edges_at_blocks),
                min_size=min(cuts, len(edges_at_blocks)),
                max_size=cuts,
                unique=True,
            )
        )
    elif kind == "empty-part":
        inner = draw(st.lists(st.integers(0, n_k), min_size=cuts, max_size=cuts))
        inner.append(draw(st.sampled_from([0, n_k, *inner])))  # a boundary twice: an empty part
    elif kind == "single-keys":
        inner = list(range(1, min(cuts, n_k) + 1))  # the first parts one key each
    else:
        inner = draw(st.lists(st.integers(0, n_k), min_size=cuts, max_size=cuts))
    return (0, *sorted(inner), n_k)


def _pages(draw: st.DrawFn, B: int, n_k: int, b: int) -> dict[str, Any]:
    """A paged cache: a page size of :data:`~exactattn.cases.interface_fields.PAGE_SIZES`,
    whole pages shared in 40% of batches, the pages in a drawn order."""
    size = page_size(_uniform(draw), b, n_k)
    whole = n_k // size
    shared = 0
    if B > 1 and whole and _percent(draw, 40):
        shared = draw(st.integers(1, whole))
    return fill_pages(size, shared, draw(st.integers(0, 2**32 - 1)), B, n_k)
