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


def flags(*args) -> list:
    """``args`` with each flag given once, a later one replacing an earlier one's value (the
    command line refuses a flag given twice): ``flags(*BASE, "--pp", 2)``. A flag followed by
    another flag, or last, is taken as one without a value."""
    out: list = []
    i = 0
    while i < len(args):
        a = args[i]
        has_value = (isinstance(a, str) and a.startswith("--") and i + 1 < len(args)
                     and not str(args[i + 1]).startswith("--"))
        item = [a, args[i + 1]] if has_value else [a]
        if isinstance(a, str) and a.startswith("--") and a in out:
            j = out.index(a)
            given = j + 1 < len(out) and not str(out[j + 1]).startswith("--")
            del out[j:j + (2 if given else 1)]
        out += item
        i += len(item)
    return out


def one_line_error(code: int, out: str, err: str, needle: str) -> bool:
    """Exit 2, nothing on stdout, one line on stderr that holds ``needle``."""
    lines = err.strip().splitlines()
    return code == 2 and out == "" and len(lines) == 1 and needle in lines[0]
