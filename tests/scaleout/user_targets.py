"""Attention functions a test checks by name (``tests.scaleout.user_targets:NAME``), so that
worker processes and Dask workers can load them too."""

from __future__ import annotations

import multiprocessing
import os
import signal

import torch.nn.functional as F


def skewed(q, k, v, **kw):
    """SDPA off by 1e-3 relative: far beyond any float32 bound."""
    return F.scaled_dot_product_attention(q, k, v, **kw) * (1 + 1e-3)


def dies_on_odd_queries(q, k, v, **kw):
    """SDPA, except that it kills its (worker) process on a case with an odd number of
    query rows (never the process that runs the tests)."""
    if q.shape[-2] % 2 and multiprocessing.parent_process() is not None:
        os.kill(os.getpid(), signal.SIGKILL)
    return F.scaled_dot_product_attention(q, k, v, **kw)
