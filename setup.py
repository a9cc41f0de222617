"""Package discovery, the one thing ``pyproject.toml`` cannot say: ``proofs/`` stays at the
top of the checkout and ships in the wheel as ``exactattn.proofs`` (``exactattn prove``
works from an installed package too). Every package under ``exactattn/`` and ``proofs/`` is
found, so a new folder cannot be left out of the wheel (a hand-written list once left
``exactattn.cases`` out). All other metadata is in ``pyproject.toml``.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["exactattn", "exactattn.*"])
    + ["exactattn.proofs"]
    + [f"exactattn.proofs.{name}" for name in find_packages("proofs")],
    package_dir={"exactattn.proofs": "proofs"},
)
