"""sympy's expression cache, sized for a proof run.

sympy memoises the construction of its expressions (``Add``, ``Mul``, ``Pow``, ``exp``…:
``sympy.core.cache.cacheit``, an LRU of ``SYMPY_CACHE_SIZE`` entries, 1000 by default, read
once when sympy is imported). A proof runs the library's code many times over the same
symbols: the forward once per block size, the reverse once per block size and query row
of ``G``, recomputing the same scores and ``e^{s − m}`` each time. With 1000 entries those
constructions are evicted before they recur; with 2^16 the reverse at ``--max-n 8`` runs
in ~30% less CPU. The cache holds values of pure functions (the same arguments build the
same expression), so its size changes the time a proof takes, never its verdict.

``exactattn`` imports sympy before a command runs, so the environment variable cannot be
set in time; :func:`widen` gives each cached function a larger LRU in place instead (an
empty one: only what is built afterwards is kept). Where sympy's cache is not the one
described here (another version, or ``SYMPY_USE_CACHE=no``), it changes nothing.
"""

from __future__ import annotations

import functools

from sympy.core import cache

MAXSIZE = 2**16


def widen(maxsize: int = MAXSIZE) -> int:
    """Give every cached sympy function an LRU of at least ``maxsize`` entries; how many
    functions it resized (0 when they already were, or the cache is not the expected one)."""
    resized = 0
    for wrapper in list(getattr(cache, "CACHE", ())):
        cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__ or ()))
        if "cfunc" not in cells or "func" not in cells:
            continue
        current = cells["cfunc"].cell_contents
        size = current.cache_info().maxsize
        if size is None or size >= maxsize:
            continue
        wider = functools.lru_cache(maxsize, typed=True)(cells["func"].cell_contents)
        cells["cfunc"].cell_contents = wider
        wrapper.cache_info, wrapper.cache_clear = wider.cache_info, wider.cache_clear
        resized += 1
    return resized
