"""Notes on measured runs that ``validate`` and ``calibrate`` read: rows filled in with defaults,
set aside, predicted far off or above their device's memory, and what a fit could not tell."""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import note


def far_rows(outcomes) -> None:
    """Say which rows are predicted 10 or more times from their measurement (``calibrate`` refuses
    them): a step time in milliseconds, or a plan the row misstates, is likelier than a model that
    far off (a user trial's runs in ms had shown -99.9 % with no word)."""
    from ..calibrate import FARTHEST
    from ..textfmt import first_of

    far = [o for o in outcomes if not 1 / FARTHEST < 1 + o.error < FARTHEST]
    if not far:
        return
    o = max(far, key=lambda o: max(1 + o.error, 1 / (1 + o.error)))
    note(f"{len(far)} of {len(outcomes)} rows are predicted {FARTHEST:g} or more times "
         f"from their measurement ({first_of([f.case.id for f in far])}; the farthest "
         f"{o.case.id}: {o.case.measured:g} s measured, {o.predicted:.3g} s predicted): "
         "step_time_s is seconds per step; check the units, and the plans the rows "
         "state")


def over_hbm(cases, peaks) -> None:
    """Say which measured runs the memory model puts above their device's memory (``peaks``:
    predicted bytes, None for a layer row): they ran, so it over-counts what they kept or their
    rows misstate a plan (a user trial: such a row was fitted and listed without a word)."""
    from ..textfmt import first_of
    from ..units import GiB

    def hbm(case):
        return case.scenario.cluster.accelerator.hbm_bytes

    over = [(c, p / hbm(c)) for c, p in zip(cases, peaks) if p is not None and p > hbm(c)]
    if not over:
        return
    c, ratio = max(over, key=lambda o: o[1])
    most = f"{ratio:.2f}x its {hbm(c) / GiB:.1f} GiB"
    which = (f"row {c.id}'s plan is predicted at {most}" if len(over) == 1 else
             f"{len(over)} of {len(cases)} rows' plans are predicted above their device's memory "
             f"({first_of([o[0].id for o in over])}; the most {c.id}, {most})")
    it, row = ("it", "the row misstates its") if len(over) == 1 else (
        "they", "the rows misstate their")
    note(f"{which}: {it} ran, so the memory model counts more than {it} kept, or {row} "
         "plan (recompute, zero_stage, micro_batch)")


def beyond_calibration(cases) -> None:
    """Say which rows lie beyond the runs their stack was calibrated on, by how
    (``notes.plan.calibration_gaps``): ``validate --stack MINE.toml`` of other runs scores how the
    fit carries to them, which evaluate and plan say of one scenario and validate had not (a
    Composer trial's)."""
    from ..textfmt import first_of
    from .plan import GAP_ASPECTS, calibration_gaps

    by_aspect: dict[str, list[str]] = {}
    beyond = 0
    for c in cases:
        gaps = calibration_gaps(c.scenario)
        beyond += bool(gaps)
        for aspect, _ in gaps:
            by_aspect.setdefault(aspect, []).append(c.id)
    if not beyond:
        return
    said = "; ".join(f"{words}: {first_of(by_aspect[a])}" for a, words in GAP_ASPECTS.items()
                     if a in by_aspect)
    note(f"{beyond} of {len(cases)} rows lie beyond the runs their stack was calibrated on, "
         f"which evaluate and plan say of such a scenario ({said}): their errors show how the "
         "fit carries, not how it fits")


def cannot_run(stack: str, refused: list, kept: int) -> None:
    """Say which rows (``validation.SetAside``) ``validate --stack`` left out because that stack
    cannot run their plans, grouped by reason (with the value where a group shares one; the
    first ``textfmt.LISTED`` reasons, ``--json`` lists all)."""
    from ..textfmt import LISTED, first_of

    by_kind: dict[str, list] = {}
    for r in refused:
        by_kind.setdefault(r.kind, []).append(r)

    def group(rows: list) -> str:
        why = rows[0].why if len({repr(r.value) for r in rows}) == 1 else rows[0].kind
        return f"{first_of([r.id for r in rows])} ({why})"

    shown = "; ".join(group(rows) for rows in list(by_kind.values())[:LISTED])
    rest = len(by_kind) - LISTED
    more = f"; and {rest} more reason{'s' if rest > 1 else ''}" if rest > 0 else ""
    note(f"--stack {stack} cannot run the plans of {len(refused)} of the "
         f"{len(refused) + kept} rows, left out of the figures (--json lists them): "
         f"{shown}{more}")


LEFT_OUT_SUSPECT = 0.5
"""A row the fit on the other rows predicts 1 + this times too slow or too fast is named: a step
time in the wrong unit or a misstated plan pulls the fit of every row."""


def far_when_left_out(cases, loo) -> None:
    """Name the rows the leave-one-out fits predict far off (``LEFT_OUT_SUSPECT``)."""
    far = [(c, e) for c, e in zip(cases, loo or ()) if abs(math.log1p(e)) > math.log1p(
        LEFT_OUT_SUSPECT)]  # (as far either way: 1.5 times too slow or too fast)
    if far:
        note("fitted without it, each of these rows is predicted far off: "
             + ", ".join(f"{c.id} {e:+.0%}" for c, e in far)
             + "; check their step times (seconds) and plans: such rows pull every "
             "row's fit")


def filled_in(runs: Path, stack: str | None, field: str = "RUNS.csv", *,
                    precision: bool = True) -> None:
    """Say which rows a command reads with a value they do not give: the default stack (no
    ``stack`` column value and no source a catalog stack names) and, with ``precision``
    (calibrate, whose fit they change), bf16 (no precision). validate says only the first: the
    shipped published runs leave the precision blank where their sources do not state it (16-bit
    mixed precision, which bf16 stands for), so that note would come with every validate."""
    from ..catalog import DEFAULT_STACK
    from ..textfmt import first_of
    from ..validation import rows_filled_in

    def rows(ids: list[str], verb: str, rest: str) -> None:  # verb: for more than one row
        if ids:
            one = len(ids) == 1
            note(f"{len(ids)} row{'' if one else 's'} ({first_of(ids)}) "
                 f"{verb}{'s' if one else ''} {rest}")

    no_stack, no_precision = rows_filled_in(runs, field)
    if not stack:  # (--stack sets the rows' own aside)
        rows(no_stack, "name", f"no stack (a stack column) and no source a catalog stack names: "
             f"read as run on {DEFAULT_STACK}, the default")
    if precision:
        rows(no_precision, "give", "no precision: read as bf16")


OUTSIZED = 2.0
"""A fitted efficiency multiplier that moves (in log) more than this many times as far as the
farthest row was off before the fit gets a note: it stands for kernels that are a small share of
the rows' steps, and carries in full into workloads where they are most of the step."""
PLAUSIBLE_MOVE = 1.25
"""... when it moves beyond this factor either way too (a smaller move is within what the rows'
scatter allows, whatever their errors)."""
PLAUSIBLE_SCALE = 2.0
"""A fitted efficiency multiplier beyond this factor of its base's, either way, gets a note: the
rows then run a kind of kernel more than twice as fast or slow as the base stack's own runs did,
which is likelier a miss of the model that the multiplier absorbs than a kernel that different."""


def fit_limits(cases, result, base) -> None:
    """Say when the fit leaves rows beyond validate's tolerance, or raises an efficiency of
    ``base`` to its cap of 1 (a user trial's one row at 1.2 s for 9 s of work: 4x the base's,
    +378 % after the fit, plans then at 99 % MFU, without a word), when the rows span several
    accelerators, or when the peaks are below the memory model's tensors."""
    from ..calibrate import PARAMETERS
    from ..validation import mean_abs
    from ..textfmt import first_of
    from ..units import GiB
    from ..validation import MEMORY_TOLERANCE, ROW_TOLERANCE

    far = [c.id for c, b, e in zip(cases, result.before, result.after)
           if abs(e) > ROW_TOLERANCE and abs(b) > ROW_TOLERANCE]
    pushed = [c.id for c, b, e in zip(cases, result.before, result.after)
              if abs(e) > ROW_TOLERANCE >= abs(b)]
    if far:
        note(f"after the fit {len(far)} of {len(cases)} rows are still beyond "
             f"{ROW_TOLERANCE:.0%} ({first_of(far)}): one calibration does not explain "
             "them; check their step times, precision, plan and stack")
    if pushed:  # (a user trial: a row within it before had been called "still" beyond)
        note(f"the fit takes {len(pushed)} of {len(cases)} rows beyond {ROW_TOLERANCE:.0%} that "
             f"were within it on {base.name} ({first_of(pushed)}): one calibration of these rows "
             "misses them; check the rows farthest off before the fit, or calibrate apart runs "
             "that differ (plans, models, stacks)")
    before, after = mean_abs(result.before), mean_abs(result.after)
    if after > before + 5e-4:  # (a two-row fit had left the mean worse without a word; by more
        # than the printed figures' rounding, so that they differ)
        note(f"the fit leaves the rows' mean |error| worse than {base.name}'s ({before:.1%} -> "
             f"{after:.1%}): it weighs each row's squared error and pulls toward the base, "
             "and these rows disagree; the base may serve them better")
    st = result.stack
    capped, capped_fields = set(), set()
    for acc in {c.scenario.cluster.accelerator for c in cases}:
        curves = [e for _, e in acc.matmul_efficiency_bf16 + (acc.matmul_efficiency_fp8 or ())]
        for what, top, field in (("the GEMM efficiency", max(curves), "matmul_scale"),
                                 ("the attention efficiency", max(acc.attention_efficiency),
                                  "attention_scale"),
                                 ("the memory-bound kernels' share of HBM bandwidth",
                                  acc.memory_efficiency, "memory_scale")):
            scale = getattr(st, field)
            if top * scale >= 1 and scale > getattr(base, field):
                capped.add(what)
                capped_fields.add(field)
    lowered = [f for f in PARAMETERS[:3] if getattr(st, f) < getattr(base, f)]
    if capped and lowered:  # (a user trial: rows 15 % slow read as "ran beyond the peak")
        note(f"the fit takes {' and '.join(sorted(capped))} to the cap of the "
             f"accelerator's peak while it lowers {' and '.join(lowered)}: the rows do "
             "not tell these efficiencies apart, so how the fit shares them out is not "
             "measured; rows of other shapes (sequence lengths, model widths, "
             "micro-batches) separate them")
    elif capped:
        note(f"the fit takes {' and '.join(sorted(capped))} to the cap of the "
             "accelerator's peak: the rows ran at or beyond what it allows, and beyond "
             "the cap a multiplier changes nothing; check their step times and "
             "precision")
    accelerators = sorted({c.scenario.cluster.accelerator.name for c in cases})
    if len(accelerators) > 1:
        note(f"the rows ran on {len(accelerators)} accelerators "
             f"({', '.join(accelerators)}), fitted with one set of multipliers of each "
             "one's own efficiencies; where they disagree, fit each accelerator's rows "
             "apart")
    alloc = result.params.get("allocator_overhead")
    over = [(c, e) for c, e in zip(cases, result.memory_after)
            if e is not None and e > MEMORY_TOLERANCE]
    if alloc == 0 and over:  # (a user trial: a peak below every tensor was fitted silently)
        c, e = over[0]
        note(f"the measured peaks are below what the memory model predicts with no "
             f"allocator overhead ({c.id}: {c.memory / GiB:.1f} GiB measured, "
             f"{c.memory * (1 + e) / GiB:.1f} predicted): allocator_overhead is 0, and "
             "the model's tensors exceed what these runs kept; check their recompute, "
             "zero_stage and micro_batch")
    elif off := [c.id for c, e in zip(cases, result.memory_after)
                 if e is not None and abs(e) > MEMORY_TOLERANCE]:
        note(f"after the fit {len(off)} of "
             f"{sum(e is not None for e in result.memory_after)} measured peaks are "
             f"still beyond {MEMORY_TOLERANCE:.0%} ({first_of(off)}): one allocator "
             "share does not explain them, and one far off moves it for the others; "
             "check their recompute, zero_stage and micro_batch")
    # (a multiplier at the peak's cap is said so above; the others are said here whatever the
    # cap: a user trial's attention at 3.25x had gone unsaid beside a memory share at its cap)
    ratios = {f: getattr(st, f) / getattr(base, f) for f in PARAMETERS[:3]}
    if base.moe_layer_host:  # (the wait, fitted for MoE rows: a review's, said of no move before)
        ratios["moe_layer_host_ms"] = st.moe_layer_host / base.moe_layer_host
    wide = [(f, r) for f, r in ratios.items()
            if f not in capped_fields and not 1 / PLAUSIBLE_SCALE <= r <= PLAUSIBLE_SCALE]
    if wide:  # (a user trial: three MoE rows fitted attention at 0.275x, dense plans then 2.5
        # times slower)
        note(f"the fit moves {', '.join(f'{f} to {r:.3g}x' for f, r in wide)} the base's "
             f"({base.name}'s): kernels more than twice as fast or slow as its own runs' "
             "are likelier a miss of the model in these rows (an MoE layer's cost, a plan "
             "misstated) that the multiplier absorbs, and carries into every other "
             "workload; check with validate on runs of other shapes before planning "
             "with it")
    reach = max(abs(math.log1p(e)) for e in result.before)
    outsized = [(f, r) for f in PARAMETERS[:3] if f not in capped_fields | dict(wide).keys()
                and abs(math.log(r := ratios[f])) > max(OUTSIZED * reach, math.log(PLAUSIBLE_MOVE))]
    if outsized:  # (a user trial: host-bound MoE rows 12.7 % fast had fitted the GEMMs at 0.58x,
        # a dense plan then 54 % slower)
        worst = max(map(abs, result.before))
        note(f"the fit moves {', '.join(f'{f} to {r:.3g}x' for f, r in outsized)} the base's to "
             f"correct rows at most {worst:.1%} off: those kernels are a small part "
             "of these rows' steps, and the factor carries in full into workloads where they are "
             "most of it; check with validate on runs of other shapes before planning with it")
