#!/usr/bin/env python3
"""Calibration from one measured run: does it carry to the rest of its group?

For every group of the held-out runs (``tests/data/held_out_runs.csv``: one stack's calibration,
which its variants share (a row may run on a variant file based on it, e.g. with DeepEP), one
accelerator, dense or MoE), and for every choice of the one row a user would measure, fit the
row's stack as ``calibrate`` does (one row: one compute scale; a blank micro-batch or
recomputation chosen again under the fit: ``calibrate.fit_choosing``) and predict the group's
other rows, each with its own stack under that calibration (``StackSpec.calibrated_as``), their
blank knobs chosen under it as ``validate --stack`` chooses them.
Prints per group the median |error| of the other rows before calibration and after it, as the
median and the worst over the choice of the calibration row. Held-out rows are scored here, never
fitted into the catalog.

    python benchmarks/calibrate_groups.py [RUNS.csv]
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from nestplan.accuracy import kind_of
from nestplan.calibrate import fit_choosing
from nestplan.catalog import get_stack, list_names
from nestplan.errors import SpecError
from nestplan.stack import CALIBRATION
from nestplan.validation import load_cases, predict

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parent / "tests" / "data" / "held_out_runs.csv"


def calibration(stack) -> tuple:
    return tuple(getattr(stack, f) for f in CALIBRATION)


def label(stacks) -> str:
    """A group's name: a catalog stack among its rows' own, else one with their calibration
    (catalog stacks that share a calibration, e.g. deepspeed and megatron-deepspeed, are one
    group)."""
    names = sorted({s.name for s in stacks})
    catalog = set(list_names("stacks"))
    for name in names:
        if name in catalog:
            return name
    for name in sorted(catalog):
        try:
            if calibration(get_stack(name)) == calibration(stacks[0]):
                return name
        except SpecError:
            continue
    return names[0]


def groups(cases):
    out = defaultdict(list)
    for c in cases:
        if c.metric != "step_time":
            continue
        sc = c.scenario
        out[(calibration(sc.stack), sc.cluster.accelerator.name, kind_of(sc.model))].append(c)
    return {(label([c.scenario.stack for c in cases]), acc, kind): cases
            for (_, acc, kind), cases in out.items()}


def error(case) -> float:
    seconds, _ = predict(case)
    return abs(seconds / case.measured - 1)


def table(path: Path) -> list[dict]:
    rows = []
    for (stack, acc, kind), cases in sorted(groups(load_cases(path)).items()):
        if len(cases) < 2:
            continue
        before = statistics.median(error(c) for c in cases)
        after = []
        for i, one in enumerate(cases):
            own = one.scenario.stack

            def load(st, one=one, own=own):  # the row as loaded with the stack st fits
                return [one] if st is own else [
                    c for c in load_cases(path, calibration=st) if c.id == one.id]

            # as `calibrate` fits it: a blank micro-batch or recomputation chosen again under
            # each fitted stack until it holds; the others then chosen under the fit too, as
            # `validate --stack` of the written file (or of a variant based on it) chooses them
            fitted = fit_choosing(load, own)[0].stack
            others = {c.id: c for c in load_cases(path, calibration=fitted)}
            after.append(statistics.median(error(others[c.id])
                                           for j, c in enumerate(cases) if j != i))
        rows.append(dict(group=f"{stack}, {acc}, {kind}", rows=len(cases), before=before,
                         after_median=statistics.median(after), after_worst=max(after)))
    return rows


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    print(f"{'group':48s} {'rows':>4s} {'before':>8s} {'after (median of choices)':>26s} "
          f"{'after (worst choice)':>21s}")
    for r in table(path):
        print(f"{r['group']:48s} {r['rows']:4d} {r['before']:8.1%} {r['after_median']:26.1%} "
              f"{r['after_worst']:21.1%}")


if __name__ == "__main__":
    main()
