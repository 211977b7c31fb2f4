import compileall
import csv
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
SHARED = HERE.parent.parent / "shared"
BENCHMARKS = HERE.parent / "benchmarks"


def pytest_configure(config):
    """The console-script tests start some 500 interpreters. Where PYTHONDONTWRITEBYTECODE is
    set (as on CI's machines) each would compile nestplan's sources afresh (~40 ms a start):
    the controller compiles them once, and every start reads the bytecode."""
    if not hasattr(config, "workerinput"):  # pytest-xdist's workers have it
        import nestplan

        compileall.compile_dir(Path(nestplan.__file__).parent, quiet=1)


@pytest.fixture(scope="session")
def shared() -> Path:
    """The read-only data folder laid out beside the checkout (as in CI)."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not beside the checkout")
    return SHARED


@pytest.fixture
def runs_csv(tmp_path, shared):
    """``runs_csv(**changes)`` writes the first row of published_runs.csv, with ``changes``
    applied (new keys become columns), as a runs CSV and returns its path; ``runs_csv.row`` is
    the unchanged row."""
    with open(shared / "data" / "published_runs.csv", newline="") as f:
        reader = csv.DictReader(f)
        first, fields = next(reader), list(reader.fieldnames)

    def write(**changes) -> str:
        path = tmp_path / "runs.csv"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields + [k for k in changes if k not in fields])
            w.writeheader()
            w.writerow(first | changes)
        return str(path)

    write.row = dict(first)
    return write


# Tests that need an optional extra or Chromium skip when it is missing. CI installs all of them
# and sets NESTPLAN_REQUIRE_OPTIONAL=1, so that there a skip of such a test is a failure.
OPTIONAL = ("frameworks", "ray", "parquet", "chromium")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The tests of the frameworks' own code run in one worker (pytest-xdist ``loadgroup``):
    importing Megatron-Core, torchtitan and DeepSpeed costs several seconds in each worker that
    does."""
    for item in items:
        if item.get_closest_marker("frameworks") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("frameworks"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if (rep.skipped and os.environ.get("NESTPLAN_REQUIRE_OPTIONAL") == "1"
            and any(item.get_closest_marker(m) for m in OPTIONAL)):
        rep.outcome = "failed"
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else rep.longrepr
        rep.longrepr = f"skipped, but NESTPLAN_REQUIRE_OPTIONAL=1 requires it: {reason}"


def pytest_terminal_summary(terminalreporter):
    """Print what tests recorded as ``record_property("print", text)`` (the validation table):
    recorded properties reach the main process also when xdist runs the tests."""
    for key in ("passed", "failed"):
        for rep in terminalreporter.stats.get(key, []):
            for name, value in getattr(rep, "user_properties", ()):
                if name == "print":
                    terminalreporter.write_line("")
                    terminalreporter.write_line(value)


def exported(sc, par, fmt: str):
    """The export to ``fmt`` of the plan file that ``evaluate(sc, par)`` saves, read back as
    ``nestplan export`` reads it."""
    from nestplan import planfile
    from nestplan.evaluate import evaluate
    from nestplan.exports import export

    return export(planfile.from_dict(planfile.to_dict(evaluate(sc, par))), fmt)
