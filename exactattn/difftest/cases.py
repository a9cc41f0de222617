"""One differential-test case: sizes, inputs, keywords; self-contained and JSON round-trippable.

A :class:`Case` holds everything a run needs (the float64 inputs ``q, k, v`` and the upstream
gradient ``G``, block size ``b``, scale ``c``, the mask as data, dropout rate and seed, the
empty-row policy), so a failure written with :meth:`Case.to_json` replays on any machine.
:func:`build_case` turns a small description (sizes, an input distribution, a data seed) into
a Case; hypothesis draws and shrinks the description, not the array entries.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .. import masks

DISTRIBUTIONS = ("normal", "outliers", "large_logits", "tiny", "uniform_int")
MASK_KINDS = ("none", "causal", "causal_br", "window", "padding", "dense", "dense_empty")


@dataclass(frozen=True)
class Spec:
    """What hypothesis draws: sizes, keywords and how to fill the arrays."""

    batch: tuple[int, ...]
    n_q: int
    n_k: int
    d: int
    v: int
    block_size: int
    distribution: str = "normal"
    logit: float = 0.0  # target max |s_ij| for "large_logits" (sets the scale c)
    explicit_scale: bool = False
    mask: str = "none"
    window: tuple[int, int] = (1, 0)
    dropout_p: float = 0.0
    seed: int = 0
    data_seed: int = 0


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

    # --- derived --------------------------------------------------------------------
    @property
    def batch(self) -> tuple[int, ...]:
        return tuple(self.q.shape[:-2])

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

    def mask_object(self, like: Any = None) -> Any:
        """The mask as an exactattn mask (``like``: a torch tensor to put lengths on)."""
        spec = self.mask
        kind = spec["kind"]
        if kind == "none":
            return None
        if kind in ("causal", "causal_br"):
            return masks.causal("top-left" if kind == "causal" else "bottom-right")
        if kind == "window":
            return masks.sliding_window(spec["left"], spec["right"])
        if kind == "padding":
            lengths = np.asarray(spec["lengths"], dtype=np.int64)
            if like is not None:
                lengths = like.new_tensor(lengths, dtype=_torch().int64)
            return masks.key_padding(lengths)
        if kind == "dense":
            allowed = self.allowed()
            if like is not None:
                allowed = _torch().from_numpy(allowed.copy()).to(like.device)
            return masks.dense(allowed)
        raise ValueError(f"unknown mask kind {kind!r} in case")

    def allowed(self) -> np.ndarray:
        """The allowed set as a dense (*batch, n_q, n_k) boolean array (for the tolerance)."""
        n_q, n_k = self.q.shape[-2], self.k.shape[-2]
        spec, batch = self.mask, self.batch
        if spec["kind"] == "dense":
            return np.broadcast_to(np.asarray(spec["allowed"], dtype=bool), (*batch, n_q, n_k))
        mask = self.mask_object()
        if mask is None:
            return np.ones((*batch, n_q, n_k), dtype=bool)
        return masks.create_mask(mask, masks.Geometry(n_q, n_k, batch))

    def keywords(self) -> dict[str, Any]:
        """Keywords for :func:`exactattn.attention` (mask left to the caller)."""
        out: dict[str, Any] = {"block_size": self.block_size, "empty_rows": self.empty_rows}
        if self.scale is not None:
            out["scale"] = self.scale
        if self.dropout_p:
            out.update(dropout_p=self.dropout_p, seed=self.seed)
        return out

    # --- files ------------------------------------------------------------------------
    def to_json(self) -> str:
        data = asdict(self)
        for name in ("q", "k", "v", "g"):
            data[name] = getattr(self, name).tolist()
        data["shape"] = {name: list(getattr(self, name).shape) for name in ("q", "k", "v", "g")}
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Case:
        data = json.loads(text)
        shapes = data.pop("shape")
        for name in ("q", "k", "v", "g"):
            data[name] = np.asarray(data[name], dtype=np.float64).reshape(shapes[name])
        data.pop("expect", None)
        return cls(**data)


def _torch() -> Any:
    import torch

    return torch


def _fill(rng: np.random.Generator, shape: tuple[int, ...], distribution: str) -> np.ndarray:
    if distribution == "outliers":  # FlashAttention-3: N(0,1) + N(0,100)·Bernoulli(0.001)
        spikes = rng.random(shape) < 0.05  # denser than 0.001 so small cases contain one
        return rng.standard_normal(shape) + 10 * rng.standard_normal(shape) * spikes
    if distribution == "tiny":
        return rng.standard_normal(shape) * 1e-6
    if distribution == "uniform_int":
        return rng.integers(-3, 4, size=shape).astype(np.float64)
    return rng.standard_normal(shape)


def build_case(spec: Spec) -> Case:
    """Fill a :class:`Spec` with arrays drawn from ``spec.data_seed``."""
    rng = np.random.default_rng(spec.data_seed)
    b = spec.batch
    dist = spec.distribution
    q = _fill(rng, (*b, spec.n_q, spec.d), dist)
    k = _fill(rng, (*b, spec.n_k, spec.d), dist)
    v = _fill(rng, (*b, spec.n_k, spec.v), "normal" if dist == "tiny" else dist)
    g = _fill(rng, (*b, spec.n_q, spec.v), "uniform_int" if dist == "uniform_int" else "normal")
    scale = None
    if dist == "large_logits":
        raw = np.abs(q @ np.swapaxes(k, -1, -2)).max()
        scale = float(spec.logit / raw) if raw > 0 else 1.0
    elif spec.explicit_scale:
        scale = float(rng.choice([0.5, 2.0, -1.0, 1 / 3]))
    mask: dict[str, Any] = {"kind": spec.mask}
    empty_rows = "error"
    if spec.mask == "window":
        mask.update(left=spec.window[0], right=spec.window[1])
    elif spec.mask == "padding":
        lengths = rng.integers(1, spec.n_k + 1, size=b[:1])  # one per batch element
        mask["lengths"] = np.asarray(lengths).tolist()
    elif spec.mask in ("dense", "dense_empty"):
        allowed = rng.random((*b, spec.n_q, spec.n_k)) < 0.6
        if spec.mask == "dense":
            allowed[..., rng.integers(0, spec.n_k)] = True  # every row nonempty
        else:
            allowed[..., 0, :] = False  # row 0 empty: exercises empty_rows='zero'
            empty_rows = "zero"
        mask = {"kind": "dense", "allowed": allowed.tolist()}
    if spec.mask in ("causal", "causal_br", "window"):
        case = Case(q, k, v, g, spec.block_size, scale, mask)
        if not case.allowed().any(axis=-1).all():
            # bottom-right alignment with n_q > n_k (or a narrow window) leaves rows with
            # no allowed key: the opt-in convention is then what is under test.
            empty_rows = "zero"
    dropout = spec.dropout_p
    return Case(
        q,
        k,
        v,
        g,
        spec.block_size,
        scale,
        mask,
        dropout_p=dropout,
        seed=spec.seed if dropout else None,
        empty_rows=empty_rows,
    )
