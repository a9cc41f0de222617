"""Every class of bad input gets a clear error naming the argument, never a wrong number."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

import exactattn as ea


@pytest.fixture
def qkv():
    rng = np.random.default_rng(0)
    return rng.standard_normal((4, 3)), rng.standard_normal((5, 3)), rng.standard_normal((5, 2))


def test_mismatched_head_dim_quotes_the_shapes(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"head dim d.*q \(4, 3\), k \(5, 2\)"):
        ea.attention(q, k[:, :2], v)


def test_mismatched_key_count_quotes_the_shapes(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"n_k.*v \(4, 2\)"):
        ea.attention(q, k, v[:4])


def test_unbroadcastable_batch_dims(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="batch/head"):
        ea.attention(np.stack([q, q]), np.stack([k, k, k]), np.stack([v, v, v]))


def test_one_dimensional_input(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="q must have shape"):
        ea.attention(q[0], k, v)


@pytest.mark.parametrize("block_size", [0, -3])
def test_block_size_not_positive(qkv, block_size):
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        ea.attention(*qkv, block_size=block_size)


@pytest.mark.parametrize("block_size", [2.0, True, "4"])
def test_block_size_not_an_integer(qkv, block_size):
    with pytest.raises(TypeError, match="block_size must be a positive integer"):
        ea.attention(*qkv, block_size=block_size)


def test_numpy_integer_block_size_is_accepted(qkv):
    np.testing.assert_allclose(
        ea.attention(*qkv, block_size=np.int64(2)), ea.attention(*qkv, block_size=5)
    )


def test_empty_allowed_set_names_the_rows(qkv):
    q, k, v = qkv
    allowed = np.ones((4, 5), dtype=bool)
    allowed[2] = False
    with pytest.raises(ValueError, match=r"no allowed key.*\[\[2\]\].*empty_rows='zero'"):
        ea.attention(q, k, v, mask=allowed)


def test_unknown_empty_rows_policy(qkv):
    with pytest.raises(ValueError, match="empty_rows must be one of"):
        ea.attention(*qkv, empty_rows="nan")


@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_in_an_input_names_it(qkv, which, bad):
    arrays = [x.copy() for x in qkv]
    arrays[which][1, 1] = bad
    with pytest.raises(ValueError, match=f"{'qkv'[which]} contains NaN or inf"):
        ea.attention(*arrays)


def test_nan_in_grad_y_names_it(qkv):
    y, stats = ea.attention(*qkv, return_stats=True)
    g = np.ones_like(y)
    g[0, 0] = np.nan
    with pytest.raises(ValueError, match="grad_y contains NaN"):
        ea.attention_backward(*qkv, y, stats, g)


def test_check_finite_false_opts_out(qkv):
    q, k, v = (x.copy() for x in qkv)
    v[0, 0] = np.inf
    y = ea.attention(q, k, v, check_finite=False)
    assert not np.isfinite(y).all()


def test_mixed_backends_name_both(qkv):
    q, k, v = qkv
    k_mp = np.vectorize(mpmath.mpf, otypes=[object])(k)
    with pytest.raises(TypeError, match=r"mix number systems.*q: numpy.*k: mpmath"):
        ea.attention(q, k_mp, v)


def test_mixed_dtypes_name_them(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match=r"mix dtypes.*float32"):
        ea.attention(q.astype(np.float32), k, v)


@pytest.mark.parametrize("dtype", [np.int64, np.complex128, np.bool_])
def test_integer_complex_or_bool_arrays_are_refused(qkv, dtype):
    q, k, v = qkv
    with pytest.raises(TypeError, match="q has dtype"):
        ea.attention(q.astype(dtype), k.astype(dtype), v.astype(dtype))


def test_object_array_of_strings_is_refused(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match="object array of str"):
        ea.attention(np.full(q.shape, "x", dtype=object), k, v)


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
def test_float16_overflow_is_reported_not_returned():
    q = np.full((2, 4), 200.0, dtype=np.float16)  # q·k = 160000 > float16 max 65504
    with pytest.raises(FloatingPointError, match="overflowed"):
        ea.attention(q, q, q, scale=1.0)


def test_wide_compute_dtype_fixes_that_overflow():
    q = np.full((2, 4), 200.0, dtype=np.float16)
    y = ea.attention(q, q, q, scale=1.0, backend=ea.NumpyContext("float16", compute="float32"))
    np.testing.assert_array_equal(y, q)


def test_dense_mask_of_the_wrong_shape(qkv):
    with pytest.raises(ValueError, match=r"mask has shape \(4, 4\).*\(4, 5\)"):
        ea.attention(*qkv, mask=np.ones((4, 4), dtype=bool))


def test_dense_mask_must_be_boolean(qkv):
    with pytest.raises(TypeError, match="must be boolean"):
        ea.attention(*qkv, mask=np.ones((4, 5)))


def test_predicate_returning_the_wrong_shape(qkv):
    with pytest.raises(ValueError, match="mask predicate returned shape"):
        ea.attention(*qkv, mask=lambda i, j: np.ones((3, 3), dtype=bool))


def test_predicate_returning_non_booleans(qkv):
    with pytest.raises(TypeError, match="must return a boolean array"):
        ea.attention(*qkv, mask=lambda i, j: i + j)


def test_key_padding_lengths_of_the_wrong_shape(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="key_padding lengths have shape"):
        ea.attention(q, k, v, mask=ea.masks.key_padding([2, 3]))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_rate_outside_zero_one(qkv, p):
    with pytest.raises(ValueError, match="dropout_p must be a number in"):
        ea.attention(*qkv, dropout_p=p, seed=0)


def test_dropout_without_seed(qkv):
    with pytest.raises(ValueError, match="needs seed"):
        ea.attention(*qkv, dropout_p=0.1)


def test_grad_y_of_the_wrong_shape(qkv):
    y, stats = ea.attention(*qkv, return_stats=True)
    with pytest.raises(ValueError, match=r"grad_y must have shape \(4, 2\)"):
        ea.attention_backward(*qkv, y, stats, np.ones((4, 3)))


def test_unknown_keyword(qkv):
    y, stats = ea.attention(*qkv, return_stats=True)
    with pytest.raises(TypeError, match="unexpected keyword"):
        ea.attention_backward(*qkv, y, stats, y, blocksize=2)


def test_non_finite_scale(qkv):
    with pytest.raises(ValueError, match="scale must be finite"):
        ea.attention(*qkv, scale=float("nan"))


def test_unknown_backend_name(qkv):
    with pytest.raises(ValueError, match="backend must be"):
        ea.attention(*qkv, backend="jax")


def test_strided_views_work():
    big = np.random.default_rng(1).standard_normal((8, 10, 6))
    q_view, k_view, v_view = big[::2, ::2, :3], big[1::2, :, 1:4], big[1::2, :, 2:4]
    y = ea.attention(q_view, k_view, v_view, block_size=3)
    y_ref = ea.naive_attention(*(np.ascontiguousarray(x) for x in (q_view, k_view, v_view)))
    np.testing.assert_allclose(y, y_ref, rtol=1e-13)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("strip", [1, 3, 1 << 20])
def test_overflowed_rows_are_named_with_their_batch_and_row(monkeypatch, strip):
    """Rows whose every score overflowed to −∞ in float16 are told apart from masked rows
    (checked a strip of rows at a time, ``validation.ROWS_CHECKED`` pairs): each is named
    as ``(*batch, i)``, whatever the strip size; a masked-out row is not among them."""
    from exactattn.core import validation

    monkeypatch.setattr(validation, "ROWS_CHECKED", strip)
    q = np.ones((2, 7, 1), np.float16)
    q[1, 5] = q[0, 2] = -300.0  # c·q·k ≈ −9e4: −∞ in float16
    k = np.full((2, 2, 1), 300.0, np.float16)
    v = np.ones((2, 2, 1), np.float16)
    allowed = np.ones((2, 7, 2), bool)
    allowed[0, 4] = False
    with pytest.raises(FloatingPointError, match=r"rows \[\(0, 2\), \(1, 5\)\] \(index"):
        ea.attention(q, k, v, scale=1.0, mask=allowed, empty_rows="zero")
