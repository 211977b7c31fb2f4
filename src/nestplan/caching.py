"""Every memo cache of nestplan, with one reset.

The cost model, the search and the catalog memoise pure functions of frozen specs. ``cached``
makes such a cache (``functools.lru_cache``) and registers it; ``clear()`` empties them all, for
a long-lived process that wants its memory back or a measurement that must start cold. Catalog
entries read from files are read again once any file they were read from changes, without a
reset (``catalog._FileMemo``).
"""

from __future__ import annotations

from functools import lru_cache

_CACHES: list = []


def cached(maxsize: int | None = 128):
    """``functools.lru_cache(maxsize)``, registered with ``clear``."""

    def wrap(fn):
        memo = lru_cache(maxsize=maxsize)(fn)
        _CACHES.append(memo)
        return memo

    return wrap


def register(memo):
    """Register a cache of another shape (with ``cache_clear`` and ``cache_info``) with
    ``clear``; returns it."""
    _CACHES.append(memo)
    return memo


def clear() -> None:
    """Empty every cache ``cached`` made."""
    for memo in _CACHES:
        memo.cache_clear()


def count() -> int:
    """How many caches are registered."""
    return len(_CACHES)
