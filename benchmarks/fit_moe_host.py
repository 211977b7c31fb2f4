#!/usr/bin/env python3
"""Fit the MoE layer's host time (``moe_layer_host_ms``) on the development MoE runs; score it
on the held-out ones.

Dropless token dispatch waits on the host once per MoE layer forward (see
``StackSpec.moe_layer_host``), so a forward whose device work is shorter than the host's takes the
host's time. One value for the Megatron-Core family (every stack in these files is based on
``megatron-core``) is chosen by a scan that minimises the mean |error| of the development rows
(``tests/data/moe_runs.csv``). The held-out MoE rows (``tests/data/moe_held_out.csv`` and the MoE
rows of ``tests/data/held_out_runs.csv``) are then predicted with it, never fitted.

Then the part of that host time the attention launches (``attention_host_share``), which per-layer
graphs of the attention spare an eager MoE layer: a scan of 0-1 over the development rows (both
files) whose stacks graph the attention; the held-out rows that do are printed beside it.

    python benchmarks/fit_moe_host.py
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from nestplan.units import MS
from nestplan.validation import load_cases, predict

from moe_accuracy import FAR, GB, held_out_release  # the split and the bound, beside this file

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
DEV = [DATA / "moe_runs.csv"]
HELD_OUT = [DATA / "moe_held_out.csv", DATA / "held_out_runs.csv"]
GRID_MS = [i / 10 for i in range(0, 151)]


def moe_cases(paths):
    return [c for p in paths for c in load_cases(p)
            if c.metric == "step_time" and c.scenario.model.moe is not None]


def errors(cases, host_ms: float) -> list[float]:
    """Each case's relative error with ``moe_layer_host`` at ``host_ms``."""
    return stack_errors(cases, moe_layer_host=host_ms * MS)


def stack_errors(cases, **fields) -> list[float]:
    """Each case's relative error with its stack's ``fields`` replaced."""
    out = []
    for c in cases:
        seconds, _ = predict(c, replace(c.scenario.stack, **fields))
        out.append(seconds / c.measured - 1)
    return out


def mean_abs(errs) -> float:
    return sum(abs(e) for e in errs) / len(errs)


def main() -> None:
    dev, held = moe_cases(DEV), moe_cases(HELD_OUT)
    scan = [(mean_abs(errors(dev, h)), h) for h in GRID_MS]
    best_mae, best = min(scan)
    print(f"development rows {len(dev)}; scan 0-{GRID_MS[-1]} ms: best {best:.1f} ms "
          f"(mean |error| {best_mae:.1%}; at 0 ms {scan[0][0]:.1%})")
    for name, cases in (("development", dev), ("held out", held)):
        before, after = errors(cases, 0.0), errors(cases, best)
        print(f"\n{name}: {len(cases)} rows  mean |error| {mean_abs(before):.1%} -> "
              f"{mean_abs(after):.1%}  median {statistics.median(map(abs, after)):.1%}  "
              f"rows over {FAR:.0%}: {sum(abs(e) > FAR for e in after)}")
        for c, b, a in zip(cases, before, after):
            print(f"  {c.id:44s} {c.scenario.stack.name[:30]:30s} {b:+7.1%} -> {a:+7.1%}")
    # the GB200/GB300/B300 rows, loaded after the fit: what a refit on every development row
    # would pick (coarser grid), against the catalog's value
    newer = moe_cases([GB])
    more = dev + [c for c in newer if not held_out_release(c)]
    catalog = dev[0].scenario.stack.moe_layer_host / MS
    scan = [(mean_abs(errors(more, h)), h) for h in GRID_MS[::5]]
    print(f"\nall {len(more)} development rows (with the GB200/GB300/B300 file's): a refit would "
          f"pick {min(scan)[1]:.1f} ms (mean |error| {min(scan)[0]:.1%}; at the catalog's "
          f"{catalog:.1f} ms {mean_abs(errors(more, catalog)):.1%})")
    # the attention's share of that host time: a scan over the development rows whose stacks
    # graph the attention per layer (their recipes' cuda_graph_scope), the held-out ones scored
    graphed = [c for c in more if c.scenario.stack.graphs_attention]
    held_graphed = [c for c in held + [n for n in newer if held_out_release(n)]
                    if c.scenario.stack.graphs_attention]
    scan = [(mean_abs(share_errors(graphed, s)), s) for s in SHARES]
    best_mae, best = min(scan)
    rest = [c for c in graphed if "gpt-oss" not in c.id]
    print(f"\nattention_host_share on the {len(graphed)} development rows whose stacks graph the "
          f"attention: scan 0-1: best {best:.2f} (mean |error| {scan[0][0]:.1%} at 0 -> "
          f"{best_mae:.1%}; without GPT-OSS {mean_abs(share_errors(rest, 0.0)):.1%} -> "
          f"{mean_abs(share_errors(rest, best)):.1%})")
    for name, cases in (("development", graphed), ("held out", held_graphed)):
        for c, b, a in zip(cases, share_errors(cases, 0.0), share_errors(cases, best)):
            print(f"  {name:11s} {c.id:44s} {b:+7.1%} -> {a:+7.1%}")


SHARES = [i / 20 for i in range(21)]


def share_errors(cases, share: float) -> list[float]:
    """Each case's relative error with ``attention_host_share`` at ``share``."""
    return stack_errors(cases, attention_host_share=share)


if __name__ == "__main__":
    main()
