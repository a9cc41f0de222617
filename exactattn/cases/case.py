"""One test case: sizes, inputs, keywords; self-contained and JSON round-trippable.

A :class:`Case` holds everything a run needs: the float64 inputs ``q, k, v`` and the
upstream gradient ``G`` (as drawn, before any rounding to a target's dtype), block size
``b``, scale ``c``, the mask as a spec (:mod:`exactattn.cases.spec`), dropout rate and
seed, the empty-row policy, and for ``exactattn check`` the dtype the targets run in and
the memory layout of the inputs; a score modification: the dense additive ``bias`` (float64,
broadcastable to ``(*batch, n_q, n_k)``, ``−∞`` excluding a pair, with the ``score`` spec it
was filled from, :mod:`exactattn.cases.spec`), a ``softcap``, or a user's ``score_mod``
(``module:function``). A failure written with :meth:`Case.to_json` replays on any
machine. :func:`build_case` turns a small description (a :class:`Draw`: sizes, a mask
template, an input distribution, a data seed) into a Case; hypothesis draws and shrinks the
description, not the array entries.

Grouped-query attention: ``k`` and ``v`` may have fewer heads (the last leading axis) than
``q``; query head ``h`` reads key/value head ``h // group``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from ..infra import loading
from . import interface_fields, mask_kinds
from . import spec as maskspec
from .inputs import fill

ARRAYS = ("q", "k", "v", "g", "bias")
# the input distributions a drawn case takes (exactattn.cases.inputs)
CHECK_DISTRIBUTIONS = ("normal", "outliers", "large_logits", "tiny", "uniform_int")
LAYOUTS = ("contiguous", "transposed", "strided")


@dataclass(frozen=True)
class Draw:
    """What hypothesis draws: sizes, keywords, a mask template and how to fill the arrays.

    ``mask`` is a mask spec whose random parts are filled by :func:`build_case` from the
    data seed (each kind's ``fill``, :data:`exactattn.cases.mask_kinds.MASK_KINDS`): a
    ``padding`` leaf without ``lengths`` gets one length in ``1..n_k`` per
    batch element, a ``dense`` leaf without ``allowed`` gets a random table (``density``;
    ``empty_row: true`` empties row 0), a ``document`` leaf without ids gets ``docs``
    sorted document ids for queries and keys.

    ``score`` is a score-modification template filled the same way: ``alibi`` gets its
    slopes (powers of two per head), ``t5`` a random ``(H, buckets)`` table, ``dense`` a
    random table (``shape`` ``full``, ``per_head`` or ``shared``) with a share ``neg_inf``
    of ``−∞`` entries (``empty_row: true``: row 0 all ``−∞``). ``softcap``: the cap.
    ``score_mod``: a user's ``module:function`` every case runs (``exactattn check
    --score-mod``).

    The interface fields (:mod:`exactattn.cases.interface_fields`; None: absent): ``seqlens`` the
    key length of each sequence, ``q_seqlens`` the query length of each (None: ``n_q``
    each); the mask becomes the varlen batch's,
    :func:`exactattn.cases.mask_kinds.per_sequence`: key padding, the ``query_padding``
    kind, causal / window per sequence. The case keeps no ``q_seqlens`` of its own: its
    mask's ``query_padding`` is the one source (:attr:`Case.q_seqlens` reads it back).
    ``splits`` the split-KV
    boundaries, ``pages`` the paged cache ``{"size", "pool", "table", "shared"}`` (drawn
    whole, the case's schema; shared pages make the sequences' first keys equal), ``sinks``
    each query head's sink offset, ``kvcache`` how a KV-cache decode call holds the keys
    (drawn as intents, resolved against the key lengths by :func:`build_case`:
    :func:`exactattn.cases.interface_fields.resolve_kvcache`).
    """

    batch: tuple[int, ...]
    n_q: int
    n_k: int
    d: int
    v: int
    block_size: int
    distribution: str = "normal"
    logit: float = 0.0  # target max |s_ij| for "large_logits" (sets the scale c)
    explicit_scale: bool = False
    mask: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    dropout_p: float = 0.0
    seed: int = 0
    data_seed: int = 0
    group: int = 1  # query heads per key/value head (GQA); divides batch[-1]
    dtype: str | None = None
    layout: str = "contiguous"
    score: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    softcap: float | None = None
    score_mod: str | None = None
    note: str = ""  # what the case is drawn as (a path, "ill-conditioned: ..."): Case.note
    seqlens: tuple[int, ...] | None = None
    q_seqlens: tuple[int, ...] | None = None
    splits: tuple[int, ...] | None = None
    pages: dict[str, Any] | None = None
    sinks: tuple[float, ...] | None = None
    kvcache: dict[str, Any] | None = None  # drawn: resolved by build_case


class Programs:
    """A case's memo of the user's programs: each ``module:function`` loaded once, and its
    table on a grid (:func:`exactattn.cases.spec.tabulated`) computed once per grid.

    The copies :func:`dataclasses.replace` makes of a case (in a target's dtype, at another
    block size, lifted to ``(B, H)``) share it: they are the same problem, and a copy of
    other shapes keys its own tables. A pickled memo arrives empty (a program loaded from a
    file does not pickle; the tables are the receiver's to compute).
    """

    def __init__(self) -> None:
        self.functions: dict[str, Callable[..., Any]] = {}
        self.tables: dict[tuple[str, tuple[int, ...], int, int], np.ndarray] = {}

    def function(self, reference: str) -> Callable[..., Any]:
        if reference not in self.functions:
            self.functions[reference] = loading.load_callable(reference, "--mask-mod")
        return self.functions[reference]

    def table(self, reference: str, batch: tuple[int, ...], n_q: int, n_k: int) -> np.ndarray:
        key = (reference, batch, n_q, n_k)
        if key not in self.tables:
            fn = self.function(reference)
            self.tables[key] = maskspec.tabulated(fn, reference, batch, n_q, n_k)
        return self.tables[key]

    def __getstate__(self) -> dict[str, Any]:
        return {"functions": {}, "tables": {}}


@dataclass
class Case:
    """A replayable case: float64 arrays (nested lists in JSON) and the call's keywords."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    block_size: int
    scale: float | None = None
    mask: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    dropout_p: float = 0.0
    seed: int | None = None
    empty_rows: str = "error"
    note: str = ""
    dtype: str | None = None  # the dtype targets run in (None: each target's own)
    layout: str = "contiguous"
    bias: np.ndarray | None = None  # float64, broadcastable to (*batch, n_q, n_k)
    softcap: float | None = None
    score: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})  # bias's spec
    score_mod: str | None = None  # a user's score_mod(score, b, h, q_idx, kv_idx)
    # the interface fields (exactattn.cases.interface_fields; None: absent)
    seqlens: list[int] | None = None  # key length per sequence (the mask is the varlen batch's)
    splits: list[int] | None = None  # split-KV key boundaries 0 = e_0 <= ... <= e_S = n_k
    pages: dict[str, Any] | None = None  # {"size", "pool", "table", "shared"}
    sinks: list[float] | None = None  # per query head: sigma_h - min_{b,i} lse_{b,h,i}
    kvcache: dict[str, Any] | None = None  # {"append", "paged", "rotary", "num_splits", ...}
    # not part of the problem: never compared, printed or written (see Programs)
    programs: Programs = field(default_factory=Programs, compare=False, repr=False)

    # --- derived --------------------------------------------------------------------
    @property
    def batch(self) -> tuple[int, ...]:
        return tuple(self.q.shape[:-2])

    @property
    def q_seqlens(self) -> list[int] | None:
        """The query length of each sequence: the mask's ``query_padding`` lengths (None: no
        query padding, ``n_q`` each), the one place they are kept."""
        lengths = mask_kinds.conjunct_query_lengths(self.mask)
        return None if lengths is None else np.asarray(lengths).tolist()

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 without GQA)."""
        if self.k.shape[:-2] == self.q.shape[:-2]:
            return 1
        return self.q.shape[-3] // self.k.shape[-3]

    @property
    def sizes(self) -> dict[str, int]:
        return {
            "n_q": self.q.shape[-2],
            "n_k": self.k.shape[-2],
            "d": self.q.shape[-1],
            "v": self.v.shape[-1],
        }

    def c(self) -> float:
        """The scale in float64 (the default ``1/sqrt(d)`` when none is given)."""
        return 1 / math.sqrt(self.q.shape[-1]) if self.scale is None else self.scale

    def allowed(self) -> np.ndarray:
        """The allowed set as a dense ``(*batch, n_q, n_k)`` boolean array, from the spec's
        definition (:func:`exactattn.cases.mask_kinds.allowed`, never through the library)."""
        n = self.sizes
        return mask_kinds.allowed(
            self.mask, self.batch, n["n_q"], n["n_k"], mask_mod_table=self.mask_mod_table
        )

    @property
    def masked(self) -> bool:
        """Whether the mask excludes anything by its kind (``none`` allows every pair)."""
        return not mask_kinds.of(self.mask).every_pair

    def arrays(self) -> dict[str, np.ndarray]:
        """The case's float64 arrays by name: ``q, k, v, g`` and the ``bias`` if it has one."""
        return {name: getattr(self, name) for name in ARRAYS if getattr(self, name) is not None}

    def allowed_rows(self, start: int, stop: int) -> np.ndarray:
        """The allowed set of query rows ``start:stop``, ``(*batch, stop − start, n_k)``, from
        the spec's definition: a long case is read one strip of rows at a time."""
        n = self.sizes
        rows = (start, stop)
        return mask_kinds.allowed(
            self.mask, self.batch, n["n_q"], n["n_k"], rows, mask_mod_table=self.mask_mod_table
        )

    def mask_mod(self, reference: str) -> Callable[..., Any]:
        """A user's mask_mod the mask names (``module:function``), loaded once per case."""
        return self.programs.function(reference)

    def mask_mod_table(self, reference: str) -> np.ndarray:
        """A user's mask_mod on the case's whole ``(*batch, n_q, n_k)`` grid, evaluated once
        per case: the allowed set is read many times (every strip of rows, every convention,
        the reference)."""
        n = self.sizes
        return self.programs.table(reference, self.batch, n["n_q"], n["n_k"])

    def bias_rows(self, start: int, stop: int) -> np.ndarray | None:
        """The bias of query rows ``start:stop`` (broadcastable to ``(*batch, stop − start,
        n_k)``; None without one): the held table's strip, or the spec evaluated there."""
        if self.bias is not None:
            return self.bias if self.bias.shape[-2] == 1 else self.bias[..., start:stop, :]
        n = self.sizes
        return maskspec.bias(self.score, self.batch, n["n_q"], n["n_k"], (start, stop))

    def attended(self) -> np.ndarray:
        """The pairs that take part: allowed and not excluded by a ``−∞`` bias."""
        return _attended(self.allowed(), self.bias)

    @property
    def modified(self) -> bool:
        """Whether the scores are modified (a bias, a soft-cap or a score_mod)."""
        return self.bias is not None or self.softcap is not None or self.score_mod is not None

    def lifted_bias(self, bias: np.ndarray | None = None) -> np.ndarray | None:
        """``bias`` (default the case's) with its batch axes lifted to the 4-d ``(B, H)``
        layout as :func:`exactattn.cases.spec.lift` lifts the inputs' (per-head tables
        stay per head, a per-batch one per batch)."""
        bias = self.bias if bias is None else bias
        if bias is None:
            return None
        nb = len(self.batch)
        full = bias.reshape((1,) * (nb + 2 - bias.ndim) + bias.shape)
        return full.reshape((*maskspec.lift(full.shape[:nb]), *full.shape[-2:]))

    def rho(self) -> np.ndarray:
        """Dropout factors ``ρ = r/(1−p)`` by formula from the keep-bits (ones without)."""
        n = self.sizes
        return maskspec.rho(self.dropout_p, self.seed, self.batch, n["n_q"], n["n_k"])

    def mask_object(self, like: Any = None) -> Any:
        """The mask as the library's :class:`~exactattn.core.masks.Mask` (None for every
        pair), built as its kind's entry says (:data:`exactattn.cases.mask_kinds.MASK_KINDS`).

        ``like``: a torch tensor to put arrays on.
        """
        return mask_kinds.library(self.mask, mask_kinds.Lowering(self, like))

    def keywords(self) -> dict[str, Any]:
        """Keywords for :func:`exactattn.attention` (mask left to the caller)."""
        out: dict[str, Any] = {"block_size": self.block_size, "empty_rows": self.empty_rows}
        if self.scale is not None:
            out["scale"] = self.scale
        if self.dropout_p:
            out.update(dropout_p=self.dropout_p, seed=self.seed)
        return out

    def expanded(self) -> Case:
        """The same problem without GQA: ``k, v`` repeated to one head per query head."""
        group = self.group
        if group == 1:
            return self
        k, v = (np.repeat(x, group, axis=-3) for x in (self.k, self.v))
        return replace(self, k=k, v=v)

    def describe(self, block_size: bool = True) -> str:
        """Shapes, dtype, mask and keywords on one line (for counterexamples); ``block_size``
        False leaves out the block size (a foreign kernel picks its own)."""
        n = self.sizes
        parts = [
            f"q {tuple(self.q.shape)}, k {tuple(self.k.shape)}, v {tuple(self.v.shape)}",
            f"dtype {self.dtype}" if self.dtype else "",
            f"mask {mask_kinds.describe(mask_kinds.simplified(self.mask))}",
            maskspec.describe_score(self.score, self.softcap),
            f"score_mod {self.score_mod}" if self.score_mod else "",
            f"scale {self.c():.6g}" + ("" if self.scale is not None else " (default)"),
            f"block_size {self.block_size}" if block_size else "",
            f"dropout p={self.dropout_p} seed={self.seed}" if self.dropout_p else "",
            f"GQA group {self.group}" if self.group > 1 else "",
            f"layout {self.layout}" if self.layout != "contiguous" else "",
            "empty rows -> 0" if self.empty_rows == "zero" else "",
            "n_q != n_k" if n["n_q"] != n["n_k"] else "",
            f"seqlens {self.seqlens}" if self.seqlens is not None else "",
            f"splits {self.splits}" if self.splits is not None else "",
            _describe_pages(self.pages),
            f"sink offsets {self.sinks}" if self.sinks is not None else "",
            _describe_kvcache(self.kvcache),
        ]
        return "; ".join(p for p in parts if p)

    # --- files ------------------------------------------------------------------------
    def to_json(self) -> str:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "programs"}
        arrays = [x for x in ARRAYS if getattr(self, x) is not None]
        for name in arrays:
            data[name] = getattr(self, name).tolist()  # −∞ bias entries: JSON's -Infinity
        data["shape"] = {name: list(getattr(self, name).shape) for name in arrays}
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Case:
        """The case written by :meth:`to_json` (files from before score modification
        load with none)."""
        data = json.loads(text)
        shapes = data.pop("shape")
        for name in ARRAYS:
            if data.get(name) is not None:
                data[name] = np.asarray(data[name], dtype=np.float64).reshape(shapes[name])
        for extra in ("expect", "finding"):
            data.pop(extra, None)
        return cls(**data)


def _describe_kvcache(kvcache: dict[str, Any] | None) -> str:
    if kvcache is None:
        return ""
    parts = [f"kvcache: append {kvcache['append']}", "paged" if kvcache["paged"] else ""]
    for key in ("leftpad", "batch_idx"):
        if kvcache.get(key) is not None:
            parts.append(f"{key} {kvcache[key]}")
    if not kvcache["paged"]:
        parts.append(f"contiguous {kvcache['rows']}×{kvcache['length']}")
    if kvcache["rotary"] is not None:
        rotary = kvcache["rotary"]
        form = "interleaved" if rotary["interleaved"] else "halves"
        parts.append(f"rotary dim {rotary['dim']} {form}")
    if kvcache["num_splits"]:
        parts.append(f"num_splits {kvcache['num_splits']}")
    return " ".join(p for p in parts if p)


def _describe_pages(pages: dict[str, Any] | None) -> str:
    if pages is None:
        return ""
    shared = f", the first {pages['shared']} shared" if pages["shared"] else ""
    return f"pages of {pages['size']} (pool {pages['pool']}{shared})"  # the table is in the file


def _fill_score(
    template: dict[str, Any], rng: np.random.Generator, batch: tuple[int, ...], n_q: int, n_k: int
) -> tuple[dict[str, Any], np.ndarray | None]:
    """The score template with its random parts drawn (see :class:`Draw`), and its bias
    (from the spec's definition, :func:`exactattn.cases.spec.bias`)."""
    spec = dict(template)
    kind = spec["kind"]
    heads = maskspec.heads(batch)
    if kind == "alibi" and "slopes" not in spec:
        # ALiBi's geometric slopes 2^(-8h/H), rounded to powers of two: the bias is then
        # exact in every input format, so a kernel that forms it from the slopes (flash-attn's
        # alibi_slopes) adds exactly the bias the reference adds
        spec["slopes"] = [2.0 ** -round(8 * (h + 1) / heads) for h in range(heads)]
    elif kind == "t5" and "table" not in spec:
        table = rng.standard_normal((heads, spec.get("buckets", 8)))
        spec["table"] = table.tolist()
        spec.setdefault("max_distance", 16)
    elif kind == "dense" and "values" not in spec:
        shape = {
            "full": (*batch, n_q, n_k),
            "per_head": (heads, n_q, n_k) if len(batch) == 2 else (n_q, n_k),
            "shared": (n_q, n_k),
        }[spec.get("shape", "full")]
        values = rng.standard_normal(shape)
        values[rng.random(shape) < spec.pop("neg_inf", 0.2)] = -np.inf
        if spec.pop("empty_row", False):
            values[..., 0, :] = -np.inf
        return spec, values
    return spec, maskspec.bias(spec, batch, n_q, n_k)


def build_case(draw: Draw) -> Case:
    """The :class:`Case` a :class:`Draw` describes: its arrays and the random parts of its
    templates drawn from ``draw.data_seed`` (always in this order, so that a seed keeps its
    case), every field computed first and the case built once."""
    rng = np.random.default_rng(draw.data_seed)
    b, n_q, n_k = draw.batch, draw.n_q, draw.n_k
    kv_b = b if draw.group == 1 else (*b[:-1], b[-1] // draw.group)
    dist = draw.distribution
    q = fill(rng, (*b, n_q, draw.d), dist)
    k = fill(rng, (*kv_b, n_k, draw.d), dist)
    v = fill(rng, (*kv_b, n_k, draw.v), "normal" if dist == "tiny" else dist)
    g = fill(rng, (*b, n_q, draw.v), "uniform_int" if dist == "uniform_int" else "normal")
    scale = _scale(draw, rng, q, k)
    drawn = mask_kinds.filled(draw.mask, rng, b, n_q, n_k)  # drawn whatever seqlens say: the
    score, bias = _fill_score(draw.score, rng, b, n_q, n_k)  # score's draws come after it
    mask = drawn
    if draw.seqlens is not None:  # a varlen batch: padding, causal / window per sequence
        q_lengths = list(draw.q_seqlens or (n_q,) * len(draw.seqlens))
        mask = mask_kinds.per_sequence(drawn, q_lengths, list(draw.seqlens), n_q)
    if draw.pages is not None:
        k, v = (interface_fields.shared_prefix(x, draw.pages) for x in (k, v))
    programs = Programs()  # the case's: a user's mask_mod tabulated here is not tabulated again

    def mask_mod_table(reference: str) -> np.ndarray:
        return programs.table(reference, b, n_q, n_k)

    # a row with no allowed key (bottom-right alignment with n_q > n_k, a narrow window, a
    # composition, a document without keys, a bias row of −∞): the opt-in convention is tested
    allowed = mask_kinds.allowed(mask, b, n_q, n_k, mask_mod_table=mask_mod_table)
    attended = _attended(allowed, bias)
    kvcache = None
    if draw.kvcache is not None:
        lengths = interface_fields.sequence_lengths(mask, draw.seqlens, (b or (1,))[0], n_k)
        kvcache = interface_fields.resolve_kvcache(draw.kvcache, lengths, draw.pages, draw.d)
    return Case(
        q,
        k,
        v,
        g,
        draw.block_size,
        scale,
        mask,
        dropout_p=draw.dropout_p,
        seed=draw.seed if draw.dropout_p else None,
        empty_rows="error" if attended.any(axis=-1).all() else "zero",
        note=draw.note,
        dtype=draw.dtype,
        layout=draw.layout,
        bias=bias,
        softcap=draw.softcap,
        score=score,
        score_mod=draw.score_mod,
        seqlens=None if draw.seqlens is None else list(draw.seqlens),
        splits=None if draw.splits is None else list(draw.splits),
        pages=draw.pages,
        sinks=None if draw.sinks is None else list(draw.sinks),
        kvcache=kvcache,
        programs=programs,
    )


def _scale(draw: Draw, rng: np.random.Generator, q: np.ndarray, k: np.ndarray) -> float | None:
    """The case's scale: for ``large_logits`` the one that makes the largest ``|c·q·k|`` the
    drawn logit; else one of a few (negative included) when ``explicit_scale``; else None."""
    if draw.distribution == "large_logits":
        kk = np.repeat(k, draw.group, axis=-3) if draw.group > 1 else k
        raw = np.abs(q @ np.swapaxes(kk, -1, -2)).max()
        return float(draw.logit / raw) if raw > 0 else 1.0
    if draw.explicit_scale:
        return float(rng.choice([0.5, 2.0, -1.0, 1 / 3]))
    return None


def _attended(allowed: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """The pairs that take part: allowed and not excluded by a ``−∞`` bias."""
    return allowed if bias is None else allowed & (bias != -np.inf)


def hold(x: np.ndarray, fmt: str) -> np.ndarray:
    """``x`` rounded to the number format ``fmt`` (to nearest), returned as float64.

    ``fmt``: a NumPy float name, ``bfloat16`` or ``pN`` (``N`` significand bits, unbounded
    exponent, as mpmath). The result is exactly representable in ``fmt``, so handing it to
    a target in that format is exact whatever conversion path the target takes.
    """
    if fmt in ("float64", "longdouble"):
        return np.asarray(x, dtype=np.float64)
    if fmt in ("float32", "float16"):
        return np.asarray(x, dtype=np.float64).astype(fmt).astype(np.float64)
    if fmt == "bfloat16":  # nearest-even on float32's top 16 bits, through float32 first
        bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        finite = np.isfinite(np.asarray(x, dtype=np.float32))
        out = np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)
        return out.astype(np.float64)
    if fmt.startswith("p") and fmt[1:].isdigit():
        import mpmath

        with mpmath.workprec(int(fmt[1:])):
            out = np.frompyfunc(lambda e: float(mpmath.mpf(float(e))), 1, 1)(x)
        return np.asarray(out, dtype=np.float64).reshape(np.shape(x))
    raise ValueError(f"cannot hold values in format {fmt!r}")
