"""Run a function on a few CPU ranks of one gloo process group, for the framework probes beside
this file (``frameworks_*.py``), which measure what a framework's own distributed code sends and
keeps.

The ranks meet at a file in a fresh temporary folder, not at a TCP port: a port found free can be
taken by another process (a test run in parallel) before gloo binds it. They are daemon processes,
so a rank left waiting for a dead peer ends with the launcher, and the launcher stops waiting as
soon as any rank has failed.
"""

from __future__ import annotations

import os
import queue
import tempfile

WAIT_S = 600
"""Longest wait for rank 0's answer, seconds (the probes take 5-30 s on two cores)."""


def _rank(target, rank: int, world: int, store: str, out, args) -> None:
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
    one fails or no answer comes in ``WAIT_S``."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="nestplan-ranks-") as folder:
        store = os.path.join(folder, "rendezvous")
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(target, r, world, store, out, args), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        result, got, waited = None, False, 0
        while not got and waited < WAIT_S and not any(p.exitcode for p in procs):
            try:
                result, got = out.get(timeout=1), True
            except queue.Empty:
                waited += 1
        for p in procs:
            p.join(timeout=60)
        codes = [p.exitcode for p in procs]
        if not got or any(codes):
            for p in procs:
                p.terminate()
            raise RuntimeError(f"a rank failed or did not answer in {WAIT_S} s: exit codes {codes}")
    return result
