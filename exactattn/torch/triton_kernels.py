"""FlashAttention-2 kernels in Triton: the CUDA path of exactattn.torch.

The same algorithm as ``exactattn.core.algorithm`` (specified in ``docs/algorithm.md``), fused
into GPU kernels in the style of Triton's tutorial ``06-fused-attention.py``; it exists to
be compared against the generic code and the naive reference, never to replace them.

Scores, with the score modification of ``exactattn.core.scores`` in its order (soft-capping,
then the additive bias, then the mask)::

    s_ij = cap * tanh(c * <Q_i, K_j> / cap) + b_ij  (-inf where j is not in A_i)

(without a cap the first term is c * <Q_i, K_j> itself; without a bias b_ij = 0). The
bias is a caller-owned tensor broadcastable to (B, H, n_q, n_k), read per tile through its
strides (stride 0 on broadcast axes, as flash-attn's Triton kernel reads its bias) and
added in float32; an entry -inf excludes that pair like the mask does.

Forward (Dao, FlashAttention-2, Alg. 1; Milakov & Gimelshein 2018), per query row i, over
key blocks ``J_t`` restricted to the allowed set ``A_i``::

    m_new  = max(m_i, max_j s_ij)
    alpha  = exp(m_i - m_new)                       (rescale of the old state)
    p_ij   = exp(s_ij - m_new)
    l_i    = alpha * l_i + sum_j p_ij
    acc_i  = alpha * acc_i + sum_j p_ij V_j         (acc is the running z)
    O_i    = acc_i / l_i,   lse_i = m_i + log l_i

Reverse (FlashAttention-2, Alg. 2; ``docs/algorithm.md``, "Reverse"), with the frozen lse::

    delta_i  = sum_a dO_ia O_ia                     (preprocess kernel)
    p_ij     = exp(s_ij - lse_i)
    gamma_ij = p_ij * (sum_a dO_ia V_ja - delta_i)  (= dL/ds_ij = dL/db_ij)
    gamma_ij *= 1 - tanh^2(c <Q_i, K_j> / cap)      (softcap: tanh recomputed from the tile)
    dQ_i    += c * gamma_ij K_j,  dK_j += c * gamma_ij Q_i,  dV_j += p_ij dO_i

The bias gradient dbias = dL/db is gamma before the softcap factor (the bias is added after
the cap), summed over the bias's broadcast axes. The dK/dV kernel produces it: each of its
programs owns one key block of one (batch, head) and visits every query block, so it sums
over a size-1 query axis in registers and writes each tile of a full one directly. Sums
across programs (a batch or head axis of size 1 < B or H, a key axis of size 1) are float32
atomic adds, whose order, hence the last bits, may vary between GPU runs. Extra memory
besides dbias itself: none when no sum crosses programs, or for a float32 bias; otherwise
one float32 array of the bias's own shape. No array larger than the bias is ever made.

Masks are predicates evaluated per tile (never a stored n_q x n_k mask), with i the query
index, j the key index (0-based) and o the alignment offset (0 for "top-left",
n_k - n_q for "bottom-right"):

    causal          j <= i + o
    window (L, R)   i + o - L <= j <= i + o + R      (L or R None: unbounded on that side)
    key padding     j < kv_lengths[b]

combined with AND. Key (query) blocks that no row (column) of the tile may see are skipped
by the loop bounds; blocks that every entry may see run without the predicate; only the
partial blocks on the edges evaluate it. The bias never lets a block be skipped (its -inf
entries are data, not structure). Rows with an empty allowed set (after the bias's -inf
entries) get O = 0, lse = -inf and zero gradients.

Precision policy (FlashAttention-2): scores, m, l, acc, delta and every gradient
accumulator in float32; P and gamma are cast to the input dtype before their dot products.
For float32 inputs every dot runs with ``input_precision="ieee"`` (no TF32), so the whole
computation stays in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real

from exactattn.infra.optional import needs  # absolute: tests load patched copies of this file

with needs("the Triton kernels (exactattn.torch.triton_kernels)"):
    import torch
    import triton
    import triton.language as tl
    from triton.runtime.errors import OutOfResources

__all__ = ["triton_backward", "triton_forward"]

# Score of a masked key: exp(-inf - m) = 0 removes it from every sum exactly.
NEG_INF = tl.constexpr(float("-inf"))

_ALIGNMENTS = ("top-left", "bottom-right")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Largest head dimension (d and v) the kernels take; a tile row holds the padded dimension.
MAX_HEAD_DIM = 256
# tl.dot needs every tile dimension to be at least 16.
MIN_BLOCK = 16


# ----------------------------------------------------------------------------- tile helpers


@triton.jit
def _key_end(KV_LEN, off_b, n_k, HAS_KV_LEN: tl.constexpr):
    """End of the valid keys of batch element b: min(n_k, kv_lengths[b])."""
    key_end = n_k
    if HAS_KV_LEN:
        key_end = tl.minimum(tl.load(KV_LEN + off_b), n_k)
    return key_end


@triton.jit
def _allowed(i, j, n_q, key_end, offset, left, right,
             HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):  # fmt: skip
    """The predicate j in A_i on one tile; i and j broadcast against each other.

    Rows i >= n_q (padding of the last query block) see nothing.
    """
    allowed = (i < n_q) & (j < key_end)
    diag = i + offset  # i + o
    if HAS_LEFT:
        allowed = allowed & (j >= diag - left)
    if HAS_RIGHT:
        allowed = allowed & (j <= diag + right)
    return allowed


@triton.jit
def _key_blocks(start_m, n_q, key_end, offset, left, right,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):  # fmt: skip
    """Key range for the query rows [start_m, start_m + BLOCK_M), split into three parts.

    Returns (lo, full_lo, full_hi, hi), multiples of BLOCK_N except hi: keys outside
    [lo, hi) are masked for every row; blocks in [full_lo, full_hi) are allowed for every
    (i, j) of the tile; [lo, full_lo) and [full_hi, hi) are the partial edge blocks.
    """
    row_last = tl.minimum(start_m + BLOCK_M, n_q) - 1
    lo = start_m * 0
    hi = key_end
    # an entire tile is allowed when its corner entries are: first row with last key
    # (right band), last row with first key (left band), last key < key_end.
    full_lo_raw = lo
    full_hi_raw = key_end
    if HAS_LEFT:
        lo = tl.maximum(start_m + offset - left, 0)
        full_lo_raw = tl.maximum(start_m + BLOCK_M - 1 + offset - left, 0)
    if HAS_RIGHT:
        hi = tl.minimum(hi, row_last + offset + right + 1)
        full_hi_raw = tl.minimum(full_hi_raw, start_m + offset + right + 1)
    lo = lo // BLOCK_N * BLOCK_N
    hi = tl.maximum(hi, lo)
    full_lo = (full_lo_raw + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(full_hi_raw, 0) // BLOCK_N * BLOCK_N
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def _query_blocks(start_n, n_q, key_end, offset, left, right,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):  # fmt: skip
    """Query range for the keys [start_n, start_n + BLOCK_N), the transpose of _key_blocks.

    Returns (lo, full_lo, full_hi, hi), multiples of BLOCK_M except hi: rows outside
    [lo, hi) see none of these keys; blocks in [full_lo, full_hi) see all of them.
    """
    key_last = tl.minimum(start_n + BLOCK_N, key_end) - 1
    lo = start_n * 0
    hi = n_q
    full_lo_raw = lo
    full_hi_raw = n_q
    if HAS_RIGHT:  # j <= i + o + R  <=>  i >= j - o - R
        lo = tl.maximum(start_n - offset - right, 0)
        full_lo_raw = tl.maximum(start_n + BLOCK_N - 1 - offset - right, 0)
    if HAS_LEFT:  # j >= i + o - L  <=>  i <= j - o + L
        hi = tl.minimum(hi, key_last - offset + left + 1)
        full_hi_raw = tl.minimum(full_hi_raw, start_n - offset + left + 1)
    lo = lo // BLOCK_M * BLOCK_M
    # keys at or beyond key_end are seen by no row; a block reaching past it is partial.
    hi = tl.where(start_n < key_end, tl.maximum(hi, lo), lo)
    full_lo = (full_lo_raw + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(full_hi_raw, 0) // BLOCK_M * BLOCK_M
    full_hi = tl.where(start_n + BLOCK_N <= key_end, full_hi, full_lo)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


# ----------------------------------------------------------------------------- score modification


@triton.jit
def _tanh(x):
    """tanh(x) in float32 from exp alone (Cephes ``tanhf``, S. L. Moshier): an odd
    polynomial for |x| < 0.625, ``1 - 2 / (exp(2|x|) + 1)`` beyond; relative error below
    3 * 2^-24 where exp is exact. The same code runs on the GPU and in the interpreter,
    which has no libdevice."""
    a = tl.abs(x)
    z = a * a
    poly = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z
             + 1.33314422036e-1) * z - 3.33332819422e-1) * z * a + a  # fmt: skip
    # exp(2|x|) = inf for |x| > 44 gives 1 - 0 = 1 exactly
    t = tl.where(a < 0.625, poly, 1.0 - 2.0 / (tl.exp(a + a) + 1.0))
    return tl.where(x < 0, -t, t)


@triton.jit
def _modify(s, BIAS, rows, cols, stride_rows, stride_cols, n_rows, n_cols, softcap,
            HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr):  # fmt: skip
    """The score modification of one tile, before the mask: s -> cap * tanh(s / cap) + b.

    rows and cols index the tile's two axes (queries and keys, or keys and queries in the
    transposed dK/dV layout), with the bias's strides along them. Returns (s', t) with
    t = tanh(s / cap) (t = s without a cap), which the reverse needs for the factor 1 - t^2.
    Bias entries outside the n_rows x n_cols range load as 0: those rows or keys are masked
    or never stored.
    """
    t = s
    if HAS_SOFTCAP:
        t = _tanh(s / softcap)
        s = softcap * t
    if HAS_BIAS:
        ptrs = (BIAS + rows[:, None].to(tl.int64) * stride_rows
                + cols[None, :].to(tl.int64) * stride_cols)  # fmt: skip
        in_range = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        s = s + tl.load(ptrs, mask=in_range, other=0.0).to(tl.float32)
    return s, t


@triton.jit
def _dbias_add(DB, gamma_t, db_rows, offs_n, offs_m, stride_dbn, stride_dbm, n_q, n_k,
               SUM_Q: tl.constexpr, SUM_K: tl.constexpr, ATOMIC: tl.constexpr):  # fmt: skip
    """Add gamma^T (keys x queries) of one tile to dbias = dL/db, reduced to the bias's shape.

    SUM_Q (the bias's query axis has size 1): the tile's column sums join db_rows, the
    running sum of this program's key block, stored once after the query loop. SUM_K (key
    axis of size 1): the row sums go to dbias[i], shared by every key block. ATOMIC: other
    programs add to the same entries.
    """
    if SUM_Q:
        db_rows += tl.sum(gamma_t, 1)
    else:
        if SUM_K:
            ptrs = DB + offs_m.to(tl.int64) * stride_dbm
            value = tl.sum(gamma_t, 0)
            in_range = offs_m < n_q
        else:
            ptrs = (DB + offs_n[:, None].to(tl.int64) * stride_dbn
                    + offs_m[None, :].to(tl.int64) * stride_dbm)  # fmt: skip
            value = gamma_t
            in_range = (offs_n[:, None] < n_k) & (offs_m[None, :] < n_q)
        if ATOMIC:
            tl.atomic_add(ptrs, value, mask=in_range)
        else:
            tl.store(ptrs, value.to(DB.dtype.element_ty), mask=in_range)
    return db_rows


@triton.jit
def _dbias_store_rows(DB, db_rows, offs_n, stride_dbn, n_k,
                      SUM_K: tl.constexpr, ATOMIC: tl.constexpr):  # fmt: skip
    """Write the query-summed dbias of one key block (the SUM_Q case), summed over the keys
    as well when the bias's key axis has size 1."""
    if SUM_K:
        tl.atomic_add(DB, tl.sum(db_rows, 0))
    elif ATOMIC:
        tl.atomic_add(DB + offs_n.to(tl.int64) * stride_dbn, db_rows, mask=offs_n < n_k)
    else:
        tl.store(DB + offs_n.to(tl.int64) * stride_dbn, db_rows.to(DB.dtype.element_ty),
                 mask=offs_n < n_k)  # fmt: skip


# ----------------------------------------------------------------------------- forward


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, K, V, BIAS, offs_m, lo, hi,
                    stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                    scale, softcap, n_q, n_k, key_end, offset, left, right,
                    D: tl.constexpr, DV: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                    MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):  # fmt: skip
    """Fold the key blocks [lo, hi) into the running state (m_i, l_i, acc)."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        rows_n = offs_n[:, None].to(tl.int64)
        k = tl.load(K + rows_n * stride_kn + offs_d[None, :] * stride_kd,
                    mask=(offs_n[:, None] < n_k) & (offs_d[None, :] < D), other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # (BLOCK_M, BLOCK_N)
        s, _ = _modify(s, BIAS, offs_m, offs_n, stride_bm, stride_bn, n_q, n_k, softcap,
                       HAS_BIAS, HAS_SOFTCAP)  # fmt: skip
        if MASKED:
            allowed = _allowed(offs_m[:, None], offs_n[None, :], n_q, key_end, offset, left,
                               right, HAS_LEFT, HAS_RIGHT)  # fmt: skip
            s = tl.where(allowed, s, NEG_INF)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row with no allowed key so far keeps m = -inf; shifting by 0 instead keeps
        # exp(-inf - (-inf)) = nan out: alpha = 0 and p = 0 there.
        m_shift = tl.where(m_new == NEG_INF, 0.0, m_new)
        alpha = tl.exp(m_i - m_shift)
        p = tl.exp(s - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + rows_n * stride_vn + offs_dv[None, :] * stride_vd,
                    mask=(offs_n[:, None] < n_k) & (offs_dv[None, :] < DV), other=0.0)  # fmt: skip
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, KV_LEN, BIAS,
              stride_qb, stride_qh, stride_qn, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_ob, stride_oh, stride_on, stride_od,
              stride_bb, stride_bh, stride_bm, stride_bn,
              scale, softcap, n_q, n_k, H, GROUP, offset, left, right,
              D: tl.constexpr, DV: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_KV_LEN: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
              DOT_PRECISION: tl.constexpr):  # fmt: skip
    """O and lse for one block of BLOCK_M query rows of one (batch, head)."""
    start_m = tl.program_id(0) * BLOCK_M
    off_b = tl.program_id(1)
    off_h = tl.program_id(2)
    pid_bh = off_b * H + off_h  # row of the (B * H, n_q) statistics lse and delta
    off_hkv = off_h // GROUP  # GQA: GROUP = H // H_kv query heads share one kv head
    key_end = _key_end(KV_LEN, off_b, n_k, HAS_KV_LEN)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows_m = offs_m[:, None].to(tl.int64)
    Q += off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    K += off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    V += off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    O += off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
    BIAS += off_b.to(tl.int64) * stride_bb + off_h.to(tl.int64) * stride_bh
    LSE += pid_bh.to(tl.int64) * n_q

    q = tl.load(Q + rows_m * stride_qn + offs_d[None, :] * stride_qd,
                mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < D), other=0.0)  # fmt: skip
    m_i = tl.full([BLOCK_M], NEG_INF, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

    lo, full_lo, full_hi, hi = _key_blocks(start_m, n_q, key_end, offset, left, right,
                                           BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)  # fmt: skip
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K, V, BIAS, offs_m, lo, full_lo,
                                    stride_kn, stride_kd, stride_vn, stride_vd,
                                    stride_bm, stride_bn,
                                    scale, softcap, n_q, n_k, key_end, offset, left, right,
                                    D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, HAS_LEFT, HAS_RIGHT,
                                    HAS_BIAS, HAS_SOFTCAP, True, DOT_PRECISION)  # fmt: skip
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K, V, BIAS, offs_m, full_lo, full_hi,
                                    stride_kn, stride_kd, stride_vn, stride_vd,
                                    stride_bm, stride_bn,
                                    scale, softcap, n_q, n_k, key_end, offset, left, right,
                                    D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, HAS_LEFT, HAS_RIGHT,
                                    HAS_BIAS, HAS_SOFTCAP, False, DOT_PRECISION)  # fmt: skip
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K, V, BIAS, offs_m, full_hi, hi,
                                    stride_kn, stride_kd, stride_vn, stride_vd,
                                    stride_bm, stride_bn,
                                    scale, softcap, n_q, n_k, key_end, offset, left, right,
                                    D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, HAS_LEFT, HAS_RIGHT,
                                    HAS_BIAS, HAS_SOFTCAP, True, DOT_PRECISION)  # fmt: skip

    # epilogue: O = acc / l, lse = m + log l; an empty row (l = 0) gets O = 0, lse = -inf.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, NEG_INF, m_i + tl.log(l_safe))
    tl.store(O + rows_m * stride_on + offs_dv[None, :] * stride_od, o.to(O.dtype.element_ty),
             mask=(offs_m[:, None] < n_q) & (offs_dv[None, :] < DV))  # fmt: skip
    tl.store(LSE + offs_m, lse, mask=offs_m < n_q)


# ----------------------------------------------------------------------------- backward


@triton.jit
def _attn_bwd_preprocess(O, DO, DELTA,
                         stride_ob, stride_oh, stride_on, stride_od,
                         stride_dob, stride_doh, stride_don, stride_dod,
                         n_q, H, DV: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):  # fmt: skip
    """delta_i = sum_a dO_ia O_ia in float32, for one block of rows of one (batch, head)."""
    start_m = tl.program_id(0) * BLOCK_M
    off_b = tl.program_id(1)
    off_h = tl.program_id(2)
    pid_bh = off_b * H + off_h  # row of the (B * H, n_q) statistics lse and delta
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows_m = offs_m[:, None].to(tl.int64)
    mask = (offs_m[:, None] < n_q) & (offs_dv[None, :] < DV)
    O += off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
    DO += off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
    o = tl.load(O + rows_m * stride_on + offs_dv[None, :] * stride_od, mask=mask, other=0.0)
    do = tl.load(DO + rows_m * stride_don + offs_dv[None, :] * stride_dod, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * n_q + offs_m, delta, mask=offs_m < n_q)


@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, db_rows, k, v, Q, DO, LSE, DELTA, BIAS, DB, offs_n, lo, hi,
                         stride_qn, stride_qd, stride_don, stride_dod,
                         stride_bm, stride_bn, stride_dbm, stride_dbn,
                         scale, softcap, n_q, n_k, key_end, offset, left, right,
                         D: tl.constexpr, DV: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                         HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                         HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                         BIAS_GRAD: tl.constexpr, DB_SUM_Q: tl.constexpr,
                         DB_SUM_K: tl.constexpr, DB_ATOMIC: tl.constexpr,
                         MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):  # fmt: skip
    """Add the query blocks [lo, hi) to dK (without the factor c), dV and dbias of one key
    block."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows_m = offs_m[:, None].to(tl.int64)
        q = tl.load(Q + rows_m * stride_qn + offs_d[None, :] * stride_qd,
                    mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < D), other=0.0)  # fmt: skip
        lse = tl.load(LSE + offs_m, mask=offs_m < n_q, other=0.0)
        # s^T and p^T: (BLOCK_N, BLOCK_M), keys along rows, the layout dK and dV need.
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * scale
        s_t, t_t = _modify(s_t, BIAS, offs_n, offs_m, stride_bn, stride_bm, n_k, n_q, softcap,
                           HAS_BIAS, HAS_SOFTCAP)  # fmt: skip
        if MASKED:
            allowed_t = _allowed(offs_m[None, :], offs_n[:, None], n_q, key_end, offset, left,
                                 right, HAS_LEFT, HAS_RIGHT)  # fmt: skip
            s_t = tl.where(allowed_t, s_t, NEG_INF)
        # an empty row has lse = -inf and only masked scores: shift by 0 so that p = 0.
        lse_shift = tl.where(lse == NEG_INF, 0.0, lse)
        p_t = tl.exp(s_t - lse_shift[None, :])
        do = tl.load(DO + rows_m * stride_don + offs_dv[None, :] * stride_dod,
                     mask=(offs_m[:, None] < n_q) & (offs_dv[None, :] < DV), other=0.0)  # fmt: skip
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        delta = tl.load(DELTA + offs_m, mask=offs_m < n_q, other=0.0)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (dO V^T)^T
        gamma_t = p_t * (dp_t - delta[None, :])
        if BIAS_GRAD:  # dL/db = gamma: the bias is added after the cap
            db_rows = _dbias_add(DB, gamma_t, db_rows, offs_n, offs_m, stride_dbn, stride_dbm,
                                 n_q, n_k, DB_SUM_Q, DB_SUM_K, DB_ATOMIC)  # fmt: skip
        if HAS_SOFTCAP:  # d(cap tanh(s / cap))/ds = 1 - t^2
            gamma_t = gamma_t * ((1.0 - t_t) * (1.0 + t_t))
        dk = tl.dot(gamma_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv, db_rows


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV_OUT, KV_LEN, BIAS, DB,
                   stride_qb, stride_qh, stride_qn, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_dob, stride_doh, stride_don, stride_dod,
                   stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                   stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                   stride_bb, stride_bh, stride_bm, stride_bn,
                   stride_dbb, stride_dbh, stride_dbm, stride_dbn,
                   scale, softcap, n_q, n_k, H, GROUP, offset, left, right,
                   D: tl.constexpr, DV: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_KV_LEN: tl.constexpr,
                   HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                   BIAS_GRAD: tl.constexpr, DB_SUM_Q: tl.constexpr,
                   DB_SUM_K: tl.constexpr, DB_ATOMIC: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):  # fmt: skip
    """dK, dV (and dbias) of one block of BLOCK_N keys from one query head (GQA sums heads
    outside)."""
    start_n = tl.program_id(0) * BLOCK_N
    off_b = tl.program_id(1)
    off_h = tl.program_id(2)
    pid_bh = off_b * H + off_h  # row of the (B * H, n_q) statistics lse and delta
    off_hkv = off_h // GROUP
    key_end = _key_end(KV_LEN, off_b, n_k, HAS_KV_LEN)

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows_n = offs_n[:, None].to(tl.int64)
    Q += off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    K += off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    V += off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    DO += off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
    DK += off_b.to(tl.int64) * stride_dkb + off_h.to(tl.int64) * stride_dkh
    DV_OUT += off_b.to(tl.int64) * stride_dvb + off_h.to(tl.int64) * stride_dvh
    BIAS += off_b.to(tl.int64) * stride_bb + off_h.to(tl.int64) * stride_bh
    DB += off_b.to(tl.int64) * stride_dbb + off_h.to(tl.int64) * stride_dbh
    LSE += pid_bh.to(tl.int64) * n_q
    DELTA += pid_bh.to(tl.int64) * n_q

    mask_k = (offs_n[:, None] < n_k) & (offs_d[None, :] < D)
    mask_v = (offs_n[:, None] < n_k) & (offs_dv[None, :] < DV)
    k = tl.load(K + rows_n * stride_kn + offs_d[None, :] * stride_kd, mask=mask_k, other=0.0)
    v = tl.load(V + rows_n * stride_vn + offs_dv[None, :] * stride_vd, mask=mask_v, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    db_rows = tl.zeros([BLOCK_N], tl.float32)  # sum_i gamma_ij, when the bias has n_q = 1

    lo, full_lo, full_hi, hi = _query_blocks(start_n, n_q, key_end, offset, left, right,
                                             BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)  # fmt: skip
    dk, dv, db_rows = _attn_bwd_dkdv_inner(dk, dv, db_rows, k, v, Q, DO, LSE, DELTA, BIAS, DB,
                                           offs_n, lo, full_lo,
                                           stride_qn, stride_qd, stride_don, stride_dod,
                                           stride_bm, stride_bn, stride_dbm, stride_dbn,
                                           scale, softcap, n_q, n_k, key_end, offset, left,
                                           right, D, DV, BLOCK_M, BLOCK_D, BLOCK_DV,
                                           HAS_LEFT, HAS_RIGHT, HAS_BIAS, HAS_SOFTCAP,
                                           BIAS_GRAD, DB_SUM_Q, DB_SUM_K, DB_ATOMIC,
                                           True, DOT_PRECISION)  # fmt: skip
    dk, dv, db_rows = _attn_bwd_dkdv_inner(dk, dv, db_rows, k, v, Q, DO, LSE, DELTA, BIAS, DB,
                                           offs_n, full_lo, full_hi,
                                           stride_qn, stride_qd, stride_don, stride_dod,
                                           stride_bm, stride_bn, stride_dbm, stride_dbn,
                                           scale, softcap, n_q, n_k, key_end, offset, left,
                                           right, D, DV, BLOCK_M, BLOCK_D, BLOCK_DV,
                                           HAS_LEFT, HAS_RIGHT, HAS_BIAS, HAS_SOFTCAP,
                                           BIAS_GRAD, DB_SUM_Q, DB_SUM_K, DB_ATOMIC,
                                           False, DOT_PRECISION)  # fmt: skip
    dk, dv, db_rows = _attn_bwd_dkdv_inner(dk, dv, db_rows, k, v, Q, DO, LSE, DELTA, BIAS, DB,
                                           offs_n, full_hi, hi,
                                           stride_qn, stride_qd, stride_don, stride_dod,
                                           stride_bm, stride_bn, stride_dbm, stride_dbn,
                                           scale, softcap, n_q, n_k, key_end, offset, left,
                                           right, D, DV, BLOCK_M, BLOCK_D, BLOCK_DV,
                                           HAS_LEFT, HAS_RIGHT, HAS_BIAS, HAS_SOFTCAP,
                                           BIAS_GRAD, DB_SUM_Q, DB_SUM_K, DB_ATOMIC,
                                           True, DOT_PRECISION)  # fmt: skip

    dk = dk * scale  # dK_j = c * sum_i gamma_ij Q_i
    tl.store(DK + rows_n * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=mask_k)  # fmt: skip
    tl.store(DV_OUT + rows_n * stride_dvn + offs_dv[None, :] * stride_dvd,
             dv.to(DV_OUT.dtype.element_ty), mask=mask_v)  # fmt: skip
    if BIAS_GRAD and DB_SUM_Q:
        _dbias_store_rows(DB, db_rows, offs_n, stride_dbn, n_k, DB_SUM_K, DB_ATOMIC)


@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse_shift, delta, K, V, BIAS, offs_m, lo, hi,
                       stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                       scale, softcap, n_q, n_k, key_end, offset, left, right,
                       D: tl.constexpr, DV: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                       HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                       HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                       MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):  # fmt: skip
    """Add the key blocks [lo, hi) to dQ (without the factor c) of one query block."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        rows_n = offs_n[:, None].to(tl.int64)
        k = tl.load(K + rows_n * stride_kn + offs_d[None, :] * stride_kd,
                    mask=(offs_n[:, None] < n_k) & (offs_d[None, :] < D), other=0.0)  # fmt: skip
        v = tl.load(V + rows_n * stride_vn + offs_dv[None, :] * stride_vd,
                    mask=(offs_n[:, None] < n_k) & (offs_dv[None, :] < DV), other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        s, t = _modify(s, BIAS, offs_m, offs_n, stride_bm, stride_bn, n_q, n_k, softcap,
                       HAS_BIAS, HAS_SOFTCAP)  # fmt: skip
        if MASKED:
            allowed = _allowed(offs_m[:, None], offs_n[None, :], n_q, key_end, offset, left,
                               right, HAS_LEFT, HAS_RIGHT)  # fmt: skip
            s = tl.where(allowed, s, NEG_INF)
        p = tl.exp(s - lse_shift[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # dO V^T
        gamma = p * (dp - delta[:, None])
        if HAS_SOFTCAP:  # d(cap tanh(s / cap))/ds = 1 - t^2
            gamma = gamma * ((1.0 - t) * (1.0 + t))
        dq = tl.dot(gamma.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, KV_LEN, BIAS,
                 stride_qb, stride_qh, stride_qn, stride_qd,
                 stride_kb, stride_kh, stride_kn, stride_kd,
                 stride_vb, stride_vh, stride_vn, stride_vd,
                 stride_dob, stride_doh, stride_don, stride_dod,
                 stride_dqb, stride_dqh, stride_dqn, stride_dqd,
                 stride_bb, stride_bh, stride_bm, stride_bn,
                 scale, softcap, n_q, n_k, H, GROUP, offset, left, right,
                 D: tl.constexpr, DV: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                 HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_KV_LEN: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):  # fmt: skip
    """dQ of one block of BLOCK_M query rows of one (batch, head)."""
    start_m = tl.program_id(0) * BLOCK_M
    off_b = tl.program_id(1)
    off_h = tl.program_id(2)
    pid_bh = off_b * H + off_h  # row of the (B * H, n_q) statistics lse and delta
    off_hkv = off_h // GROUP
    key_end = _key_end(KV_LEN, off_b, n_k, HAS_KV_LEN)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows_m = offs_m[:, None].to(tl.int64)
    Q += off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    K += off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    V += off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    DO += off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
    DQ += off_b.to(tl.int64) * stride_dqb + off_h.to(tl.int64) * stride_dqh
    BIAS += off_b.to(tl.int64) * stride_bb + off_h.to(tl.int64) * stride_bh
    LSE += pid_bh.to(tl.int64) * n_q
    DELTA += pid_bh.to(tl.int64) * n_q

    mask_q = (offs_m[:, None] < n_q) & (offs_d[None, :] < D)
    q = tl.load(Q + rows_m * stride_qn + offs_d[None, :] * stride_qd, mask=mask_q, other=0.0)
    do = tl.load(DO + rows_m * stride_don + offs_dv[None, :] * stride_dod,
                 mask=(offs_m[:, None] < n_q) & (offs_dv[None, :] < DV), other=0.0)  # fmt: skip
    lse = tl.load(LSE + offs_m, mask=offs_m < n_q, other=0.0)
    lse_shift = tl.where(lse == NEG_INF, 0.0, lse)  # empty rows: every score masked, p = 0
    delta = tl.load(DELTA + offs_m, mask=offs_m < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    lo, full_lo, full_hi, hi = _key_blocks(start_m, n_q, key_end, offset, left, right,
                                           BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)  # fmt: skip
    dq = _attn_bwd_dq_inner(dq, q, do, lse_shift, delta, K, V, BIAS, offs_m, lo, full_lo,
                            stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                            scale, softcap, n_q, n_k, key_end, offset, left, right,
                            D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, HAS_LEFT, HAS_RIGHT,
                            HAS_BIAS, HAS_SOFTCAP, True, DOT_PRECISION)  # fmt: skip
    dq = _attn_bwd_dq_inner(dq, q, do, lse_shift, delta, K, V, BIAS, offs_m, full_lo, full_hi,
                            stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                            scale, softcap, n_q, n_k, key_end, offset, left, right,
                            D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, HAS_LEFT, HAS_RIGHT,
                            HAS_BIAS, HAS_SOFTCAP, False, DOT_PRECISION)  # fmt: skip
    dq = _attn_bwd_dq_inner(dq, q, do, lse_shift, delta, K, V, BIAS, offs_m, full_hi, hi,
                            stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                            scale, softcap, n_q, n_k, key_end, offset, left, right,
                            D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, HAS_LEFT, HAS_RIGHT,
                            HAS_BIAS, HAS_SOFTCAP, True, DOT_PRECISION)  # fmt: skip

    dq = dq * scale  # dQ_i = c * sum_j gamma_ij K_j
    tl.store(DQ + rows_m * stride_dqn + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=mask_q)  # fmt: skip


# ----------------------------------------------------------------------------- host side

_INTERPRETED = not isinstance(_attn_fwd, triton.runtime.jit.JITFunction)


@dataclass(frozen=True)
class _MaskSpec:
    """The mask as kernel arguments: alignment offset o, band [i + o - left, i + o + right].

    Causal is the band's right edge at 0; a side is unbounded when its has_* flag is off.
    """

    offset: int
    left: int
    right: int
    has_left: bool
    has_right: bool
    kv_lengths: torch.Tensor | None  # int32 (B,), clamped to [0, n_k]


@dataclass(frozen=True)
class _ScoreSpec:
    """The score modification as kernel arguments.

    ``view`` is the caller's bias expanded to (B, H, n_q, n_k) (stride 0 on its broadcast
    axes, no copy); ``softcap`` is the cap, None for no soft-capping.
    """

    bias: torch.Tensor | None
    view: torch.Tensor | None
    softcap: float | None


@dataclass(frozen=True)
class _DbiasPlan:
    """Where the backward accumulates dbias and how the dK/dV kernel reduces into it.

    ``acc`` has the bias's shape padded to 4 dims with leading 1s: float32 when programs add
    into shared entries (``atomic``), else the bias's dtype, written once per entry.
    """

    acc: torch.Tensor
    sum_q: bool  # the bias's query axis has size 1: sum gamma over the rows
    sum_k: bool  # its key axis has size 1: sum gamma over the keys
    atomic: bool  # several programs add into one entry (batch, head or key axis shared)


@dataclass(frozen=True)
class _Blocks:
    """Tile sizes and launch options of one kernel launch."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def smaller(self) -> _Blocks | None:
        """The next configuration to try after an out-of-resources error, or None."""
        if self.num_stages > 1:
            return _Blocks(self.block_m, self.block_n, self.num_warps, 1)
        if self.block_n > MIN_BLOCK and self.block_n >= self.block_m:
            return _Blocks(self.block_m, self.block_n // 2, self.num_warps, 1)
        if self.block_m > MIN_BLOCK:
            return _Blocks(self.block_m // 2, self.block_n, self.num_warps, 1)
        return None


def _default_blocks(block_d: int, dtype: torch.dtype) -> _Blocks:
    """Tiles by padded head dimension and dtype, checked for sm_90 (H100/H200) with ptxas:
    all fit shared memory with at most a few bytes of register spill. float32 dots run
    with input_precision="ieee" on FMA units and hold whole tiles in registers, hence the
    smaller float32 tiles."""
    if dtype == torch.float32:
        if block_d <= 32:
            return _Blocks(32, 32, 4, 2)
        if block_d <= 64:
            return _Blocks(32, 32, 8, 2)
        return _Blocks(16, 32, 8, 1)
    if block_d <= 64:
        return _Blocks(64, 64, 4, 2)
    if block_d <= 128:
        return _Blocks(64, 64, 8, 2)
    return _Blocks(64, 32, 8, 1)


def _blocks(
    block_d: int, dtype: torch.dtype, block_m: int | None, block_n: int | None
) -> tuple[_Blocks, bool]:
    """The launch configuration and whether the caller fixed it (then no fallback)."""
    default = _default_blocks(block_d, dtype)
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < MIN_BLOCK or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= {MIN_BLOCK}, got {value}")
    blocks = _Blocks(
        block_m if block_m is not None else default.block_m,
        block_n if block_n is not None else default.block_n,
        default.num_warps,
        default.num_stages,
    )
    return blocks, block_m is not None or block_n is not None


def _launch(launch: Callable[[_Blocks], None], blocks: _Blocks, fixed: bool) -> None:
    """Run launch(blocks), retrying smaller tiles if the GPU runs out of shared memory."""
    while True:
        try:
            launch(blocks)
            return
        except OutOfResources:
            smaller = None if fixed else blocks.smaller()
            if smaller is None:
                raise
            blocks = smaller


def _head_consts(d: int, dv: int, dtype: torch.dtype) -> dict[str, object]:
    """Head-dimension constexprs: true sizes, power-of-two tile widths, dot precision."""
    return {
        "D": d,
        "DV": dv,
        "BLOCK_D": max(MIN_BLOCK, triton.next_power_of_2(d)),
        "BLOCK_DV": max(MIN_BLOCK, triton.next_power_of_2(dv)),
        # float32 stays float32: no TF32 rounding of the dot operands.
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
    }


def _check_tensor(name: str, x: object, ndim: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    return x


def _validate_qkv(q: object, k: object, v: object) -> None:
    """Check q (B, H, n_q, d), k (B, H_kv, n_k, d), v (B, H_kv, n_k, dv) for the kernels."""
    q = _check_tensor("q", q, 4)
    k = _check_tensor("k", k, 4)
    v = _check_tensor("v", v, 4)
    if q.dtype not in _DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(
            f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    if k.device != q.device or v.device != q.device:
        raise ValueError(
            f"q, k and v must be on one device, got q {q.device}, k {k.device}, v {v.device}"
        )
    if q.device.type != "cuda" and not _INTERPRETED:
        raise ValueError(
            f"the Triton kernels need CUDA tensors, got q on {q.device}; set "
            "TRITON_INTERPRET=1 before importing triton to run them on the CPU interpreter"
        )
    batch, heads, _, d = q.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(
            f"q, k and v must share the batch size B, got shapes q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.shape[1:3] != v.shape[1:3]:
        raise ValueError(
            f"k (B, H_kv, n_k, d) and v (B, H_kv, n_k, dv) must agree on H_kv and n_k, "
            f"got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.shape[3] != d:
        raise ValueError(
            f"q and k must share the head dimension d, got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    heads_kv = k.shape[1]
    if heads_kv == 0 or heads % heads_kv:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the key/value heads "
            f"H_kv = {heads_kv} (grouped-query attention)"
        )
    for name, size in (("d (q.shape[-1])", d), ("dv (v.shape[-1])", v.shape[3])):
        if not 1 <= size <= MAX_HEAD_DIM:
            raise ValueError(f"head dimension {name} must be in 1..{MAX_HEAD_DIM}, got {size}")


def _validate_scale(scale: object) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def _mask_spec(
    causal: str | None,
    window: tuple[int | None, int | None] | None,
    alignment: str | None,
    kv_lengths: torch.Tensor | Sequence[int] | None,
    q: torch.Tensor,
    n_k: int,
) -> _MaskSpec:
    """Translate the keyword arguments into kernel arguments; see the module docstring."""
    batch, _, n_q, _ = q.shape
    for name, value in (("causal", causal), ("alignment", alignment)):
        if value is not None and value not in _ALIGNMENTS:
            raise ValueError(f"{name} must be None, 'top-left' or 'bottom-right', got {value!r}")
    if causal is not None and alignment is not None and causal != alignment:
        raise ValueError(
            f"causal={causal!r} and alignment={alignment!r} disagree; the window and the "
            "causal mask share one alignment"
        )
    offset = n_k - n_q if (causal or alignment) == "bottom-right" else 0
    # |j - (i + o)| <= n_q + n_k for every tile entry: a wider band is unbounded, and the
    # clamp keeps the kernel's int32 arithmetic exact.
    bound = n_q + n_k + 1
    left = right = 0
    has_left = has_right = False
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise ValueError(f"window must be None or a pair (left, right), got {window!r}")
        for name, side in zip(("left", "right"), window, strict=True):
            if side is not None and (isinstance(side, bool) or not isinstance(side, Integral)):
                raise TypeError(f"window {name} must be an int or None, got {side!r}")
            if side is not None and side < 0:
                raise ValueError(f"window {name} must be >= 0 or None, got {side}")
        if window[0] is not None:
            has_left, left = True, min(int(window[0]), bound)
        if window[1] is not None:
            has_right, right = True, min(int(window[1]), bound)
    if causal is not None:  # j <= i + o is the band's right edge at 0
        right = min(right, 0) if has_right else 0
        has_right = True
    lengths = None
    if kv_lengths is not None:
        if not isinstance(kv_lengths, torch.Tensor):
            kv_lengths = torch.as_tensor(kv_lengths)
        dtype = kv_lengths.dtype
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise TypeError(f"kv_lengths must hold integers, got dtype {dtype}")
        if tuple(kv_lengths.shape) != (batch,):
            raise ValueError(
                f"kv_lengths must have shape (B,) = ({batch},), got {tuple(kv_lengths.shape)}"
            )
        lengths = kv_lengths.to(q.device).clamp(0, n_k).to(torch.int32).contiguous()
    return _MaskSpec(offset, left, right, has_left, has_right, lengths)


def _score_spec(bias: object, softcap: object, q: torch.Tensor, n_k: int) -> _ScoreSpec:
    """Check the bias and the cap; see the module docstring."""
    batch, heads, n_q, _ = q.shape
    target = (batch, heads, n_q, n_k)
    view = None
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.dtype not in _DTYPES:
            raise TypeError(
                f"bias must be float16, bfloat16 or float32 (it is added in float32), "
                f"got {bias.dtype}"
            )
        if bias.device != q.device:
            raise ValueError(f"bias must be on q's device {q.device}, got {bias.device}")
        shape = tuple(bias.shape)
        fits = all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))
        if not (2 <= len(shape) <= 4 and fits):
            raise ValueError(
                f"bias must broadcast to (B, H, n_q, n_k) = {target} with 2 to 4 dims, each "
                f"the size above or 1, got shape {shape}"
            )
        view = bias.expand(target)
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, Real):
            raise TypeError(f"softcap must be a real number or None, got {type(softcap).__name__}")
        if not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"softcap must be positive and finite, got {softcap}")
        softcap = float(softcap)
    return _ScoreSpec(bias, view, softcap)


def _score_args(score: _ScoreSpec, dummy: torch.Tensor) -> tuple[tuple[object, ...], dict]:
    """(BIAS pointer, its four strides, the cap) and the score constexprs of a launch."""
    view = score.view if score.view is not None else dummy
    strides = score.view.stride() if score.view is not None else (0, 0, 0, 0)
    consts = {"HAS_BIAS": score.view is not None, "HAS_SOFTCAP": score.softcap is not None}
    cap = score.softcap if score.softcap is not None else 1.0  # unread without HAS_SOFTCAP
    return (view, strides, cap), consts


def _dbias_plan(bias: torch.Tensor, target: tuple[int, int, int, int]) -> _DbiasPlan:
    """The dbias accumulator for a bias broadcast to target = (B, H, n_q, n_k)."""
    shape = (1,) * (4 - bias.dim()) + tuple(bias.shape)
    sum_q, sum_k = shape[2] == 1, shape[3] == 1
    spread = any(s == 1 < t for s, t in zip(shape[:2], target[:2]))
    atomic = spread or sum_k
    dtype = torch.float32 if atomic else bias.dtype
    return _DbiasPlan(torch.zeros(shape, dtype=dtype, device=bias.device), sum_q, sum_k, atomic)


def _mask_args(mask: _MaskSpec, dummy: torch.Tensor) -> tuple[tuple[object, ...], dict]:
    """(KV_LEN pointer, band ints) and the mask constexprs of a kernel launch."""
    kv_len = mask.kv_lengths if mask.kv_lengths is not None else dummy
    consts = {
        "HAS_LEFT": mask.has_left,
        "HAS_RIGHT": mask.has_right,
        "HAS_KV_LEN": mask.kv_lengths is not None,
    }
    return (kv_len, (mask.offset, mask.left, mask.right)), consts


def triton_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: str | None = None,
    window: tuple[int | None, int | None] | None = None,
    kv_lengths: torch.Tensor | Sequence[int] | None = None,
    alignment: str | None = None,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention O = softmax(mod(c Q K^T) + mask) V and its log-sum-exp.

    For each batch b, head h and query row i, with A_i the allowed keys less those whose
    bias is -inf::

        s_ij  = cap * tanh(c * sum_r Q_ir K_jr / cap) + bias_bhij,    j in A_i
        lse_i = log sum_{j in A_i} exp(s_ij)
        O_i   = sum_{j in A_i} exp(s_ij - lse_i) V_j

    (no tanh without softcap, no bias term without bias) computed blockwise with the online
    softmax (FlashAttention-2). A row with A_i empty gets O_i = 0 and lse_i = -inf.

    Args:
        q: (B, H, n_q, d) queries; float16, bfloat16 or float32; any strides.
        k: (B, H_kv, n_k, d) keys, same dtype; H must be a multiple of H_kv (GQA: query
            head h reads key/value head h // (H // H_kv)).
        v: (B, H_kv, n_k, dv) values, same dtype; d and dv at most 256.
        scale: the score scale c (usually 1 / sqrt(d)).
        causal: None, "top-left" (j <= i) or "bottom-right" (j <= i + n_k - n_q).
        window: None or (left, right): i + o - left <= j <= i + o + right, either side
            None for unbounded; o is the offset of the alignment.
        kv_lengths: None or (B,) integers: key j of batch b is allowed iff
            j < kv_lengths[b].
        alignment: "top-left" (o = 0, the default) or "bottom-right" (o = n_k - n_q) for
            the window when causal is None; must agree with causal when both are given.
        bias: None or an additive score bias broadcastable to (B, H, n_q, n_k) (2 to 4
            dims, size-1 axes broadcast), float16, bfloat16 or float32, any strides; added
            in float32 after the cap, before the mask. An entry -inf excludes that pair;
            NaN or +inf entries give NaN rows.
        softcap: None or the cap > 0 of the logit soft-capping cap * tanh(s / cap).
        block_m, block_n: tile sizes (powers of two >= 16); default by head dim and dtype.

    Returns:
        (o, lse): o (B, H, n_q, dv) in the input dtype, lse (B, H, n_q) float32 with
        lse = m + log l (natural logarithm).
    """
    _validate_qkv(q, k, v)
    scale = _validate_scale(scale)
    batch, heads, n_q, d = q.shape
    heads_kv, n_k, dv = k.shape[1], k.shape[2], v.shape[3]
    mask = _mask_spec(causal, window, alignment, kv_lengths, q, n_k)
    score = _score_spec(bias, softcap, q, n_k)
    o = torch.empty((batch, heads, n_q, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    consts = _head_consts(d, dv, q.dtype)
    blocks, fixed = _blocks(max(consts["BLOCK_D"], consts["BLOCK_DV"]), q.dtype, block_m, block_n)
    (kv_len, band), mask_consts = _mask_args(mask, lse)
    (bias_view, bias_strides, cap), score_consts = _score_args(score, lse)

    def launch(cfg: _Blocks) -> None:
        grid = (triton.cdiv(n_q, cfg.block_m), batch, heads)
        _attn_fwd[grid](
            q, k, v, o, lse, kv_len, bias_view,
            *q.stride(), *k.stride(), *v.stride(), *o.stride(), *bias_strides,
            scale, cap, n_q, n_k, heads, heads // heads_kv, *band,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **consts, **mask_consts,
            **score_consts, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip

    _launch(launch, blocks, fixed)
    return o, lse


def triton_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    *,
    scale: float,
    causal: str | None = None,
    window: tuple[int | None, int | None] | None = None,
    kv_lengths: torch.Tensor | Sequence[int] | None = None,
    alignment: str | None = None,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    bias_grad: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """Vector-Jacobian product of triton_forward: (dQ, dK, dV[, dbias]) for the upstream dO.

    With the frozen statistic lse from the forward (never differentiated) and s_ij the
    modified scores of triton_forward::

        delta_i  = sum_a dO_ia O_ia
        p_ij     = exp(s_ij - lse_i),                  j in A_i (0 elsewhere)
        gamma_ij = p_ij * (sum_a dO_ia V_ja - delta_i)                = dL/dbias_bhij
        dS_ij    = gamma_ij * (1 - tanh^2(c sum_r Q_ir K_jr / cap))   (gamma_ij without cap)
        dQ_i = c sum_j dS_ij K_j,  dK_j = c sum_i dS_ij Q_i,  dV_j = sum_i p_ij dO_i

    Under GQA dK and dV of a key/value head sum the contributions of its query heads.
    Rows with an empty allowed set contribute nothing (their dQ row is 0).

    Args:
        q, k, v: the forward inputs, as for triton_forward.
        o: (B, H, n_q, dv) the forward output, same dtype as q.
        lse: (B, H, n_q) the forward log-sum-exp (float32).
        do: (B, H, n_q, dv) the upstream gradient dL/dO; converted to q's dtype.
        scale, causal, window, kv_lengths, alignment, bias, softcap, block_m, block_n:
            as for the forward, and they must be the same values.
        bias_grad: also return dbias = dL/dbias, gamma summed over the bias's broadcast
            axes. Extra memory: none when no two (batch, head) pairs or key blocks share a
            bias entry (the bias's batch and head axes full, its key axis n_k), or for a
            float32 bias; else one float32 array of the bias's shape. Its float32 sums over
            a shared batch, head or key axis are atomic adds: on a GPU their order, hence
            the last bits, may differ between runs.

    Returns:
        (dq, dk, dv) with the shapes and dtype of q, k and v, and dbias with the shape and
        dtype of bias when bias_grad is true.
    """
    _validate_qkv(q, k, v)
    scale = _validate_scale(scale)
    batch, heads, n_q, d = q.shape
    heads_kv, n_k, dv = k.shape[1], k.shape[2], v.shape[3]
    o_shape = (batch, heads, n_q, dv)
    o = _check_tensor("o", o, 4)
    do = _check_tensor("do", do, 4)
    lse = _check_tensor("lse", lse, 3)
    for name, x, shape in (("o", o, o_shape), ("do", do, o_shape), ("lse", lse, o_shape[:3])):
        if tuple(x.shape) != shape:
            raise ValueError(
                f"{name} must have shape {shape} for q {tuple(q.shape)} and "
                f"v {tuple(v.shape)}, got {tuple(x.shape)}"
            )
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
    if o.dtype != q.dtype:
        raise TypeError(f"o must have q's dtype {q.dtype}, got {o.dtype}")
    if not lse.dtype.is_floating_point:
        raise TypeError(f"lse must be floating point (float32), got {lse.dtype}")
    do = do.to(q.dtype)
    lse = lse.to(torch.float32).contiguous()
    mask = _mask_spec(causal, window, alignment, kv_lengths, q, n_k)
    score = _score_spec(bias, softcap, q, n_k)
    if not isinstance(bias_grad, bool):
        raise TypeError(f"bias_grad must be a bool, got {type(bias_grad).__name__}")
    if bias_grad and score.bias is None:
        raise ValueError("bias_grad=True needs a bias tensor, got bias=None")
    db = _dbias_plan(score.bias, (batch, heads, n_q, n_k)) if bias_grad else None
    group = heads // heads_kv

    run = batch * heads * n_q * n_k > 0
    new = torch.empty if run else torch.zeros  # the kernels write every entry when they run
    dq = new(q.shape, dtype=q.dtype, device=q.device)
    # GQA: per-query-head float32 partial sums, reduced over each group below.
    part_dtype = q.dtype if group == 1 else torch.float32
    dk = new((batch, heads, n_k, d), dtype=part_dtype, device=q.device)
    dv_ = new((batch, heads, n_k, dv), dtype=part_dtype, device=q.device)
    if run:
        consts = _head_consts(d, dv, q.dtype)
        blocks, fixed = _blocks(
            max(consts["BLOCK_D"], consts["BLOCK_DV"]), q.dtype, block_m, block_n
        )
        (kv_len, band), mask_consts = _mask_args(mask, lse)
        (bias_view, bias_strides, cap), score_consts = _score_args(score, lse)
        db_view = db.acc.expand(batch, heads, n_q, n_k) if db is not None else lse
        db_consts = {
            "BIAS_GRAD": db is not None,
            "DB_SUM_Q": db is not None and db.sum_q,
            "DB_SUM_K": db is not None and db.sum_k,
            "DB_ATOMIC": db is not None and db.atomic,
        }
        db_strides = db_view.stride() if db is not None else (0, 0, 0, 0)
        delta = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
        common = (scale, cap, n_q, n_k, heads, group, *band)

        def launch(cfg: _Blocks) -> None:
            if db is not None:  # a retry after an out-of-resources error starts over
                db.acc.zero_()
            # launch options only; the preprocess kernel has no mask or dot
            options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
            grid_m = (triton.cdiv(n_q, cfg.block_m), batch, heads)
            _attn_bwd_preprocess[grid_m](
                o, do, delta, *o.stride(), *do.stride(), n_q, heads,
                DV=dv, BLOCK_M=cfg.block_m, BLOCK_DV=consts["BLOCK_DV"], **options,
            )  # fmt: skip
            grid_n = (triton.cdiv(n_k, cfg.block_n), batch, heads)
            _attn_bwd_dkdv[grid_n](
                q, k, v, do, lse, delta, dk, dv_, kv_len, bias_view, db_view,
                *q.stride(), *k.stride(), *v.stride(), *do.stride(),
                *dk.stride(), *dv_.stride(), *bias_strides, *db_strides, *common,
                BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **consts, **mask_consts,
                **score_consts, **db_consts, **options,
            )  # fmt: skip
            _attn_bwd_dq[grid_m](
                q, k, v, do, lse, delta, dq, kv_len, bias_view,
                *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
                *bias_strides, *common,
                BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **consts, **mask_consts,
                **score_consts, **options,
            )  # fmt: skip

        _launch(launch, blocks, fixed)
    if group > 1:
        dk = dk.view(batch, heads_kv, group, n_k, d).sum(2).to(q.dtype)
        dv_ = dv_.view(batch, heads_kv, group, n_k, dv).sum(2).to(q.dtype)
    if db is None:
        return dq, dk, dv_
    return dq, dk, dv_, db.acc.to(score.bias.dtype).reshape(score.bias.shape)
