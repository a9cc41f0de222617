"""The torch path's planning: independent heads run as pieces, on worker threads when torch
has several, with tile shapes chosen per pass and per mask — and none of it changes a result.

The expected values are naive attention written from the definition in float64 (scores,
the mask as −∞, softmax, its torch autograd), never the code under test.
"""

from __future__ import annotations

import math
import multiprocessing
import threading

import pytest

from tests.optional import requires

torch = requires("torch")

import exactattn.torch as et
from exactattn.backends.torch_backend import TorchContext
from exactattn.core import algorithm, masks
from exactattn.torch import passes

from .helpers import assert_close, qkv, randn


@pytest.fixture
def tiny_pieces(monkeypatch):
    """Pieces and several row runs at test sizes: any call splits, tiles hold 64 scores."""
    monkeypatch.setattr(passes, "PIECE_WORK", 0)
    monkeypatch.setattr(passes, "PIECE_TILE", 64)
    monkeypatch.setattr(passes, "MIN_ROW_BLOCK", 2)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def naive(q, k, v, *, causal=None, window=None, softcap=None, gqa=False):
    """softmax(mod(c·QKᵀ) with −∞ off A_i)·V, A_i from ``causal`` ('top-left' or
    'bottom-right') and ``window`` = (left, right) about the top-left diagonal."""
    if gqa:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = q.shape[-2], k.shape[-2]
    i, j = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal is not None:
        allowed &= j <= i + (n_k - n_q if causal == "bottom-right" else 0)
    if window is not None:
        allowed &= (j >= i - window[0]) & (j <= i + window[1])
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


CASES = {  # q, k shapes, attention() keywords, naive() keywords
    "plain": ((2, 3, 9, 4), (2, 3, 9, 4), {}, {}),
    "causal": ((1, 4, 11, 4), (1, 4, 11, 4), {"is_causal": True}, {"causal": "top-left"}),
    "causal-bottom-right-cross": (
        (2, 2, 5, 3), (2, 2, 12, 3),
        {"is_causal": True, "alignment": "bottom-right"}, {"causal": "bottom-right"},
    ),
    "window": ((1, 3, 13, 4), (1, 3, 13, 4),
               {"mask": masks.sliding_window(3, 1)}, {"window": (3, 1)}),
    "gqa": ((2, 6, 7, 4), (2, 2, 7, 4), {"enable_gqa": True, "is_causal": True},
            {"gqa": True, "causal": "top-left"}),
    "softcap-3d": ((3, 10, 4), (3, 10, 4), {"softcap": 2.0}, {"softcap": 2.0}),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_pieces_agree_with_the_definition(name, tiny_pieces, threads):
    q_shape, k_shape, ours, theirs = CASES[name]
    q, k, v = qkv(q_shape, k_shape, seed=3)
    parts = _pieces_of(q, k, v, ours)
    assert len(parts) > 1, "the case must run as pieces"
    g = randn(*q_shape[:-1], v.shape[-1], seed=9)
    got = _value_and_grads(lambda *a: et.attention(*a, **ours), q, k, v, g)
    want = _value_and_grads(lambda *a: naive(*a, **theirs), q, k, v, g)
    for what, a, b in zip(("y", "dq", "dk", "dv"), got, want):
        assert_close(a, b, atol=1e-12, what=f"{name} {what}")


def test_pieces_pass_gradcheck(tiny_pieces, threads):
    q, k, v = qkv((1, 4, 6, 3), (1, 4, 6, 3), seed=5, grad=True)
    assert len(_pieces_of(q, k, v, {"is_causal": True})) == 4
    fn = lambda q, k, v: et.attention(q, k, v, is_causal=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize(
    "what",
    ["dropout", "dense mask", "key padding", "bias tensor", "broadcast keys", "predicate"],
)
def test_calls_that_read_batch_or_head_run_whole(what, tiny_pieces):
    """Dropout's keep-bits, per-batch masks and a bias array read b and h; shared keys
    would need their dK summed across pieces: such calls are one piece."""
    q, k, v = qkv((2, 2, 5, 3), (2, 2, 5, 3), seed=1)
    keywords = {
        "dropout": {"dropout_p": 0.3, "seed": 4},
        "dense mask": {"mask": torch.rand(2, 2, 5, 5) < 0.7},
        "key padding": {"mask": masks.key_padding(torch.tensor([5, 3]))},
        "bias tensor": {"bias": randn(5, 5, seed=2)},
        "broadcast keys": {},
        "predicate": {"mask": masks.predicate(lambda i, j: (i + j) % 3 != 0)},
    }[what]
    if what == "broadcast keys":
        k, v = k[:1], v[:1]
    assert _pieces_of(q, k, v, keywords) == [passes.WHOLE]
    assert len(_pieces_of(q, q, q, {})) > 1  # the same sizes split without them


def test_pieces_follow_the_memory_and_thread_limits():
    """At (1, 8, 4096, 64): no piece holds more than an eighth of the heads, with two
    threads still at least one piece per thread; a decode step is one piece."""
    big = torch.zeros(1, 8, 4096, 64)
    for count in (1, 2):
        assert len(_pieces_of(big, big, big, {}, threads=count)) == passes.MIN_PIECES
    wide = torch.zeros(4, 16, 1024, 64)
    parts = _pieces_of(wide, wide, wide, {})
    heads = {p.kv[-1].stop - p.kv[-1].start for p in parts}
    assert heads == {2} and len(parts) == 32  # 2 heads × 256 rows × 512 keys = PIECE_TILE
    decode_q, cache = torch.zeros(1, 8, 1, 64), torch.zeros(1, 8, 4096, 64)
    assert _pieces_of(decode_q, cache, cache, {}) == [passes.WHOLE]


def test_worker_threads_run_torch_single_threaded_and_leave_the_default():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pool = passes._workers(2)
        seen = set(pool.map(lambda _: (threading.get_ident(), torch.get_num_threads()), range(8)))
        assert {n for _, n in seen} == {1}
        assert torch.get_num_threads() == 2  # the caller keeps its own
        fresh: list[int] = []
        thread = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert fresh == [2]  # and a new thread still takes the process default
    finally:
        torch.set_num_threads(before)


def _child_attention(out) -> None:
    torch.set_num_threads(2)
    q = torch.randn(1, 8, 100, 16)  # ops below OpenMP's grain: none forks in the child
    out.put(float(et.attention(q, q, q).sum()))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_a_forked_child_makes_its_own_workers(monkeypatch):
    monkeypatch.setattr(passes, "PIECE_WORK", 0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        passes._workers(2)  # the parent's pool exists before the fork
        context = multiprocessing.get_context("fork")
        out = context.Queue()
        child = context.Process(target=_child_attention, args=(out,))
        child.start()
        child.join(timeout=60)
        alive = child.is_alive()
        if alive:
            child.kill()
        assert not alive, "the child waited on its parent's worker threads"
        assert math.isfinite(out.get(timeout=5))
    finally:
        torch.set_num_threads(before)


# --- tile shapes --------------------------------------------------------------------------------
def test_window_masks_take_a_smaller_key_block():
    cpu = torch.device("cpu")
    causal = masks.causal()
    for n, b in ((1024, 128), (4096, 256), (16384, 512), (512, 128)):
        geometry = masks.Geometry(n, n, (4, 16))
        assert passes.key_block_size(geometry, None, cpu, causal) == b
        assert passes.key_block_size(geometry, None, cpu) == passes.DEFAULT_BLOCK_SIZE
        assert passes.key_block_size(geometry, 64, cpu, causal) == 64  # the caller's b
    decode = masks.Geometry(1, 4096, (1, 8))  # a decode step is still one key block
    assert passes.key_block_size(decode, None, cpu, masks.causal("bottom-right")) == 4096
    padding = masks.key_padding(torch.tensor([3]))  # no window: the default b
    geometry = masks.Geometry(4096, 4096, (1, 8))
    assert passes.key_block_size(geometry, None, cpu, padding) == passes.DEFAULT_BLOCK_SIZE


def test_forward_tiles_keep_the_causal_edge_apart(monkeypatch):
    """With row runs longer than b, the forward's first run of each key block is its b
    edge rows (the only PARTIAL ones); the reverse keeps whole runs; results agree."""
    shapes = []
    real = algorithm.tile_scores

    def recording(ctx, q, k, scale, allowed, mod=None):
        shapes.append((q.shape[-2], allowed is not None))
        return real(ctx, q, k, scale, allowed, mod)

    monkeypatch.setattr(algorithm, "tile_scores", recording)
    ctx = TorchContext(torch.float64)
    q, k, v = qkv((2, 24, 3), (2, 24, 3), seed=4)
    keywords = dict(scale=ctx.default_scale(3), block_size=4, mask=masks.causal(), row_block=12)
    y, state = algorithm.forward(ctx, q, k, v, **keywords)
    forward, shapes[:] = list(shapes), []
    assert forward[:3] == [(4, True), (12, False), (8, False)]  # key block 0: rows 0..23
    assert all(rows <= 4 for rows, partial in forward if partial)
    g = randn(2, 24, 3, seed=5)
    algorithm.backward(ctx, q, k, v, y, state.m, state.l, g, **keywords)
    assert shapes[:2] == [(12, True), (12, False)]  # the reverse: runs of 12 from the span
    assert_close(y, naive(q, k, v, causal="top-left"), atol=1e-12, what="y")


# --- the torch context ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_shifted_is_e_to_the_shifted_score(dtype):
    """``2^{(s−m)·log₂e}``: within ``(2|s − m| + 2)·u`` of ``e^{s−m}`` relative (the two
    argument roundings the error bound counts, and exp2's own)."""
    ctx = TorchContext(dtype)
    s = torch.linspace(-80, 20, 200_001, dtype=torch.float64).to(dtype).reshape(1, -1)
    shift = torch.tensor([7.25], dtype=dtype)
    x = s.double() - shift.double()[:, None]  # exact: both are short binary fractions
    got = ctx.exp_shifted(s.clone(), shift).double()
    unit = torch.finfo(dtype).eps / 2
    assert ((got - x.exp()).abs() <= (2 * x.abs() + 2) * unit * x.exp()).all()


def test_any_of_a_bool_tile_matches_torch_any():
    ctx = TorchContext()
    tiles = [
        torch.zeros(3, 4, dtype=torch.bool),
        torch.eye(5, dtype=torch.bool)[:, 1:],
        torch.eye(4, dtype=torch.bool)[::2, 1::2],  # strided: False everywhere
        torch.zeros(0, 3, dtype=torch.bool),
        torch.ones(2, 1, dtype=torch.bool).expand(2, 6),
        torch.tensor([0.0, 2.0]),
    ]
    assert [ctx.any(t) for t in tiles] == [bool(torch.any(t)) for t in tiles]


# --- helpers ------------------------------------------------------------------------------------
def _pieces_of(q, k, v, keywords, threads=1):
    """The pieces exactattn.torch.attention would run (q, k, v, keywords) as."""
    plans = []
    real = passes.pieces

    def record(plan, *args):
        plans.append(plan)
        return real(plan, *args)

    passes.pieces = record
    try:
        with torch.no_grad():
            et.attention(q, k, v, check_finite=False, empty_rows="zero", **keywords)
    finally:
        passes.pieces = real
    return real(plans[0], q, k, v, threads)


def _value_and_grads(fn, q, k, v, g):
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    y = fn(*leaves)
    return (y.detach(), *torch.autograd.grad(y, leaves, g))


def test_pieces_on_workers_under_torch_func(tiny_pieces, threads):
    """The op's pieces run on worker threads inside torch.func.grad and vmap alike."""
    q, k, v = qkv((2, 4, 9, 8), (2, 4, 9, 8), seed=6)
    sdpa = lambda q, k, v: et.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    want = _value_and_grads(lambda *a: naive(*a, causal="top-left"), q, k, v, torch.ones_like(q))
    dq = torch.func.grad(lambda q: sdpa(q, k, v).sum())(q)
    assert_close(dq, want[1], atol=1e-12, what="dq")
    assert_close(torch.func.vmap(sdpa)(q, k, v), want[0], atol=1e-12, what="y")


@pytest.mark.parametrize("threads", [2], indirect=True)
def test_pieces_on_workers_under_torch_compile(tiny_pieces, threads):
    """fullgraph=True: the op is opaque to dynamo, its pieces run on the workers at run time."""
    q, k, v = qkv((2, 4, 9, 8), (2, 4, 9, 8), seed=7)
    sdpa = lambda q, k, v: et.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    g = randn(2, 4, 9, 8, seed=8)
    got = _value_and_grads(torch.compile(sdpa, fullgraph=True), q, k, v, g)
    want = _value_and_grads(lambda *a: naive(*a, causal="top-left"), q, k, v, g)
    for what, a, b in zip(("y", "dq", "dk", "dv"), got, want):
        assert_close(a, b, atol=1e-12, what=what)
