"""The case model: one description of a drawn attention problem for check, difftest and sweep.

A case (:class:`Case`) is everything one run needs — the float64 inputs as drawn, the block
size and scale, the mask and score modification as *specs* (data, written from their
definitions in :mod:`.spec`, never through :mod:`exactattn.core.masks` or
:mod:`exactattn.core.scores`), dropout, the empty-row policy, the dtype and memory layout — and
it is JSON round-trippable (:meth:`Case.to_json`), so a failure replays anywhere.

* :mod:`.spec`: masks, score modifications and dropout keep-bits from their definitions,
  evaluated densely or on one strip of query rows at a time (``rows=(start, stop)``), so a
  long case never builds an ``n_q × n_k`` table;
* :mod:`.mask_kinds`: the one table of mask kinds, each kind's definition (from
  :mod:`.spec`), library mask, drawn parts and how each calling convention lowers it; a new
  mask kind is one entry there;
* :mod:`.inputs`: the named input distributions (the sweep's and the check's);
* :mod:`.case`: :class:`Case`, :class:`Draw` (what hypothesis draws) and
  :func:`build_case`, :func:`hold` (rounding to a target's format);
* :mod:`.strategies`: the hypothesis strategies over :class:`Draw` (imports hypothesis);
* :mod:`exactattn.cases.interface_fields`: the interface fields (``seqlens``, ``splits``, ``pages``,
``sinks``:
  how a packed varlen batch, a paged cache, split-KV partials and a sink lay out the case),
  drawn by :func:`.paths.interface_fields` for the interface conventions.

**Adding a case field** (a new kind of problem: packed variable-length sequences, a paged
KV cache, split-KV partitions, sinks): add the field to :class:`Case` with a default that
means "absent" (old replay files then load unchanged), give :class:`Draw` the knob that
draws it and :func:`build_case` the lines that fill it, write its meaning from the
definition in :mod:`.spec` if the reference needs it, say it in :meth:`Case.describe`, and
let targets that cannot take it skip it in their ``unsupported`` (with the reason). Check,
difftest and the sweep then all see it.
"""

from .case import ARRAYS, CHECK_DISTRIBUTIONS, LAYOUTS, Case, Draw, build_case, hold

__all__ = ["ARRAYS", "CHECK_DISTRIBUTIONS", "LAYOUTS", "Case", "Draw", "build_case", "hold"]
