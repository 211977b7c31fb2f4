"""The processes running here, from Linux's /proc (tests that check nothing is left running)."""

from __future__ import annotations

import os


def processes() -> dict[int, tuple[int, bytes]]:
    """Every process here: pid -> (parent pid, command line)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    out[int(entry)] = (ppid, f.read())
            except (OSError, ValueError, IndexError):
                pass
    return out


def children(pid: int) -> list[int]:
    """The processes ``pid`` started that are still running (not zombies awaiting their parent)."""
    return [child for child, (ppid, _) in processes().items() if ppid == pid and running(child)]


def running(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
