"""Where an input file really is: light enough for the catalog's start-up import (``list``'s
argument parser imports the catalog; the loaders and the specs they import are not needed)."""

from __future__ import annotations

import os
from pathlib import Path


def real_path(path) -> Path:
    """The file ``path`` names, links followed; where they lead nowhere (a loop of links:
    RuntimeError from Path.resolve in Python 3.11 and 3.12, OSError later) its absolute path,
    and reading it says what is wrong."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError):
        return Path(os.path.abspath(path))
