"""Running a sweep: the results CSV (appended row by row, resumed on a re-run), the backends
(in this process, a local process pool, Ray tasks), progress on stderr, and the Parquet copy.

A point's row records ``status`` ``ok`` (a plan was found), ``infeasible`` (nothing fits) or
``error`` (any other failure; its text is in ``error``). A re-run skips the points whose id has
an ``ok`` or ``infeasible`` row and runs the others again, replacing their ``error`` rows.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Iterator
from concurrent import futures
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..build import fingerprint
from ..errors import InfeasibleError, NestplanError, Note, SpecError, UsageError
from ..processes import (Terminated, cores, on_sigterm, restore_sigterm, signals_held, stop_pool,
                         worker_signals)
from ..units import counted
from .spec import RESULT_COLUMNS, RESULT_TYPES, TIME_PARTS, Point, SweepSpec

DONE = ("ok", "infeasible")
"""Statuses a re-run keeps; ``error`` rows are run again."""
_METRICS = tuple(c for c in RESULT_COLUMNS if c not in ("status", "error", "stage_layers",
                                                        "search_seconds", "straddles_domains",
                                                        "constraints", "nestplan_build",
                                                        "measured_runs",
                                                        "measured_mean_abs_error")
                 and not c.startswith("time_"))
"""Result columns taken from the best plan's ``--json`` object as they are (the ``time_*_s``
columns from its ``time_s``)."""


# ----------------------------------------------------------------------------- one point


@dataclass(frozen=True)
class Task:
    """What a worker needs for one point: built specs, not names, so remote workers need no
    files."""

    point: Point
    scenario: Any
    method: str
    constraints: Any


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def run_task(scenario, method: str, constraints) -> dict:
    """Search one point; never raises for a failed search (KeyboardInterrupt passes through)."""
    from ..search.methods import run_method

    try:
        res = run_method(method, scenario, constraints, top=1)
    except InfeasibleError as e:
        return {"status": "infeasible", "error": _one_line(e)}
    except Exception as e:  # noqa: BLE001 - a failed point is recorded, the sweep goes on
        return error_row(e)
    js = res.best.to_json()
    row = {k: js[k] for k in _METRICS}  # (etp null without experts, as to_json gives it)
    row.update({f"time_{part}_s": js["time_s"][part] for part in TIME_PARTS})
    from ..specs import blocks_per_chunk, list_text

    plan = res.best.plan
    names = plan.recompute  # data: one name, or every stage's spelt out (for splitting)
    row["recompute"] = names[0] if len(set(names)) == 1 else ",".join(names)
    # whichever method split the plan (blank only in rows kept from a file of before the column)
    row["stage_layers"] = list_text(blocks_per_chunk(scenario.model, plan))
    # the model's error on measured runs like the point's, as plan --json's measured_error gives
    # it (0 runs: none behind it; blank: a calibration of the user's own), so that a row on an
    # accelerator no run measured does not read as one backed by dozens (a buyer's trial)
    from .. import accuracy

    name, record = accuracy.measured(scenario)
    row["measured_runs"] = None if name is None else record.runs if record else 0
    row["measured_mean_abs_error"] = record.mean_abs_error if record else None
    # groups straddle the scale-up domains, which the sweep's note says once on stderr and a
    # design review reading the file had not seen (a datacenter trial's 72-GPU racks at 1,024)
    row["straddles_domains"] = scenario.cluster.straddled_by(scenario.gpus)
    row.update(status="ok", error="", search_seconds=res.seconds)
    return row


def error_row(e: BaseException) -> dict:
    text = str(e) if isinstance(e, NestplanError) else f"{type(e).__name__}: {e}"
    return {"status": "error", "error": _one_line(text)}


# ----------------------------------------------------------------------------- results file


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


SIGNED_COLUMNS = ("margin_gib",)
"""Result columns that may hold a negative number (a plan short of its headroom); every other
number a sweep writes is a time, a rate, a share, a size or a degree, never below zero."""


def _reads_as(cell: str, kind: type, signed: bool = False) -> bool:
    """A results-CSV cell is blank or what ``_cell`` writes for a ``kind`` (finite numbers, not
    negative unless ``signed``)."""
    if cell == "":
        return True
    if kind is bool:
        return cell in ("true", "false")
    if kind is int:
        return cell.isascii() and cell.isdigit()
    try:
        x = float(cell)
    except ValueError:
        return False
    return math.isfinite(x) and (signed or x >= 0)


@dataclass
class Existing:
    """What a results CSV already holds for a sweep."""

    done: set[str] = field(default_factory=set)
    """Ids of this sweep's points with an ``ok`` or ``infeasible`` row."""
    keep: list[list[str]] = field(default_factory=list)
    """Rows a re-run keeps (everything but error rows, torn rows and repeated ids)."""
    dropped: int = 0
    """Rows a re-run removes."""
    set_aside: list[list[str]] = field(default_factory=list)
    """Of those, the rows that are no error to retry (a torn line, a repeated id, a cell edited
    by hand, a line that is no row): moved to ``PATH.dropped`` rather than lost."""
    foreign: int = 0
    """Kept rows whose id is not a point of this sweep (an edited sweep file)."""
    superseded: list[list[str]] = field(default_factory=list)
    """Rows another nestplan build wrote (``build.fingerprint``; blank: a nestplan from before the
    column), whose cost model may differ: moved to ``superseded_path`` (a datacenter trial's
    re-run after an upgrade had held each design twice, and a pivot counted both)."""
    upgraded: bool = False
    """The file was written before some ``LATER_COLUMNS`` existed: rewritten with them blank."""


LATER_COLUMNS = (("etp", "schedule"), ("stage_layers",),
                 ("hfu", "model_tflops_per_gpu", "margin_gib",
                  *(f"time_{part}_s" for part in TIME_PARTS if part != "embedding")),
                 ("straddles_domains",),
                 ("mfu_peak_tflops",), ("constraints",), ("time_embedding_s",),
                 ("slowest_stage", "last_stage", "nestplan_build"),
                 ("measured_runs", "measured_mean_abs_error"))
"""Result columns added after the first sweeps were written, oldest first (nestplan of
2026-12-02, of 2026-12-03 morning and evening, of 2026-12-06 six times): a results CSV written
before some of them is read with those cells blank; since point ids hold the nestplan build
(2026-12-06), its rows, another build's, are moved aside (``superseded_path``) and their points
run again."""


def _header_before(columns: list[str], header: list[str]) -> bool:
    """``header`` is ``columns`` as a nestplan from before the later columns of some
    ``LATER_COLUMNS`` generation wrote them."""
    later: set[str] = set()
    for added in reversed(LATER_COLUMNS):
        later.update(added)
        if header == [c for c in columns if c not in later]:
            return True
    return False


def read_existing(path: Path, spec: SweepSpec, ids: set[str]) -> Existing:
    """Read a results CSV; SpecError when its header is not this sweep's."""
    out = Existing()
    if not path.is_file() or path.stat().st_size == 0:
        return out
    columns = list(spec.columns)
    try:  # (a byte-order mark, as a spreadsheet saves one, read as one: a fuzzing trial's had
        # made "id" a column not in this sweep; lines of blanks alone, e.g. a stray carriage
        # return, are no rows)
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = [r for r in csv.reader(f) if any(cell.strip() for cell in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise SpecError("output", str(path), f"cannot read it as a results CSV ({_one_line(e)}); "
                        "give another --output or delete the file") from None
    if rows and _header_before(columns, rows[0]):
        at = {c: i for i, c in enumerate(rows[0])}
        rows = [columns] + [[r[at[c]] if c in at else "" for c in columns]
                            if len(r) == len(at) else r for r in rows[1:]]
        out.upgraded = True
    if not rows or rows[0] != columns:
        have = rows[0] if rows else []
        missing = [c for c in columns if c not in have]
        extra = [c for c in have if c not in columns]
        detail = "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                       f"not in this sweep {', '.join(extra)}" if extra else "") if x)
        raise SpecError("output", str(path), "its columns are not this sweep's ("
                        f"{detail or 'different order'}); give another --output or delete the file")
    status = columns.index("status")
    typed = [(columns.index(c), t, c in SIGNED_COLUMNS) for c, t in RESULT_TYPES.items()
             if t is not str]
    seen: set[str] = set()
    degrees = [columns.index(c) for c in ("tp", "pp", "dp", "cp")]
    gpus = columns.index("gpus")
    build = columns.index("nestplan_build")
    for row in rows[1:]:
        if len(row) == len(columns) and row[build] != fingerprint() and row[0] not in ids:
            out.superseded.append(row)  # (a point of this build cannot have another's row)
            continue
        if len(row) != len(columns) or row[0] in seen or row[status] not in DONE or not all(
                _reads_as(row[i], t, signed) for i, t, signed in typed) or (
                row[status] == "ok" and not _degrees_agree(row, degrees, gpus)):
            # torn last line of a killed run, a repeat, an error to retry, a cell edited by hand
            out.dropped += 1
            if not (len(row) == len(columns) and row[status] == "error" and row[0] not in seen):
                out.set_aside.append(row)
            continue
        seen.add(row[0])
        out.keep.append(row)
        if row[0] in ids:
            out.done.add(row[0])
        else:
            out.foreign += 1
    if out.set_aside:  # (a line that was no row had vanished without a word: a fuzzing helper's)
        n = len(out.set_aside)
        aside = dropped_path(path)
        warnings.warn(f"output: {counted(n, 'line')} of {path} cannot be read as this sweep's "
                      "results (a torn line, a repeated id, a cell edited by hand); the run moves "
                      f"{'them' if n > 1 else 'it'} to {aside}", Note)
    return out


def superseded_path(path: Path, columns: tuple[str, ...]) -> Path:
    """Where the rows of results file ``path`` that another nestplan wrote are moved, beside the
    file itself (as ``dropped_path``): the first of ``PATH.superseded``, ``PATH.superseded.2``,
    ... that is new or has ``columns`` (rows moved by a nestplan of other columns keep their own
    file, one header each)."""
    base = os.path.realpath(path) + ".superseded"
    for n in itertools.count(1):
        aside = Path(base if n == 1 else f"{base}.{n}")
        try:
            with open(aside, newline="") as f:
                header = next(csv.reader(f), None)
        except FileNotFoundError:
            return aside
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
        if header is None or header == list(columns):
            return aside


def dropped_path(path: Path) -> Path:
    """Where the rows of results file ``path`` that a re-run cannot read are moved: beside the
    file itself (the one a link names, as ``ResultsWriter`` writes it)."""
    return Path(os.path.realpath(path) + ".dropped")


def _degrees_agree(row: list[str], degrees: list[int], gpus: int) -> bool:
    """An ``ok`` row's tp·pp·dp·cp is its GPU count (a row edited to tp 3 of 16 GPUs had been
    kept as a finished point: a seventh fuzzing round's)."""
    try:
        return math.prod(int(row[i]) for i in degrees) == int(row[gpus])
    except ValueError:  # (a blank degree: no plan to check)
        return False


class ResultsWriter:
    """Appends one row per finished point and flushes it, so an interrupted sweep keeps every
    finished point."""

    def __init__(self, path: Path, spec: SweepSpec, existing: Existing):
        self.columns = spec.columns
        # where existing's superseded rows were moved (superseded_path), once moved
        self.superseded_to: Path | None = None
        self.constraints = spec.constraints_text
        path = Path(os.path.realpath(path))  # a link to the file: write the file, keep the link
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if (existing.dropped or existing.upgraded or existing.superseded
                    or not path.is_file() or path.stat().st_size == 0):
                if existing.set_aside:  # kept beside it, never lost
                    with open(dropped_path(path), "a", newline="") as f:
                        csv.writer(f).writerows(existing.set_aside)
                if existing.superseded:  # (a header first, for a file of their own)
                    aside = superseded_path(path, self.columns)
                    with open(aside, "a", newline="") as f:
                        csv.writer(f).writerows(([] if aside.stat().st_size else [
                            list(self.columns)]) + existing.superseded)
                    self.superseded_to = aside
                _rewrite(path, [list(self.columns), *existing.keep])
            self.file = open(path, "a", newline="")
        except OSError as e:
            raise SpecError("output", str(path), f"cannot write ({e.strerror})") from None
        self.writer = csv.writer(self.file)

    def write(self, point: Point, result: dict):
        row = {"id": point.id, **dict(point.values), **result, "constraints": self.constraints,
               "nestplan_build": fingerprint()}
        self.writer.writerow([_cell(row.get(c)) for c in self.columns])
        self.file.flush()

    def close(self):
        self.file.close()


def _rewrite(path: Path, rows: list) -> None:
    """Write ``rows`` (the header first) over the CSV at ``path`` at once (a file beside it,
    then renamed: an interruption leaves the old file or the new, never half of one)."""
    from ..loaders import replacing

    with replacing(path) as draft, open(draft, "w", newline="") as f:
        csv.writer(f).writerows(rows)


def in_grid_order(path: Path, ids: list[str]) -> None:
    """Rewrite a finished sweep's CSV with its rows in the grid's order (``ids``), rows of no
    point of the grid after them as they were: they are appended as points finish, which a
    NEST-paper trial found in no order it could read. A file that cannot be rewritten keeps its
    rows as written, with a note."""
    path = Path(os.path.realpath(path))
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            return
        header, body = rows[0], rows[1:]
        rank = {ident: i for i, ident in enumerate(ids)}
        ordered = sorted(body, key=lambda r: rank.get(r[0] if r else "", len(rank)))
        if ordered != body:
            _rewrite(path, [header, *ordered])
    except OSError as e:
        warnings.warn(f"{path.name}: rows left in the order they finished (cannot rewrite the "
                      f"file: {e.strerror or e})", Note)


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8-sig") as f:  # (as read_existing reads it)
        return list(csv.DictReader(f))


# ----------------------------------------------------------------------------- progress


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def pace_text(rate: float) -> str:
    """A sweep's pace of ``rate`` points a second: per second, or per minute where a point takes
    seconds (a datacenter trial read "0.0 points/s" beside a valid ETA)."""
    if rate >= 0.5:
        return f"{rate:.3g} points/s"
    per_minute = float(f"{rate * 60:.2g}")
    return f"{per_minute:g} point{'' if per_minute == 1 else 's'}/min"


class Progress:
    """Progress on stderr: one updating line with a bar on a terminal, a line every few seconds
    otherwise; nothing when disabled."""

    WIDTH = 24

    def __init__(self, total: int, skipped: int, *, enabled: bool = True, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > skipped
        self.tty = self.stream.isatty()
        self.total, self.skipped = total, skipped
        self.start = time.perf_counter()
        self.last = 0.0
        self.shown = False

    def update(self, ran: int, failed: int, *, force: bool = False):
        if not self.enabled:
            return
        now = time.perf_counter() - self.start
        if self.tty and not force and now - self.last < 0.1:
            return
        if not self.tty and now - self.last < 5.0:  # force or not: a line every 5 s at most
            return
        self.last, self.shown = now, True
        done = self.skipped + ran
        rate = ran / now if now > 0 else 0.0
        eta = f"ETA {_duration((self.total - done) / rate)}" if rate > 0 else "ETA -"
        fail = f"{failed} failed"
        pace = pace_text(rate)
        if self.tty:
            fill = round(self.WIDTH * done / self.total)
            bar = "█" * fill + "░" * (self.WIDTH - fill)
            self._write(f"\rsweep {bar} {done:,}/{self.total:,} · {fail} · {pace} · {eta}\x1b[K")
        else:
            self._write(f"nestplan: sweep {done:,}/{self.total:,} points, {fail}, {pace}, {eta}\n")

    def close(self):
        if self.shown and self.tty:
            self._write("\r\x1b[K")

    def _write(self, text: str):
        """Write and flush; a stream whose reader is gone ends the progress, not the sweep (a
        broken pipe is how a closed stdout ends a command, with exit 0 and nothing more)."""
        try:
            self.stream.write(text)
            self.stream.flush()
        except BrokenPipeError:
            self.enabled = self.shown = False


# ----------------------------------------------------------------------------- backends
# A backend is a generator over tasks yielding (task, result row) as points finish, or None
# now and then while waiting (to refresh the progress line). Closing it early (Ctrl-C) cancels
# what has not finished.


def _in_process(tasks: Iterator[Task]):
    for t in tasks:
        yield t, run_task(t.scenario, t.method, t.constraints)


def _pool(tasks: Iterator[Task], workers: int):
    def start():
        return futures.ProcessPoolExecutor(max_workers=workers, initializer=worker_signals)

    window = 4 * workers
    ex = start()
    pending: dict[futures.Future, Task] = {}
    finished = False
    try:
        for t in tasks:
            while len(pending) >= window:
                yield from _drain(ex, pending)
            try:
                fut = ex.submit(run_task, t.scenario, t.method, t.constraints)
            except BrokenProcessPool:  # a worker died: its pending points became error rows
                ex.shutdown(wait=False)
                ex = start()
                fut = ex.submit(run_task, t.scenario, t.method, t.constraints)
            pending[fut] = t
        while pending:
            yield from _drain(ex, pending)
        finished = True
    finally:
        if finished:
            ex.shutdown(wait=True)
        else:
            stop_pool(ex)


def _drain(ex, pending):
    done, _ = futures.wait(pending, timeout=0.25, return_when=futures.FIRST_COMPLETED)
    if not done:
        yield None
    for fut in done:
        t = pending.pop(fut)
        try:
            row = fut.result()
        except BrokenProcessPool:
            row = {"status": "error", "error": "a worker process died (killed, or out of memory) "
                   "while this point was running or queued"}
        except Exception as e:  # noqa: BLE001 - recorded as the point's error
            row = error_row(e)
        yield t, row


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'nestplan[ray]'") from None
    return ray


RAY_RETRIES = 3
"""Times Ray runs a point again when the worker process running it dies."""


REACH_TIMEOUT = 5.0
"""Seconds to wait for a Ray address to answer before the sweep starts."""


def check_reachable(address: str) -> None:
    """Refuse a ``HOST:PORT`` or ``ray://HOST:PORT`` address where nothing answers (Ray's core
    retries an unreachable head for minutes, printing its own log lines: a mistyped port had
    hung a sweep); ``local`` and other forms (``auto``) are Ray's to find."""
    import socket

    if address == "local":
        return

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not (host and port.isascii() and port.isdigit()):
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT).close()
    except (OSError, OverflowError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise SpecError("--ray", address, f"nothing answers at {host}:{port} ({reason}); give the "
                        "address of a running Ray head, or local") from None


def _ray(tasks: Iterator[Task], address: str, workers: int | None):
    import logging

    ray = _import_ray()
    local = address == "local"
    kw: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING,
                          "log_to_driver": False, "configure_logging": False}
    if local:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        kw.update(num_cpus=workers or cores(), object_store_memory=80 * 2**20)
    else:
        import nestplan

        # the same nestplan on every node, by its folder: Ray 2.60's client copies the runtime
        # env (copy.deepcopy in its uv hook), which a module object refuses ("cannot pickle
        # 'module' object" had hidden why an address could not be reached)
        kw["runtime_env"] = {"py_modules": [os.path.dirname(nestplan.__file__)]}
    try:
        with warnings.catch_warnings():  # its timeout's warning says what the one line says
            warnings.simplefilter("ignore")
            ray.init(address=address, **kw)
    except Exception as e:  # noqa: BLE001 - connection failures come in many types
        # a head with token authentication (Ray 2.5x's default) times a client out without
        # saying why, unless the client is told to send the token
        advice = ("" if local or os.environ.get("RAY_AUTH_MODE") else
                  "a head with token authentication needs RAY_AUTH_MODE=token here")
        raise SpecError("--ray", address, f"cannot start or reach Ray ({_one_line(e)[:200]})",
                        advice) from None
    pending: dict[Any, Task] = {}
    try:
        window = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        window *= 2
        # a point whose worker process dies (killed, out of memory, a lost node) runs again on
        # another; a failed search is a row, not an exception, so nothing else is retried
        remote = ray.remote(num_cpus=1, max_retries=RAY_RETRIES)(run_task)
        it = iter(tasks)
        exhausted = False
        while pending or not exhausted:
            while not exhausted and len(pending) < window:
                t = next(it, None)
                if t is None:
                    exhausted = True
                    break
                pending[remote.remote(t.scenario, t.method, t.constraints)] = t
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.25,
                                fetch_local=True)
            if not ready:
                yield None
            for ref in ready:
                t = pending.pop(ref)
                try:
                    row = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - the task's worker died
                    row = error_row(e)
                yield t, row
    finally:
        with signals_held():  # (a Ctrl-C in ray.wait lands here, before run_sweep's guard)
            for ref in pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - already finished or gone
                    pass
            ray.shutdown()


# ----------------------------------------------------------------------------- the sweep


@dataclass
class Summary:
    total: int
    skipped: int = 0
    ok: int = 0
    infeasible: int = 0
    errors: int = 0
    seconds: float = 0.0
    interrupted: int = 0
    """0, or the signal that stopped the sweep (SIGINT, SIGTERM)."""
    foreign: int = 0
    superseded: int = 0
    """Rows another nestplan build wrote, moved aside (``Existing.superseded``) ..."""
    superseded_to: Path | None = None
    """... to this file (``ResultsWriter.superseded_to``)."""
    outputs: list[Path] = field(default_factory=list)
    first_infeasible: str = ""
    """The first infeasible point's id and why, as its row says it (for a sweep where no point
    found a plan)."""

    @property
    def ran(self) -> int:
        return self.ok + self.infeasible + self.errors


def check_extras(*, parquet: bool, ray: str | None):
    """Fail before any work when an optional dependency is missing."""
    import importlib.util

    if parquet and importlib.util.find_spec("pyarrow") is None:
        raise UsageError("--parquet needs pyarrow: pip install 'nestplan[parquet]'")
    if ray is not None and importlib.util.find_spec("ray") is None:
        raise UsageError("--ray needs Ray: pip install 'nestplan[ray]'")


def plan_run(spec: SweepSpec) -> tuple[list[Point], Existing]:
    """Every point and what the results file already holds."""
    points = spec.points()
    return points, read_existing(spec.output, spec, {p.id for p in points})


def point_tasks(spec: SweepSpec, points: list[Point], failed: list):
    """Tasks for the points; a point whose scenario cannot be built goes to ``failed``."""
    for p in points:
        try:
            sc = spec.scenario(p)
        except Exception as e:  # noqa: BLE001 - recorded as this point's error
            failed.append((p, error_row(e)))
            continue
        yield Task(point=p, scenario=sc, method=p["method"], constraints=spec.constraints)


def run_sweep(spec: SweepSpec, *, workers: int | None = None, ray: str | None = None,
              parquet: bool = False, quiet: bool = False,
              planned: tuple[list[Point], Existing] | None = None,
              reached: bool = False) -> Summary:
    """Run the points not yet done; rows are appended to ``spec.output`` as points finish.
    ``planned``: ``plan_run(spec)`` where the caller has it already; ``reached``: the caller
    has just found the ``ray`` address answering (``check_reachable``: the command does, before
    its notes), so it is not probed twice."""
    from .plot import write_plot

    parquet = parquet or spec.parquet
    check_extras(parquet=parquet, ray=ray)
    if ray is not None and not reached:  # before the results file is made
        check_reachable(ray)
    points, existing = planned if planned is not None else plan_run(spec)
    todo = [p for p in points if p.id not in existing.done]
    summary = Summary(total=len(points), skipped=len(points) - len(todo), foreign=existing.foreign,
                      superseded=len(existing.superseded))
    writer = ResultsWriter(spec.output, spec, existing)
    summary.superseded_to = writer.superseded_to
    progress = Progress(len(points), summary.skipped, enabled=not quiet)
    start = time.perf_counter()
    failed: list = []
    tasks = point_tasks(spec, todo, failed)
    if ray is not None:
        backend = _ray(tasks, ray, workers)
    elif (workers or cores()) == 1 or len(todo) <= 1:
        backend = _in_process(tasks)
    else:
        backend = _pool(tasks, min(workers or cores(), len(todo)))

    def record(point, row):
        writer.write(point, row)
        status = row["status"]
        summary.ok += status == "ok"
        summary.infeasible += status == "infeasible"
        if status == "infeasible" and not summary.first_infeasible:
            summary.first_infeasible = f"{point.id}: {row['error']}"
        summary.errors += status == "error"
        progress.update(summary.ran, summary.errors, force=True)

    previous = on_sigterm()
    try:
        for item in backend:
            while failed:
                record(*failed.pop())
            if item is None:
                progress.update(summary.ran, summary.errors)
            else:
                record(item[0].point, item[1])
        while failed:
            record(*failed.pop())
    except KeyboardInterrupt as e:
        summary.interrupted = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
        with signals_held():  # a second Ctrl-C or SIGTERM waits for the workers to stop
            backend.close()
    finally:
        restore_sigterm(previous)
        progress.close()
        writer.close()
        summary.seconds = time.perf_counter() - start
    if summary.interrupted:
        return summary
    in_grid_order(spec.output, [p.id for p in points])
    summary.outputs.append(spec.output)
    summary.outputs.append(write_plot(spec, points))
    if parquet:
        summary.outputs.append(write_parquet(spec))
    return summary


# ----------------------------------------------------------------------------- Parquet


def write_parquet(spec: SweepSpec) -> Path:
    """``<output stem>.parquet`` from the whole CSV, with a type per column."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError("--parquet needs pyarrow: pip install 'nestplan[parquet]'") from None
    arrow = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}
    types = {"id": pa.string(), **{k: arrow[t] for k, t in RESULT_TYPES.items()}}
    types.update({p.key: arrow[p.kind] for p in spec.parameters})
    table = pacsv.read_csv(spec.output, convert_options=pacsv.ConvertOptions(
        column_types=types, true_values=["true"], false_values=["false"],
        strings_can_be_null=False))
    out = spec.output.with_suffix(".parquet")
    pq.write_table(table, out)
    return out
