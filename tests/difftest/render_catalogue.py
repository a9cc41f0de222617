"""Print the rows of ``docs/bad_inputs.md``'s table from the catalogue (paste them in).

    PYTHONPATH=. python -m tests.difftest.render_catalogue

Error texts are the messages the first function of each row raises today; rows with a
``behaviour`` text (results, open bugs) print that instead.
"""

from __future__ import annotations

import warnings

from .catalogue import ALL, BACKWARD, FORWARD, KEYWORDS, NUMPY, PAIRWISE, ROWS, call, good

GROUPS = (
    ("all", ALL),
    ("all taking q, k, v", PAIRWISE),
    ("NumPy-input functions", NUMPY),
    ("all with keywords", KEYWORDS),
    ("forwards", FORWARD),
    ("backwards", BACKWARD),
)


def _functions(names: tuple[str, ...]) -> str:
    for label, group in GROUPS:
        if set(names) == set(group):
            return label
    return ", ".join(f"`{n}`" for n in names)


def _behaviour(row) -> str:
    if row.behaviour:
        text = row.behaviour
    else:
        try:
            call(row.functions[0], row.spoil(good()))
            text = "works"
        except Exception as error:  # the message is what we document
            message = str(error).split("\n")[0]
            message = message if len(message) <= 110 else message[:107] + "..."
            text = f"`{type(error).__name__}`: {message}"
    if row.bug:
        text = f"**open bug** ({row.bug}) — expected: {text}"
    return text.replace("|", "\\|")


def main() -> None:
    warnings.simplefilter("ignore")
    for row in ROWS:
        print(f"| `{row.id}` | {row.what} | {_functions(row.functions)} | {_behaviour(row)} |")


if __name__ == "__main__":
    main()
