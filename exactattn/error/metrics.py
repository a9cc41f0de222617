"""Error metrics of an approximation ``x̂`` against a reference ``x`` (float64 arrays): the one
module for both kinds.

**Normwise** (``exactattn check``'s report): ``relative_error = max |x̂ − x| / max |x|`` and
``ulps = max |x̂ − x| / ulp_F(max |x|)``, over finite entries (:func:`scale_of` is
``max |x|``).

**Elementwise** (the precision sweep's columns, :func:`error_metrics`):

* ``max_abs = max |x̂ − x|``;
* ``max_rel = max |x̂ − x| / |x|`` over the entries with ``x ≠ 0``;
* ``rmse = sqrt(mean (x̂ − x)²)`` (FlashAttention-3 §4.3 reports this);
* ``mean_ulp``, ``max_ulp``: ``|x̂ − x| / ulp_F(x)``, the error in units of the last place
  of the format ``F`` the configuration stores its results in (entries where ``ulp`` is
  undefined, ``x = 0`` in an unbounded format, are left out).
"""

from __future__ import annotations

import numpy as np

from ..backends.formats import Format, number_format

METRICS = ("max_abs", "max_rel", "rmse", "mean_ulp", "max_ulp")


def error_metrics(
    approx: np.ndarray, exact: np.ndarray, fmt: Format, exact_lo: np.ndarray | None = None
) -> dict[str, float]:
    """The five metrics of ``approx`` against ``exact`` (+ ``exact_lo``, a double-double tail)."""
    approx = np.asarray(approx, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    if approx.shape != exact.shape:
        raise ValueError(f"approx has shape {approx.shape} but exact has {exact.shape}")
    if approx.size == 0:
        return dict.fromkeys(METRICS, float("nan"))
    err = approx - exact  # exact when approx is close to exact (Sterbenz), then the tail
    err = np.abs(err if exact_lo is None else err - exact_lo)
    nonzero = exact != 0
    rel = err[nonzero] / np.abs(exact[nonzero])
    ulps = err / fmt.ulp(exact)
    ulps = ulps[np.isfinite(ulps)]
    return {
        "max_abs": float(err.max()),
        "max_rel": float(rel.max()) if rel.size else float("nan"),
        "rmse": float(np.sqrt(np.mean(err**2))),
        "mean_ulp": float(ulps.mean()) if ulps.size else float("nan"),
        "max_ulp": float(ulps.max()) if ulps.size else float("nan"),
    }


def deviation(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """``max |a − b|`` and ``rmse(a − b)``: tiled versus naive in the same arithmetic."""
    diff = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
    if diff.size == 0:
        return {"max_abs": float("nan"), "rmse": float("nan")}
    return {"max_abs": float(diff.max()), "rmse": float(np.sqrt(np.mean(diff**2)))}


def scale_of(x: np.ndarray) -> float:
    """``max |x|`` over finite entries (0 when there are none): the normwise error scale."""
    finite = np.abs(x[np.isfinite(x)])
    return float(finite.max()) if finite.size else 0.0


def relative_error(error: np.ndarray, ref: np.ndarray, fmt: str = "float64") -> float:
    """Normwise ``max |error| / max |ref|`` (finite entries); NaN when the reference is
    below ``fmt``'s normal range (an exact zero, e.g. dQ with one key: no scale to judge by)."""
    scale = scale_of(ref)
    e_min = number_format(fmt).e_min
    tiny = 2.0**e_min if e_min is not None else 0.0
    if not error.size or scale <= tiny:
        return float("nan")
    return float(np.max(error[np.isfinite(error)], initial=0.0)) / scale


def ulps(error: np.ndarray, ref: np.ndarray, fmt: str) -> float:
    """``max |error|`` in ulps of ``fmt`` at the output's scale ``max |ref|`` (normwise); NaN
    where there is no scale, or no spacing at it in float64 (a format without an exponent
    floor, such as ``p11``, at a scale of 1e-323 has a spacing below float64's range)."""
    scale = scale_of(ref)
    if not error.size or scale == 0:
        return float("nan")
    spacing = float(number_format(fmt).ulp(np.array([scale]))[0])
    if not spacing > 0:
        return float("nan")
    return float(np.max(error[np.isfinite(error)], initial=0.0)) / spacing


PAPER_METRICS = ("cossim", "rel_l1")


def paper_metrics(x: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """The low-bit papers' metrics of ``x`` against ``ref`` (SageAttention, arXiv:2410.02367
    §5: cosine similarity ``Σx·r / (‖x‖‖r‖)`` and relative L1 ``Σ|x − r| / Σ|r|`` over all
    entries; RMSE is :func:`error_metrics`' ``rmse``)."""
    x, r = np.asarray(x, dtype=np.float64).ravel(), np.asarray(ref, dtype=np.float64).ravel()
    norms = float(np.linalg.norm(x) * np.linalg.norm(r))
    total = float(np.abs(r).sum())
    return {
        "cossim": float(x @ r) / norms if norms else float("nan"),
        "rel_l1": float(np.abs(x - r).sum()) / total if total else float("nan"),
    }
