"""Bad files and flags through the installed console script: exit 2 and one line, never a
traceback, never a hang (issue 11)."""

import os

import pytest

from console import cli, one_line_error

EVALUATE = ["evaluate", "--cluster", "dgx-h100-ndr", "--gpus", 8, "--tp", 1, "--pp", 1,
            "--mbs", 1, "--global-batch", 8, "--seq-len", 2048]
PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8]


@pytest.mark.parametrize("top", [0, -1, 1001])
def test_top_out_of_range(top):
    assert one_line_error(*cli(*PLAN, "--top", top),
                          f"top: got {top}; must be an integer in [1, 1000]")


def test_a_directory_is_not_a_plan_file(tmp_path):
    for command in (["export", tmp_path, "--format", "megatron"], ["evaluate", "--plan", tmp_path],
                    ["report", tmp_path, "-o", tmp_path / "r.html"]):
        assert one_line_error(*cli(*command), "a directory; give a JSON file"), command


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_before_reading(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # reading it would block: nestplan must not open it
    assert one_line_error(*cli(*EVALUATE, "--model", fifo, timeout=30),
                          "not a regular file; give a JSON file")
    stack = tmp_path / "stack.toml"
    os.mkfifo(stack)
    assert one_line_error(*cli(*EVALUATE, "--model", "llama3-8b", "--stack", stack, timeout=30),
                          "not a regular file; give a TOML file")


def test_a_device_is_refused_before_reading():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    assert one_line_error(*cli(*EVALUATE, "--model", "llama3-8b", "--cluster", "/dev/zero",
                               timeout=30), "not a regular file; give a TOML file")


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_bytes(b"\xef\xbb\xbf" + b'base = "megatron-core"\nname = "mine"\n')
    code, out, err = cli(*EVALUATE, "--model", "llama3-8b", "--stack", path)
    assert code == 0 and "stack mine" in out, err


def test_validate_csv_must_be_a_file(tmp_path):
    assert one_line_error(*cli("validate", "--csv", tmp_path),
                          "--csv: got '%s'; a directory; give a runs CSV file" % tmp_path)
