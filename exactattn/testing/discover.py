"""``exactattn check TARGET --discover``: what a function takes, found by calling it.

Each probe is one tiny case that exercises one feature — a dtype, ``v ≠ d``, GQA,
``n_q ≠ n_k``, each mask kind, an additive bias, a row with no allowed key (any answer but
SDPA's 0 there, where the other rows are right, is "not supported": the function defines such
rows otherwise, NaN or JAX's mean of V), a negative scale, dropout,
gradients — run
and judged as check runs it (:func:`.case_check.check_case`). A probe the function answers
correctly is *supported*; one it refuses (``NotImplementedError``, or any exception it
raises on that input alone, an output detached from autograd for the gradients, an output in
another dtype for a dtype) is *not supported*, with its message; one it answers wrongly is
*supported but failing*: that is a finding for ``check``, never hidden by a ``--supports``
flag. :func:`discover` returns the probes' outcomes, :func:`supports_text` the
``--supports`` text that leaves out exactly what the function does not take, ready to paste.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cases import Case
from ..targets import Capabilities, Target, Variant
from ..targets.conventions import DETACHED
from ..targets.target import FLOAT_DTYPES
from .case_check import Options, check_case

# what a function that does not take a feature answers (else a failure is a wrong answer):
# an exception, an output outside autograd's graph, an output in another dtype
REFUSED = ("raised ", DETACHED, "y has dtype ")
MASK_KINDS = ("none", "causal", "window", "padding", "dense")  # what the probes draw
N, D = 12, 8  # a probe's size: two key blocks of the smallest claimed block sizes and a tail


@dataclass(frozen=True)
class Probe:
    """One feature's tiny case and the ``--supports`` item that leaves it out."""

    feature: str
    key: str  # the --supports key ("masks" names the kind in ``value``)
    value: str
    build: Callable[[str], Case]
    grads: bool = False


@dataclass
class Outcome:
    probe: Probe
    status: str  # "supported", "not supported", "fails", "not probed"
    detail: str = ""


def _arrays(n_q: int, n_k: int, heads: tuple[int, int] = (2, 2), v: int = D, seed: int = 0):
    rng = np.random.default_rng(seed)
    hq, hkv = heads
    q, g = rng.standard_normal((1, hq, n_q, D)), rng.standard_normal((1, hq, n_q, v))
    return q, rng.standard_normal((1, hkv, n_k, D)), rng.standard_normal((1, hkv, n_k, v)), g


def _case(dtype: str, n_q: int = N, n_k: int = N, **fields: Any) -> Case:
    heads, v = fields.pop("heads", (2, 2)), fields.pop("v", D)
    q, k, vv, g = _arrays(n_q, n_k, heads, v)
    return Case(q, k, vv, g, 8, dtype=dtype, **fields)


def _causal(align: str) -> dict[str, Any]:
    return {"kind": "causal", "align": align}


def _no_key_in_row_0() -> list[list[bool]]:
    allowed = np.ones((N, N), dtype=bool)
    allowed[0] = False
    return allowed.tolist()


PROBES = (
    Probe("v != d", "equal_head_dims", "yes", lambda t: _case(t, v=D // 2)),
    Probe("n_q != n_k", "cross", "no", lambda t: _case(t, n_q=5)),
    Probe("GQA (4 query heads, 2 key/value heads)", "gqa", "no", lambda t: _case(t, heads=(4, 2))),
    Probe("causal, square", "masks", "causal", lambda t: _case(t, mask=_causal("top-left"))),
    Probe(
        "causal, n_q < n_k (top-left)", "masks", "causal",
        lambda t: _case(t, n_q=5, mask=_causal("top-left")),
    ),
    Probe(
        "causal, bottom-right", "masks", "causal",
        lambda t: _case(t, n_q=5, mask=_causal("bottom-right")),
    ),
    Probe(
        "sliding window", "masks", "window",
        lambda t: _case(t, mask={"kind": "window", "left": 3, "right": 1, "align": "top-left"}),
    ),
    Probe(
        "key padding", "masks", "padding",
        lambda t: _case(t, mask={"kind": "padding", "lengths": [7]}),
    ),
    Probe(
        "boolean mask", "masks", "dense",
        lambda t: _case(t, mask={"kind": "dense", "allowed": np.tri(N, N, 2, dtype=bool).tolist()}),
    ),
    Probe(
        "additive bias", "bias", "no",
        lambda t: _case(t, bias=np.random.default_rng(3).standard_normal((1, 2, N, N))),
    ),
    Probe(
        "a row with no allowed key", "empty_rows", "no",
        lambda t: _case(t, mask={"kind": "dense", "allowed": _no_key_in_row_0()},
                        empty_rows="zero"),
    ),
    Probe("negative scale", "negative_scale", "no", lambda t: _case(t, scale=-0.25)),
    Probe("gradients", "grads", "no", lambda t: _case(t), grads=True),
)  # fmt: skip


def discover(target: Target, dtypes: tuple[str, ...] = FLOAT_DTYPES) -> list[Outcome]:
    """Every probe's outcome on ``target``: first one plain case per dtype, then each
    feature in the first dtype it takes (float32 where it can)."""
    wide = dataclasses.replace(target, caps=_everything(target.caps))
    out = [_dtype_outcome(wide, dtype) for dtype in dtypes]
    taken = [o.probe.value for o in out if o.status in ("supported", "fails")]
    if not taken:
        return out
    dtype = "float32" if "float32" in taken else taken[0]
    variant = Variant(wide, dtype)
    out += [_outcome(variant, probe) for probe in PROBES]
    out.append(_dropout(variant))
    return out


def supports_text(outcomes: list[Outcome]) -> str:
    """The ``--supports`` text that leaves out what the probes found the function does not
    take (empty: it takes everything probed)."""
    refused = {(o.probe.key, o.probe.value) for o in outcomes if o.status == "not supported"}
    items = []
    if any(key == "dtypes" for key, _ in refused):
        taken = [o.probe.value for o in outcomes if o.probe.key == "dtypes"]
        items.append("dtypes=" + "+".join(t for t in taken if ("dtypes", t) not in refused))
    kinds = {value for key, value in refused if key == "masks"}
    if kinds:
        items.append("masks=" + "+".join(k for k in MASK_KINDS if k not in kinds))
    items += sorted({f"{key}={value}" for key, value in refused if key not in ("dtypes", "masks")})
    return ",".join(items)


def _everything(caps: Capabilities) -> Capabilities:
    """The capabilities a probe assumes: the convention's, with every feature offered (the
    probe, not a guess, decides)."""
    return dataclasses.replace(
        caps, gqa=True, cross=True, bias=True, negative_scale=True, equal_head_dims=False,
        masks=None, dtypes=FLOAT_DTYPES, empty_rows=True,
    )  # fmt: skip


def _dtype_outcome(target: Target, dtype: str) -> Outcome:
    probe = Probe(f"dtype {dtype}", "dtypes", dtype, lambda t: _case(t))
    return _outcome(Variant(target, dtype), probe)


def _outcome(variant: Variant, probe: Probe) -> Outcome:
    case = probe.build(variant.dtype)
    why = variant.unsupported(case)
    if why is not None:
        return Outcome(probe, "not probed", why)
    (found,) = check_case(case, [variant], Options(grads=probe.grads, fast_reference=True))
    if found.status in ("ok", "known-upstream"):
        return Outcome(probe, "supported")
    if found.status == "skip" or found.detail.startswith(REFUSED):
        return Outcome(probe, "not supported", found.detail)
    if probe.key == "empty_rows" and _others_pass(variant, case):
        # the rows with keys are right, so the function defines a row with none otherwise
        # than SDPA's 0: a plain softmax's NaN (ONNX's, OpenVINO's), JAX's mean of V
        return Outcome(probe, "not supported", f"not 0 there: {found.detail}")
    return Outcome(probe, "fails", found.detail)


def _others_pass(variant: Variant, case: Case) -> bool:
    """Whether ``case`` with every row given its keys back passes: then only the rows with
    no allowed key failed."""
    full = {"kind": "dense", "allowed": np.ones((N, N), dtype=bool).tolist()}
    control = dataclasses.replace(case, mask=full, empty_rows="error")
    (found,) = check_case(control, [variant], Options(grads=False, fast_reference=True))
    return found.status in ("ok", "known-upstream")


def _dropout(variant: Variant) -> Outcome:
    probe = Probe("dropout", "dropout", "no", lambda t: _case(t, dropout_p=0.3, seed=0))
    if variant.target.caps.dropout not in (True, "own"):
        return Outcome(probe, "not probed", str(variant.target.caps.dropout))
    case = probe.build(variant.dtype)
    try:
        variant.run(case, variant.held(case), False)
    except Exception as error:
        return Outcome(probe, "not supported", f"{type(error).__name__}: {error}"[:300])
    return Outcome(probe, "supported", "its own keep-bits: judged by the dropout probe")
