#!/usr/bin/env python3
"""Write ``src/nestplan/data/accuracy.csv``: the model's step-time (and peak-memory) error on
every measured run, grouped by the catalog calibration of the run's stack, its accelerator and its
kind of model (``nestplan.accuracy``), which ``evaluate``, ``plan`` and the report print for a
plan's own group. Held out: ``held_out_runs.csv``, ``moe_held_out.csv``,
``composer_h100_held_out.csv`` and the GB200/GB300/B300
file's held-out releases (``moe_accuracy.held_out_release``); the rest is development data.

    python benchmarks/accuracy_table.py            # rewrite the table
    python benchmarks/accuracy_table.py --check    # exit 1 if the shipped table is not current
"""

from __future__ import annotations

import sys
from pathlib import Path

from moe_accuracy import GB, held_out_release
from runs_fit import FILES

from nestplan.accuracy import summarise, to_csv
from nestplan.validation import load_cases, outcome

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "src" / "nestplan" / "data" / "accuracy.csv"
HELD_OUT_FILES = ("held_out_runs.csv", "moe_held_out.csv", "composer_h100_held_out.csv")


def current() -> str:
    outcomes, held = [], set()
    for path in FILES:
        for case in load_cases(path, field="RUNS.csv"):
            if case.metric != "step_time":
                continue
            outcomes.append(outcome(case))
            if path.name in HELD_OUT_FILES or (path == GB and held_out_release(case)):
                held.add(case.where)
    return to_csv(summarise(outcomes, lambda case: case.where in held))


def main(argv: list[str]) -> int:
    text = current()
    if "--check" in argv:
        if TABLE.read_text() != text:
            print(f"{TABLE} is not current: python benchmarks/accuracy_table.py rewrites it")
            return 1
        return 0
    TABLE.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
