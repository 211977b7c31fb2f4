"""Run the bad-input campaign's cases (``bad_inputs.CASES``) through the console script."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bad_inputs import DIR, FIFO, Case, Link
from console import cli


def base_plan(tmp: Path) -> dict:
    """A valid plan file, written by the console script itself."""
    path = tmp / "base.json"
    code, _, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus",
                       8, "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len",
                       2048, "--save", path)
    assert code == 0, err
    return json.loads(path.read_text())


def _paths(text: str, names: dict) -> str:
    for stem, path in names.items():
        text = text.replace("{%s}" % stem, path)
    return text


def materialise(c: Case, where: Path, base: dict) -> list[str]:
    """Write the case's files under ``where``; its arguments with their paths (``{stem}``)."""
    names = {name.split(".")[0]: str(where / name.split(".")[0]) for name in c.files}
    for name, content in c.files.items():
        path = where / name
        if content is DIR:
            path.mkdir()
        elif content is FIFO:
            os.mkfifo(path)
        elif isinstance(content, Link):
            os.symlink(content.target, path)
        else:
            if callable(content):
                content = content(base)
            if isinstance(content, str):
                path.write_text(_paths(content, names))
            else:
                path.write_bytes(content)
    return [_paths(str(a), names) for a in c.args]


def run(c: Case, where: Path, base: dict):
    """(exit code, stdout, stderr, seconds) of the case."""
    args = materialise(c, where, base)
    t = time.perf_counter()
    code, out, err = cli(*args, timeout=60)
    return code, out, err, time.perf_counter() - t
