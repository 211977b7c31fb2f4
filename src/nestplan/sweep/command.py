"""The ``nestplan sweep SWEEP.toml`` subcommand.

Exit codes: 0 when every point has a row (some may be ``infeasible`` or ``error``), 1 when every
point's row is an error (nothing was searched), 2 for a bad sweep file or flag (one line on
stderr, before any work), 130 after Ctrl-C and 143 after SIGTERM (finished points stay in the
CSV; running the same command again resumes).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import say
from ..units import counted


def _note(message: str) -> None:
    """A note of the run, on stderr as every command's (``nestplan: note: ...``): a datacenter
    trial's ``2>/dev/null`` had kept the sweep's on stdout beside its summary."""
    say(f"nestplan: note: {message}")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``sweep`` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "sweep", help="run a grid of searches from a sweep file (CSV, resumable)",
        description="Run one search per point of the grid in SWEEP.toml and append a row per "
        "point to the results CSV as points finish; re-running resumes (points with an ok or "
        "infeasible row are skipped, errors are retried). Also writes a summary plot "
        "(OUTPUT.svg) and, with --parquet, OUTPUT.parquet.")
    p.add_argument("file", metavar="SWEEP.toml", help="the sweep file")
    p.add_argument("-o", "--output", metavar="CSV",
                   help="results file (default: [sweep] output, else SWEEP.csv beside the file)")
    from ..cli import whole_arg

    p.add_argument("--workers", type=whole_arg, metavar="N",
                   help="points run in parallel (default: the cores this process may use; 1 = in "
                   "this process)")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="run the points as Ray tasks: 'local' starts a local instance, 'auto' or "
                   "ray://HOST:10001 joins a cluster (needs nestplan[ray])")
    p.add_argument("--parquet", action="store_true",
                   help="also write OUTPUT.parquet (needs nestplan[parquet])")
    p.add_argument("--dry-run", action="store_true",
                   help="check the file, print how many points are to run, and stop")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run_command)
    return p


def run_command(args) -> int:
    from ..errors import SpecError
    from ..loaders import writable
    from .run import check_extras, check_reachable
    from .spec import load

    if args.workers is not None and args.workers < 1:
        raise SpecError("--workers", args.workers, "must be an integer >= 1")
    spec = load(args.file, output=args.output)
    parquet = args.parquet or spec.parquet
    check_extras(parquet=parquet, ray=args.ray)
    if args.ray is not None and not args.dry_run:  # before any note, and any file
        check_reachable(args.ray)
    # every file the sweep writes, refused before any point runs
    for path, kind in ((spec.output, "results CSV"), (spec.output.with_suffix(".svg"), "plot SVG"),
                       *([(spec.output.with_suffix(".parquet"), "Parquet")] if parquet else [])):
        writable(path, "output", kind, makes_folder=True)  # the results writer makes it
        if path.exists() and not path.is_file():  # (a device, a pipe: read back, replaced)
            raise SpecError("output", str(path), f"not a regular file; a sweep reads its {kind} "
                            "back and replaces it: give a file path")
    _refused_everywhere(spec)
    _note_levels_never_crossed(spec)
    _note_partial_domains(spec)
    _note_unlikely_bandwidths(spec)
    _note_unmeasured_accelerators(spec)
    _note_expert_loads_without_experts(spec)
    lock = None if args.dry_run else _lock_output(spec.output)
    try:
        return _run_locked(args, spec, parquet)
    finally:  # (released at the process's end too, however it ends)
        if lock is not None:
            import os

            os.close(lock)


def _run_locked(args, spec, parquet: bool) -> int:
    """``run_command`` once the results file's lock is held."""
    from ..errors import SpecError, flush_notes
    from ..search.methods import check_method
    from .run import error_row, pace_text, plan_run, point_tasks, run_sweep, superseded_path

    planned = plan_run(spec)  # a results file it cannot resume is refused before any note
    flush_notes()  # how the grid's files were read, before the points run
    if args.dry_run:
        points, existing = planned
        done = len(existing.done)
        print(f"sweep: {counted(len(points), 'point')}, {done:,} already done, "
              f"{len(points) - done:,} to run; results in {spec.output}")
        if existing.superseded:  # (said before the run moves them)
            _note(_superseded_text(len(existing.superseded), spec.output,
                                   superseded_path(spec.output, spec.columns), dry=True))
        unbuilt: list = []  # points to run that fail before their search, as the run does
        for task in point_tasks(spec, [p for p in points if p.id not in existing.done], unbuilt):
            try:
                check_method(task.method, task.scenario, task.constraints)
            except SpecError as e:  # (a constraint this point cannot take)
                unbuilt.append((task.point, error_row(e)))
        if unbuilt:
            point, row = unbuilt[0]  # (in the points' order: the generator appends as it goes)
            _note(f"{counted(len(unbuilt), 'point')} to run cannot be set up; the run "
                  f"records an error row for each (the first, {point.id}: {row['error']})")
        return 0
    s = run_sweep(spec, workers=args.workers, ray=args.ray, parquet=parquet, quiet=args.quiet,
                  planned=planned, reached=args.ray is not None)
    if s.interrupted:
        done = s.skipped + s.ok + s.infeasible
        say(f"nestplan: sweep interrupted: {done:,} of {s.total:,} points done in {spec.output}; "
            "run the same command again to resume")
        return 128 + int(s.interrupted)
    rate = f", {pace_text(s.ran / s.seconds)}" if s.ran and s.seconds > 0 else ""
    print(f"sweep: {counted(s.total, 'point')}: {s.ran:,} run ({s.ok:,} ok, "
          f"{s.infeasible:,} infeasible, "
          f"{s.errors:,} errors), {s.skipped:,} already done; {s.seconds:.1f} s{rate}")
    if s.errors:
        _note(f"{counted(s.errors, 'point')} failed (see the error column); running the same "
              "command again retries them")
    if s.infeasible and not s.ok and not s.skipped:  # (nothing fits anywhere: said, not only
        # counted; still exit 0, every point has its row)
        _note(f"no point found a plan that fits; each infeasible row's error column "
              f"says why (the first, {s.first_infeasible})")
    if s.superseded:
        _note(_superseded_text(s.superseded, spec.output, s.superseded_to, dry=False))
    if s.foreign:  # (the plot: a datacenter trial's other grid's plot was redrawn without a word)
        _note(f"{counted(s.foreign, 'row')} of {spec.output} {'is' if s.foreign == 1 else 'are'} "
              "not points of this sweep (kept: rows of another grid, or of a model, cluster or "
              "stack file since edited); "
              "its plot, "
              f"{spec.output.with_suffix('.svg').name}, is redrawn with this sweep's points only")
    print("wrote " + ", ".join(str(p) for p in s.outputs))
    if s.errors and not (s.ok or s.infeasible or s.skipped):
        say(f"nestplan: sweep: every point failed ({counted(s.errors, 'error')}); the error column "
            f"of {spec.output} says why")
        return 1
    return 0


def _superseded_text(n: int, output, to, *, dry: bool) -> str:
    """The note on ``n`` rows of ``output`` another nestplan wrote, moved to ``to`` by the run
    (``dry``: that the run would move them)."""
    rows = f"{counted(n, 'row')} of {output} another nestplan wrote (its nestplan_build column; "
    return rows + (f"blank before it) would be moved to {to} by the run" if dry else
                   f"blank before it), whose cost model may differ: moved to {to}, and their "
                   "points run again with this one")


def _lock_output(path: Path) -> int | None:
    """Take the results file's lock (``.NAME.lock`` beside it, an exclusive ``flock``), which the
    process holds until it ends, however it ends; refuse when another sweep holds it (two sweeps
    writing one file had each run every point, the file holding both's rows: a pipeline
    engineer's trial). None where the system has no ``flock``."""
    import os

    from ..errors import SpecError

    try:
        import fcntl
    except ImportError:  # (not POSIX)
        return None
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(f".{path.name}.lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise SpecError("output", str(path), f"cannot write beside it ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SpecError("output", str(path), f"another nestplan sweep is writing it (it holds "
                        f"{lock.name}); wait for that one to end, or give -o another file") \
            from None
    return fd


def _refused_everywhere(spec) -> None:
    """Refuse constraints that no point of the grid can take (``tp = 3`` on 8-GPU points, say:
    each value is fine alone, so the file's check passes it), and a grid none of whose points
    can be set up, before any work, as ``plan`` would; constraints or points that fail only
    somewhere leave those points to their error rows."""
    from ..errors import SpecError
    from ..search.constraints import check_constraints

    first = unbuilt = None
    for point in spec.points():
        try:
            sc = spec.scenario(point)
        except SpecError as e:  # this point cannot be built: its own error row says it
            unbuilt = unbuilt or e
            continue
        try:
            check_constraints(sc, spec.constraints)
        except SpecError as e:
            first = first or e
            continue
        return
    if first is not None:  # a grid key's value (precision, global_batch) or a constraint's
        from .spec import GRID_DEFAULTS

        grid = {p.key: p.values for p in spec.parameters}
        field = f"constraints.{first.field}"
        if first.field in grid:  # (one the file may not name: said so)
            field = f"grid.{first.field}" + (
                " (by default)" if grid[first.field] == GRID_DEFAULTS.get(first.field) else "")
        raise SpecError(field, first.value,
                        f"no point of the grid takes it (at the first: {first.allowed})")
    if unbuilt is not None:  # no point can even be set up (more GPUs than its cluster holds)
        field = unbuilt.field if unbuilt.field.startswith("grid.") else f"grid: {unbuilt.field}"
        raise SpecError(field, unbuilt.value,
                        f"{unbuilt.allowed} (at every point of the grid: none can run)")


def _note_expert_loads_without_experts(spec) -> None:
    """Say so when the grid varies an expert load (``moe_imbalance``, ``moe_capacity``) and a
    model of the grid has no experts: its values change nothing for that model, and its points
    repeat each other (as evaluate says of --moe-imbalance on a dense model; a sixth fuzzing
    round's where no model had experts, a user trial's where one of two had none)."""
    import warnings

    from ..errors import Note, SpecError

    varied = [p.key for p in spec.parameters
              if p.key in ("moe_imbalance", "moe_capacity") and len(p.values) > 1]
    if not varied:
        return
    models = spec.values_of("model")
    dense = []
    for ref in models:
        try:
            if spec.model(ref).moe is None:
                dense.append(str(ref))
        except SpecError:  # (checked when the grid was read)
            return
    if len(dense) == len(models):
        warnings.warn(f"grid.{varied[0]}: no model of the grid has experts, so its values change "
                      "nothing and those points repeat each other", Note)
    elif dense:
        one = len(dense) == 1
        warnings.warn(f"grid.{varied[0]}: {', '.join(dense)} {'has' if one else 'have'} no "
                      f"experts, so its values change nothing there and the points of "
                      f"{'that model' if one else 'those models'} repeat each other", Note)


def _grid_clusters(spec):
    """Yield each cluster and network variant of the grid (no other column moves a level) with
    the grid's GPU counts it holds (a larger one is an error row of its own); a variant that is
    not valid is passed over (its error rows say why)."""
    import itertools

    from ..errors import SpecError
    from .spec import Point, level_key

    shape_keys = [p for p in spec.parameters
                  if p.key in ("cluster", "network") or level_key(p.key) is not None]
    counts = spec.values_of("gpus")
    for combo in itertools.product(*(p.values for p in shape_keys)):
        try:
            cluster = spec.cluster(Point(id="", values=tuple(zip((p.key for p in shape_keys),
                                                                  combo))))
        except SpecError:
            continue
        yield cluster, [n for n in counts
                        if cluster.max_devices is None or n <= cluster.max_devices]


def _note_partial_domains(spec) -> None:
    """Say, for each cluster of the grid, which of its GPU counts fill its last scale-up domain
    only in part (``textfmt.partial_domain_text``: plan and evaluate say it of one run; a user
    trial's sweep of NVL72 racks said nothing)."""
    import warnings

    from ..errors import Note
    from ..textfmt import partial_domain_text

    said: set[tuple[str, int]] = set()
    for cluster, held in _grid_clusters(spec):
        if (cluster.name, cluster.levels[0].size) in said:
            continue
        said.add((cluster.name, cluster.levels[0].size))
        counts = [n for n in held if partial_domain_text(cluster, n)]
        if counts:
            more = (f" (and so for the points of {', '.join(f'{n:,}' for n in counts[1:])} "
                    "GPUs)") if len(counts) > 1 else ""
            warnings.warn(f"grid: on {cluster.name}, {partial_domain_text(cluster, counts[0])}"
                          f"{more}", Note)


def _note_once_per_cluster(spec, texts_of) -> None:
    """Say each text ``texts_of(cluster)`` gives for the grid's clusters and network variants
    (``_grid_clusters``) once, in the order met."""
    import warnings

    from ..errors import Note

    said: set[str] = set()
    for cluster, _ in _grid_clusters(spec):
        for text in texts_of(cluster):
            if text and text not in said:
                said.add(text)
                warnings.warn(f"grid: {text}", Note)


def _note_unlikely_bandwidths(spec) -> None:
    """Say, once per cluster or network variant of the grid, what is implausible or unstated in
    its network figures (``notes.scenario.cluster_texts``, as plan and evaluate say them)."""
    from ..notes.scenario import cluster_texts

    _note_once_per_cluster(spec, cluster_texts)


def _note_unmeasured_accelerators(spec) -> None:
    """Say, once per accelerator of the grid, when no measured run stands behind its efficiencies
    (``notes.plan.unmeasured_accelerator_text``, which plan says of one plan: a buyer's trial's
    sweep of MI300X beside H200 had said nothing of it)."""
    from ..notes.plan import unmeasured_accelerator_text

    _note_once_per_cluster(spec, lambda cluster: [unmeasured_accelerator_text(
        cluster.accelerator, "its points (their measured_runs column is 0) rest")])


def _note_levels_never_crossed(spec) -> None:
    """Say so when a network level the grid varies is one no point's GPUs reach beyond: every
    point fits in one block below it (a leaf of 256 GPUs and points of at most 256), so its
    values change nothing and the rows look alike for that reason alone. A job's ranks fill the
    cluster's devices in order (``placement``), so n GPUs cross level i exactly when n exceeds
    the devices under one block of level i - 1."""
    import warnings

    from ..errors import Note
    from .spec import level_key

    alone = {level_key(p.key)[0] for p in spec.parameters if level_key(p.key) is not None}
    named = {level for _, levels in spec.networks for level, _ in levels}
    watched = alone | named
    if not watched:
        return
    # each cluster and network variant of the grid, with the largest GPU count it holds
    reach: dict[str, tuple[int, int]] = {}  # level -> (most GPUs of a point, devices below it)
    crossed: set[str] = set()
    for cluster, held in _grid_clusters(spec):
        if not held:
            continue
        most = max(held)
        below = (1, *cluster.block_sizes())  # devices under one block of the level below
        for level, inside in zip(cluster.levels, below):
            if level.name in watched:
                if most > inside:
                    crossed.add(level.name)
                if most >= reach.get(level.name, (0, 0))[0]:
                    reach[level.name] = (most, inside)
    never = set(reach) - crossed
    for level in sorted(never & alone):
        most, size = reach[level]
        warnings.warn(f"grid.network.{level}: no point crosses this level (points of at most "
                      f"{most:,} GPUs, blocks below it of {size:,}): its values change nothing",
                      Note)
    if named and named <= never:  # (a named network that moves some level it reaches is fine)
        warnings.warn("grid.networks: no point crosses a level they set (points within one "
                      "block below each): the named networks change nothing", Note)
