"""Run a selection of flash-attn's own ``tests/test_flash_attn.py`` against
exactattn.flash_attn.

Not part of the default suite (the file's name is not ``test_*``): it needs flash-attn's test
file, which is never committed here, and einops (the test file's one extra dependency). To
reproduce the run reported for issue 22::

    # a flash-attention checkout (or bare git directory), e.g. the search tool's fetch of
    # github:Dao-AILab/flash-attention
    pip install --target /tmp/fa_tests/deps einops
    python tests/external/flash_attn_selection.py /path/to/flash-attention /tmp/fa_tests

It copies ``tests/test_flash_attn.py`` and ``flash_attn/bert_padding.py`` into the output
folder, changes only the device and the imports (``"cuda"`` → ``"cpu"``, the device
capability fixed to an A100's ``(8, 0)`` so every gradient assertion is active,
``from flash_attn import`` → ``from exactattn.flash_attn import``; the two dropout-only
helpers and the rotary reference come from a stub that raises), and runs pytest on a seeded
selection: per test function, the parametrizations with no dropout, no rotary embedding, no
left padding, ``seqlen ≤ 512`` and ``headdim ≤ 128``, drawn with ``random.Random(0)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

QUOTA = {  # parametrizations drawn per test function
    "test_flash_attn_output": 90,
    "test_flash_attn_varlen_output": 70,
    "test_flash_attn_causal": 40,
    "test_flash_attn_varlen_causal": 30,
    "test_flash_attn_kvcache": 60,
    "test_flash_attn_qkvpacked": 15,
    "test_flash_attn_varlen_qkvpacked": 15,
}
MAX_SEQLEN, MAX_HEADDIM, SEED = 512, 128, 0

REPLACEMENTS = [  # (old, new): the device and the imports, nothing else
    ("from flash_attn import (", "from exactattn.flash_attn import ("),
    ("from flash_attn.bert_padding import", "from bert_padding import"),
    (
        "from flash_attn.flash_attn_interface import _get_block_size_n, USE_TRITON_ROCM",
        "from flash_attn_stubs import _get_block_size_n, USE_TRITON_ROCM, apply_rotary_emb",
    ),
    ("from flash_attn.layers.rotary import apply_rotary_emb\n", ""),
    ('torch.cuda.get_device_capability("cuda")', "(8, 0)"),
    ('torch.cuda.get_device_properties("cuda").total_memory', "(64 * 2**30)"),
    ('device = "cuda"', 'device = "cpu"'),
    ('device="cuda"', 'device="cpu"'),
]

STUBS = """USE_TRITON_ROCM = False


def _get_block_size_n(*args, **kwargs):
    raise NotImplementedError("flash-attn's kernel block size: its dropout tests are not run")


def apply_rotary_emb(*args, **kwargs):
    raise NotImplementedError("rotary embeddings are out of scope for exactattn.flash_attn")
"""

PLUGIN = f"""import random

QUOTA = {QUOTA!r}


def _eligible(params):
    if params.get("dropout_p", 0.0) != 0.0 or params.get("rotary_fraction", 0.0) != 0.0:
        return False
    if params.get("has_leftpad", False):
        return False
    lengths = [params[n] for n in ("seqlen", "seqlen_q", "seqlen_k") if n in params]
    return max(lengths) <= {MAX_SEQLEN} and params.get("d", 0) <= {MAX_HEADDIM}


def pytest_collection_modifyitems(config, items):
    by_function = {{}}
    for item in items:
        by_function.setdefault(item.originalname, []).append(item)
    keep = set()
    for name, quota in QUOTA.items():
        pool = sorted(
            (i for i in by_function.get(name, []) if _eligible(i.callspec.params)),
            key=lambda i: i.nodeid,
        )
        keep.update(random.Random({SEED}).sample(pool, min(quota, len(pool))))
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
    (out / "flash_attn_stubs.py").write_text(STUBS)
    (out / "select_issue22.py").write_text(PLUGIN)


def main() -> int:
    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    prepare(source, out)
    root = Path(__file__).resolve().parents[2]
    paths = [str(out / "deps"), str(out), str(root), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    command = [sys.executable, "-m", "pytest", "test_flash_attn.py", "-p", "select_issue22",
               "-q", "-rfs", "-p", "no:cacheprovider", *sys.argv[3:]]  # fmt: skip
    return subprocess.run(command, cwd=out, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
