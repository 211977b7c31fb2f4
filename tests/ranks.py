"""Run a function on a few CPU ranks of one gloo process group, for the framework probes beside
this file (``frameworks_*.py``), which measure what a framework's own distributed code sends and
keeps.

The ranks meet at a file in a fresh temporary folder, not at a TCP port: a port found free can be
taken by another process (a test run in parallel) before gloo binds it. They are daemon processes
that also die with the launcher when it is killed (a test's subprocess timeout), and the launcher
stops waiting as soon as any rank has failed.
"""

from __future__ import annotations

import os
import queue
import tempfile
import time

WAIT_S = 240
"""Longest wait for rank 0's answer, seconds: the probes take 5-30 s on two cores, and the tests
that start them give up at 300 s, after which nothing would be left to stop the ranks."""


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (a killed launcher cannot stop its
    daemon ranks itself); elsewhere nothing."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _rank(target, rank: int, world: int, store: str, out, args) -> None:
    _die_with_parent()
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    result = target(rank, *args)
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()
    if rank == 0:
        out.put(result)
        out.close()
        out.join_thread()  # the answer is in the pipe before the process ends
    # leave without the interpreter's teardown, where a thread of the collective libraries has
    # aborted a finished process ("terminate called without an active exception", seen in CI)
    os._exit(0)


def run(target, world: int = 2, args: tuple = ()):
    """``target(rank, *args)`` on ``world`` gloo ranks (the process group is up when it starts);
    returns what rank 0's call returned. Raises ``RuntimeError`` naming the ranks' exit codes if
    one fails, or if no answer comes in ``WAIT_S``."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="nestplan-ranks-") as folder:
        store = os.path.join(folder, "rendezvous")
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(target, r, world, store, out, args), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        result, got, end = None, False, time.monotonic() + WAIT_S
        while not got and time.monotonic() < end and not any(p.exitcode for p in procs):
            try:
                result, got = out.get(timeout=1), True
            except queue.Empty:
                pass
        failed = [p.exitcode for p in procs if p.exitcode]
        if not got or failed:
            for p in procs:  # (a rank stuck where gloo does not notice its peer's end)
                p.terminate()
        for p in procs:
            p.join(timeout=30)
        codes = [p.exitcode for p in procs]
        if not got and not failed:
            raise RuntimeError(f"no answer from rank 0 in {WAIT_S} s: exit codes {codes}")
        if failed or any(codes):
            raise RuntimeError(f"a rank failed: exit codes {codes}")
    return result


def print_result(target, world: int = 2, args: tuple = (), wrap=lambda result: result) -> None:
    """A probe's main: ``run`` it and print ``wrap`` of rank 0's answer as one JSON line on
    stdout, or exit naming the ranks' failure."""
    import json
    import sys

    try:
        result = run(target, world, args)
    except RuntimeError as e:
        sys.exit(str(e))
    print(json.dumps(wrap(result)))
