"""FlexAttention programs for ``exactattn prove --mask-mod tests/scaleout/programs.py:NAME``."""

from __future__ import annotations

import multiprocessing
import os
import signal

import numpy as np


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def causal_dies_at_two(b, h, q_idx, kv_idx):
    """Causal, but a worker process evaluating it on a query index ≥ 1 (n ≥ 2) is killed
    (never the process that runs the tests)."""
    if np.any(np.asarray(q_idx) >= 1) and multiprocessing.parent_process() is not None:
        os.kill(os.getpid(), signal.SIGKILL)
    return q_idx >= kv_idx
