import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
SHARED = HERE.parent.parent / "shared"


@pytest.fixture(scope="session")
def shared() -> Path:
    """The read-only data folder laid out beside the checkout (as in CI)."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not beside the checkout")
    return SHARED


# Tests that need an optional extra or Chromium skip when it is missing. CI installs all of them
# and sets NESTPLAN_REQUIRE_OPTIONAL=1, so that there a skip of such a test is a failure.
OPTIONAL = ("frameworks", "ray", "parquet", "chromium")


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
