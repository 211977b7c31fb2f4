"""Run the 200-point example sweep from scratch and print its throughput.

    python benchmarks/sweep_run.py                 # local process pool (one worker per core it may use)
    python benchmarks/sweep_run.py --ray           # the same points as tasks on a local Ray instance
    python benchmarks/sweep_run.py --workers 1     # in this process

The results go to a temporary folder (the example's own CSV is left alone); wall time includes
starting the workers (and Ray).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from nestplan.processes import cores
from nestplan.sweep.run import run_sweep
from nestplan.sweep.spec import load

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sweep-200.toml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default=str(EXAMPLE), help="sweep file (default: %(default)s)")
    ap.add_argument("--workers", type=int, help="parallel points (default: the cores this process may use)")
    ap.add_argument("--ray", action="store_true", help="run on a local Ray instance")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = load(args.file, output=Path(tmp) / "results.csv")
        start = time.perf_counter()
        s = run_sweep(spec, workers=args.workers, ray="local" if args.ray else None,
                      quiet=args.quiet)
        wall = time.perf_counter() - start
    backend = ("Ray (local instance)" if args.ray else
               "in process" if args.workers == 1 else "process pool")
    workers = min(args.workers or cores(), s.total)
    print(f"{Path(args.file).name}: {s.total} points, {backend}, {workers} workers")
    if s.interrupted:
        print(f"interrupted after {s.ran} points, {wall:.1f} s")
        return 130
    print(f"wall time {wall:.1f} s, {s.ran / wall:.2f} points/s")
    print(f"ok {s.ok}, infeasible {s.infeasible}, errors {s.errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
