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
