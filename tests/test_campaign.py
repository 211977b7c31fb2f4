"""The bad-input campaign (``bad_inputs.py``): every case through the installed console script
must exit 2 within 60 s with nothing on stdout and one line on stderr naming what was wrong —
never a traceback, never exit 0 or 3."""

import os

import pytest

from bad_inputs import CASES, FIFO
from campaign_run import base_plan, run


@pytest.fixture(scope="session")
def base(tmp_path_factory):
    return base_plan(tmp_path_factory.mktemp("campaign"))


def test_the_campaign_is_as_large_as_issue_11_asks():
    assert len(CASES) >= 250
    assert len({c.id for c in CASES}) == len(CASES)
    commands = {c.args[0] for c in CASES}
    assert commands >= {"evaluate", "plan", "compare", "export", "report", "sweep", "list",
                        "validate", "calibrate"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_exit_2(case, base, tmp_path):
    if any(v is FIFO for v in case.files.values()) and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    code, out, err, seconds = run(case, tmp_path, base)
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert code == 2 and out == "" and len(lines) == 1, (code, out[:300], err[-600:])
    # the needle names what was wrong: look for it in the message, not in the prefix
    assert case.needle in lines[0].removeprefix("nestplan: error: "), lines[0]
    assert seconds < 60
