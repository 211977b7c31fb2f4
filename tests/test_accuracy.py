"""The model's error on measured runs, shipped with it (``nestplan.accuracy``) and printed beside
a plan's figures."""

import json
import sys

from conftest import BENCHMARKS
from console import cli, flags

from nestplan.accuracy import COLUMNS, shipped_text

H100_PLAN = ("evaluate", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr", "--gpus", 512,
             "--tp", 8, "--pp", 4, "--vp", 5, "--mbs", 1, "--global-batch", 1024,
             "--seq-len", 8192)


def test_the_shipped_table_is_the_models_error_now(shared):
    """Written again from every runs file, the table is the one shipped: a change to the cost
    model that moves a prediction must write it again (benchmarks/accuracy_table.py)."""
    sys.path.insert(0, str(BENCHMARKS))
    from accuracy_table import current

    now = current()
    assert now == shipped_text(), "python benchmarks/accuracy_table.py rewrites the table"
    header, *rows = now.splitlines()
    assert tuple(header.split(",")) == COLUMNS and len(rows) >= 10
    # the held-out MoE rows are all there (README "MoE runs": 60), each in its own group
    held_moe = sum(int(r.split(",")[6]) for r in rows if r.split(",")[2] == "MoE")
    assert held_moe == 60
    # a stack fitted on no run of its own is grouped with the one fitted calibration it holds:
    # torchtitan-float8's runs with torchtitan-compile's, under its name (a review's
    # torchtitan-0.3-compile plan had been told float8's runs alone)
    names = {r.split(",")[0] for r in rows}
    assert not names & {"torchtitan-float8", "torchtitan-0.3-compile"}
    compiled = next(r for r in rows if r.startswith("torchtitan-compile,h100-sxm-96gb-hbm2e,"))
    assert compiled.split(",")[3] == "18"  # 8 compiled runs, 10 with Float8


def test_evaluate_prints_the_error_on_its_groups_runs():
    """The megatron-core H100 dense group: nine Megatron-LM weak-scaling rows (development) and
    the two Llama 3 405B rows (held out), as the table counts them; text and JSON agree."""
    code, out, _ = cli(*H100_PLAN)
    assert code == 0
    line = next(s for s in out.splitlines() if s.startswith("measured error"))
    assert "stack megatron-core's calibration on h100-sxm-80gb, dense: 11 runs" in line
    assert "(2 held out of every fit:" in line
    code, out, _ = cli(*H100_PLAN, "--json")
    got = json.loads(out)["measured_error"]
    assert (got["stack"], got["accelerator"], got["kind"], got["runs"],
            got["held_out_runs"]) == ("megatron-core", "h100-sxm-80gb", "dense", 11, 2)
    assert f"mean |error| {got['mean_abs_error']:.1%}" in line
    assert f"worst {got['worst_error']:+.1%}" in line


def test_a_plan_without_runs_of_its_group_says_so_and_names_others_there(tmp_path):
    """On B200 the default stack has no run: its runs on H100 and nemo's dense B200 runs are named
    instead; with neither, the error is unknown. A stack of the user's own calibration gets no
    line (calibrate printed its rows' errors) and null."""
    b200 = [*H100_PLAN[:4], "dgx-b200-ndr", *H100_PLAN[5:]]
    code, out, _ = cli(*b200)
    line = next(s for s in out.splitlines() if s.startswith("measured error"))
    assert "no measured run of stack megatron-core's calibration on b200-sxm-180gb (dense)" in line
    assert "; its runs elsewhere: h100-sxm-80gb 11, mean |error| " in line
    # nemo's dense B200 runs are all fp8, which a bf16 plan is told (a buyer's trial) and an
    # fp8 plan is not
    assert "; other stacks' here: nemo's 12 (all fp8), mean |error| " in line
    for precision, told in (("bf16", " (all fp8)"), ("fp8", "")):
        code, out, _ = cli(*b200, "--stack", "nemo", "--precision", precision)
        line = next(s for s in out.splitlines() if s.startswith("measured error"))
        assert f"b200-sxm-180gb, dense: 12 runs{told}, step time" in line
    code, out, _ = cli(*b200, "--stack", "nemo", "--json")
    assert json.loads(out)["measured_error"]["precisions"] == "fp8"
    # a stack's family first: DeepSpeed's runs for the deepspeed stack (a DeepSpeed trial's had
    # been told composer's and megatron-2021's, the most runs there)
    code, out, err = cli(*flags(*H100_PLAN, "--cluster", "selene-a100-hdr", "--model", "llama3-8b",
                                "--tp", 1, "--pp", 1, "--vp", 1, "--stack", "deepspeed",
                                "--gpus", 64, "--global-batch", 64))
    assert code == 0, err
    here = out.split("other stacks' here: ")[1].splitlines()[0]
    assert here.startswith("deepspeed-2021's 6, mean |error| ") and ", megatron-deepspeed's 4, " in here
    tpu = [*H100_PLAN[:4], "nest-tpuv4-fattree", *H100_PLAN[5:]]
    code, out, err = cli(*flags(*tpu, "--gpus", 16, "--pp", 2, "--global-batch", 16, "--stack",
                                "deepspeed", "--tp", 1, "--vp", 1, "--model", "llama3-8b"))
    assert code == 0, err
    assert ("measured error   no measured run of stack deepspeed's calibration on tpu-v4-64gib "
            "(dense): this figure's error is unknown") in out
    code, out, _ = cli(*b200, "--json")
    assert json.loads(out)["measured_error"] is None
    mine = tmp_path / "mine.toml"
    mine.write_text('base = "megatron-core"\nmatmul_scale = 0.9\nfitted_on = ["my run"]\n')
    code, out, err = cli(*H100_PLAN, "--stack", mine)
    assert code == 0, err
    assert "measured error" not in out
    code, out, _ = cli(*H100_PLAN, "--stack", mine, "--json")
    assert json.loads(out)["measured_error"] is None


def test_a_stack_of_a_borrowed_calibration_is_told_the_runs_behind_it():
    """torchtitan-0.3-compile holds torchtitan-compile's calibration, fitted on none of its own
    runs: its plan is told torchtitan-compile's (and Float8's) runs; the group's name is the
    same whichever stack of it asks (a review found naming and lookup could disagree)."""
    from nestplan.accuracy import calibration_name
    from nestplan.catalog import get_stack

    names = {calibration_name(get_stack(s)) for s in ("torchtitan-compile", "torchtitan-float8",
                                                       "torchtitan-0.3-compile",
                                                       "torchtitan-float8-asynctp")}
    assert names == {"torchtitan-compile"}
    assert calibration_name(get_stack("torchtitan")) == "torchtitan-2024"  # its runs' stack
    code, out, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "meta-h100-hbm2e-rdma",
                         "--gpus", 64, "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 64,
                         "--seq-len", 8192, "--stack", "torchtitan-0.3-compile")
    assert code == 0, err
    assert ("measured error   stack torchtitan-compile's calibration on h100-sxm-96gb-hbm2e, "
            "dense: 18 runs") in out



def test_the_line_says_whether_its_runs_were_held_out():
    """composer's A100 runs are the ones it was fitted on and its H100 runs were held out of every
    fit: the line says which (a Composer trial had read the A100 figure as a held-out one)."""
    plan = ("evaluate", "--model", "llama2-7b", "--gpus", 8, "--tp", 1, "--pp", 1, "--zero", 3,
            "--mbs", 2, "--global-batch", 16, "--seq-len", 2048, "--stack", "composer")
    told = {"selene-a100-hdr": "61 runs, step time mean |error| 4.0%, worst -25.9% (none held out: "
                               "the runs the calibration was fitted or checked on)",
            "dgx-h100-ndr": "77 runs, step time mean |error| 8.3%, worst +31.3% (all held out of "
                            "every fit)"}
    for cluster, words in told.items():
        code, out, err = cli(*plan, "--cluster", cluster)
        assert code == 0, err
        line = next(s for s in out.splitlines() if s.startswith("measured error"))
        assert words in line, line
