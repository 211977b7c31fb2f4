"""Which nestplan this is: its version and a digest of everything it computes from (its code, its
catalog and its data), so that results of another build can be told apart even where the version
number did not change."""

from __future__ import annotations

import hashlib
from pathlib import Path

from . import __version__
from .caching import cached

_SOURCE_SUFFIXES = (".py", ".toml", ".csv")
"""The package's own files that make its figures: its code, its catalog, its data."""


@cached(maxsize=1)
def fingerprint() -> str:
    """The first 12 hex digits of a SHA-256 over the package's code, catalog and data files
    (their paths from the package folder and their bytes, in path order); the same installed
    nestplan gives the same digest in every process, any edit or release another."""
    root = Path(__file__).parent
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(p for p in root.rglob("*") if p.suffix in _SOURCE_SUFFIXES
                       and "__pycache__" not in p.parts and p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]
