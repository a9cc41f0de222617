"""``.ci/run`` runs README's commands, and none of its pytest runs can come back empty.

(pytest exits 5 when it collects no test: a marker selection that matches nothing would
turn CI red, or, with the status ignored, silently skip a whole step.)
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CI = (ROOT / ".ci" / "run").read_text()
README = (ROOT / "README.md").read_text()


def _pytest_lines() -> list[str]:
    lines = [line.strip() for line in CI.splitlines() if not line.lstrip().startswith("#")]
    return [line for line in lines if re.search(r"\bpytest\b", line)]


def _readme_test_command() -> str:
    section = README.split("Install and run the tests", 1)[1]
    return re.search(r"```bash\n(.+?)\n```", section, flags=re.S).group(1).strip()


def test_ci_first_runs_readme_test_command_verbatim():
    command = _readme_test_command()
    assert command.endswith("python -m pytest -q"), command
    assert _pytest_lines()[0].startswith(command)


def test_the_last_pytest_line_of_ci_is_in_readme():
    assert _pytest_lines()[-1] in README


def test_every_marker_selection_in_ci_selects_some_test():
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    for line in _pytest_lines():
        for expression in re.findall(r"-m\s+(\S+)", line):
            if expression == "pytest":  # python -m pytest
                continue
            assert re.fullmatch(r"\w+", expression), f"teach this test {expression!r}: {line}"
            assert f"pytest.mark.{expression}" in sources, f"no test is marked {expression}"
