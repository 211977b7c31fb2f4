#!/usr/bin/env python3
"""Do the measured runs fit? Every run in these files ran, so a plan that the memory model puts
above its device's HBM points to an error in the memory model or to a misstated plan.

Most rows publish no peak. For those this check is the only one their memory gets. It found two
errors on 2026-12-03. Composer's loss had been costed as eager fp32 cross-entropy, which put 16
llm-foundry plans above HBM. The batch-level expert overlap had been charged a whole micro-batch
instead of one block, which put 14 MoE plans above HBM. See README "Accuracy".

For every runs file this prints the rows, how many the model puts above HBM, the largest ratio,
and the rows above it with their stacks.

    python benchmarks/runs_fit.py [RUNS.csv ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from nestplan.errors import NestplanError
from nestplan.validation import hbm_ratios, load_cases

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
FILES = (ROOT / "src" / "nestplan" / "data" / "published_runs.csv", SHARED / "fsdp_runs.csv",
         ROOT / "tests" / "data" / "held_out_runs.csv", ROOT / "tests" / "data" / "moe_runs.csv",
         ROOT / "tests" / "data" / "moe_held_out.csv",
         ROOT / "tests" / "data" / "moe_runs_gb200_gb300_b300.csv",
         ROOT / "tests" / "data" / "long_context_runs.csv",
         ROOT / "tests" / "data" / "composer_h100_held_out.csv")


def ratios(path: Path) -> list[tuple[float, str, str]]:
    """(peak / HBM, id, stack) of every step-time row of ``path``, as ``validate`` loads it."""
    return [(r, c.id, c.scenario.stack.name)
            for r, c in hbm_ratios(load_cases(path, field="RUNS.csv"))]


def main(argv: list[str]) -> int:
    for path in [Path(a) for a in argv] or FILES:
        if not argv and not path.exists():  # ../shared is not beside this checkout
            print(f"{path.name:36s} not found ({path}): skipped")
            continue
        try:
            rows = ratios(path)
        except NestplanError as e:
            print(f"runs_fit.py: {e}", file=sys.stderr)
            return 2
        over = sorted((r for r in rows if r[0] > 1.0), reverse=True)
        top = max((r[0] for r in rows), default=0.0)
        print(f"{path.name:36s} {len(rows):4d} rows  above HBM {len(over):3d}  largest {top:.2f}x")
        for ratio, rid, stack in over:
            print(f"    {ratio:5.2f}x  {rid}  ({stack})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
