"""Run a selection of flash-attn's own ``tests/test_flash_attn.py`` against
exactattn.flash_attn.

Not part of the default suite (the file's name is not ``test_*``): it needs flash-attn's test
file, which is never committed here, and einops (the test file's one extra dependency). To
reproduce the run reported for issue 32 (``docs/interfaces.md``, "flash-attn's own tests")::

    # a flash-attention checkout (or bare git directory), e.g. the search tool's fetch of
    # github:Dao-AILab/flash-attention (commit 0251105a)
    pip install --target /tmp/fa_tests/deps einops
    python tests/external/flash_attn_selection.py /path/to/flash-attention /tmp/fa_tests

It copies ``tests/test_flash_attn.py`` and ``flash_attn/bert_padding.py`` into the output
folder and changes only the device, the capability and memory queries and the imports
(``"cuda"`` → ``"cpu"``, the capability fixed to an A100's ``(8, 0)`` so every gradient
assertion is active, ``from flash_attn import`` → ``from exactattn.flash_attn import``, the
kernel's block size ``_get_block_size_n`` from ``exactattn.flash_attn``, which writes
``S_dmask`` in those blocks). The test's rotary reference ``apply_rotary_emb`` (a Triton
kernel) becomes flash-attn's own torch formula ``apply_rotary_emb_torch`` at the per-sequence
offsets. It runs pytest on a seeded selection (``select_k.py`` below): per test function, a
``random.Random(0)`` sample of the parametrizations within the size limits, dropout, rotary,
left padding and paged caches included.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPLACEMENTS = [  # (old, new): imports, device, capability and memory queries, nothing else
    ("from flash_attn import (", "from exactattn.flash_attn import ("),
    ("from flash_attn.bert_padding import", "from bert_padding import"),
    (
        "from flash_attn.flash_attn_interface import _get_block_size_n, USE_TRITON_ROCM",
        "from exactattn.flash_attn import _get_block_size_n\nUSE_TRITON_ROCM = False",
    ),
    (
        "from flash_attn.layers.rotary import apply_rotary_emb",
        "from rotary_cpu import apply_rotary_emb",
    ),
    ('torch.cuda.get_device_capability("cuda")', "(8, 0)"),
    ('torch.cuda.get_device_properties("cuda").total_memory', "(64 * 2**30)"),
    ('device = "cuda"', 'device = "cpu"'),
    ('device="cuda"', 'device="cpu"'),
]

# flash_attn/layers/rotary.py's apply_rotary_emb_torch, with the seqlen_offsets argument of
# its Triton apply_rotary_emb: row s of batch b uses cos[offset_b + s].
ROTARY = """import torch
from einops import repeat


def rotate_half(x, interleaved=False):
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    assert cu_seqlens is None and not inplace
    batch, seqlen = x.shape[:2]
    offsets = torch.as_tensor(seqlen_offsets).reshape(-1, 1).expand(batch, 1)
    positions = offsets.long() + torch.arange(seqlen)
    cos, sin = cos[positions].float(), sin[positions].float()  # (b, s, rotary_dim / 2)
    ro_dim = cos.shape[-1] * 2
    pattern = "... d -> ... 1 (2 d)" if not interleaved else "... d -> ... 1 (d 2)"
    cos, sin = repeat(cos, pattern), repeat(sin, pattern)
    xf = x[..., :ro_dim].float()
    out = xf * cos + rotate_half(xf, interleaved) * sin
    return torch.cat([out.to(x.dtype), x[..., ro_dim:]], dim=-1)
"""

PLUGIN = """'''Seeded selection of flash-attn's parametrizations, random.Random(0) per function.

Eligible: every size <= LIMIT[function] (seqlen, seqlen_q, seqlen_k) and headdim <= 128; dropout,
rotary, left padding, paged caches, alibi, softcap, local, GQA are all drawn as the file
parametrizes them, but for the combinations the file skips itself. QUOTA is the number drawn
per function (all when fewer are eligible); FA_SCALE (env) multiplies the quotas, for a trial
run. Not drawn: race_condition (250 repeated forward and backward passes at batch 60: hours
on 2 CPU cores).
'''

import os
import random

QUOTA = {
    "test_flash_attn_qkvpacked": 150,
    "test_flash_attn_varlen_qkvpacked": 120,
    "test_flash_attn_output": 250,
    "test_flash_attn_varlen_output": 200,
    "test_flash_attn_causal": 50,
    "test_flash_attn_varlen_causal": 50,
    "test_flash_attn_kvcache": 400,
    "test_flash_attn_splitkv": 30,
    "test_flash_attn_bwd_overflow": 30,
    "test_flash_attn_deterministic": 6,
    "test_flash_attn_varlen_deterministic": 6,
    "test_flash_attn_kvcache_paged_block_table_bounds": 2,
    "test_flash_attn_varlen_paged_kv_num_splits": 2,
    "test_flash_attn_generator_arg_must_be_none": 1,
}
LIMIT = {"test_flash_attn_kvcache": 2048, "test_flash_attn_deterministic": 260,
         "test_flash_attn_varlen_deterministic": 260}
DEFAULT_LIMIT, MAX_HEADDIM = 520, 128


def _self_skipped(name, params):
    '''The combinations the test file skips itself (so the draws are all run).'''
    if params.get("softcap", 0.0) > 0.0 and params.get("dropout_p", 0.0) > 0.0:
        return True
    if name != "test_flash_attn_kvcache":
        return False
    new_kv, paged = params["new_kv"], params["paged_kv_block_size"] is not None
    return (
        (params["seqlen_q"] > params["seqlen_k"] and new_kv)
        or (not new_kv and params["rotary_fraction"] > 0.0)
        or (params["has_batch_idx"] and paged)
        or (params["has_leftpad"] and paged)
    )


def _eligible(name, params):
    lengths = [params[n] for n in ("seqlen", "seqlen_q", "seqlen_k") if n in params]
    if lengths and max(lengths) > LIMIT.get(name, DEFAULT_LIMIT):
        return False
    return params.get("d", 0) <= MAX_HEADDIM and not _self_skipped(name, params)


def pytest_collection_modifyitems(config, items):
    scale = float(os.environ.get("FA_SCALE", "1"))
    by_function = {}
    for item in items:
        by_function.setdefault(item.originalname, []).append(item)
    keep = set()
    for name, quota in QUOTA.items():
        pool = sorted(
            (i for i in by_function.get(name, [])
             if _eligible(name, getattr(i, "callspec", None) and i.callspec.params or {})),
            key=lambda i: i.nodeid,
        )
        n = min(len(pool), max(1, round(quota * scale)))
        keep.update(random.Random(0).sample(pool, n))
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = [i for i in items if i in keep]
"""


def _read(source: Path, path: str) -> str:
    if (source / path).exists():
        return (source / path).read_text()
    git = ["git", f"--git-dir={source}", "show", f"HEAD:{path}"]
    return subprocess.run(git, check=True, capture_output=True, text=True).stdout


def prepare(source: Path, out: Path) -> None:
    """The modified copy of flash-attn's test file, its helpers and the selection plugin."""
    out.mkdir(parents=True, exist_ok=True)
    text = _read(source, "tests/test_flash_attn.py")
    for old, new in REPLACEMENTS:
        if old not in text:
            raise SystemExit(f"flash-attn's test file changed: {old!r} not found")
        text = text.replace(old, new)
    (out / "test_flash_attn.py").write_text(text)
    (out / "bert_padding.py").write_text(_read(source, "flash_attn/bert_padding.py"))
    (out / "rotary_cpu.py").write_text(ROTARY)
    (out / "select_k.py").write_text(PLUGIN)


def main() -> int:
    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    prepare(source, out)
    root = Path(__file__).resolve().parents[2]
    paths = [str(out / "deps"), str(out), str(root), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    command = [sys.executable, "-m", "pytest", "test_flash_attn.py", "-p", "select_k",
               "-q", "-rfs", "-p", "no:cacheprovider", *sys.argv[3:]]  # fmt: skip
    return subprocess.run(command, cwd=out, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
