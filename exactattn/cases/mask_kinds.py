"""The mask kinds, one table: all that is known of a kind is its entry in :data:`MASK_KINDS`.

A mask spec (:mod:`.spec`) is ``{"kind": K, ...}``; its entry (a :class:`MaskKind`) says

* ``allowed``: its allowed set from the definition (a function of :mod:`.spec`, which never
  calls the library: the reference cannot inherit a bug of the code it judges);
* ``library``: the library's :class:`~exactattn.core.masks.Mask` for it (None: every pair);
* ``describe``: one line for counterexamples; ``fill``: a template's random parts drawn
  (padding lengths, a dense table, document ids); ``lift``: the spec for inputs whose
  leading dims are lifted to ``(B, H)`` (a dense table follows);
* how the calling conventions lower it: every kind is a boolean mask (its allowed set);
  ``causal`` the alignment of a causal mask (SDPA's ``is_causal``, xformers' triangular
  masks), ``window`` flash-attn's ``window_size`` as ``(left, right, align)``, ``key_lengths``
  the per-sequence key lengths of a varlen batch or a KV cache, ``query_lengths`` the
  per-sequence query lengths of a ragged batch of queries (JAX's ``query_seq_lengths``),
  ``program`` the user's
  program a FlexAttention target runs as itself. None where the kind is not that: a
  convention that takes masks only in that form skips the case, saying why.

A composition (``and``, ``or``) has ``parts``; ``absorbs``: every pair absorbs it (``or``)
rather than being its identity (``and``). Adding a kind is adding its entry: the case
model, check, difftest and every convention then read it from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core import masks
from . import spec as maskspec

Spec = dict[str, Any]
Window = tuple[int | None, int | None, str | None]  # (left, right, alignment); None: unbounded


@dataclass(frozen=True)
class Lowering:
    """Where a library mask is built: the ``case`` (its batch dims and sizes, its user's
    programs loaded once) and ``like``, a torch tensor whose device the arrays go to (None:
    NumPy arrays)."""

    case: Any
    like: Any = None

    def array(self, values: Any, dtype: str) -> Any:
        arr = np.array(values, dtype=dtype)  # a writable copy (torch shares its memory)
        if self.like is None:
            return arr
        import torch

        return torch.from_numpy(arr).to(self.like.device)

    def table(self, spec: Spec) -> np.ndarray:
        """The spec's allowed set on the case's grid, from its definition."""
        n, case = self.case.sizes, self.case
        return allowed(spec, case.batch, n["n_q"], n["n_k"], mask_mod_table=case.mask_mod_table)


def _as_drawn(template: Spec, rng: np.random.Generator, batch: tuple, n_q: int, n_k: int) -> Spec:
    return dict(template)


def _unchanged(spec: Spec, batch: tuple[int, ...], n_q: int, n_k: int) -> Spec:
    return spec


@dataclass(frozen=True)
class MaskKind:
    """One kind of mask spec (see the module docstring)."""

    name: str
    allowed: Callable[[Spec, maskspec.Strip], np.ndarray]
    library: Callable[[Spec, Lowering], Any]
    describe: Callable[[Spec], str]
    fill: Callable[..., Spec] = _as_drawn  # (template, rng, batch, n_q, n_k) -> spec
    lift: Callable[[Spec, tuple[int, ...], int, int], Spec] = _unchanged
    causal: Callable[[Spec], str] | None = None
    window: Callable[[Spec], Window] | None = None
    key_lengths: Callable[[Spec], Any] | None = None
    query_lengths: Callable[[Spec], Any] | None = None
    program: Callable[[Spec], str] | None = None
    every_pair: bool = False
    parts: bool = False
    absorbs: bool = False


def _align(spec: Spec) -> str:
    if "offsets" in spec:
        return "per sequence"
    return spec.get("align", "top-left")


def _varlen(spec: Spec) -> bool:
    """Whether the spec is per sequence of a varlen batch (:mod:`.spec`: causal / window
    aligned within each sequence by its ``offsets``)."""
    return "offsets" in spec


def _whole(lowering: Callable[[Spec], Any]) -> Callable[[Spec], Any]:
    """A lowering that only a mask over the whole ``n_q × n_k`` grid has (None per sequence:
    only a varlen call expresses that, from the case's lengths)."""
    return lambda spec: None if _varlen(spec) else lowering(spec)


def _per_sequence(build: Callable[[Spec, Any], Any]) -> Callable[[Spec, Any], Any]:
    """The library mask, or per sequence the dense table of its definition."""
    return lambda spec, at: _dense_mask(spec, at) if _varlen(spec) else build(spec, at)


# --- leaves ----------------------------------------------------------------------------------
def _fill_padding(template: Spec, rng: np.random.Generator, batch, n_q: int, n_k: int) -> Spec:
    """One length in ``1..n_k`` per element of the first batch axis."""
    spec = dict(template)
    if "lengths" not in spec:
        spec["lengths"] = np.asarray(rng.integers(1, n_k + 1, size=batch[:1])).tolist()
    return spec


def _fill_query_padding(
    template: Spec, rng: np.random.Generator, batch, n_q: int, n_k: int
) -> Spec:
    """One length in ``0..n_q`` per element of the first batch axis (0: every row padding)."""
    spec = dict(template)
    if "lengths" not in spec:
        spec["lengths"] = np.asarray(rng.integers(0, n_q + 1, size=batch[:1])).tolist()
    return spec


def _fill_dense(template: Spec, rng: np.random.Generator, batch, n_q: int, n_k: int) -> Spec:
    """A random table of ``density``, every row nonempty (``empty_row``: row 0 empty)."""
    spec = dict(template)
    if "allowed" not in spec:
        table = rng.random((*batch, n_q, n_k)) < spec.pop("density", 0.6)
        if spec.pop("empty_row", False):
            table[..., 0, :] = False
        else:
            table[..., rng.integers(0, n_k)] = True  # every row nonempty
        spec["allowed"] = table.tolist()
    return spec


def _fill_documents(template: Spec, rng: np.random.Generator, batch, n_q: int, n_k: int) -> Spec:
    """``docs`` sorted document ids for the queries and for the keys."""
    spec = dict(template)
    if "q_doc" not in spec:
        docs = spec.pop("docs", 2)
        spec["q_doc"] = np.sort(rng.integers(0, docs, size=(*batch[:1], n_q)), axis=-1).tolist()
        spec["k_doc"] = np.sort(rng.integers(0, docs, size=(*batch[:1], n_k)), axis=-1).tolist()
    return spec


def _lift_dense(spec: Spec, batch: tuple[int, ...], n_q: int, n_k: int) -> Spec:
    table = allowed(spec, batch, n_q, n_k)
    return {**spec, "allowed": table.reshape((*maskspec.lift(batch), n_q, n_k)).tolist()}


def _dense_mask(spec: Spec, at: Lowering) -> Any:
    return masks.dense(at.array(at.table(spec), "bool"))


def _document_mask(spec: Spec, at: Lowering) -> Any:
    """A ``mask_mod(b, h, i, j)`` written from the definition (ids per element of the first
    batch axis: the library's ``b`` for ``(B, H)`` inputs, ``h`` for ``(B,)``) for a torch
    call; a mask_mod is evaluated on torch index tensors (FlexAttention's), so a NumPy call
    gets the dense table and checking it imports no torch."""
    if at.like is None:
        return _dense_mask(spec, at)
    q_doc = at.array(spec["q_doc"], "int64")
    k_doc = at.array(spec["k_doc"], "int64")
    per_b = len(at.case.batch) == 2

    def mask_mod(b: Any, h: Any, i: Any, j: Any) -> Any:
        if q_doc.ndim == 1:
            return q_doc[i] == k_doc[j]
        first = b if per_b else h
        return q_doc[first, i] == k_doc[first, j]

    return masks.from_mask_mod(mask_mod)


def _describe_dense(spec: Spec) -> str:
    table = np.asarray(spec["allowed"], dtype=bool)
    return f"dense({table.shape}, {int(table.sum())} allowed)"


# --- compositions ------------------------------------------------------------------------------
def _composed_allowed(combine: Callable[[list[np.ndarray]], np.ndarray]) -> Callable:
    def read(spec: Spec, at: maskspec.Strip) -> np.ndarray:
        return combine([_allowed(part, at) for part in spec["parts"]])

    return read


def _composed_mask(combine: Callable[..., Any]) -> Callable[[Spec, Lowering], Any]:
    def build(spec: Spec, at: Lowering) -> Any:
        parts = [library(part, at) for part in spec["parts"]]
        if of(spec).absorbs and None in parts:  # every pair ("none": None) absorbs an or
            return None
        parts = [part for part in parts if part is not None]  # ... and is the identity of and
        return combine(*parts) if parts else None

    return build


def _describe_parts(spec: Spec) -> str:
    return f"{spec['kind']}({', '.join(describe(part) for part in spec['parts'])})"


def _fill_parts(template: Spec, rng: np.random.Generator, batch, n_q: int, n_k: int) -> Spec:
    parts = [filled(part, rng, batch, n_q, n_k) for part in template["parts"]]
    return {"kind": template["kind"], "parts": parts}


def _lift_parts(spec: Spec, batch: tuple[int, ...], n_q: int, n_k: int) -> Spec:
    return {**spec, "parts": [lifted(part, batch, n_q, n_k) for part in spec["parts"]]}


MASK_KINDS: dict[str, MaskKind] = {
    kind.name: kind
    for kind in (
        MaskKind(
            "none",
            maskspec.every_pair,
            lambda spec, at: None,
            lambda spec: "none",
            window=lambda spec: (None, None, None),
            every_pair=True,
        ),
        MaskKind(
            "causal",
            maskspec.causal,
            _per_sequence(lambda spec, at: masks.causal(_align(spec))),
            lambda spec: f"causal[{_align(spec)}]",
            causal=_whole(_align),
            window=_whole(lambda spec: (None, 0, _align(spec))),
        ),
        MaskKind(
            "window",
            maskspec.window,
            _per_sequence(lambda spec, at: masks.sliding_window(*window(spec))),
            lambda spec: f"window({spec.get('left')}, {spec.get('right')})[{_align(spec)}]",
            window=_whole(lambda spec: (spec.get("left"), spec.get("right"), _align(spec))),
        ),
        MaskKind(
            "padding",
            maskspec.key_padding,
            lambda spec, at: masks.key_padding(at.array(spec["lengths"], "int64")),
            lambda spec: f"padding(lengths={np.asarray(spec['lengths']).tolist()})",
            fill=_fill_padding,
            key_lengths=lambda spec: spec["lengths"],
        ),
        MaskKind(
            "query_padding",
            maskspec.query_padding,
            _dense_mask,
            lambda spec: f"query_padding(lengths={np.asarray(spec['lengths']).tolist()})",
            fill=_fill_query_padding,
            query_lengths=lambda spec: spec["lengths"],
        ),
        MaskKind(
            "dense",
            maskspec.dense,
            _dense_mask,
            _describe_dense,
            fill=_fill_dense,
            lift=_lift_dense,
        ),
        MaskKind(
            "document",
            maskspec.documents,
            _document_mask,
            lambda spec: f"document(q_doc={np.asarray(spec['q_doc']).tolist()}, k_doc=…)",
            fill=_fill_documents,
        ),
        MaskKind(
            "mask_mod",
            maskspec.program,
            lambda spec, at: masks.from_mask_mod(at.case.mask_mod(spec["fn"])),
            lambda spec: f"mask_mod {spec['fn']}",
            program=lambda spec: spec["fn"],
        ),
        MaskKind(
            "and",
            _composed_allowed(maskspec.conjunction),
            _composed_mask(masks.and_masks),
            _describe_parts,
            fill=_fill_parts,
            lift=_lift_parts,
            parts=True,
        ),
        MaskKind(
            "or",
            _composed_allowed(maskspec.disjunction),
            _composed_mask(masks.or_masks),
            _describe_parts,
            fill=_fill_parts,
            lift=_lift_parts,
            parts=True,
            absorbs=True,
        ),
    )
}


# --- reading a spec through the table ------------------------------------------------------------
def of(spec: Spec) -> MaskKind:
    """The entry of the spec's kind; a ValueError naming the kinds for an unknown one."""
    kind = spec["kind"]
    if kind not in MASK_KINDS:
        raise ValueError(f"unknown mask kind {kind!r}; use one of {tuple(MASK_KINDS)}")
    return MASK_KINDS[kind]


def allowed(
    spec: Spec,
    batch: tuple[int, ...],
    n_q: int,
    n_k: int,
    rows: maskspec.Rows | None = None,
    mask_mod_table: Callable[[str], np.ndarray] | None = None,
) -> np.ndarray:
    """The allowed set ``A`` as a dense boolean array of shape ``(*batch, n_q, n_k)``, from
    the definitions (:mod:`.spec`); with ``rows = (start, stop)`` only that strip of query
    rows, ``(*batch, stop − start, n_k)``. ``mask_mod_table(reference)``: a user's mask_mod
    on the whole grid (default: tabulated on each call,
    :func:`exactattn.cases.spec.mask_mod_table`)."""
    start, stop = (0, n_q) if rows is None else rows
    if mask_mod_table is None:

        def mask_mod_table(reference: str) -> np.ndarray:
            return maskspec.mask_mod_table(reference, batch, n_q, n_k)

    at = maskspec.Strip(batch, n_q, n_k, start, stop, mask_mod_table)
    return np.broadcast_to(_allowed(spec, at), (*batch, stop - start, n_k))


def _allowed(spec: Spec, at: maskspec.Strip) -> np.ndarray:
    return of(spec).allowed(spec, at)


def library(spec: Spec, at: Lowering) -> Any:
    """The library's mask for the spec (None: every pair)."""
    return of(spec).library(spec, at)


def filled(
    template: Spec, rng: np.random.Generator, batch: tuple[int, ...], n_q: int, n_k: int
) -> Spec:
    """The template with its random parts drawn from ``rng`` (see
    :class:`~exactattn.cases.Draw`)."""
    return of(template).fill(template, rng, batch, n_q, n_k)


def lifted(spec: Spec, batch: tuple[int, ...], n_q: int, n_k: int) -> Spec:
    """The spec for inputs whose leading dims ``batch`` are lifted to ``(B, H)``."""
    return of(spec).lift(spec, batch, n_q, n_k)


def describe(spec: Spec) -> str:
    """A one-line human description, e.g. ``and(causal[bottom-right], window(2, 0))``."""
    return of(spec).describe(spec)


def leaves(spec: Spec) -> list[Spec]:
    """The leaf specs of a (possibly composed) mask, left to right."""
    if of(spec).parts:
        return [leaf for part in spec["parts"] for leaf in leaves(part)]
    return [spec]


def kinds_named(spec: Spec) -> set[str]:
    """The kinds a target's ``masks`` capability is matched against: the spec's own and its
    leaves'."""
    return {leaf["kind"] for leaf in leaves(spec)} | {spec["kind"]}


def simplified(spec: Spec) -> Spec:
    """The same allowed set with the composition written shortest: every pair (``none``) is
    the identity of ``and`` and absorbs an ``or``, a nested ``and`` in an ``and`` (``or`` in
    ``or``) is flattened, repeated parts kept once, a single part stands alone
    (``and(and(none, none), and(none, none))`` is ``none``)."""
    kind = of(spec)
    if not kind.parts:
        return spec
    parts: list[Spec] = []
    for part in (simplified(p) for p in spec["parts"]):
        for leaf in part["parts"] if part["kind"] == kind.name else [part]:
            if leaf not in parts:
                parts.append(leaf)
    if any(of(p).every_pair for p in parts):
        if kind.absorbs:
            return {"kind": "none"}
        parts = [p for p in parts if not of(p).every_pair]
    if not parts:
        return {"kind": "none"}
    return parts[0] if len(parts) == 1 else {"kind": kind.name, "parts": parts}


def conjuncts(spec: Spec) -> list[Spec]:
    """The parts whose intersection the mask is: an ``and``'s parts, else the mask itself."""
    kind = of(spec)
    return spec["parts"] if kind.parts and not kind.absorbs else [spec]


def causal_alignment(spec: Spec) -> str | None:
    """The alignment of a causal mask (None: the mask is no causal kind)."""
    kind = of(spec)
    return None if kind.causal is None else kind.causal(spec)


def window(spec: Spec) -> Window | None:
    """The mask as flash-attn's window ``(left, right, align)`` (None: it is no window)."""
    kind = of(spec)
    return None if kind.window is None else kind.window(spec)


def key_lengths(spec: Spec) -> Any:
    """The mask as one key length per sequence (None: it is no key padding)."""
    kind = of(spec)
    return None if kind.key_lengths is None else kind.key_lengths(spec)


def query_lengths(spec: Spec) -> Any:
    """The mask as one query length per sequence (None: it is no query padding)."""
    kind = of(spec)
    return None if kind.query_lengths is None else kind.query_lengths(spec)


def conjunct_query_lengths(spec: Spec) -> Any:
    """The query lengths of the mask's ``query_padding`` conjunct (None: it has none): a
    varlen batch's (:func:`per_sequence`) or a ragged batch's query lengths, read from the
    mask, which is where they live."""
    found = [query_lengths(part) for part in conjuncts(spec) if query_lengths(part) is not None]
    return found[0] if found else None


VARLEN_KINDS = ("causal", "window")  # aligned within each sequence in a varlen batch


def varlen(template: Spec, per_sequence: bool = False) -> bool:
    """Whether a varlen batch expresses the kind: every pair, key lengths, or with
    ``per_sequence`` (a convention that passes each sequence's query rows, ``cu_seqlens_q``)
    a causal / window mask aligned bottom-right within each sequence
    (:func:`per_sequence`)."""
    kind = of(template)
    aligned = per_sequence and kind.name in VARLEN_KINDS
    return kind.every_pair or kind.key_lengths is not None or aligned


def per_sequence(template: Spec, q_lengths: list[int], k_lengths: list[int], n_q: int) -> Spec:
    """The mask of a varlen batch of sequences with ``q_lengths`` queries and ``k_lengths``
    keys: key padding ``j < ℓ^k_b``, the ``query_padding`` kind ``i < ℓ^q_b`` (its rows have
    no allowed key: ``Y = 0``, ``dQ = 0``; left out when every sequence has ``n_q``) and the
    template's causal / window leaf aligned bottom-right within each sequence (``"offsets"``
    ``o_b = ℓ^k_b − ℓ^q_b``, :mod:`.spec`). The lengths live in the two padding parts only
    (:func:`conjunct_query_lengths` reads the query lengths back); the leaf holds the
    offsets, which the lengths determine."""
    parts: list[Spec] = [{"kind": "padding", "lengths": list(k_lengths)}]
    if any(length != n_q for length in q_lengths):
        parts.append({"kind": "query_padding", "lengths": list(q_lengths)})
    if template["kind"] in VARLEN_KINDS:
        leaf = {key: value for key, value in template.items() if key != "align"}
        leaf["offsets"] = [lk - lq for lq, lk in zip(q_lengths, k_lengths, strict=True)]
        parts.append(leaf)
    return parts[0] if len(parts) == 1 else {"kind": "and", "parts": parts}


def program(spec: Spec) -> str | None:
    """The user's program (``module:function``) the mask is (None: it is none)."""
    kind = of(spec)
    return None if kind.program is None else kind.program(spec)


def programs(spec: Spec) -> list[str]:
    """The user's programs among the mask's leaves."""
    return [ref for leaf in leaves(spec) if (ref := program(leaf)) is not None]
