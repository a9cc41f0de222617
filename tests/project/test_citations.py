"""Every document the code and the docs cite resolves to a file of the checkout, and every
relative link of a markdown page to a file (and its heading) there.

A citation is a path to a markdown file under a tracked folder (``docs/algorithm.md``,
``gpu/README.md``) or an upper-case document name (``README.md``); both
must name a tracked file (an upper-case name at the top or beside the citing file).
Lower-case bare names (``report.md``, ``cert.md``) are files the commands write, not
citations.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.project.tracked import tracked

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.md)\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def unresolved(path: str, text: str, files: set[str]) -> list[str]:
    """The citations in ``text`` (a file at ``path``) that name no tracked file."""
    folders = {f.split("/")[0] for f in files if "/" in f}
    here = str(Path(path).parent)
    out = []
    for cited in CITATION.findall(text):
        head = cited.split("/")[0]
        if "/" in cited and head in folders:
            ok = cited in files
        elif "/" not in cited and cited[:-3].isupper():
            ok = cited in files or f"{here}/{cited}" in files
        else:
            continue  # an output file a command writes (report.md, DIR/report.md, ...)
        if not ok:
            out.append(f"{path}: {cited}")
    return out


def test_every_cited_document_exists():
    files = set(tracked())
    sources = [f for f in files if f.endswith((".py", ".md", ".toml")) or f.startswith(".ci/")]
    missing = []
    for path in sorted(sources):
        missing += unresolved(path, (ROOT / path).read_text(errors="replace"), files)
    assert missing == []


def test_a_citation_of_a_missing_document_is_caught():
    """certified.py once cited the seed's ALGORITHM document, which is not in the checkout
    (the names are spelt in pieces here so that this file cites nothing itself)."""
    md = ".md"
    files = {f"docs/algorithm{md}", "exactattn/oracle/certified.py", f"README{md}"}
    text = f"see ALGORITHM{md} and docs/algorithm{md}, docs/gone{md}; writes DIR/report{md}"
    assert unresolved("exactattn/oracle/certified.py", text, files) == [
        f"exactattn/oracle/certified.py: ALGORITHM{md}",
        f"exactattn/oracle/certified.py: docs/gone{md}",
    ]


def anchors(text: str) -> set[str]:
    """The anchors of a markdown page's headings, as GitHub makes them: lower case, the
    punctuation dropped, spaces as hyphens, a repeated heading numbered ``-1``, ``-2``, ..."""
    out: set[str] = set()
    for line in FENCE.sub("", text).splitlines():
        if line.startswith("#"):
            slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            n, base = 0, slug
            while slug in out:
                n += 1
                slug = f"{base}-{n}"
            out.add(slug)
    return out


def broken_links(path: str, text: str, files: set[str], read) -> list[str]:
    """The relative links of the page at ``path`` whose file is not tracked or whose
    ``#anchor`` is no heading of it (``read(file)`` gives a tracked page's text)."""
    folders = {f.rsplit("/", 1)[0] for f in files if "/" in f}
    out = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        resolved = path if not file else os.path.normpath(os.path.join(os.path.dirname(path), file))
        if resolved.rstrip("/") not in files and resolved.rstrip("/") not in folders:
            out.append(f"{path}: {target}")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(read(resolved)):
            out.append(f"{path}: {target} (no such heading)")
    return out


def test_every_relative_link_of_the_docs_resolves():
    files = set(tracked())
    read = lambda name: (ROOT / name).read_text()  # noqa: E731
    broken = []
    for path in sorted(f for f in files if f.endswith(".md")):
        broken += broken_links(path, read(path), files, read)
    assert broken == []


def test_a_broken_link_is_caught():
    md = ".md"
    pages = {
        f"README{md}": f"[a](docs/x{md}#two-words) [b](docs/gone{md}) [c](#nope) [d](docs/)",
        f"docs/x{md}": f"# Two words\n[up](../README{md}) [e](img/p.png) [f](https://e.org)",
    }
    files = set(pages) | {"docs/img/q.png"}
    found = [
        out for path, text in pages.items() for out in broken_links(path, text, files, pages.get)
    ]
    assert found == [
        f"README{md}: docs/gone{md}",
        f"README{md}: #nope (no such heading)",
        f"docs/x{md}: img/p.png",
    ]
