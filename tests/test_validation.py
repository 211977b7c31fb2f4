"""Predictions against measured training runs (../shared/data/published_runs.csv)."""

from nestplan.evaluate import evaluate
from nestplan.validation import MEAN_TOLERANCE, ROW_TOLERANCE, load_cases, run, table


def test_every_published_run_within_tolerance(shared, record_property):
    outcomes = run(shared / "data" / "published_runs.csv")
    record_property("print", table(outcomes))  # shown at the end of the run (conftest.py)
    assert len(outcomes) >= 60  # every row except LoRA (frozen weights are not modelled)
    over = [f"{o.case.id} {o.error:+.1%}" for o in outcomes if abs(o.error) > ROW_TOLERANCE]
    assert not over, over
    mae = sum(abs(o.error) for o in outcomes) / len(outcomes)
    assert mae <= MEAN_TOLERANCE, mae


def test_runs_that_happened_are_predicted_to_nearly_fit(shared):
    # The memory model may be a little pessimistic, never far: each run really fitted.
    for case in load_cases(shared / "data" / "published_runs.csv"):
        if case.metric != "step_time":
            continue
        ev = evaluate(case.scenario, case.plan)
        assert ev.peak_memory <= 1.15 * ev.capacity, (case.id, ev.why_not)
