"""Worker processes and the signals that stop them: Ctrl-C (SIGINT) and SIGTERM end a command
cleanly, its workers with it (the sweep's pool, compare's methods side by side)."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (not at start-up: every command imports this module)
    from concurrent import futures


def cores() -> int:
    """Cores this process may run on: its CPU affinity (``taskset``, a container's cpuset), not
    a CPU-time quota (``docker --cpus``), which the kernel does not show as fewer cores."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C."""


def worker_signals():
    """Pool workers leave Ctrl-C to the parent, which stops them with SIGTERM, and die with it
    when it is killed outright (SIGKILL leaves it no time to stop them: a pipeline engineer's
    trial found a killed sweep's workers running on)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()


PR_SET_PDEATHSIG = 1
"""Linux's prctl option that sends this process a signal when its parent ends (prctl(2))."""


def _die_with_parent() -> None:
    """Ask Linux for SIGTERM when the parent process ends, and end now if it already has (it may
    die between the fork and this call; the worker's parent is then init); elsewhere nothing.
    The signal follows the thread that forked: the pools here start their workers from the
    main thread (Python 3.11's fork; under forkserver, the server, which ends with its parent);
    a Ray sweep's workers are Ray's."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        failed = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):
        return
    if not failed and os.getppid() == 1:
        os._exit(0)


@contextlib.contextmanager
def signals_held():
    """Ctrl-C and SIGTERM are ignored inside: a second one while workers are being stopped
    waits for them instead of abandoning them (or raising mid-cleanup); only SIGKILL ends a
    process stuck there. A no-op off the main thread, where handlers cannot be set."""
    try:
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield
    finally:
        for s, handler in previous.items():
            # None: a handler set outside Python, which cannot be put back; the default then
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def stop_pool(ex: futures.ProcessPoolExecutor):
    """End the pool's workers now, whatever they are doing, and cancel what has not started."""
    with signals_held():
        terminate = getattr(ex, "terminate_workers", None)  # Python 3.14
        if terminate is not None:
            terminate()
        else:
            for p in list((getattr(ex, "_processes", None) or {}).values()):
                p.terminate()
        ex.shutdown(wait=True, cancel_futures=True)


def on_sigterm():
    """From now on SIGTERM raises ``Terminated`` in the main thread; the handler it replaced
    (None off the main thread, where none can be set)."""
    def handler(signum, frame):
        raise Terminated()

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return None


def restore_sigterm(previous):
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """The shell's code for a command ended by this signal: 130 (Ctrl-C) or 143 (SIGTERM)."""
    return 128 + int(signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)
