"""The guard that keeps a second Ctrl-C or SIGTERM from cutting short the stopping of workers."""

from __future__ import annotations

import signal
import threading

import pytest

from nestplan.processes import Terminated, exit_code, on_sigterm, restore_sigterm, signals_held


def _handlers():
    return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)


def test_signals_are_held_inside_and_given_back_after():
    before = _handlers()
    previous = on_sigterm()  # as a command runs: SIGTERM raises Terminated
    try:
        mine = _handlers()
        with pytest.raises(RuntimeError):
            with signals_held():
                assert _handlers() == (signal.SIG_IGN, signal.SIG_IGN)
                with signals_held():  # stop_pool inside run_sweep's guard
                    assert _handlers() == (signal.SIG_IGN, signal.SIG_IGN)
                assert _handlers() == (signal.SIG_IGN, signal.SIG_IGN)
                raise RuntimeError("cleanup failed")
        assert _handlers() == mine  # back, also after a failure inside
        with pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
    finally:
        restore_sigterm(previous)
    assert _handlers() == before


def test_held_signals_are_ignored_not_lost_in_a_traceback():
    """A SIGINT that arrives inside is ignored: no KeyboardInterrupt there or after."""
    with signals_held():
        signal.raise_signal(signal.SIGINT)
    assert exit_code(Terminated()) == 143 and exit_code(KeyboardInterrupt()) == 130


def test_off_the_main_thread_nothing_changes():
    seen = []

    def run():
        with signals_held():
            seen.append(_handlers())

    before = _handlers()
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [before] and _handlers() == before


def test_workers_die_with_a_parent_killed_outright():
    """SIGKILL leaves a command no time to stop its workers: they end with it (Linux's
    parent-death signal), not run on orphaned (a pipeline engineer's trial found a killed
    compare's and sweep's workers alive 36 s later)."""
    import os
    import subprocess
    import sys
    import time

    from console import NESTPLAN
    from procs import children, running

    from nestplan.processes import cores

    if NESTPLAN is None or not sys.platform.startswith("linux"):
        pytest.skip("the console script on Linux")
    if cores() < 2:
        pytest.skip("compare runs its methods side by side only on two cores or more")
    p = subprocess.Popen([NESTPLAN, "compare", "--model", "qwen3-235b-a22b", "--cluster",
                          "dgx-h100-ndr", "--gpus", "512"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (workers := children(p.pid)) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert workers, "compare started no worker"
        time.sleep(0.5)
        workers = children(p.pid)
        p.kill()
        p.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(running(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [w for w in workers if running(w)]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
