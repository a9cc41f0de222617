"""Family 6 — mutants: deliberately broken variants the proofs (and the tests) must kill.

A prover that cannot fail proves nothing. Each :class:`Mutant` replaces one piece of the
library for the duration of a check — a step of ``exactattn.core.algorithm`` (looked up at call
time by module attribute), a method of a mask class or of ``Dropout`` (patched on the
class, by name), or the alignment offset — with a broken version built *from the
original* (a wrapper), so the mutants follow the library through refactors; a target that
no longer exists is reported, never skipped.

Theorem (of the test harness): with any one mutant applied, the default proof families
(``forward``, ``reverse``, ``scores``, ``general``, ``overflow``, ``monoid``, ``smt``,
``tiles``, ``dropout``) do not all prove: some obligation is REFUTED with a numeric
counterexample (or the solver's model), or fails. The mutants family runs each mutant
against those obligations (the likeliest first) and stops at the first that does not
prove; a mutant whose probes that ran all proved while some were SKIPPED (z3 missing) is
SKIPPED, not counted as surviving. ``exactattn prove --mutation-tests`` also runs
the default test suite against each mutant (:mod:`exactattn.proofs.mutation`); the certificate's
mutation table has both verdicts.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import sympy

from ..engine import deciders, ledger
from . import decider_mutants, overflow
from .patch_targets import as_method, full_one_key_wider, target_of

FAMILY = "mutants"
ALGORITHM = "exactattn.core.algorithm"
MASKS = "exactattn.core.masks"
DROPOUT = "exactattn.core.dropout"
SCORES = "exactattn.core.scores"
PROOFS = "exactattn.proofs"  # the proofs' own modules (a mutant of the tracer or the example)


@dataclass(frozen=True)
class Mutant:
    """One broken variant: ``make(original) -> replacement`` for the first target found."""

    name: str
    breaks: str  # which step, method or parameter
    targets: tuple[str, ...]  # "module:attr" or "module:Class.method", alternatives
    make: Callable[[Any], Any]
    probes: tuple[str, ...] = ()  # likeliest killers first: "family" or "family/name words"

    @property
    def of_the_proofs(self) -> bool:
        """Whether it breaks the proofs' own code (the tracer, an example), not the library."""
        return all(spec.startswith(f"{PROOFS}.") for spec in self.targets)

    def resolve(self) -> tuple[Any, str, Any]:
        for spec in self.targets:
            found = target_of(spec).resolve()
            if found is not None:
                return found
        wanted = " or ".join(str(target_of(s)) for s in self.targets)
        raise ledger.NoTarget(f"mutant {self.name!r}: {wanted} not found in the library (renamed?)")

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        owner, attribute, original = self.resolve()
        replacement = self.make(original)
        if isinstance(owner, type):  # a method: keep it a plain function on the class
            replacement = as_method(replacement)
        with mock.patch.object(owner, attribute, replacement):
            yield


# --- the broken variants, each built from the original -------------------------------------
def _caller() -> str:
    return sys._getframe(2).f_code.co_name


def _rows_overlapping(tiles: Callable) -> Callable:
    """Row runs after the first of a key block start one row early (that row counted twice)."""

    def broken(ctx, mask, geometry, block_size, row_block=None, **options):
        singles = None
        previous = None
        for tile in tiles(ctx, mask, geometry, block_size, row_block, **options):
            if previous is not None and tile.cols == previous.cols:
                if singles is None:
                    singles = list(tiles(ctx, mask, geometry, block_size, 1))
                extra = [t for t in singles if t.cols == tile.cols]
                extra = [t for t in extra if t.rows.start == tile.rows.start - 1]
                yield from extra
            previous = tile
            yield tile

    return broken


def _rows_skipping(tiles: Callable) -> Callable:
    """Row runs after the first of a key block lose their first row."""

    def broken(ctx, mask, geometry, block_size, row_block=None, **options):
        singles = None
        previous = None
        for tile in tiles(ctx, mask, geometry, block_size, row_block, **options):
            if previous is None or tile.cols != previous.cols or len(range(*_bounds(tile))) == 1:
                previous = tile
                yield tile
                continue
            previous = tile
            if singles is None:
                singles = list(tiles(ctx, mask, geometry, block_size, 1))
            start, stop = _bounds(tile)
            yield from (
                t for t in singles if t.cols == tile.cols and start + 1 <= t.rows.start < stop
            )

    return broken


def _bounds(tile: Any) -> tuple[int, int]:
    return tile.rows.start, tile.rows.stop


def _scale_dropped(original: Callable) -> Callable:
    def broken(ctx, q, k, scale, allowed, *rest, **kw):
        return original(ctx, q, k, ctx.scalar(1), allowed, *rest, **kw)

    return broken


def _mask_ignored_in_reverse(original: Callable) -> Callable:
    def broken(ctx, q, k, scale, allowed, *rest, **kw):
        if _caller() == "backward":
            allowed = None
        return original(ctx, q, k, scale, allowed, *rest, **kw)

    return broken


def _dq_dropped_on_partial_tiles(original: Callable) -> Callable:
    """dQ += 0 on every partially-masked tile (its scores carry a −∞)."""

    def broken(ctx, gamma, k, scale):
        out = original(ctx, gamma, k, scale)
        frame = sys._getframe(1)
        tile = frame.f_locals.get("tile")
        if tile is not None and getattr(tile, "allowed", None) is not None:
            return out * 0
        return out

    return broken


def _l_of_dropped_weights(original: Callable) -> Callable:
    def broken(ctx, s, v, rho=None):
        out = original(ctx, s, v, rho)
        if rho is None:
            return out
        ones = v[..., :1] * 0 + ctx.scalar(1)
        out.l = original(ctx, s, ones, rho).z[..., 0]  # Σ p·ρ instead of Σ p
        return out

    return broken


class _MinShift:
    """A context whose row max is the row min (of the finite entries)."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    def rowmax(self, x: Any) -> Any:
        finite = self._ctx.where(self._ctx.is_neg_inf(x), -self._ctx.neg_inf, x)
        low = -self._ctx.rowmax(-finite)
        return self._ctx.where(self._ctx.is_neg_inf(self._ctx.rowmax(x)), self._ctx.neg_inf, low)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


class _BlockMax:
    """A context whose ``maximum`` returns the block's side (the new summary's m)."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    def maximum(self, a: Any, b: Any) -> Any:
        return b

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def _merge_no_rescale(original: Callable) -> Callable:
    def broken(ctx, a, b):
        out = original(ctx, a, b)
        beta = ctx.exp(b.m - ctx.where(ctx.is_neg_inf(out.m), ctx.scalar(0), out.m))
        out.l, out.z = a.l + b.l * beta, a.z + b.z * beta[..., None]
        return out

    return broken


def _merge_sign_flipped(original: Callable) -> Callable:
    def broken(ctx, a, b):
        out = original(ctx, a, b)
        shift = ctx.where(ctx.is_neg_inf(out.m), ctx.scalar(0), out.m)
        old = ctx.where(ctx.is_neg_inf(a.m), ctx.scalar(0), a.m)
        alpha, beta = ctx.exp(shift - old), ctx.exp(b.m - shift)  # e^{M − m_old}: flipped
        out.l, out.z = a.l * alpha + b.l * beta, a.z * alpha[..., None] + b.z * beta[..., None]
        return out

    return broken


def _merge_block_m_stored(original: Callable) -> Callable:
    def broken(ctx, a, b):
        out = original(ctx, a, b)
        out.m = b.m
        return out

    return broken


def _keep(value: Callable) -> Callable:
    """A replacement that ignores the original."""
    return lambda original: value


def _times_zero(original: Callable) -> Callable:
    return lambda *args, **kw: original(*args, **kw) * 0


def _kind_swapped(old: str, new: str) -> Callable:
    def make(original: Callable) -> Callable:
        from exactattn.core.masks import TileKind

        def broken(self, rows, cols, geometry):
            kind = original(self, rows, cols, geometry)
            return TileKind[new] if kind is TileKind[old] else kind

        return broken

    return make


def _one_key_wider(original: Callable) -> Callable:
    """``allowed(i, j) ∨ allowed(i, j − 1)``: the set reaches one key further right."""
    return lambda self, i, j, geometry: (
        original(self, i, j, geometry) | original(self, i, j - 1, geometry)
    )


def _span_one_row_late(original: Callable) -> Callable:
    def broken(self, cols, geometry):
        span = original(self, cols, geometry)
        return range(min(span.start + 1, span.stop), span.stop)

    return broken


def _span_by_shortest(original: Callable) -> Callable:
    def broken(self, cols, geometry):
        if int(self.lengths.min()) <= cols.start:
            return range(0)
        return original(self, cols, geometry)

    return broken


def _or_span_intersection(original: Callable) -> Callable:
    def broken(self, cols, geometry):
        spans = [part.row_span(cols, geometry) for part in self.parts]
        start, stop = max(s.start for s in spans), min(s.stop for s in spans)
        return range(start, max(start, stop))

    return broken


def _and_full_if_any_full(original: Callable) -> Callable:
    from exactattn.core.masks import TileKind

    def broken(self, rows, cols, geometry):
        kinds = {part.classify(rows, cols, geometry) for part in self.parts}
        if TileKind.FULL in kinds and TileKind.EMPTY not in kinds:
            return TileKind.FULL
        return original(self, rows, cols, geometry)

    return broken


def _or_empty_if_any_empty(original: Callable) -> Callable:
    from exactattn.core.masks import TileKind

    def broken(self, rows, cols, geometry):
        kinds = {part.classify(rows, cols, geometry) for part in self.parts}
        if TileKind.EMPTY in kinds and TileKind.FULL not in kinds:
            return TileKind.EMPTY
        return original(self, rows, cols, geometry)

    return broken


def _factor_one_plus_p(original: Callable) -> Callable:
    def broken(self, ctx, batch_index, i, j):
        one, p = ctx.scalar(1), ctx.scalar(self.p)
        return original(self, ctx, batch_index, i, j) * ((one - p) / (one + p))

    return broken


def _keep_inverted(original: Callable) -> Callable:
    return lambda self, batch_index, i, j: ~original(self, batch_index, i, j)


def _keep_batch_ignored(original: Callable) -> Callable:
    return lambda self, batch_index, i, j: original(self, batch_index * 0, i, j)


def _stop_one_row_short(original: Callable) -> Callable:
    from exactattn.core.masks import INT

    def broken(left, right, offset, a, e, n_q, ops=INT):
        start, stop = original(left, right, offset, a, e, n_q, ops)
        return start, ops.max(stop - 1, start)

    return broken


def _stop_unclamped(original: Callable) -> Callable:
    """The stop is not clamped to n_q (the shape of the or_masks bug: rows past n_q)."""
    from exactattn.core.masks import INT

    def broken(left, right, offset, a, e, n_q, ops=INT):
        start, stop = original(left, right, offset, a, e, n_q, ops)
        if left is not None:
            stop = ops.max(e - offset + left, start)
        return start, stop

    return broken


def _empty_one_key_early(original: Callable) -> Callable:
    from exactattn.core.masks import INT

    def broken(left, right, offset, r0, r1, a, e, ops=INT):
        _, full = original(left, right, offset, r0, r1, a, e, ops)
        return original(left, right, offset, r0, r1, a + 1, e, ops)[0], full

    return broken


def _padding_full_one_short(original: Callable) -> Callable:
    def broken(shortest, longest, a, e):
        return original(shortest, longest, a, e)[0], original(shortest + 1, longest, a, e)[1]

    return broken


def _padding_rows_dropped_one_early(original: Callable) -> Callable:
    def broken(longest, a, n_q, ops=None):
        return original(longest - 1, a, n_q, *(() if ops is None else (ops,)))

    return broken


def _wider_side(original: Callable) -> Callable:
    return lambda a, b: original(a, b) if a is None or b is None else max(a, b)


def _offset_flipped(original: Callable) -> Callable:
    return lambda *args, **kw: -original(*args, **kw)


def _tiles_reversed(method: Callable) -> Callable:
    """A chain method run over its tiles in the other order."""

    def broken(self, *args):
        flipped = copy.copy(self)
        flipped.tiles = self.tiles[::-1]
        return method(flipped, *args)

    return broken


def _cap_not_divided(original: Callable) -> Callable:
    """``cap·tanh(s)`` instead of ``cap·tanh(s/cap)``."""
    return lambda self, s: original(self, s * self.cap)


class _FirstNotSum:
    """A context whose ``sum_to`` keeps the first entry along each reduced axis."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    def sum_to(self, x: Any, shape: tuple[int, ...]) -> Any:
        x = x[(0,) * (x.ndim - len(shape))]
        picked = tuple(slice(0, 1) if n == 1 else slice(None) for n in shape)
        return x[picked]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def _bias_first_not_sum(original: Callable) -> Callable:
    def broken(self, gamma, grads):
        real = self.ctx
        self.ctx = _FirstNotSum(real)
        try:
            return original(self, gamma, grads)
        finally:
            self.ctx = real

    return broken


def _z_unshifted(original: Callable) -> Callable:
    """``z = Σ e^{s} V`` (ℓ keeps its shift by m)."""

    def broken(ctx, s, v, rho=None):
        block = original(ctx, s, v, rho)
        weights = ctx.exp(s)
        return type(block)(
            block.m, block.l, ctx.matmul(weights if rho is None else weights * rho, v)
        )

    return broken


def _block_unclamped(original: Callable) -> Callable:
    """The last key block runs ``b`` keys past its start even beyond ``n_k``."""
    return lambda start, block_size, n_k, ops=None: (start, start + block_size)


def _resumes_one_late(original: Callable) -> Callable:
    """The iterator's loop resumes one past each run's end (that row or key is skipped)."""

    def broken(start, stop, run):
        while start < stop:
            first, end = run(start)
            yield first, end
            start = end + 1

    return broken


def _run_starts_late(original: Callable) -> Callable:
    """A row run after the first of its span starts one row late (that row is never visited)."""

    def broken(first, start, stop, widths, ops=None):
        got = original(first, start, stop, widths)
        return got if first == start else (first + 1, got[1])

    return broken


def _diagonal_full(original: Callable) -> Callable:
    """A structure that calls the diagonal blocks FULL (they are PARTIAL for causal)."""
    from ..engine.trace import where

    return lambda b, h, q_block, kv_block: where(kv_block <= q_block, 2, 0)


def _full_kind() -> Any:
    from exactattn.core.masks import TileKind

    return TileKind.FULL


_FULL = _full_kind()


def _a(step: str) -> tuple[str, ...]:
    return (f"{ALGORITHM}:{step}",)


def _b_read_outside_tiles(original: Callable) -> Callable:
    """A forward that clamps b itself before the loop (harmless, but b is read outside
    ``tiles()``, which the block-size deduplication of the enumerated families relies on)."""

    def forward(ctx, q, k, v, *, block_size, **keywords):
        block_size = min(block_size, k.shape[-2])
        return original(ctx, q, k, v, block_size=block_size, **keywords)

    return forward


def _keys_one_right(original: Callable) -> Callable:
    return lambda self, i, j, geometry: original(self, i, j + 1, geometry)


def _key_sequences_late(original: Callable) -> Callable:
    """``packed_tile_kind`` reading the keys' sequences one later (EMPTY where they meet)."""

    def broken(sequences, *rest, **keywords):
        q0, q1, k0, k1 = sequences
        return original((q0, q1, k0 + 1, k1 + 1), *rest, **keywords)

    return broken


def _last_block_dropped(original: Callable) -> Callable:
    def broken(start, stop, size, *ops):
        first, end = original(start, stop, size, *ops)
        return first, end - 1

    return broken


def _first_block_second_order_dropped(original: Callable) -> Callable:
    """The second pass adds nothing for the first key block (its visit's terms dropped)."""

    def broken(ctx, x, r, *rest, **kw):
        out = original(ctx, x, r, *rest, **kw)
        tile = sys._getframe(1).f_locals.get("tile")
        cols = getattr(tile, "cols", None)
        return tuple(t * 0 for t in out) if cols is not None and cols.start == 0 else out

    return broken


def _second_visits_at_once(original: Callable) -> Callable:
    """Each step second-visits the tiles it has just first-visited, complete rows or not."""

    def broken(rows):
        return [(firsts, firsts) for firsts, _ in original(rows)]

    return broken


def _sink_value_one(original: Callable) -> Callable:
    """The sink's summary ``(σ, 1, 1)``: ``e^σ`` enters the numerator."""

    def broken(ctx, sinks, geometry, v_dim):
        start = original(ctx, sinks, geometry, v_dim)
        return type(start)(start.m, start.l, start.z + 1)

    return broken


FWD, REV, GEN, OVF, TIL, DRP = "forward", "reverse", "general", "overflow", "tiles", "dropout"
SMT, SCO, PRG, IFC = "smt", "scores", "program", "interfaces"
PAGED, MERGE, SINKS = "exactattn.layouts.paged", "exactattn.core.merge", "exactattn.core.sinks"
HVP, SEC = "exactattn.core.hvp", "second_order"

MUTANTS: list[Mutant] = [
    # the forward
    Mutant("tiles: row runs overlap by one row", "tiles (row_block)", _a("tiles"),
           _rows_overlapping, (f"{SMT}/the stated loop and its previous twin", TIL)),
    Mutant("tiles: row runs skip their first row", "tiles (row_block)", _a("tiles"),
           _rows_skipping, (f"{SMT}/the stated loop and its previous twin", TIL)),
    Mutant("key_block: the last key block runs past n_k", "key_block (tiles)",
           _a("key_block"), _block_unclamped, (f"{SMT}/key blocks are the stated", TIL)),
    Mutant("runs: the loop resumes one past each run's end", "runs (tiles)", _a("runs"),
           _resumes_one_late, (f"{SMT}/key blocks are the stated", TIL)),
    Mutant("row_run: runs after the first start one row late", "row_run (tiles, row_block)",
           _a("row_run"), _run_starts_late, (f"{SMT}/row runs are the stated", TIL)),
    Mutant("tile_scores: scale c dropped", "tile_scores", _a("tile_scores"), _scale_dropped,
           (FWD,)),
    Mutant("tile_scores: mask ignored in the reverse", "tile_scores (reverse)",
           _a("tile_scores"), _mask_ignored_in_reverse, ("reverse/causal,",)),
    Mutant("safe_shift: ⊥ shifted by −∞ (NaN)", "safe_shift", _a("safe_shift"),
           _keep(lambda ctx, m: m), (GEN, FWD)),
    Mutant("safe_shift: no shift at all (0)", "safe_shift", _a("safe_shift"),
           _keep(lambda ctx, m: ctx.where(ctx.is_neg_inf(m), ctx.scalar(0), ctx.scalar(0))),
           (OVF,)),
    Mutant("block_summary: shift by the row min", "block_summary",
           _a("block_summary"), lambda o: lambda ctx, s, v, rho=None: o(_MinShift(ctx), s, v, rho),
           (OVF,)),
    Mutant("block_summary: ℓ sums the dropped-out weights", "block_summary (dropout)",
           _a("block_summary"), _l_of_dropped_weights, (GEN, FWD)),
    Mutant("block_summary: z = Σ e^s V (not shifted by m)", "block_summary",
           _a("block_summary"), _z_unshifted, (f"{GEN}/tile of symbolic width", GEN, FWD)),
    Mutant("block_summary: dropout ignored in z", "block_summary (dropout)",
           _a("block_summary"), lambda o: lambda ctx, s, v, rho=None: o(ctx, s, v, None),
           (GEN, FWD)),
    Mutant("merge: old accumulator not rescaled", "merge", _a("merge"), _merge_no_rescale,
           (GEN,)),
    Mutant("merge: rescale exponent sign flipped", "merge", _a("merge"), _merge_sign_flipped,
           (GEN,)),
    Mutant("merge: stored m is the current block's", "merge", _a("merge"),
           _merge_block_m_stored, (GEN, FWD)),
    Mutant("merge: shift by the current block's max", "merge", _a("merge"),
           lambda o: lambda ctx, a, b: o(_BlockMax(ctx), a, b), (OVF,)),
    Mutant("finalize: Y = z (no division by ℓ)", "finalize", _a("finalize"),
           _keep(lambda ctx, state: state.z), (GEN,)),
    Mutant("log_sum_exp: lse = m", "log_sum_exp", _a("log_sum_exp"),
           _keep(lambda ctx, m, l: m), (GEN,)),
    Mutant("_nonzero_l: ℓ = 0 of an empty row kept (0/0)", "_nonzero_l (empty rows)",
           _a("_nonzero_l"), _keep(lambda ctx, m, l: l), ("forward/empty rows",)),
    # the reverse
    Mutant("softmax_delta: δ = 0", "softmax_delta", _a("softmax_delta"), _times_zero,
           (GEN, REV)),
    Mutant("tile_probabilities: p not divided by ℓ", "tile_probabilities",
           _a("tile_probabilities"),
           lambda o: lambda ctx, s, m, l: o(ctx, s, m, l * 0 + ctx.scalar(1)), (GEN, REV)),
    Mutant("tile_gamma: δ not subtracted", "tile_gamma", _a("tile_gamma"),
           _keep(lambda ctx, p, dp, delta: p * dp), (GEN, REV)),
    Mutant("tile_gamma: δ added, not subtracted", "tile_gamma", _a("tile_gamma"),
           _keep(lambda ctx, p, dp, delta: p * (dp + delta[..., None])),
           (f"{GEN}/reverse visit, tile of symbolic width", GEN, REV)),
    Mutant("key_gradient: c missing from dK", "key_gradient", _a("key_gradient"),
           lambda o: lambda ctx, gamma, q, scale: o(ctx, gamma, q, ctx.scalar(1)), (GEN, REV)),
    Mutant("query_gradient: c missing from dQ", "query_gradient", _a("query_gradient"),
           lambda o: lambda ctx, gamma, k, scale: o(ctx, gamma, k, ctx.scalar(1)), (GEN, REV)),
    Mutant("query_gradient: dQ dropped on partially-masked tiles", "query_gradient (masks)",
           _a("query_gradient"), _dq_dropped_on_partial_tiles, ("reverse/causal,",)),
    Mutant("value_gradient: dV = 0", "value_gradient", _a("value_gradient"), _times_zero,
           (GEN, REV)),
    Mutant("flat batch·head index: every head reads 0", "Geometry.flat_index (dropout)",
           (*_a("batch_index_of"), f"{MASKS}:Geometry.flat_index"), _times_zero,
           ("forward/dropout",)),
    # the masks
    Mutant("SlidingWindow.tile: one key too far right", "SlidingWindow.tile",
           (f"{MASKS}:SlidingWindow.tile",), _one_key_wider, (TIL, FWD)),
    Mutant("SlidingWindow.classify: PARTIAL reported FULL", "SlidingWindow.classify",
           (f"{MASKS}:SlidingWindow.classify",), _kind_swapped("PARTIAL", "FULL"), (TIL, FWD)),
    Mutant("SlidingWindow.classify: PARTIAL reported EMPTY", "SlidingWindow.classify",
           (f"{MASKS}:SlidingWindow.classify",), _kind_swapped("PARTIAL", "EMPTY"), (TIL, FWD)),
    Mutant("SlidingWindow.row_span: one row late", "SlidingWindow.row_span",
           (f"{MASKS}:SlidingWindow.row_span",), _span_one_row_late, (TIL, FWD)),
    Mutant("alignment offset: sign flipped", "alignment offset",
           (f"{MASKS}:alignment_offset", f"{MASKS}:_alignment_offset"), _offset_flipped,
           (f"{SMT}/window_allows", TIL, FWD)),
    Mutant("window_row_span: stop one row short", "window_row_span",
           (f"{MASKS}:window_row_span",), _stop_one_row_short, (f"{SMT}/window_row_span", TIL)),
    Mutant("window_row_span: stop not clamped to n_q", "window_row_span",
           (f"{MASKS}:window_row_span",), _stop_unclamped, (f"{SMT}/window_row_span", TIL)),
    Mutant("window_tile_kind: FULL one key too wide", "window_tile_kind",
           (f"{MASKS}:window_tile_kind",), full_one_key_wider, (f"{SMT}/window_tile_kind", TIL)),
    Mutant("window_tile_kind: EMPTY one key too early", "window_tile_kind",
           (f"{MASKS}:window_tile_kind",), _empty_one_key_early,
           (f"{SMT}/window_tile_kind", TIL)),
    Mutant("padding_tile_kind: FULL once the shortest length reaches e − 1",
           "padding_tile_kind", (f"{MASKS}:padding_tile_kind",), _padding_full_one_short,
           (f"{SMT}/padding_tile_kind", TIL)),
    Mutant("padding_row_span: rows dropped once the longest length reaches a + 1",
           "padding_row_span", (f"{MASKS}:padding_row_span",), _padding_rows_dropped_one_early,
           (f"{SMT}/padding_row_span", TIL)),
    Mutant("Band.intersect: the wider window side kept", "Band.intersect (Mask.lower)",
           (f"{MASKS}:_tighter",), _wider_side, (f"{SMT}/Mask.lower",)),
    Mutant("KeyPadding.tile: j ≤ length", "KeyPadding.tile", (f"{MASKS}:KeyPadding.tile",),
           _one_key_wider, (TIL, FWD)),
    Mutant("KeyPadding.row_span: no row once the shortest length is reached",
           "KeyPadding.row_span", (f"{MASKS}:KeyPadding.row_span",), _span_by_shortest,
           (TIL, FWD)),
    Mutant("KeyPadding.classify: PARTIAL reported FULL", "KeyPadding.classify",
           (f"{MASKS}:KeyPadding.classify",), _kind_swapped("PARTIAL", "FULL"), (TIL, FWD)),
    Mutant("And.classify: FULL if any part is FULL", "And.classify",
           (f"{MASKS}:And.classify",), _and_full_if_any_full, (f"{SMT}/classify", "tiles/∧")),
    Mutant("Or.classify: EMPTY if any part is EMPTY", "Or.classify",
           (f"{MASKS}:Or.classify",), _or_empty_if_any_empty, (f"{SMT}/classify", "tiles/∧")),
    Mutant("Or.row_span: the intersection of the parts' spans", "Or.row_span",
           (f"{MASKS}:Or.row_span",), _or_span_intersection, (f"{SMT}/row_span meet", "tiles/∧")),
    # score modification
    Mutant("softcap pullback: the factor 1 − tanh² dropped", "Softcap (reverse)",
           (f"{SCORES}:_SoftcapTile.pullback",), _keep(lambda self, gamma, grads: gamma),
           (f"{GEN}/Lemma S", f"{SCO}/reverse (dQ, dK, dV): softcap")),
    Mutant("softcap: cap·tanh(s) (s not divided by cap)", "Softcap",
           (f"{SCORES}:_SoftcapTile.apply",), _cap_not_divided, (f"{SCO}/forward: softcap",)),
    Mutant("chain: softcap applied after the bias", "Chain (score_mod order)",
           (f"{SCORES}:_ChainTile.apply",), _tiles_reversed,
           (f"{GEN}/Lemma S", f"{SCO}/forward: softcap then")),
    Mutant("chain pullback: forward order (dB gets the softcap factor)", "Chain (reverse)",
           (f"{SCORES}:_ChainTile.pullback",), _tiles_reversed,
           (f"{GEN}/Lemma S", f"{SCO}/reverse (dQ, dK, dV, dB): softcap then")),
    Mutant("bias pullback: a broadcast bias's dB takes one entry, not the sum", "Bias (dB)",
           (f"{SCORES}:_BiasTile.pullback",), _bias_first_not_sum,
           (f"{SCO}/reverse (dQ, dK, dV, dB): softcap then a bias broadcast",)),
    # a user's program, for every length
    Mutant("trace: q_idx ≥ kv_idx traced as q_idx > kv_idx", "the mask_mod tracer",
           (f"{PROOFS}.engine.trace:Traced.__ge__",),
           lambda o: lambda self, other: o(self, other + 1),
           (f"{PRG}/the traced mask_mod is the program",)),
    Mutant("block structure: the diagonal (partial) blocks marked FULL", "a hand-built BlockMask",
           (f"{PROOFS}.families.flex_program:example_causal_blocks",), _diagonal_full,
           (f"{PRG}/the block structure is sound",)),
    Mutant("MaskMod.classify: every tile FULL", "MaskMod.classify (all n)",
           (f"{MASKS}:MaskMod.classify",), _keep(lambda self, rows, cols, geometry: _FULL),
           (f"{PRG}/its structure is the default",)),
    # the block size, read only through tiles()
    Mutant("forward: b clamped before the loop (read outside tiles())", "algorithm.forward",
           _a("forward"), _b_read_outside_tiles, (f"{GEN}/read b only through tiles",)),
    # a torch BlockMask, for every length
    Mutant("create_block_mask restated: the padding rounds down", "the construction (restated)",
           (f"{PROOFS}.families.blockmask:round_up",), _keep(lambda n, size: n / size * size),
           (f"{SMT}/create_block_mask's classes are sound",)),
    Mutant("blocks_of: a tile's last block dropped", "blocks_of (FlexBlockMask.classify)",
           (f"{MASKS}:blocks_of",), _last_block_dropped, (f"{SMT}/FlexBlockMask.classify",)),
    Mutant("block_rows: the span stops one block early", "block_rows (FlexBlockMask.row_span)",
           (f"{MASKS}:block_rows",),
           lambda o: lambda first, last, size, n_q, *ops: o(first, last - 1, size, n_q, *ops),
           (f"{SMT}/FlexBlockMask.row_span",)),
    # the interfaces, for every length
    Mutant("PackedSequences.tile: keys read one position right", "PackedSequences.tile",
           (f"{MASKS}:PackedSequences.tile",), _keys_one_right,
           (f"{IFC}/a packed batch is the block-diagonal mask",)),
    Mutant("packed_tile_kind: the keys' sequences read one late", "packed_tile_kind",
           (f"{MASKS}:packed_tile_kind",), _key_sequences_late,
           (f"{IFC}/packed_tile_kind and the packed row span",)),
    Mutant("cache_row: key t at row (t + 1) mod P of its page", "cache_row (paged gather)",
           (f"{PAGED}:cache_row",), _keep(lambda page, t, size: page * size + (t + 1) % size),
           (f"{IFC}/the paged gather reads key t",)),
    Mutant("new_row: appended keys read one row early", "new_row (paged gather)",
           (f"{PAGED}:new_row",), lambda o: lambda *args: o(*args) - 1,
           (f"{IFC}/the paged gather reads key t",)),
    Mutant("merge.fold: the last part dropped", "merge.fold (merge_partials)",
           (f"{MERGE}:fold",), lambda o: lambda ctx, parts: o(ctx, parts[:-1] or parts),
           (f"{IFC}/merge_partials of k free partials",)),
    Mutant("sinks.initial_summary: the sink's value 1", "sinks.initial_summary",
           (f"{SINKS}:initial_summary",), _sink_value_one, (f"{IFC}/a sink's row starts",)),
    Mutant("sinks.sink_gradient: sign flipped", "sinks.sink_gradient",
           (f"{SINKS}:sink_gradient",), lambda o: lambda *a, **kw: -o(*a, **kw),
           (f"{IFC}/dσ = −Σ_i",)),
    # dropout
    Mutant("Dropout.factors: 1/(1+p) instead of 1/(1−p)", "Dropout.factors",
           (f"{DROPOUT}:Dropout.factors",), _factor_one_plus_p, (DRP, FWD)),
    Mutant("Dropout.keep: keeps at rate p (bits inverted)", "Dropout.keep",
           (f"{DROPOUT}:Dropout.keep",), _keep_inverted, (DRP, FWD)),
    Mutant("Dropout.keep: batch·head index ignored", "Dropout.keep",
           (f"{DROPOUT}:Dropout.keep",), _keep_batch_ignored, (DRP, FWD)),
    # the second-order reverse
    Mutant("hvp.second_visit: the first key block's second-order terms dropped",
           "second_visit (hvp)", (f"{HVP}:second_visit",), _first_block_second_order_dropped,
           (f"{SEC}/(dQ̇", SEC)),
    Mutant("hvp.row_schedule: a tile's second visit before its rows are complete",
           "row_schedule (hvp)", (f"{HVP}:row_schedule",), _second_visits_at_once,
           (f"{SEC}/row_schedule", SEC)),
    Mutant("hvp.delta_tangent: δ̇ = 0 (δ's derivative omitted)", "delta_tangent (hvp)",
           (f"{HVP}:delta_tangent",), _times_zero, (f"{SEC}/Ẏ = w − σY", SEC)),
]  # fmt: skip
BY_NAME = {m.name: m for m in MUTANTS}


class MinContext(overflow.RecordingContext):
    """The recording sympy context with ``sympy.Min`` where the max belongs."""

    _max2 = staticmethod(sympy.Min)


# --- killing a mutant with the proofs ------------------------------------------------------
def probe_obligations(max_n: int) -> dict[str, list[ledger.Obligation]]:
    """The default families' obligations, by family (the mutants' judges)."""
    from . import (
        dropout_bits,
        forward,
        general,
        interfaces,
        monoid,
        reverse,
        score_mods,
        second_order,
        smt,
        tiles,
    )
    from .flex_program import example_obligations

    families = {
        GEN: general, SMT: smt, TIL: tiles, FWD: forward, REV: reverse, SCO: score_mods,
        OVF: overflow, DRP: dropout_bits, "monoid": monoid, IFC: interfaces, SEC: second_order,
    }  # fmt: skip
    probes = {name: module.obligations(max_n) for name, module in families.items()}
    return {**probes, PRG: example_obligations()}


def kill(mutant: Mutant, probes: dict[str, list[ledger.Obligation]], baseline: dict) -> str:
    """Run the probes under ``mutant`` until one does not prove; raise its verdict.

    A probe that does not prove on the unmutated library either (``baseline`` caches that)
    judges nothing and is passed over, and so is a SKIPPED one (z3 missing). Returns (the
    mutant survived) only if every probe that proves unmutated also proved under the
    mutant; raises Skipped instead when some probe could not run.
    """
    mutant.resolve()  # a missing target is reported even with no probe to run
    skipped = []
    for ob in _ordered(mutant, probes):
        with mutant.applied():
            (outcome,) = ledger.run([ob], stream=None)
        if outcome.status in (ledger.SKIPPED, ledger.UNKNOWN):  # not judged by this probe
            skipped.append(f"{ob.family} / {ob.name}: {outcome.status} {outcome.detail}")
            continue
        if outcome.status == ledger.PROVED or not _proves_unmutated(ob, baseline):
            continue
        where = f"{ob.family} / {ob.name} ({ob.sizes})"
        deciders.add(outcome.deciders)  # who judged the probe that killed it
        if outcome.counterexample is not None:
            cex = outcome.counterexample
            raise ledger.Refuted(cex.relabelled(f"{where} — {cex.what}"))
        raise ledger.Killed(outcome.status, f"{where} — {outcome.detail}")
    if skipped:  # not judged: its likeliest judges could not run or gave no verdict
        raise ledger.Skipped(f"survived the probes that ran; not judged by {skipped[0]}")
    return "every probe proved"


def _ordered(mutant: Mutant, probes: dict[str, list[ledger.Obligation]]):
    """The mutant's hinted probes first ("family" or "family/words in the name"), then all."""
    seen: set[int] = set()
    hints = [*mutant.probes, *probes]
    for hint in hints:
        family, _, words = hint.partition("/")
        for ob in probes.get(family, []):
            if id(ob) not in seen and words in ob.name:
                seen.add(id(ob))
                yield ob


# Verdicts of obligations already run on the unmutated library in this process (the
# families that ran before the mutants family), so a probe's baseline is not run twice.
_UNMUTATED: dict[tuple[str, str, str], bool] = {}


def remember(outcomes: list[ledger.Outcome]) -> None:
    """Record verdicts reached with no mutant applied (the runner calls this per family)."""
    for o in outcomes:
        if not o.obligation.expect_refuted:
            ob = o.obligation
            _UNMUTATED[(ob.family, ob.name, ob.sizes)] = o.status == ledger.PROVED


def _proves_unmutated(ob: ledger.Obligation, baseline: dict) -> bool:
    key = (ob.family, ob.name, ob.sizes)
    if key in _UNMUTATED:
        return _UNMUTATED[key]
    if key not in baseline:
        (outcome,) = ledger.run([ob], stream=None)
        baseline[key] = outcome.status == ledger.PROVED
    return baseline[key]


def obligations(max_n: int = 4) -> list[ledger.Obligation]:
    probes, baseline = probe_obligations(max_n), {}
    out = [
        ledger.Obligation(
            FAMILY, m.name, f"first: {', '.join(m.probes)}",
            lambda m=m: kill(m, probes, baseline), expect_refuted=True,
        )
        for m in MUTANTS
    ]  # fmt: skip

    def min_for_max() -> None:
        for order in ((0, 1), (1, 0)):
            for b in (1, 2):
                overflow.check_case(MinContext, order, b)

    out.append(
        ledger.Obligation(
            FAMILY, "ctx: min instead of max (sympy)", "overflow n=2 b=1,2", min_for_max, True
        )
    )
    out += decider_mutants.obligations(lambda m: kill(m, probes, baseline))
    return out
