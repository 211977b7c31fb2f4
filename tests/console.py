"""The installed ``nestplan`` console script, run in a subprocess (so that a traceback cannot hide
behind an in-process call): bad-input tests go through it."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# the console script of the interpreter running the tests (its venv need not be on PATH)
_BESIDE = Path(sys.executable).parent / "nestplan"
NESTPLAN = str(_BESIDE) if _BESIDE.exists() else shutil.which("nestplan")


def cli(*args, cwd=None, timeout=120):
    """Run ``nestplan ARGS``: (exit code, stdout, stderr)."""
    if NESTPLAN is None:
        pytest.skip("the nestplan console script is not installed")
    p = subprocess.run([NESTPLAN, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def one_line_error(code: int, out: str, err: str, needle: str) -> bool:
    """Exit 2, nothing on stdout, one line on stderr that holds ``needle``."""
    lines = err.strip().splitlines()
    return code == 2 and out == "" and len(lines) == 1 and needle in lines[0]
