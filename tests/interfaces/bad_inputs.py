"""The bad inputs of the interfaces (varlen, paged, merge, sinks, key ranges, flash_attn), as data.

Each row: an id (the first column of the "Interfaces" table of ``docs/bad_inputs.md``), what is
wrong, the call that makes the mistake on otherwise good inputs, and the behaviour: an error
type and a pattern its message must match (the argument's name), or a check of the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import exactattn as ea

RNG = np.random.default_rng(0)
CU = np.array([0, 2, 2, 5])  # three sequences, the second empty
Q, K, V = RNG.normal(size=(5, 2, 3)), RNG.normal(size=(5, 1, 3)), RNG.normal(size=(5, 1, 2))
CACHE = RNG.normal(size=(4, 2, 1, 3))  # 4 pages of 2 positions
TABLE = np.array([[0, 1], [2, 3]])
PAGED_Q = RNG.normal(size=(2, 1, 2, 3))
NEW = RNG.normal(size=(2, 1, 1, 3))
PART = (RNG.normal(size=(3, 2)), RNG.normal(size=3))
DENSE = (RNG.normal(size=(2, 3, 4)), RNG.normal(size=(2, 5, 4)), RNG.normal(size=(2, 5, 2)))


def _sdpa_sinks(heads: int, grad: bool):
    import torch

    from exactattn.torch import scaled_dot_product_attention

    q, k, v = (torch.as_tensor(x)[None] for x in DENSE)
    bias = torch.zeros(3, 5, dtype=q.dtype, requires_grad=grad)
    return scaled_dot_product_attention(q, k, v, bias, sinks=torch.zeros(heads, dtype=q.dtype))


@dataclass(frozen=True)
class Row:
    id: str
    what: str
    run: Callable[[], Any]
    error: type[Exception] | None = None
    pattern: str = ""
    check: Callable[[Any], bool] | None = None
    behaviour: str = ""  # the documented behaviour of a row that works


def _varlen(**kw):
    args = dict(q=Q, k=K, v=V, cu_seqlens_q=CU, cu_seqlens_k=CU)
    return ea.varlen_attention(**{**args, **kw})


def _paged(**kw):
    args = dict(
        q=PAGED_Q, k_cache=CACHE, v_cache=CACHE, block_table=TABLE, cache_seqlens=np.array([3, 1])
    )
    return ea.paged_attention(**{**args, **kw})


def _without_the_empty_sequence(out) -> bool:
    """Equal to the per-sequence definition, where sequence 1 has 2 keys and no query."""
    from .spec import varlen

    y_ref, _ = varlen(Q, K, V, CU, [0, 1, 3, 5])
    return bool(np.abs(out - y_ref).max() < 1e-14)


def _zero_length_rows(out) -> bool:
    y, stats = out
    return bool((y[2] == 0).all() and np.isneginf(stats.lse[:, 2]).all())


def _sink_rows(out) -> bool:
    y, stats = out
    return bool((y[2] == 0).all() and (stats.lse[:, 2] == [0.5, -0.5]).all())


def _flash_attn(**kw):
    """flash_attn_with_kvcache on a contiguous cache of 4 positions (numpy arguments as
    tensors; cache_seqlens=3 unless given)."""
    import torch

    from exactattn.layouts import flash_attn

    q = torch.zeros(1, 1, 1, 4)
    kw = {"cache_seqlens": 3, **kw}
    kw = {key: torch.as_tensor(x) if isinstance(x, np.ndarray) else x for key, x in kw.items()}
    return flash_attn.flash_attn_with_kvcache(
        q, torch.zeros(1, 4, 1, 4), torch.zeros(1, 4, 1, 4), **kw
    )


_NEW = np.zeros((1, 1, 1, 4), dtype=np.float32)
_NEW_KV = dict(k=_NEW, v=_NEW)  # one new key and value for _flash_attn's batch of one


ROWS = [
    Row(
        "varlen.cu-start",
        "cu_seqlens not starting at 0",
        lambda: _varlen(cu_seqlens_q=np.array([1, 2, 2, 5])),
        ValueError,
        "cu_seqlens_q must start at 0",
    ),
    Row(
        "varlen.cu-decreasing",
        "cu_seqlens decreasing",
        lambda: _varlen(cu_seqlens_k=np.array([0, 3, 2, 5])),
        ValueError,
        "cu_seqlens_k must be nondecreasing",
    ),
    Row(
        "varlen.cu-end",
        "cu_seqlens not ending at the packed length",
        lambda: _varlen(cu_seqlens_q=np.array([0, 2, 2, 4])),
        ValueError,
        "cu_seqlens_q ends at 4 but",
    ),
    Row(
        "varlen.cu-shape",
        "cu_seqlens not a vector of S+1 offsets",
        lambda: _varlen(cu_seqlens_q=np.array([5])),
        ValueError,
        "cu_seqlens_q must be a 1-D array",
    ),
    Row(
        "varlen.cu-dtype",
        "cu_seqlens of floats",
        lambda: _varlen(cu_seqlens_q=CU.astype(float)),
        TypeError,
        "cu_seqlens_q must hold integers",
    ),
    Row(
        "varlen.cu-batches",
        "cu_seqlens_q and cu_seqlens_k of different batches",
        lambda: _varlen(cu_seqlens_q=np.array([0, 5])),
        ValueError,
        "cu_seqlens_q has 1 sequences but",
    ),
    Row(
        "varlen.max-seqlen",
        "max_seqlen smaller than a sequence",
        lambda: _varlen(max_seqlen_q=2, max_seqlen_k=2),
        ValueError,
        "max_seqlen 2 is smaller than sequence 2",
    ),
    Row(
        "varlen.layout",
        "q not packed as (total, heads, dim)",
        lambda: _varlen(q=Q[None]),
        ValueError,
        r"q must be packed as \(total, heads, dim\)",
    ),
    Row(
        "varlen.mask",
        "a mask= beside cu_seqlens",
        lambda: _varlen(mask=np.ones((5, 5), bool)),
        TypeError,
        "varlen attention takes no mask=",
    ),
    Row(
        "varlen.window",
        "a negative window side",
        lambda: _varlen(window=(-2, None)),
        ValueError,
        "window left must be a non-negative integer",
    ),
    Row(
        "varlen.alibi-shape",
        "alibi_slopes neither (H,) nor (S, H)",
        lambda: _varlen(alibi_slopes=np.ones(3)),
        ValueError,
        r"alibi_slopes has shape \(3,\)",
    ),
    Row(
        "varlen.empty-sequence",
        "a sequence with keys but no queries (len_q = 0)",
        lambda: _varlen(cu_seqlens_k=np.array([0, 1, 3, 5])),
        check=_without_the_empty_sequence,
        behaviour="works: it owns no rows of the output; its keys are never read",
    ),
    Row(
        "varlen.no-keys",
        "queries whose sequence has no keys (len_k = 0)",
        lambda: _varlen(cu_seqlens_k=np.array([0, 2, 5, 5]), return_stats=True),
        check=_zero_length_rows,
        behaviour="works: y = 0, lse = −∞ (empty_rows defaults to 'zero')",
    ),
    Row(
        "varlen.no-keys-sink",
        "the same with sinks",
        lambda: _varlen(
            cu_seqlens_k=np.array([0, 2, 5, 5]), sinks=np.array([0.5, -0.5]), return_stats=True
        ),
        check=_sink_rows,
        behaviour="works: y = 0, lse = the head's sink",
    ),
    Row(
        "paged.table-range",
        "a block_table entry that is no page",
        lambda: _paged(block_table=np.array([[0, 9], [2, 3]])),
        ValueError,
        r"block_table\[0, 1\] = 9 is not a page",
    ),
    Row(
        "paged.capacity",
        "an append past a sequence's pages",
        lambda: _paged(cache_seqlens=np.array([4, 1]), k=NEW, v=NEW),
        ValueError,
        "sequence 0 needs 5 positions",
    ),
    Row(
        "paged.shared-append",
        "an append to a page shared between sequences",
        lambda: _paged(
            block_table=np.array([[0, 1], [0, 3]]), cache_seqlens=np.array([1, 1]), k=NEW, v=NEW
        ),
        ValueError,
        "cannot be appended to",
    ),
    Row(
        "paged.table-shape",
        "block_table not (batch, pages)",
        lambda: _paged(block_table=TABLE[:1]),
        ValueError,
        r"block_table has shape \(1, 2\)",
    ),
    Row(
        "paged.seqlens-shape",
        "cache_seqlens of another batch",
        lambda: _paged(cache_seqlens=np.array([1, 1, 1])),
        ValueError,
        r"cache_seqlens has shape \(3,\)",
    ),
    Row(
        "paged.seqlens-negative",
        "a negative cache_seqlens",
        lambda: _paged(cache_seqlens=np.array([-1, 1])),
        ValueError,
        "cache_seqlens must be >= 0",
    ),
    Row(
        "paged.no-seqlens",
        "a paged cache without cache_seqlens",
        lambda: _paged(cache_seqlens=None),
        ValueError,
        "a paged cache needs cache_seqlens",
    ),
    Row(
        "paged.batch-idx",
        "cache_batch_idx out of range",
        lambda: ea.paged_attention(
            PAGED_Q, CACHE, CACHE, None, 1, cache_batch_idx=np.array([0, 7])
        ),
        ValueError,
        r"cache_batch_idx\[1\] = 7 is not a row of k_cache",
    ),
    Row(
        "paged.half-new", "new k without v", lambda: _paged(k=NEW), ValueError, "give both k and v"
    ),
    Row(
        "merge.empty", "no partials", lambda: ea.merge_partials([]), ValueError, "partials is empty"
    ),
    Row(
        "merge.not-pair",
        "a part that is neither (y, lse) nor a Summary",
        lambda: ea.merge_partials([PART, PART[0]]),
        TypeError,
        r"partials\[1\] must be a \(y, lse\) pair",
    ),
    Row(
        "merge.lse-shape",
        "an lse that is not y's shape less its last axis",
        lambda: ea.merge_partials([(PART[0], PART[1][:2])]),
        ValueError,
        r"partials\[0\]: y has shape \(3, 2\) and lse \(2,\)",
    ),
    Row(
        "merge.rows",
        "parts over different query rows",
        lambda: ea.merge_partials([PART, (PART[0][:2], PART[1][:2])]),
        ValueError,
        "every part must cover the same query rows",
    ),
    Row(
        "merge.lse-base",
        "an lse base other than e or 2",
        lambda: ea.merge_partials([PART], lse_base=10),
        ValueError,
        "lse_base must be 'e'",
    ),
    Row(
        "sinks.shape",
        "sinks not one logit per query head",
        lambda: ea.attention(*DENSE, sinks=np.ones(3)),
        ValueError,
        r"sinks has shape \(3,\); give one logit per query head, shape \(2,\)",
    ),
    Row(
        "sinks.nonfinite",
        "a NaN or infinite sink",
        lambda: ea.attention(*DENSE, sinks=np.array([0.0, np.inf])),
        ValueError,
        "sinks has NaN or infinite entries",
    ),
    Row(
        "sdpa.sinks-shape",
        "sinks of the SDPA drop-in not one logit per query head",
        lambda: _sdpa_sinks(3, grad=False),
        ValueError,
        r"sinks has shape \(3,\); give one logit per query head, shape \(2,\)",
    ),
    Row(
        "sdpa.sinks-mask-grad",
        "sinks with a floating attn_mask that requires grad",
        lambda: _sdpa_sinks(2, grad=True),
        ValueError,
        "sinks with a floating attn_mask that requires grad",
    ),
    Row(
        "key-range.bounds",
        "a key range outside 0..n_k",
        lambda: ea.attention(*DENSE, key_range=(0, 9)),
        ValueError,
        r"key_range \(0, 9\) must satisfy",
    ),
    Row(
        "key-range.type",
        "a key range that is not a pair",
        lambda: ea.attention(*DENSE, key_range=3),
        TypeError,
        r"key_range must be a \(start, stop\) pair",
    ),
    Row(
        "flash_attn.rotary-dim",
        "a rotary dimension above the head dimension",
        lambda: _flash_attn(rotary_cos=np.zeros((4, 3)), rotary_sin=np.zeros((4, 3)), **_NEW_KV),
        RuntimeError,
        r"rotary_cos \(4, 3\) and rotary_sin \(4, 3\) must both be",
    ),
    Row(
        "flash_attn.rotary-half",
        "rotary_cos without rotary_sin",
        lambda: _flash_attn(rotary_cos=np.zeros((4, 2)), **_NEW_KV),
        RuntimeError,
        "give both rotary_cos and rotary_sin",
    ),
    Row(
        "flash_attn.rotary-no-new",
        "a rotary embedding without new keys to rotate",
        lambda: _flash_attn(rotary_cos=np.zeros((4, 2)), rotary_sin=np.zeros((4, 2))),
        RuntimeError,
        "rotary_cos/rotary_sin rotate the new keys",
    ),
    Row(
        "flash_attn.rotary-short",
        "rotary_cos with fewer positions than the new keys reach",
        lambda: _flash_attn(
            rotary_cos=np.zeros((2, 2)), rotary_sin=np.zeros((2, 2)), cache_seqlens=2, **_NEW_KV
        ),
        RuntimeError,
        "rotary_cos has 2 positions but the new keys and queries reach position 2",
    ),
    Row(
        "flash_attn.leftpad-range",
        "cache_leftpad beyond cache_seqlens",
        lambda: _flash_attn(cache_seqlens=2, cache_leftpad=np.array([3])),
        ValueError,
        r"cache_leftpad\[0\] = 3 is outside 0..cache_seqlens\[0\] = 2",
    ),
    Row(
        "flash_attn.leftpad-shape",
        "cache_leftpad not one start per sequence",
        lambda: _flash_attn(cache_leftpad=np.zeros(2, dtype=np.int64)),
        ValueError,
        r"cache_leftpad has shape \(2,\)",
    ),
    Row(
        "flash_attn.append-runtime",
        "an append past the cache, caught as flash-attn's RuntimeError",
        lambda: _flash_attn(cache_seqlens=4, **_NEW_KV),
        RuntimeError,
        "sequence 0 needs 5 positions",
    ),
    Row(
        "flash_attn.window",
        "window_size not a pair",
        lambda: _flash_attn(window_size=3),
        ValueError,
        r"window_size must be a \(left, right\) pair",
    ),
]
