"""What measured runs say of the model's error, shipped beside it: for each catalog calibration
of a stack, accelerator and kind of model (dense or MoE), how far the predicted step times (and
peak memories, where a run gives one) fell from the measured ones on every run nestplan is scored
on, development and held-out alike (``data/accuracy.csv``).

``benchmarks/accuracy_table.py`` writes the table from the runs files (the published runs
shipped in ``data/``, ``../shared/data``'s FSDP runs and ``tests/data``), and a test writes it
again and compares, so it is the model's error as it is now.
``evaluate``, ``plan`` and the report print the row of the plan's stack, accelerator and kind (a
hardware buyer's trial had to look up the README's tables to learn how far to trust a figure).
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass
from importlib import resources

from .caching import cached
from .stack import CALIBRATION, CALIBRATION_VALUES, fitted_kind
from .units import counted

COLUMNS = ("stack", "accelerator", "kind", "runs", "mean_abs_error", "worst_error",
           "held_out_runs", "held_out_mean_abs_error", "memory_runs", "memory_mean_abs_error",
           "precisions")
"""The table's columns: errors are fractions (predicted / measured - 1), the worst signed;
``precisions`` the matmul precisions the group's runs ran in, space-separated."""
SHOWN = 2
"""How many other groups a plan without runs of its own group is told of, of each kind."""


@dataclass(frozen=True)
class Record:
    """One group's errors: ``stack`` is the catalog stack the group's calibration is named for
    (``_names``: one its runs ran on); the runs may be on other stacks of that calibration."""

    stack: str
    accelerator: str
    kind: str
    runs: int
    mean_abs_error: float
    worst_error: float
    held_out_runs: int
    held_out_mean_abs_error: float | None
    memory_runs: int
    memory_mean_abs_error: float | None
    precisions: str

    def to_json(self) -> dict:
        return {c: getattr(self, c) for c in COLUMNS}

    def unlike(self, precision: str) -> str:
        """`` (all fp8)``-like words where none of the runs ran in ``precision`` (a buyer's
        trial: a bf16 plan on B200 was told nemo's runs there, all of them fp8), else ''."""
        ran = self.precisions.split()
        if precision in ran:
            return ""
        return f" ({'all ' if self.runs > 1 else ''}{' or '.join(ran)})"

    def text(self, precision: str) -> str:
        """One line of what the runs say of a plan in ``precision``, e.g. for ``evaluate``'s
        output."""
        out = (f"stack {self.stack}'s calibration on {self.accelerator}, {self.kind}: "
               f"{counted(self.runs, 'run')}{self.unlike(precision)}, step time mean |error| "
               f"{self.mean_abs_error:.1%}, worst {self.worst_error:+.1%}")
        if self.held_out_runs == self.runs:
            out += " (all held out of every fit)"
        elif self.held_out_runs:
            out += (f" ({self.held_out_runs} held out of every fit: "
                    f"{self.held_out_mean_abs_error:.1%})")
        else:  # (a Composer trial read composer's 4.0 % on A100 as a held-out figure)
            out += " (none held out: the runs the calibration was fitted or checked on)"
        if self.memory_runs:
            out += (f"; peak memory on {self.memory_runs}: mean |error| "
                    f"{self.memory_mean_abs_error:.1%}")
        return out


def kind_of(model) -> str:
    """The table's kind of ``model``: ``stack.fitted_kind``'s, MoE capitalised."""
    return {"moe": "MoE"}.get(fitted_kind(model), "dense")


def _own(stack, fields=CALIBRATION) -> tuple:
    """``stack``'s calibration (``stack.CALIBRATION``), or of it ``fields``."""
    return tuple(getattr(stack, f) for f in fields)


def _values(stack) -> tuple:
    """What ``stack``'s calibration holds (``stack.CALIBRATION_VALUES``), not where it came
    from."""
    return _own(stack, CALIBRATION_VALUES)


@cached(maxsize=None)
def _fitted() -> dict[tuple, tuple[tuple, ...]]:
    """The catalog's calibrations fitted on runs (``fitted_on`` not empty), by the values they
    hold."""
    from .catalog import get_stack, list_names

    out: dict[tuple, dict[tuple, None]] = {}  # (a dict keeps each calibration once, in order)
    for st in map(get_stack, sorted(list_names("stacks"))):
        if st.fitted_on:
            out.setdefault(_values(st), {})[_own(st)] = None
    return {values: tuple(owns) for values, owns in out.items()}


def calibration(stack) -> tuple:
    """The calibration a stack's runs' errors are grouped by (``stack.CALIBRATION``): its own,
    or, for a stack fitted on no run of its own, the one fitted calibration of the catalog that
    holds its values (torchtitan-float8's and torchtitan-0.3-compile's are torchtitan-compile's;
    where several hold them, its own)."""
    own = _own(stack)
    if stack.fitted_on:
        return own
    same = _fitted().get(_values(stack), ())
    return same[0] if len(same) == 1 else own


@cached(maxsize=None)
def _catalog_calibrations() -> dict[tuple, tuple[str, ...]]:
    """Each catalog calibration (as ``calibration`` groups) and the catalog stacks, by name, of
    it."""
    from .catalog import get_stack, list_names

    out: dict[tuple, tuple[str, ...]] = {}
    for name in sorted(list_names("stacks")):
        key = calibration(get_stack(name))
        out[key] = out.get(key, ()) + (name,)
    return out


@cached(maxsize=64)  # (a sweep asks it of every point)
def calibration_name(stack) -> str | None:
    """The catalog stack a group of ``stack``'s calibration is named for: of the catalog stacks
    of it, the first (by name) the shipped table names, else the first; None for a calibration
    of a user's own (``calibrate``'s output, a file that sets multipliers)."""
    names = _catalog_calibrations().get(calibration(stack))
    if not names:
        return None
    labelled = {r.stack for r in _shipped().values()}
    return next((n for n in names if n in labelled), names[0])


def _names(groups: dict[tuple, list]) -> dict[tuple, str]:
    """What the runs of each calibration are named, over all their groups (``summarise``'s, keyed
    by calibration, accelerator and kind; so that a calibration has one name, which
    ``calibration_name`` finds): the first catalog stack of it (by name) some run ran on, else
    the first."""
    ran: dict[tuple, set] = {}
    for (key, _, _), outs in groups.items():
        ran.setdefault(key, set()).update(o.case.scenario.stack.name for o in outs)
    out = {}
    for key, stacks in ran.items():
        names = _catalog_calibrations().get(key)
        if names:
            out[key] = next((n for n in names if n in stacks), names[0])
    return out


def summarise(outcomes, held_out) -> list[Record]:
    """The table's rows from validation outcomes (step-time rows): ``held_out(case)`` says
    whether a run is held out of every fit."""
    groups: dict[tuple, list] = {}
    for o in outcomes:
        sc = o.case.scenario
        key = (calibration(sc.stack), sc.cluster.accelerator.name, kind_of(sc.model))
        groups.setdefault(key, []).append(o)
    names = _names(groups)
    named = {(names[key], acc, kind): outs for (key, acc, kind), outs in groups.items()
             if key in names}
    out = []
    for (name, acc, kind), outs in sorted(named.items()):
        errors = [o.error for o in outs]
        held = [abs(o.error) for o in outs if held_out(o.case)]
        memory = [abs(o.memory_error) for o in outs if o.memory_error is not None]
        out.append(Record(
            name, acc, kind, len(outs), round(statistics.mean(map(abs, errors)), 4),
            round(max(errors, key=abs), 4), len(held),
            round(statistics.mean(held), 4) if held else None, len(memory),
            round(statistics.mean(memory), 4) if memory else None,
            " ".join(sorted({o.case.scenario.training.precision.value for o in outs}))))
    return out


def to_csv(records: list[Record]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in records:
        w.writerow(["" if v is None else v for v in r.to_json().values()])
    return buf.getvalue()


def _record(row: dict) -> Record:
    def share(key):
        return float(row[key]) if row[key] else None

    return Record(row["stack"], row["accelerator"], row["kind"], int(row["runs"]),
                  float(row["mean_abs_error"]), float(row["worst_error"]),
                  int(row["held_out_runs"]), share("held_out_mean_abs_error"),
                  int(row["memory_runs"]), share("memory_mean_abs_error"), row["precisions"])


def shipped_text() -> str:
    return resources.files("nestplan").joinpath("data", "accuracy.csv").read_text()


@cached(maxsize=None)
def _shipped() -> dict[tuple, Record]:
    rows = csv.DictReader(io.StringIO(shipped_text()))
    return {(r.stack, r.accelerator, r.kind): r for r in map(_record, rows)}


def measured(scenario) -> tuple[str | None, Record | None]:
    """The scenario's stack calibration name (None: a user's own) and its group's errors (None:
    no measured run of that calibration on that accelerator and kind)."""
    name = calibration_name(scenario.stack)
    if name is None:
        return None, None
    key = (name, scenario.cluster.accelerator.name, kind_of(scenario.model))
    return name, _shipped().get(key)


def text(scenario) -> str | None:
    """``evaluate``'s line on the runs behind the figures; None for a user's own calibration
    (``calibrate`` printed its rows' errors)."""
    name, record = measured(scenario)
    if name is None:
        return None
    precision = scenario.training.precision.value
    if record is not None:
        return record.text(precision)
    acc, kind = scenario.cluster.accelerator.name, kind_of(scenario.model)
    records = sorted(_shipped().values(), key=lambda r: (-r.runs, r.stack, r.accelerator))
    elsewhere = [r for r in records if (r.stack, r.kind) == (name, kind)][:SHOWN]
    # stacks of its family first (a DeepSpeed trial was told composer's runs, not DeepSpeed's)
    family = set(name.split("-"))
    here = sorted((r for r in records if (r.accelerator, r.kind) == (acc, kind)),
                  key=lambda r: not family & set(r.stack.split("-")))[:SHOWN]
    parts = [f"no measured run of stack {name}'s calibration on {acc} ({kind})"]
    if elsewhere:
        parts.append("its runs elsewhere: " + ", ".join(
            f"{r.accelerator} {r.runs}{r.unlike(precision)}, mean |error| {r.mean_abs_error:.1%}"
            for r in elsewhere))
    if here:
        parts.append("other stacks' here: " + ", ".join(
            f"{r.stack}'s {r.runs}{r.unlike(precision)}, mean |error| {r.mean_abs_error:.1%}"
            for r in here))
    if len(parts) == 1:
        return parts[0] + ": this figure's error is unknown"
    return "; ".join(parts)
