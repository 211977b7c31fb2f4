"""Bad files and flags through the installed console script: exit 2 and one line, never a
traceback, never a hang (issue 11)."""

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from campaign_run import base_plan
from console import cli, one_line_error

ON_CLUSTER = ["evaluate", "--gpus", 8, "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8,
              "--seq-len", 2048]
"""An evaluation whose --cluster the test gives (a flag is given once)."""
EVALUATE = [*ON_CLUSTER, "--cluster", "dgx-h100-ndr"]
PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8]


@pytest.mark.parametrize("top", [0, -1, 101])
def test_top_out_of_range(top):
    assert one_line_error(*cli(*PLAN, "--top", top),
                          f"top: got {top}; must be an integer in [1, 100]")


def test_a_directory_is_not_a_plan_file(tmp_path):
    for command in (["export", tmp_path, "--format", "megatron"], ["evaluate", "--plan", tmp_path],
                    ["report", tmp_path, "-o", tmp_path / "r.html"]):
        assert one_line_error(*cli(*command), "a directory; give a JSON file"), command


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_before_reading(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # reading it would block: nestplan must not open it
    assert one_line_error(*cli(*EVALUATE, "--model", fifo, timeout=30),
                          "not a regular file; give a model TOML or HuggingFace config.json file")
    stack = tmp_path / "stack.toml"
    os.mkfifo(stack)
    assert one_line_error(*cli(*EVALUATE, "--model", "llama3-8b", "--stack", stack, timeout=30),
                          "not a regular file; give a TOML file")


def test_a_device_is_refused_before_reading():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    assert one_line_error(*cli(*ON_CLUSTER, "--model", "llama3-8b", "--cluster", "/dev/zero",
                               timeout=30), "not a regular file; give a TOML file")


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_bytes(b"\xef\xbb\xbf" + b'base = "megatron-core"\nname = "mine"\n')
    code, out, err = cli(*EVALUATE, "--model", "llama3-8b", "--stack", path)
    assert code == 0 and "stack mine" in out, err


def test_validate_csv_must_be_a_file(tmp_path):
    assert one_line_error(*cli("validate", "--csv", tmp_path),
                          "--csv: got '%s'; a directory; give a runs CSV file" % tmp_path)


@pytest.mark.parametrize("flags, needle", [
    (["--gpus", 64, "--tp", 8, "--pp", 8, "--dp", 8],
     "dp: got 8; tp·pp·dp = 8·8·8 = 512 must divide gpus = 64"),
    (["--gpus", 64, "--tp", 16, "--tp-within-node"],
     "tp: got 16; --tp-within-node keeps tensor parallelism inside a node of 8 devices"),
    (["--gpus", 64, "--tp", 1, "--sp"], "sp: got true; sequence parallelism needs tp > 1"),
    (["--gpus", 8, "--recompute", "full,none"],
     "recompute: got 'full,none'; 2 policies, one per pipeline stage, need --pp 2"),
    # a pp that is not their count says so (it had said they need --pp 4 beside --pp 8)
    (["--gpus", 64, "--pp", 8, "--recompute", "full*2,none*2"],
     "recompute: got 'full*2,none*2'; 4 policies for --pp 8: give one, or one per stage"),
    (["--gpus", 8, "--recompute", "some"], "recompute: got 'some'; stack megatron-core offers"),
    # knobs each possible alone whose batch or sequence does not divide (had been exit 3, "no
    # feasible plan", where evaluate names the field)
    (["--gpus", 16, "--global-batch", 64, "--dp", 16, "--mbs", 8],
     "global_batch: got 64; must be a multiple of mbs·dp = 8·16 = 128"),
    (["--gpus", 16, "--global-batch", 8, "--tp", 1, "--pp", 1, "--cp", 1],
     "global_batch: got 8; must be a multiple of dp = 16 (dp = gpus / (tp·pp·cp) = 16/1)"),
    (["--gpus", 16, "--seq-len", 16, "--cp", 16],
     "cp: got 16; seq_len / cp must be even (load-balanced causal chunks)"),
    (["--gpus", 16, "--global-batch", 16, "--pp", 4, "--vp", 2, "--dp", 4, "--mbs", 4],
     "global_batch: got 16; 1 micro-batches per replica (global_batch / (mbs·dp)); stack "
     "megatron-core runs interleaved-1f1b with at least pp = 4 per replica"),
    (["--gpus", 16, "--global-batch", 64, "--dp", 16, "--mbs", 8, "--method", "mcmc"],
     "global_batch: got 64; must be a multiple of mbs·dp = 8·16 = 128"),
])
def test_contradictory_constraints_are_bad_input(flags, needle):
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", *flags]
    assert one_line_error(*cli(*args), needle)


@pytest.mark.parametrize("method", ["manual", "mcmc"])
def test_the_rule_of_thumb_plans_keep_a_given_dp(method):
    """manual (and mcmc, which starts from it) had ignored --dp: 70B on 64 GPUs with --dp 2 came
    back with dp 8 (a fuzzing helper's)."""
    code, out, err = cli("plan", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr", "--gpus",
                         64, "--dp", 2, "--method", method, "--top", 3, "--json")
    assert code == 0, err
    best = json.loads(out)
    assert best["dp"] == 2 and {p["dp"] for p in best["top"]} == {2}


@pytest.mark.parametrize("command", ["report", "export"])
def test_an_output_that_is_a_hard_link_of_the_plan_is_refused(tmp_path, command):
    """The check compared paths, so a hard link of the plan file was overwritten by the report
    or the script (a fuzzing helper's)."""
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(base_plan(tmp_path)))
    os.link(plan, tmp_path / "h.json")
    before = plan.read_text()
    extra = ["--format", "megatron"] if command == "export" else []
    assert one_line_error(*cli(command, plan, *extra, "-o", tmp_path / "h.json"),
                          "is the plan file being read; write to a new file")
    assert plan.read_text() == before


def test_fp8_on_a_part_without_it_is_bad_input_for_plan_too():
    assert one_line_error(*cli("plan", "--model", "llama3-8b", "--cluster", "selene-a100-hdr",
                               "--gpus", 64, "--precision", "fp8"),
                          "precision: got 'fp8'; a100-sxm-80gb has no fp8 matmul units")


def test_per_stage_recomputation_is_kept_by_the_search():
    code, out, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                         "--pp", 2, "--recompute", "full,none", "--json", "--top", 1)
    assert code == 0, err
    js = json.loads(out)
    assert js["recompute"] == "full,none"  # text, as --recompute takes it; each stage's below
    assert [s["recompute"] for s in js["stages"]] == ["full", "none"]


@given(st.lists(st.sampled_from(["none", "selective", "fine-grained", "full"]), min_size=1,
                max_size=40))
def test_per_stage_policies_print_as_runs_and_read_back(names):
    """A plan prints its policies with runs of one name as name*k; that text reads back as the
    same policy on every stage."""
    from nestplan.recompute import names_text, parse_names

    text = names_text(names)
    back = parse_names("recompute", text)
    assert (back * len(names) if len(back) == 1 else back) == tuple(names)
    runs = 1 + sum(a != b for a, b in zip(names, names[1:]))  # one item per run of one name
    assert len(text.split(",")) == runs


def test_a_plan_prints_per_stage_policies_as_runs_and_takes_them_back():
    args = ["--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8, "--tp", 1,
            "--pp", 8, "--mbs", 1, "--global-batch", 64, "--seq-len", 2048]
    code, out, err = cli("evaluate", *args, "--recompute", "full*3,none,full*4")
    assert code == 0, err
    assert "recompute=full*3,none,full*4 " in out
    code, out, err = cli("evaluate", *args, "--recompute", "full,full,full,none,full,full,full,"
                         "full", "--json")
    assert code == 0 and json.loads(out)["recompute"] == "full*3,none,full*4"


def test_evaluate_refuses_sequence_parallelism_without_tp():
    assert one_line_error(*cli(*EVALUATE, "--model", "llama3-8b", "--sp"),
                          "sp: got true; sequence parallelism needs tp > 1")


@pytest.mark.parametrize("value", ["-50", "1e-300", "1e300"])
def test_a_level_bandwidth_outside_physical_range_is_named_in_the_files_units(tmp_path, value):
    path = tmp_path / "c.toml"
    path.write_text(f'name = "x"\naccelerator = "h100-sxm-80gb"\n[[levels]]\nname = "n"\n'
                    f'size = 8\nbandwidth_GBps = {value}\nlatency_us = 2\n[[levels]]\n'
                    f'name = "net"\nbandwidth_GBps = 50\nlatency_us = 5\n')
    shown = f"{float(value):g}" if "e" in value else value
    assert one_line_error(*cli(*ON_CLUSTER, "--model", "llama3-8b", "--cluster", path),
                          f"levels[n].bandwidth_GBps: got {shown}; must be in [0.001, 100000]")


@pytest.mark.parametrize("layers", [10**9, 513])
def test_a_model_too_large_to_work_on_is_refused_before_any_work(tmp_path, layers):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": layers,
                                "hidden_size": 64, "num_attention_heads": 4,
                                "intermediate_size": 128, "vocab_size": 100}))
    assert one_line_error(*cli(*EVALUATE, "--model", path, timeout=30),
                          f"num_hidden_layers: got {layers}; at most 512 is supported")


def test_a_plan_file_names_a_real_method(tmp_path):
    path = tmp_path / "p.json"
    code, out, err = cli(*EVALUATE, "--model", "llama3-8b", "--save", path)
    assert code == 0, err
    data = json.loads(path.read_text())
    data["method"] = "magic"
    path.write_text(json.dumps(data))
    assert one_line_error(*cli("evaluate", "--plan", path),
                          "method: got 'magic'; the search method that found the plan: nest")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_disk_is_one_line_not_a_traceback():
    import subprocess

    from console import NESTPLAN

    with open("/dev/full", "w") as full:
        p = subprocess.run([NESTPLAN, *map(str, EVALUATE), "--model", "llama3-8b", "--json"],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.strip() == (
        "nestplan: error: cannot write the output: No space left on device")
    # one line too where the command had notes to give (the defaults a plan took: they had
    # followed the error, a pipeline engineer's trial)
    with open("/dev/full", "w") as full:
        p = subprocess.run([NESTPLAN, "plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                            "--gpus", "8", "--json"], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.strip() == (
        "nestplan: error: cannot write the output: No space left on device")


def test_a_closed_stderr_leaves_the_exit_code_as_it_was(tmp_path):
    """A command whose stderr is a pipe its reader has closed (``2>&1 >/dev/null | true``) exits as
    it would have: 0 for an evaluation with notes, 2 for bad input, as a closed stdout leaves 0 (a
    user trial's notes had made it 1)."""
    import subprocess

    from console import NESTPLAN

    for args, code in ((["--model", "qwen3-30b-a3b", "--ep", "8"], 0), (["--model", "nope"], 2)):
        read, write = os.pipe()
        os.close(read)  # (the reader gone before the command writes)
        try:
            p = subprocess.run([NESTPLAN, *map(str, EVALUATE), *args], stdout=subprocess.DEVNULL,
                               stderr=write, timeout=60)
        finally:
            os.close(write)
        assert p.returncode == code, args
    # a note said before the output ends: every line on stderr goes through one writer that
    # takes a broken pipe (a sweep's note on a grid where nothing fits had raised it, and the
    # command had ended at exit 0 without its "wrote" line; a search's progress line so too)
    grid = tmp_path / "s.toml"
    grid.write_text('[sweep]\noutput = "s.csv"\n[grid]\nmodel = ["llama3-405b"]\n'
                    'cluster = ["dgx-h100-ndr"]\ngpus = [8]\nseq_len = [2048]\n'
                    'global_batch = [64]\n')
    read, write = os.pipe()
    os.close(read)
    try:
        p = subprocess.run([NESTPLAN, "sweep", "s.toml", "--workers", "1"], stdout=subprocess.PIPE,
                           stderr=write, text=True, timeout=60, cwd=tmp_path)
    finally:
        os.close(write)
    assert p.returncode == 0 and "1 infeasible" in p.stdout
    assert p.stdout.endswith("wrote s.csv, s.svg\n"), p.stdout
    # started with stderr closed (2>&-): the notes go nowhere, not after the JSON on stdout (a
    # review's: Python prints a line for a closed stderr to stdout)
    p = subprocess.run([NESTPLAN, *map(str, EVALUATE), "--model", "qwen3-30b-a3b", "--ep", "8",
                        "--json"], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: os.close(2))
    assert p.returncode == 0 and json.loads(p.stdout)["step_time_s"] > 0


def test_a_stack_that_cannot_mix_policies_refuses_per_stage_ones():
    assert one_line_error(*cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                               "--gpus", 8, "--stack", "torchtitan", "--pp", 2, "--recompute",
                               "none,full"),
                          "recompute: got 'none,full'; stack torchtitan applies one policy to "
                          "every stage")


def test_a_plan_file_may_list_per_stage_policies_as_one_string(tmp_path):
    path = tmp_path / "p.json"
    code, out, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                         "--gpus", 8, "--tp", 1, "--pp", 2, "--mbs", 1, "--global-batch", 8,
                         "--seq-len", 2048, "--recompute", "full,none", "--save", path)
    assert code == 0, err
    data = json.loads(path.read_text())
    data["plan"]["recompute"] = "full,none"
    path.write_text(json.dumps(data))
    code, out, err = cli("evaluate", "--plan", path, "--json")
    assert code == 0 and json.loads(out)["recompute"] == "full,none", err


def test_a_plan_file_without_a_pipeline_edited_to_one_takes_the_default_schedule(tmp_path):
    """Without a pipeline a plan file's schedule is null; edited to pp > 1, the file loads with
    the default schedule, as one without the key does."""
    path = tmp_path / "p.json"
    code, out, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                         "--gpus", 8, "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8,
                         "--seq-len", 2048, "--save", path)
    assert code == 0, err
    data = json.loads(path.read_text())
    assert data["plan"]["schedule"] is None
    data["plan"].update(pp=2, dp=4, recompute=["none", "none"], stage_layers=None)
    del data["stages"]  # (the saved stages: optional, checked against the plan when given)
    path.write_text(json.dumps(data))
    code, out, err = cli("evaluate", "--plan", path, "--json")
    assert code == 0 and json.loads(out)["schedule"] == "1f1b", err


def test_validate_works_anywhere_with_the_shipped_published_runs(tmp_path, shared):
    """``nestplan validate`` without --csv reads the published runs shipped inside the package,
    which must be the shared file itself (a copy that drifted would validate something else)."""
    from importlib import resources

    shipped = resources.files("nestplan").joinpath("data", "published_runs.csv").read_bytes()
    assert shipped == (shared / "data" / "published_runs.csv").read_bytes()
    code, out, err = cli("validate", "--json", cwd=tmp_path)
    assert code == 0, err
    assert json.loads(out)["count"] == 63


@pytest.mark.parametrize("flag", ["--model", "--cluster", "--stack"])
def test_a_file_error_names_the_path_as_typed(tmp_path, flag):
    """A relative path is echoed as the user typed it, ``./`` and all (``Path`` had normalised
    it away, so the message named a path the user had not written)."""
    (tmp_path / "bad.toml").write_text("garbage = \n")
    given = {"--model": "llama3-8b", "--cluster": "dgx-h100-ndr", "--stack": "megatron-core"}
    given[flag] = "./bad.toml"
    args = [a for k, v in given.items() for a in (k, v)]
    code, out, err = cli("evaluate", *args, "--gpus", 8, "--tp", 1, "--pp", 1, "--mbs", 1,
                         "--global-batch", 8, "--seq-len", 2048, cwd=tmp_path)
    assert one_line_error(code, out, err, "got './bad.toml'; not valid TOML"), err


def test_a_baseline_whose_policies_the_constraints_exclude_says_so():
    """phaze searches none and full only: asked for selective, it finds nothing and says why
    (exit 3), as compare's table does, instead of failing inside the search."""
    code, out, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                         "--method", "phaze", "--recompute", "selective")
    assert code == 3 and out == "" and "Traceback" not in err
    assert "phaze searches only the recompute policies none, full" in err


def test_a_global_batch_no_data_parallel_size_divides_is_named():
    """--tp 1 --pp 1 on 64 devices leaves data-parallel sizes 8 to 64 (CP up to 8): a global batch
    of 100 fits none, and the answer says so with a batch that would (a user trial was given every
    rule of the space instead)."""
    base = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 64,
            "--seq-len", 8192, "--tp", 1, "--pp", 1]
    code, out, err = cli(*base, "--global-batch", 100)
    assert code == 3 and out == "" and len(err.strip().splitlines()) == 1, err
    assert ("global batch 100 is a multiple of none of the data-parallel sizes they leave "
            "(8, 16, 32, 64): a multiple of 8, such as 96 or 104, would be") in err
    code, out, err = cli(*base, "--global-batch", 96)
    assert code == 0, err


def test_an_infeasible_search_with_json_prints_an_object_too():
    """Exit 3 with --json: the reason on stderr as always, and on stdout one object a script can
    read (no plan)."""
    code, out, err = cli("plan", "--model", "llama3-405b", "--cluster", "dgx-h100-ndr", "--gpus",
                         8, "--global-batch", 8, "--seq-len", 4096, "--json")
    assert code == 3 and "Traceback" not in err and "no feasible plan" in err
    js = json.loads(out)
    assert js["feasible"] is False and "short by" in js["reason"] and "more GPUs" in js["reason"]
    assert "less headroom" not in js["reason"]  # 779 GiB short: no headroom would close it


def test_moe_flags_on_a_dense_model_get_a_note():
    code, out, err = cli(*EVALUATE, "--model", "llama3-8b", "--moe-imbalance", 1.5,
                         "--moe-capacity-factor", 1.0)
    assert code == 0 and "Traceback" not in err
    assert ("nestplan: note: --moe-imbalance and --moe-capacity-factor: llama3-8b has no "
            "experts; ignored") in err


def test_compare_with_nothing_feasible_keeps_each_methods_reason_in_json():
    code, out, err = cli("compare", "--model", "llama3-405b", "--cluster", "dgx-h100-ndr",
                         "--gpus", 1, "--global-batch", 1, "--seq-len", 4096, "--json")
    js = json.loads(out)
    assert code == 3 and js["feasible"] is False and js["methods"] == []
    assert set(js["errors"]) >= {"nest", "manual", "phaze"} and "short by" in js["errors"]["nest"]


def test_a_plan_that_fits_hbm_but_not_the_headroom_is_told_of_the_headroom():
    """Every knob fixed, the one configuration fits 79.6 GiB of HBM but not with 6 % kept free:
    the reason names its shortfall (a cell of a few blocks fitting must not hide it) and the
    headroom as a way out; with no headroom it is the plan."""
    fixed = ["--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8, "--tp", 1, "--pp", 1,
             "--dp", 8, "--cp", 1, "--mbs", 1, "--zero", 1, "--recompute", "none",
             "--global-batch", 64, "--seq-len", 3584]
    code, out, err = cli("plan", *fixed, "--json")
    js = json.loads(out)
    assert code == 3 and "short by" in js["reason"] and "less headroom" in js["reason"], err
    code, out, err = cli("plan", *fixed, "--memory-headroom", 0, "--json")
    assert code == 0 and json.loads(out)["fits"], err


def test_gib_text_keeps_a_small_shortfall_visible():
    from nestplan.units import GiB, fmt_gib

    assert fmt_gib(0.03 * GiB) == "0.03" and fmt_gib(-0.03 * GiB) == "-0.03"
    assert fmt_gib(0.1 * GiB) == "0.1" and fmt_gib(779.34 * GiB) == "779.3"
    assert fmt_gib(0) == "0.0"


def test_a_peak_just_over_the_memory_does_not_print_as_equal_to_it():
    from nestplan.units import GiB, fmt_gib_against

    assert fmt_gib_against(79.63 * GiB, 79.6 * GiB) == ("79.63", "79.60")
    assert fmt_gib_against(60.0 * GiB, 79.6 * GiB) == ("60.0", "79.6")
    assert fmt_gib_against(79.6 * GiB, 79.6 * GiB) == ("79.6", "79.6")
    assert fmt_gib_against(79.601 * GiB, 79.6 * GiB) == ("79.601", "79.600")


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(gpus=0), "p.json: gpus"),
    (lambda d: d["cluster"]["levels"][0].update(size=0), "p.json: cluster.levels[nvlink].size"),
    (lambda d: d["training"].update(seq_len=-1), "p.json: training.seq_len"),
    (lambda d: d["plan"].update(tp=3), "p.json: dp"),
])
def test_every_error_in_a_plan_file_names_the_file(tmp_path, edit, field):
    path = tmp_path / "p.json"
    data = base_plan(tmp_path)
    edit(data)
    path.write_text(json.dumps(data))
    code, out, err = cli("evaluate", "--plan", "p.json", cwd=tmp_path)  # (named as typed)
    assert code == 2 and err.startswith(f"nestplan: error: {field}"), err


def test_only_an_oversubscription_is_told_how_to_write_a_ratio(tmp_path):
    """"2:1" as an oversubscription gets the number to write; the same text as a latency gets
    no such advice (a review: it had been given for any number)."""
    from nestplan.catalog import get_cluster
    from nestplan.errors import SpecError

    levels = ('[[levels]]\nname = "node"\nsize = 8\nbandwidth_GBps = 450\nlatency_us = {lat}\n'
              '[[levels]]\nname = "net"\nbandwidth_GBps = 50\nlatency_us = 10\n'
              'oversubscription = {over}\n')
    for i, (lat, over, ends) in enumerate((
            ("3", '"2:1"', "must be a number; write the ratio as one number, 2"),
            ('"1:30"', "1", "latency_us: got '1:30'; must be a number"))):
        path = tmp_path / f"c{i}.toml"
        path.write_text('name = "mine"\naccelerator = "h100-sxm-80gb"\n'
                        + levels.format(lat=lat, over=over))
        with pytest.raises(SpecError) as e:
            get_cluster(str(path))
        assert str(e.value).endswith(ends), e.value
