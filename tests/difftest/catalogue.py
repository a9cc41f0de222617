"""The bad-input catalogue as data: one :class:`Row` per class of bad input.

Each row names the class (its ``id`` is the first column of ``docs/bad_inputs.md``), the
public functions it applies to, how it spoils a good call, and the behaviour every one of
those functions must show: ``raises(ExceptionType, pattern)`` — a clear error whose message
names the argument — or ``works(check)`` — a correct result. Rows whose current behaviour is
a reported bug carry ``bug`` (the regression file); their tests are strict xfails until the
core is fixed, then they pass and the marker must go.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import mpmath
import numpy as np

import exactattn as ea
from exactattn.core import masks

FORWARD = ("attention", "naive_attention", "flash_attention", "self_attention", "torch.attention")
BACKWARD = ("attention_backward", "naive_attention_backward", "self_attention_backward")
ALL = FORWARD + BACKWARD
PAIRWISE = tuple(f for f in ALL if not f.startswith("self_"))  # take q, k, v separately
KEYWORDS = tuple(f for f in ALL if f != "flash_attention")  # accept every keyword
NUMPY = tuple(f for f in ALL if f != "torch.attention")  # inputs in NumPy arrays


@dataclass
class Args:
    """A call's arguments; ``y``, ``stats``, ``g`` matter only to the backward functions."""

    q: Any
    k: Any
    v: Any
    kw: dict[str, Any] = field(default_factory=dict)
    y: Any = None
    stats: Any = None
    g: Any = None

    def with_(self, **changes: Any) -> Args:
        return replace(self, **changes)

    def keyword(self, **kw: Any) -> Args:
        return replace(self, kw={**self.kw, **kw})


def good(n: int = 4, d: int = 3, v: int = 2, batch: tuple[int, ...] = (2,)) -> Args:
    """Well-formed float64 self-attention-compatible inputs (n_q = n_k, d = v for x)."""
    rng = np.random.default_rng(7)
    return Args(
        rng.standard_normal((*batch, n, d)),
        rng.standard_normal((*batch, n, d)),
        rng.standard_normal((*batch, n, v)),
    )


@dataclass(frozen=True)
class Raises:
    error: type[BaseException] | tuple[type[BaseException], ...]
    pattern: str


@dataclass(frozen=True)
class Works:
    check: Callable[[str, Args, Any], None]  # (function, args, result) -> assert


@dataclass(frozen=True)
class Row:
    id: str
    what: str
    functions: tuple[str, ...]
    spoil: Callable[[Args], Args]
    expect: Raises | Works
    bug: str | None = None  # a strict xfail until the reported bug is fixed
    behaviour: str = ""  # the docs column (derived from expect when empty)
    needs: tuple[str, ...] = ()  # optional packages the spoiled call needs (tests.optional)


# --- how each public function is called -------------------------------------------------
def _forward_of(name: str) -> Callable[..., Any]:
    return ea.naive_attention if name.startswith("naive") else ea.attention


def _backward_of(name: str) -> Callable[..., Any]:
    return ea.naive_attention_backward if name.startswith("naive") else ea.attention_backward


def _stats_for(name: str, a: Args) -> tuple[Any, Any]:
    """y and stats for a backward call: the forward of the same (spoiled) inputs when it
    runs, else of the good inputs (so the backward's own checks meet the bad argument)."""
    if a.y is not None:
        return a.y, a.stats
    fwd = _forward_of(name)
    kw = {key: val for key, val in a.kw.items() if key != "check_finite"}
    try:
        if name == "self_attention_backward":
            return ea.self_attention(a.q, return_stats=True, check_finite=False, **kw)
        return fwd(a.q, a.k, a.v, return_stats=True, check_finite=False, **kw)
    except Exception:
        g0 = good()
        if name == "self_attention_backward":
            return ea.self_attention(g0.q, return_stats=True)
        return fwd(g0.q, g0.k, g0.v, return_stats=True)


def _torch_tensor(x: Any) -> Any:
    import torch

    if isinstance(x, (np.ndarray, np.generic)) and x.dtype != object and x.dtype.kind != "U":
        return torch.from_numpy(np.array(x))
    return x


def call(name: str, a: Args) -> Any:
    """Invoke public function ``name`` on ``a``."""
    if name == "attention":
        return ea.attention(a.q, a.k, a.v, **a.kw)
    if name == "naive_attention":
        return ea.naive_attention(a.q, a.k, a.v, **a.kw)
    if name == "flash_attention":
        return ea.flash_attention(a.q, a.k, a.v, a.kw.get("block_size", 2), a.kw.get("mask"))
    if name == "self_attention":
        return ea.self_attention(a.q, **a.kw)
    if name == "torch.attention":
        import exactattn.torch as et

        kw = dict(a.kw)
        if isinstance(kw.get("mask"), np.ndarray):
            kw["mask"] = _torch_tensor(kw["mask"])
        return et.attention(_torch_tensor(a.q), _torch_tensor(a.k), _torch_tensor(a.v), **kw)
    y, stats = _stats_for(name, a)
    g = a.g if a.g is not None else np.ones_like(np.asarray(y, dtype=np.float64))
    if isinstance(y, np.ndarray) and y.dtype != object and g.dtype != y.dtype and a.g is None:
        g = g.astype(y.dtype)
    if a.g is None and isinstance(y, np.ndarray) and y.dtype == object:
        g = np.frompyfunc(lambda e: e * 0 + 1, 1, 1)(y)
    if name == "self_attention_backward":
        return ea.self_attention_backward(a.q, y, stats, g, **a.kw)
    return _backward_of(name)(a.q, a.k, a.v, y, stats, g, **a.kw)


# --- checks for rows that must work -------------------------------------------------------
def _outputs(result: Any) -> list[np.ndarray]:
    items = result if isinstance(result, tuple) else (result,)
    out = []
    for x in items:
        if hasattr(x, "detach"):
            x = x.detach().numpy()
        out.append(np.asarray(x, dtype=np.float64))
    return out


def _same_as(reference_args: Callable[[Args], Args]) -> Callable[[str, Args, Any], None]:
    """The result equals the function on equivalent well-formed inputs, within the float64
    rounding bound ``(n_k + d + 8)·u·(Σ|terms|)`` of either computation."""

    def check(name: str, a: Args, result: Any) -> None:
        expected = _outputs(call(name, reference_args(a)))
        got = _outputs(result)
        assert [x.shape for x in got] == [x.shape for x in expected]
        u = np.finfo(np.float64).eps / 2
        n = np.shape(a.k)[-2] + np.shape(a.q)[-1] + 8
        for x, e in zip(got, expected):
            scale = np.abs(e).max(initial=0.0) + 1.0
            assert np.all(np.abs(x - e) <= 2 * n * u * scale * 4), (name, np.abs(x - e).max())

    return check


def _broadcast_equals_repeat(name: str, a: Args, result: Any) -> None:
    """Shared k, v: y and dq as with explicitly repeated k, v; dk, dv their batch sums."""
    repeated = a.with_(k=np.repeat(a.k, 2, 0), v=np.repeat(a.v, 2, 0))
    expected = _outputs(call(name, repeated))
    if len(expected) == 3:
        expected[1:] = [x.sum(axis=0, keepdims=True) for x in expected[1:]]
    got = _outputs(result)
    u = np.finfo(np.float64).eps / 2
    for x, e in zip(got, expected):
        assert x.shape == e.shape
        assert np.all(np.abs(x - e) <= 16 * (4 + 3 + 8) * u * (np.abs(e).max() + 1))


def _finite_shapes(name: str, a: Args, result: Any) -> None:
    for x in _outputs(result):
        assert np.all(np.isfinite(x))


def _empty_shapes(name: str, a: Args, result: Any) -> None:
    outs = _outputs(result)
    assert all(np.all(np.isfinite(x)) for x in outs)
    assert any(x.size == 0 for x in outs) or all(np.all(x == 0) for x in outs[1:])


def _zeros_on_empty_rows(name: str, a: Args, result: Any) -> None:
    """Rows with no allowed key: y = 0; their dq = 0; nothing else is touched."""
    outs = _outputs(result)
    mask = a.kw["mask"]
    empty = ~np.asarray(mask).any(axis=-1)  # (batch, n_q)
    first = outs[0]
    assert np.all(np.isfinite(first))
    if name in FORWARD:
        assert np.all(first[empty] == 0)
    elif name != "self_attention_backward":
        assert np.all(first[empty] == 0)  # dq rows of the empty rows


def _all_zero_or_empty(name: str, a: Args, result: Any) -> None:
    for x in _outputs(result):
        assert np.all(x == 0)


def _uniform_average(name: str, a: Args, result: Any) -> None:
    """scale = 0: every score is 0, so Y_i is the plain mean of the values."""
    if name in FORWARD:
        y = _outputs(result)[0]
        v = a.q if name == "self_attention" else a.v
        mean = np.broadcast_to(np.asarray(v).mean(axis=-2, keepdims=True), y.shape)
        n = np.asarray(v).shape[-2]
        assert np.allclose(y, mean, rtol=0, atol=4 * (n + 2) * 2**-53 * np.abs(v).max())
    else:
        _finite_shapes(name, a, result)


def _nonfinite_propagates(name: str, a: Args, result: Any) -> None:
    """check_finite=False: the caller opted out; a NaN/inf input may give NaN/inf, and does."""
    assert any(not np.all(np.isfinite(x)) for x in _outputs(result))


def _as_given(name: str, a: Args, result: Any) -> None:
    _finite_shapes(name, a, result)


# --- spoilers -----------------------------------------------------------------------------
def _set(name: str, index: tuple, value: float) -> Callable[[Args], Args]:
    def spoil(a: Args) -> Args:
        x = getattr(a, name).copy()
        x[index] = value
        return a.with_(**{name: x})

    return spoil


def _dtype(dtype: Any) -> Callable[[Args], Args]:
    return lambda a: a.with_(q=a.q.astype(dtype), k=a.k.astype(dtype), v=a.v.astype(dtype))


def _empty_row_mask(a: Args) -> np.ndarray:
    m = np.ones((*a.q.shape[:-2], a.q.shape[-2], a.k.shape[-2]), dtype=bool)
    m[..., 1, :] = False
    return m


def _strided(a: Args) -> Args:
    def view(x: np.ndarray) -> np.ndarray:
        return np.repeat(x, 2, axis=-2)[..., ::2, :]

    return a.with_(q=view(a.q), k=view(a.k), v=view(a.v))


def _reversed(a: Args) -> Args:
    return a.with_(q=a.q[..., ::-1, ::-1], k=a.k[..., ::-1, ::-1], v=a.v[..., ::-1, :])


def _contiguous(a: Args) -> Args:
    return a.with_(
        q=np.ascontiguousarray(a.q), k=np.ascontiguousarray(a.k), v=np.ascontiguousarray(a.v)
    )


def _torch_views(a: Args) -> Args:
    import torch

    def view(x: np.ndarray) -> Any:
        wide = torch.from_numpy(np.repeat(x, 2, axis=-1).swapaxes(-1, -2).copy())
        return wide.transpose(-1, -2)[..., ::2]

    return a.with_(q=view(a.q), k=view(a.k), v=view(a.v))


def _torch_contiguous(a: Args) -> Args:
    return a.with_(q=a.q.contiguous(), k=a.k.contiguous(), v=a.v.contiguous())


def _fortran(a: Args) -> Args:
    return a.with_(q=np.asfortranarray(a.q), k=np.asfortranarray(a.k), v=np.asfortranarray(a.v))


def _broadcast_view(a: Args) -> Args:
    shape = a.q.shape
    return a.with_(
        q=np.broadcast_to(a.q[:1], shape),
        k=np.broadcast_to(a.k[:1], shape),
        v=np.broadcast_to(a.v[:1], a.v.shape),
    )


def _object(kind: Callable[[Any], Any]) -> Callable[[Args], Args]:
    f = np.frompyfunc(kind, 1, 1)
    return lambda a: a.with_(
        q=f(a.q).astype(object), k=f(a.k).astype(object), v=f(a.v).astype(object)
    )


def _fp16_overflowing_scores(a: Args) -> Args:
    """One query, two keys whose scores c·q·k = −90000, −89700 overflow float16 to −inf."""
    return Args(
        np.array([[1.0]], np.float16),
        np.array([[-300.0], [-299.0]], np.float16),
        np.array([[1.0], [2.0]], np.float16),
        {"scale": 300.0},
    )


def _empty_result(name: str, a: Args, result: Any) -> None:
    """No query row: an empty y of shape (0, v)."""
    assert np.shape(_outputs(result)[0]) == (0, 2)


def _stats_replace(**fields: Callable[[Any], Any]) -> Callable[[Args], Args]:
    def spoil(a: Args) -> Args:
        y, stats = ea.attention(a.q, a.k, a.v, return_stats=True)
        changed = {key: fn(getattr(stats, key)) for key, fn in fields.items()}
        return a.with_(y=y, stats=dataclasses.replace(stats, **changed))

    return spoil


def _with_nan(x: np.ndarray, value: float = np.nan) -> np.ndarray:
    x = np.array(x, dtype=np.float64, copy=True)
    x.flat[0] = value
    return x


def _torch_inputs_numpy_mask(a: Args) -> Args:
    import torch

    return a.with_(
        q=torch.from_numpy(a.q),
        k=torch.from_numpy(a.k),
        v=torch.from_numpy(a.v),
        kw={"mask": np.tril(np.ones((a.q.shape[-2], a.k.shape[-2]), dtype=bool))},
    )


def _torch_predicate_numpy(a: Args) -> Args:
    import torch

    n_q, n_k = a.q.shape[-2], a.k.shape[-2]
    return a.with_(
        q=torch.from_numpy(a.q),
        k=torch.from_numpy(a.k),
        v=torch.from_numpy(a.v),
        kw={"mask": lambda i, j: np.ones((n_q, n_k), dtype=bool)},
    )


def _causal_same(a: Args) -> Args:
    return a.with_(kw={"mask": masks.causal()})


B1 = "tests/regressions/overflow_as_masked.py"
B2 = "tests/regressions/mask_of_another_array_system.py"
B2P = "tests/regressions/predicate_of_another_array_system.py"
B3 = "tests/regressions/stats_not_validated.py"
B4 = "tests/regressions/empty_object_arrays.py"
B5 = "tests/regressions/numpy_scalar_dropout_and_seed.py"
B6 = "tests/regressions/complex_sympy_entries.py"

ROWS: list[Row] = [
    # --- shapes -----------------------------------------------------------------------
    Row(
        "ndim-1d",
        "q (x) with ndim 1",
        ALL,
        lambda a: a.with_(q=a.q[0, 0]),
        Raises(ValueError, r"\bq must have shape \(\.\.\., n, features\)"),
    ),
    Row(
        "ndim-0d",
        "q (x) a 0-d scalar",
        ALL,
        lambda a: a.with_(q=np.float64(1.0)),
        Raises(ValueError, r"\bq must have shape"),
    ),
    Row(
        "ndim-k",
        "k or v with ndim 1",
        PAIRWISE,
        lambda a: a.with_(k=a.k[0, 0]),
        Raises(ValueError, r"\bk must have shape"),
    ),
    Row(
        "mismatch-d",
        "q and k disagree on d",
        PAIRWISE,
        lambda a: a.with_(k=a.k[..., :2]),
        Raises(ValueError, r"q and k must share the head dim d.*k \(2, 4, 2\)"),
    ),
    Row(
        "mismatch-nk",
        "k and v disagree on n_k",
        PAIRWISE,
        lambda a: a.with_(v=a.v[..., :3, :]),
        Raises(ValueError, r"k and v must have the same number of keys n_k.*v \(2, 3, 2\)"),
    ),
    Row(
        "mismatch-batch",
        "leading dims that do not broadcast",
        PAIRWISE,
        lambda a: a.with_(k=np.concatenate([a.k, a.k[:1]]), v=np.concatenate([a.v, a.v[:1]])),
        Raises(ValueError, r"leading \(batch/head\) dims do not broadcast"),
    ),
    Row(
        "broadcast-batch",
        "leading dims that broadcast (k, v shared over the batch)",
        PAIRWISE,
        lambda a: a.with_(k=a.k[:1], v=a.v[:1]),
        Works(_broadcast_equals_repeat),
        behaviour="works; equals the explicitly repeated inputs (dk, dv summed over the batch)",
    ),
    Row(
        "zero-nq",
        "n_q = 0 (no queries)",
        PAIRWISE,
        lambda a: a.with_(q=a.q[..., :0, :]),
        Works(_empty_shapes),
        behaviour="works: y of shape (..., 0, v); dk = dv = 0",
    ),
    Row(
        "zero-nk",
        "n_k = 0 (no keys)",
        FORWARD[:3] + FORWARD[4:],
        lambda a: a.with_(k=a.k[..., :0, :], v=a.v[..., :0, :]),
        Raises(ValueError, r"no allowed key.*empty_rows='zero'"),
        behaviour="ValueError: every row has an empty allowed set (names the rows); the "
        "backward is not reached (see stats-other-call)",
    ),
    Row(
        "zero-nk-opt-in",
        "n_k = 0 with empty_rows='zero'",
        tuple(f for f in PAIRWISE if f != "flash_attention"),
        lambda a: a.with_(k=a.k[..., :0, :], v=a.v[..., :0, :]).keyword(empty_rows="zero"),
        Works(_all_zero_or_empty),
        behaviour="works: y = 0, dq = 0, dk, dv empty",
    ),
    Row(
        "zero-d",
        "d = 0",
        ALL,
        lambda a: a.with_(q=a.q[..., :0], k=a.k[..., :0]),
        Raises(ValueError, r"head dim d must be >= 1"),
    ),
    Row(
        "zero-v",
        "value width v = 0",
        PAIRWISE,
        lambda a: a.with_(v=a.v[..., :0]),
        Works(_empty_shapes),
        behaviour="works: y of shape (..., n_q, 0), dq = dk = 0",
    ),
    Row(
        "zero-batch",
        "a batch dimension of length 0",
        ALL,
        lambda a: a.with_(q=a.q[:0], k=a.k[:0], v=a.v[:0]),
        Works(_empty_shapes),
        behaviour="works: empty results",
    ),
    # --- block size -----------------------------------------------------------------------
    Row(
        "block-zero",
        "block_size = 0",
        ALL,
        lambda a: a.keyword(block_size=0),
        Raises(ValueError, r"block_size must be a positive integer; got 0"),
    ),
    Row(
        "block-negative",
        "block_size < 0",
        ALL,
        lambda a: a.keyword(block_size=-2),
        Raises(ValueError, r"block_size must be a positive integer; got -2"),
    ),
    Row(
        "block-float",
        "block_size a float (2.0)",
        ALL,
        lambda a: a.keyword(block_size=2.0),
        Raises(TypeError, r"block_size must be a positive integer; got 2\.0"),
    ),
    Row(
        "block-bool",
        "block_size True",
        ALL,
        lambda a: a.keyword(block_size=True),
        Raises(TypeError, r"block_size must be a positive integer; got True"),
    ),
    Row(
        "block-str",
        "block_size '2'",
        ALL,
        lambda a: a.keyword(block_size="2"),
        Raises(TypeError, r"block_size must be a positive integer; got '2'"),
    ),
    Row(
        "block-numpy-int",
        "block_size a NumPy integer",
        ALL,
        lambda a: a.keyword(block_size=np.int32(3)),
        Works(_same_as(lambda a: a.keyword(block_size=3))),
        behaviour="works",
    ),
    Row(
        "block-beyond-nk",
        "block_size far beyond n_k",
        ALL,
        lambda a: a.keyword(block_size=10**6),
        Works(_same_as(lambda a: a.keyword(block_size=1))),
        behaviour="works; same as b = 1",
    ),
    # --- non-finite values ------------------------------------------------------------------
    Row(
        "nonfinite-q",
        "NaN in q (x)",
        ALL,
        _set("q", (0, 1, 1), np.nan),
        Raises(ValueError, r"\bq contains NaN or inf \(first at indices \[\[0, 1, 1\]\]\)"),
    ),
    Row(
        "nonfinite-k",
        "+inf in k",
        PAIRWISE,
        _set("k", (1, 2, 0), np.inf),
        Raises(ValueError, r"\bk contains NaN or inf \(first at indices \[\[1, 2, 0\]\]\)"),
    ),
    Row(
        "nonfinite-v",
        "-inf in v",
        PAIRWISE,
        _set("v", (0, 0, 1), -np.inf),
        Raises(ValueError, r"\bv contains NaN or inf"),
    ),
    Row(
        "nonfinite-y",
        "NaN in y (backward)",
        BACKWARD,
        lambda a: _y_nan(a),
        Raises(ValueError, r"\by contains NaN or inf"),
    ),
    Row(
        "nonfinite-grad_y",
        "inf in grad_y (backward)",
        BACKWARD,
        lambda a: _g_inf(a),
        Raises(ValueError, r"grad_y contains NaN or inf"),
    ),
    Row(
        "nonfinite-stats",
        "NaN or +inf in stats.m / stats.l (backward)",
        ("attention_backward", "naive_attention_backward"),
        _stats_replace(l=lambda x: _with_nan(x)),
        Raises(ValueError, r"stats\.l"),
    ),
    Row(
        "stats-inconsistent",
        "stats.m = +inf (a tampered forward statistic)",
        ("attention_backward", "naive_attention_backward"),
        _stats_replace(m=lambda x: np.full_like(x, np.inf)),
        Raises(ValueError, r"stats\.m"),
    ),
    Row(
        "nonfinite-opt-out",
        "inf in q (x) with check_finite=False",
        tuple(f for f in KEYWORDS if f != "torch.attention"),
        lambda a: _set("q", (0, 0, 0), np.inf)(a).keyword(check_finite=False),
        Works(_nonfinite_propagates),
        behaviour="computes anyway (the caller opted out): NaN/inf where the input had them",
    ),
    Row(
        "nonfinite-opt-out-torch",
        "inf in q with check_finite=False",
        ("torch.attention",),
        lambda a: _set("q", (0, 0, 0), np.inf)(a).keyword(check_finite=False),
        Works(_nonfinite_propagates),
        behaviour="as nonfinite-opt-out (a bug here was fixed during this work: "
        "tests/regressions/torch_check_finite_opt_out.py)",
    ),
    Row(
        "overflow-fp16",
        "float16 scores beyond its range (c·q·k = −9e4)",
        ("attention", "naive_attention"),
        _fp16_overflowing_scores,
        Raises(FloatingPointError, r"overflowed in numpy\[float16\]"),
        behaviour="FloatingPointError naming the overflowed rows (scores of -inf from "
        "finite inputs are told apart from masked keys by the mask), never 'no allowed key'",
    ),
    # --- number systems and types ---------------------------------------------------------
    Row(
        "mixed-systems",
        "NumPy q with a torch k",
        PAIRWISE[:2] + BACKWARD[:2],
        lambda a: a.with_(k=_torch_tensor(a.k)),
        Raises(TypeError, r"inputs mix number systems \(q: numpy, k: torch"),
        needs=("torch",),
    ),
    Row(
        "mixed-mpmath",
        "NumPy q with mpf k",
        PAIRWISE[:2] + BACKWARD[:2],
        lambda a: a.with_(k=np.frompyfunc(mpmath.mpf, 1, 1)(a.k)),
        Raises(TypeError, r"inputs mix number systems \(q: numpy, k: mpmath"),
    ),
    Row(
        "mixed-dtypes",
        "float32 q with float64 k, v",
        (*ALL[:3], "torch.attention", *BACKWARD[:2]),
        lambda a: a.with_(q=a.q.astype(np.float32)),
        Raises(TypeError, r"mix dtypes|must share one dtype"),
    ),
    Row(
        "mixed-elements",
        "an object array mixing mpf and float",
        NUMPY,
        lambda a: a.with_(q=_mixed_objects(a.q), k=_mixed_objects(a.k), v=_mixed_objects(a.v)),
        Raises(TypeError, r"object array mixes element types \['float', 'mpmath'\]"),
    ),
    Row(
        "mask-other-system",
        "torch inputs with a NumPy dense mask",
        ("attention",),
        _torch_inputs_numpy_mask,
        Works(_same_as(_causal_same)),
        behaviour="works: the mask adopts the inputs' array system (fixed during this work; "
        "regression: tests/regressions/mask_of_another_array_system.py)",
        needs=("torch",),
    ),
    Row(
        "dtype-int",
        "integer arrays",
        ALL,
        _dtype(np.int64),
        Raises(TypeError, r"\bq has dtype int64|dtype must be one of .*int64"),
    ),
    Row(
        "dtype-bool",
        "boolean arrays",
        ALL,
        _dtype(np.bool_),
        Raises(TypeError, r"\bq has dtype bool|dtype must be one of .*bool"),
    ),
    Row(
        "dtype-complex",
        "complex arrays",
        ALL,
        _dtype(np.complex128),
        Raises(TypeError, r"\bq has dtype complex128|dtype must be one of .*complex128"),
    ),
    Row("dtype-str", "string arrays", NUMPY, _dtype(str), Raises(TypeError, r"\bq has dtype <U")),
    Row(
        "object-floats",
        "object arrays of Python floats",
        NUMPY,
        _object(float),
        Raises(TypeError, r"\bq is an object array of float"),
    ),
    Row(
        "object-str",
        "object arrays of strings",
        NUMPY,
        _object(str),
        Raises(TypeError, r"\bq is an object array of str"),
    ),
    Row(
        "object-empty",
        "empty object arrays",
        ("attention", "naive_attention"),
        lambda a: a.with_(
            q=np.empty((0, 3), object), k=np.empty((0, 3), object), v=np.empty((0, 2), object)
        ),
        Works(_empty_result),
        behaviour="an empty result in float64 (an empty object array holds no number "
        "to choose a system from)",
    ),
    Row(
        "object-complex-sympy",
        "sympy entries that are not real (I)",
        ("attention",),
        lambda a: _sympy_complex(),
        Raises(TypeError, r"\bq\b.*real"),
    ),
    Row(
        "none",
        "None for q",
        ALL,
        lambda a: a.with_(q=None),
        Raises(TypeError, r"\bq must be (an array|a torch\.Tensor)"),
    ),
    Row(
        "nested-lists",
        "nested lists instead of arrays",
        NUMPY,
        lambda a: a.with_(q=a.q.tolist(), k=a.k.tolist(), v=a.v.tolist()),
        Works(_same_as(lambda a: a.with_(q=np.asarray(a.q), k=np.asarray(a.k), v=np.asarray(a.v)))),
        behaviour="works (converted as np.asarray would)",
    ),
    # --- layouts that must work ---------------------------------------------------------------
    Row(
        "strided-view",
        "strided views (x[..., ::2, :])",
        NUMPY,
        _strided,
        Works(_same_as(_contiguous)),
        behaviour="works; same result as a contiguous copy",
    ),
    Row(
        "negative-strides",
        "negative strides (x[..., ::-1, :])",
        NUMPY,
        _reversed,
        Works(_same_as(_contiguous)),
        behaviour="works; same result as a contiguous copy",
    ),
    Row(
        "fortran-order",
        "Fortran-ordered (transposed) arrays",
        NUMPY,
        _fortran,
        Works(_same_as(_contiguous)),
        behaviour="works; same result as a contiguous copy",
    ),
    Row(
        "zero-stride",
        "broadcast_to views (stride 0)",
        NUMPY,
        _broadcast_view,
        Works(_same_as(_contiguous)),
        behaviour="works; same result as a contiguous copy",
    ),
    Row(
        "torch-noncontiguous",
        "non-contiguous torch tensors (transposed and sliced views)",
        ("attention", "naive_attention", "torch.attention"),
        _torch_views,
        Works(_same_as(_torch_contiguous)),
        behaviour="works; same result as contiguous tensors",
        needs=("torch",),
    ),
    # --- masks ----------------------------------------------------------------------------------
    Row(
        "empty-row",
        "a mask row with no allowed key",
        FORWARD,
        lambda a: a.keyword(mask=_empty_row_mask(a)),
        Raises(ValueError, r"query rows with no allowed key .*\[\[0, 1\], \[1, 1\]\]"),
        behaviour="ValueError naming the rows (*batch, i) and the opt-in; the backward is "
        "not reached (its stats come from the forward)",
    ),
    Row(
        "empty-row-opt-in",
        "a mask row with no allowed key, empty_rows='zero'",
        KEYWORDS,
        lambda a: a.keyword(mask=_empty_row_mask(a), empty_rows="zero"),
        Works(_zeros_on_empty_rows),
        behaviour="works: y = 0 and dq = 0 on that row",
    ),
    Row(
        "mask-shape",
        "a dense mask of the wrong shape",
        ALL,
        lambda a: a.keyword(mask=np.ones((4, 5), dtype=bool)),
        Raises(ValueError, r"mask has shape \(4, 5\), which does not broadcast"),
    ),
    Row(
        "mask-dtype",
        "a dense mask that is not boolean",
        ALL,
        lambda a: a.keyword(mask=np.ones((4, 4))),
        Raises(TypeError, r"dense mask must be boolean"),
    ),
    Row(
        "mask-ndim",
        "a 1-D dense mask",
        ALL,
        lambda a: a.keyword(mask=np.ones(4, dtype=bool)),
        Raises(ValueError, r"dense mask needs at least 2 dims"),
    ),
    Row(
        "predicate-other-system",
        "a predicate returning NumPy booleans for torch index tensors",
        ("attention",),
        _torch_predicate_numpy,
        Raises(TypeError, r"mask predicate"),
        needs=("torch",),
    ),
    Row(
        "mask-type",
        "a mask that is neither array, Mask nor callable",
        ALL,
        lambda a: a.keyword(mask="causal"),
        Raises(TypeError, r"mask must be None, an exactattn"),
    ),
    Row(
        "predicate-shape",
        "a predicate returning the wrong shape",
        NUMPY,
        lambda a: a.keyword(mask=lambda i, j: np.ones((3, 3), dtype=bool)),
        Raises(ValueError, r"mask predicate returned shape \(3, 3\)"),
    ),
    Row(
        "predicate-dtype",
        "a predicate returning integers",
        NUMPY,
        lambda a: a.keyword(mask=lambda i, j: (i >= j).astype(np.int64)),
        Raises(TypeError, r"mask predicate must return a boolean array; got dtype int64"),
    ),
    Row(
        "predicate-none",
        "a predicate returning None",
        NUMPY,
        lambda a: a.keyword(mask=lambda i, j: None),
        Raises(TypeError, r"mask predicate must return a boolean array; got dtype NoneType"),
    ),
    Row(
        "padding-negative",
        "key_padding lengths < 0",
        ("attention",),
        lambda a: a.keyword(mask=masks.key_padding([-1, 2])),
        Raises(ValueError, r"key_padding lengths must be >= 0"),
        behaviour="ValueError from masks.key_padding (before any call)",
    ),
    Row(
        "padding-float",
        "key_padding lengths not integers",
        ("attention",),
        lambda a: a.keyword(mask=masks.key_padding([1.5, 2])),
        Raises(TypeError, r"key_padding lengths must be integers; got dtype float64"),
        behaviour="TypeError from masks.key_padding (before any call)",
    ),
    Row(
        "padding-shape",
        "key_padding lengths not matching the batch",
        ALL,
        lambda a: a.keyword(mask=masks.key_padding([1, 2, 3])),
        Raises(ValueError, r"key_padding lengths have shape \(3,\)"),
    ),
    # --- dropout --------------------------------------------------------------------------------
    Row(
        "dropout-negative",
        "dropout_p < 0",
        KEYWORDS,
        lambda a: a.keyword(dropout_p=-0.1, seed=1),
        Raises(ValueError, r"dropout_p must be a number in \[0, 1\); got -0\.1"),
    ),
    Row(
        "dropout-one",
        "dropout_p >= 1",
        KEYWORDS,
        lambda a: a.keyword(dropout_p=1.0, seed=1),
        Raises(ValueError, r"dropout_p must be a number in \[0, 1\); got 1\.0"),
    ),
    Row(
        "dropout-nan",
        "dropout_p NaN",
        KEYWORDS,
        lambda a: a.keyword(dropout_p=np.nan, seed=1),
        Raises(ValueError, r"dropout_p must be a number in \[0, 1\); got nan"),
    ),
    Row(
        "dropout-bool",
        "dropout_p True",
        KEYWORDS,
        lambda a: a.keyword(dropout_p=True, seed=1),
        Raises(ValueError, r"dropout_p must be a number in \[0, 1\); got True"),
    ),
    Row(
        "dropout-no-seed",
        "dropout_p > 0 without a seed",
        KEYWORDS,
        lambda a: a.keyword(dropout_p=0.1),
        Raises(ValueError, r"dropout_p > 0 needs seed="),
    ),
    Row(
        "dropout-bad-seed",
        "a negative or float seed",
        KEYWORDS,
        lambda a: a.keyword(dropout_p=0.1, seed=-1),
        Raises(ValueError, r"seed must be an integer in \[0, 2\*\*64\); got -1"),
    ),
    Row(
        "dropout-numpy-scalars",
        "dropout_p and seed as NumPy scalars",
        KEYWORDS,
        lambda a: a.keyword(dropout_p=np.float32(0.25), seed=np.int64(3)),
        Works(_same_as(lambda a: a.keyword(dropout_p=float(np.float32(0.25)), seed=3))),
        behaviour="works like the Python numbers",
    ),
    # --- scale and keywords ----------------------------------------------------------------------
    Row(
        "scale-nonfinite",
        "scale NaN or inf",
        KEYWORDS,
        lambda a: a.keyword(scale=np.inf),
        Raises(ValueError, r"scale must be finite; got inf"),
    ),
    Row(
        "scale-type",
        "scale a bool, string or complex",
        KEYWORDS,
        lambda a: a.keyword(scale=1j),
        Raises(TypeError, r"scale must be a real number"),
    ),
    Row(
        "scale-zero",
        "scale = 0",
        KEYWORDS,
        lambda a: a.keyword(scale=0.0),
        Works(_uniform_average),
        behaviour="works: y is the mean of the allowed values",
    ),
    Row(
        "empty-rows-policy",
        "empty_rows not 'error' or 'zero'",
        KEYWORDS,
        lambda a: a.keyword(empty_rows="nan"),
        Raises(ValueError, r"empty_rows must be one of"),
    ),
    Row(
        "backend-name",
        "an unknown backend name",
        NUMPY[:2] + BACKWARD,
        lambda a: a.keyword(backend="cuda"),
        Raises(ValueError, r"backend must be .*got 'cuda'"),
    ),
    Row(
        "unknown-keyword",
        "a misspelt keyword",
        KEYWORDS,
        lambda a: a.keyword(blocksize=2),
        Raises(TypeError, r"blocksize"),
    ),
    # --- backward-only arguments ----------------------------------------------------------------
    Row(
        "stats-type",
        "stats not a Stats",
        BACKWARD[:2],
        lambda a: a.with_(y=ea.attention(a.q, a.k, a.v), stats=(0, 0)),
        Raises(TypeError, r"stats must be the Stats returned by the forward"),
    ),
    Row(
        "stats-other-call",
        "stats of another call (other n_q)",
        BACKWARD[:2],
        lambda a: a.with_(
            y=ea.attention(a.q, a.k, a.v),
            stats=ea.attention(a.q[:, :2], a.k, a.v, return_stats=True)[1],
        ),
        Raises(ValueError, r"stats\.m must have shape \(2, 4\); got \(2, 2\)"),
    ),
    Row(
        "y-shape",
        "y of the wrong shape",
        BACKWARD[:2],
        lambda a: _y_other_shape(a),
        Raises(ValueError, r"\by must have shape \(2, 4, 2\)"),
    ),
    Row(
        "grad_y-shape",
        "grad_y of the wrong shape",
        BACKWARD,
        lambda a: a.with_(g=np.ones((2, 4, 1))),
        Raises(ValueError, r"grad_y must have shape"),
    ),
    Row(
        "grad_y-dtype",
        "grad_y integer",
        BACKWARD,
        lambda a: a.with_(g=np.ones((2, 4, 2), dtype=np.int64)),
        Raises(TypeError, r"grad_y has dtype int64"),
    ),
]


def _y_nan(a: Args) -> Args:
    y, stats = ea.attention(a.q, a.k, a.v, return_stats=True)
    return a.with_(y=_with_nan(y), stats=stats)


def _g_inf(a: Args) -> Args:
    g = np.ones((*a.q.shape[:-1], a.v.shape[-1]))
    return a.with_(g=_with_nan(g, np.inf))


def _y_other_shape(a: Args) -> Args:
    y, stats = ea.attention(a.q, a.k, a.v, return_stats=True)
    return a.with_(y=y[:, :, :1], stats=stats)


def _mixed_objects(x: np.ndarray) -> np.ndarray:
    out = np.frompyfunc(mpmath.mpf, 1, 1)(x).astype(object)
    out.flat[0] = float(x.flat[0])
    return out


def _sympy_complex() -> Args:
    import sympy

    one = np.array([[sympy.Integer(1)]], dtype=object)
    return Args(np.array([[sympy.I]], dtype=object), one, one.copy())


def applicable() -> list[tuple[Row, str]]:
    return [(row, name) for row in ROWS for name in row.functions]
