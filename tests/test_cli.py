"""The command line: output contracts, exit codes and one-line errors (no tracebacks)."""

import csv
import json
import os
import re
import subprocess
import sys

import pytest

from nestplan.cli import main

BASE = ["evaluate", "--model", "gpt3-175b", "--cluster", "selene-a100-hdr", "--gpus", "1024",
        "--tp", "8", "--pp", "8", "--mbs", "1", "--global-batch", "1536", "--seq-len", "2048"]


SAVE_8B = ("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8, "--tp",
           1, "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len", 2048, "--save")
"""A one-node Llama 3 8B plan saved to the path that follows (the plan-file tests' start)."""


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def swap(args, flag, value):
    out = list(args)
    if flag in out:
        i = out.index(flag)
        if value is None:
            del out[i:i + 2]
        else:
            out[i + 1] = value
    else:
        out += [flag, value]
    return out


def test_evaluate_json_is_one_object(capsys):
    code, out, err = run(BASE + ["--recompute", "full", "--json"], capsys)
    assert code == 0 and err == ""
    js = json.loads(out)
    assert js["tp"] == 8 and js["dp"] == 16 and js["fits"] is True


def test_evaluate_text_breakdown(capsys):
    code, out, _ = run(BASE + ["--recompute", "full"], capsys)
    assert code == 0
    for word in ("step time", "tokens/s", "MFU", "peak memory", "bubble", "optimizer", "weights",
                 "activations"):
        assert word in out


def test_the_gradient_groups_line_names_dp_cp_under_context_parallelism(capsys):
    """The dense gradients reduce over dp·cp ranks; the line says so (a user trial read
    "dp (128)" of a plan with dp 16)."""
    code, out, _ = run(BASE + ["--recompute", "full", "--cp", "2", "--dp", "8"], capsys)
    assert code == 0 and "dp·cp (16) " in out, out
    code, out, _ = run(BASE + ["--recompute", "full"], capsys)
    assert "dp (16) " in out and "dp·cp" not in out


def test_list(capsys):
    code, out, _ = run(["list", "clusters"], capsys)
    assert code == 0 and "nest-h100-spineleaf" in out.split()
    # an architect sees each cluster's levels: fan-out and bandwidth per device
    line = next(ln for ln in out.splitlines() if ln.startswith("dgx-h100-ndr "))
    assert "h100-sxm-80gb" in line and "nvlink x8 450 GB/s" in line and "leaf x32 50 GB/s" in line
    code, out, _ = run(["list", "accelerators"], capsys)
    assert "989.4 bf16 TFLOP/s" in next(ln for ln in out.splitlines()
                                        if ln.startswith("h100-sxm-80gb "))
    # a cluster's file says what its levels' sizes add up to (a trial's own file showed none)
    code, out, _ = run(["list", "clusters", "dgx-h100-ndr"], capsys)
    assert ("# devices under one block of each level: nvlink 8, leaf 256, spine 1,024, core any "
            "number") in out.splitlines()[:4]


def test_what_stands_behind_an_accelerator_and_a_models_size_are_shown(tmp_path):
    """Listing marks the accelerators no measured run stands behind, and a plan on one says so;
    a file that restates a catalog part's efficiencies keeps none of its runs; a model given as a
    file lists its size as the catalog's do (a new user's trial found neither, and MI300X's 192
    GiB read as 192e9 bytes)."""
    from console import cli

    code, out, _ = cli("list", "accelerators")
    bare = {ln.split()[0] for ln in out.splitlines() if "no measured run" in ln}
    assert code == 0 and bare == {"mi300x", "h200-sxm-141gb", "tpu-v4"}, out
    assert " 192.0 GiB at 5.30 TB/s" in next(ln for ln in out.splitlines()
                                            if ln.startswith("mi300x "))
    plan = ("evaluate", "--model", "llama3-8b", "--gpus", 8, "--tp", 1, "--pp", 1, "--mbs", 1,
            "--global-batch", 8, "--seq-len", 4096)
    said = "no measured training run stands behind its efficiencies"
    level = '[[levels]]\nname = "node"\nsize = 8\nbandwidth_GBps = 450\nlatency_us = 3\n'
    for accelerator, noted in (('"h100-sxm-80gb"', False), ('"mi300x"', True),
                               ('{ base = "h100-sxm-80gb", name = "mine", hbm_GiB = 40 }', False),
                               ('{ base = "h100-sxm-80gb", name = "mine", '
                                'attention_efficiency = [0.5, 0.4] }', True)):
        cluster = tmp_path / "c.toml"
        cluster.write_text(f'name = "c"\naccelerator = {accelerator}\n{level}')
        code, out, err = cli(*plan, "--cluster", cluster)
        assert code == 0, err
        assert (said in err) == noted, (accelerator, err)
    config = tmp_path / "mine.json"
    config.write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 5120,
        "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 8,
        "intermediate_size": 13824, "vocab_size": 128256, "max_position_embeddings": 8192,
        "rope_theta": 500000.0}))
    code, out, err = cli("list", "models", config)
    assert code == 0 and out.splitlines()[1] == "# 12.3B parameters", out


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "nestplan.cli", "list", "accelerators"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "h100-sxm-80gb" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (swap(BASE, "--model", "gpt-4"), "model: got 'gpt-4'; unknown model; catalog names"),
    (swap(BASE, "--cluster", "nowhere"), "cluster: got 'nowhere'; unknown cluster"),
    (swap(BASE, "--tp", "0"), "tp: got 0; must be an integer > 0"),
    (swap(BASE, "--tp", "-8"), "tp: got -8"),
    (swap(BASE, "--mbs", "0"), "mbs: got 0"),
    (swap(BASE, "--seq-len", "0"), "seq-len: got 0"),
    (swap(BASE, "--global-batch", "-1"), "global-batch: got -1"),
    (swap(BASE, "--gpus", "0"), "gpus: got 0"),
    (swap(BASE, "--tp", "7"), "tp·pp·cp = 7·8·1 = 56 must divide gpus = 1024"),
    (swap(swap(BASE, "--gpus", "1792"), "--tp", "7"), "tp: got 7; must divide heads = 96"),
    (swap(swap(swap(BASE, "--gpus", "1536"), "--tp", "192"), "--pp", "1"),
     "tp: got 192; must be <= heads = 96"),
    (swap(BASE, "--global-batch", "1000"), "global-batch: got 1000; must be a multiple of mbs·dp"),
    (swap(BASE, "--dp", "3"), "must equal gpus = 1024"),
    (swap(BASE, "--precision", "fp4"), "precision: got 'fp4'; allowed: bf16, fp8"),
    (swap(BASE, "--precision", "fp8"), "a100-sxm-80gb has no fp8"),
    (swap(BASE, "--recompute", "some"),
     "recompute: got 'some'; stack megatron-core offers none, selective, fine-grained, full"),
    (swap(BASE, "--zero", "4"), "zero: got 4; allowed: 0, 1, 2, 3"),
    (swap(BASE, "--ep", "2"), "ep: got 2; gpt3-175b has no experts"),
    (swap(BASE, "--etp", "3"), "etp: got 3; gpt3-175b has no experts; leave etp unset"),
    (swap(swap(swap(BASE, "--vp", "2"), "--global-batch", "1552"), "--stack", "megatron-2022"),
     "global-batch: got 1552; 97 micro-batches per replica (global_batch / (mbs·dp)); "
     "stack megatron-2022 runs interleaved-1f1b in rounds of pp = 8: their count must be a "
     "multiple of 8"),
    (swap(BASE, "--rank-order", "tp-dp-pp"), "rank-order: got 'tp-dp-pp'"),
    (swap(BASE, "--tp", "eight"), "argument --tp: got 'eight'; must be a whole number"),
])
def test_bad_input_exits_2_with_one_line(args, needle, capsys):
    code, out, err = run_exit(args, capsys)
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def run_exit(args, capsys):
    try:
        code = main(args)
    except SystemExit as e:  # argparse errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_moe_errors(capsys):
    moe = ["evaluate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ndr", "--gpus", "64",
           "--tp", "2", "--pp", "1", "--mbs", "1", "--global-batch", "64", "--seq-len", "4096",
           "--sp"]
    code, _, err = run_exit(moe + ["--ep", "3"], capsys)
    assert code == 2 and "ep: got 3" in err
    code, _, err = run_exit(moe + ["--ep", "16"], capsys)
    assert code == 2 and "ep: got 16; must divide the 8 experts of mixtral-8x7b" in err
    code, out, _ = run_exit(moe + ["--ep", "8", "--json"], capsys)
    assert code == 0 and json.loads(out)["ep"] == 8


def test_expert_parallelism_folds_over_tensor_parallel_ranks(capsys):
    """MoE parallel folding (Megatron-Core): EP 8 on 16 GPUs with TP 4 spans TP ranks (dp·cp is
    only 4); evaluate takes it, plan searches such grids, and an impossible fold is bad input."""
    base = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100-ndr", "--gpus", "16",
            "--global-batch", "64", "--seq-len", "4096"]
    fixed = ["--tp", "4", "--pp", "2", "--sp", "--mbs", "1", "--recompute", "full"]
    code, out, err = run_exit(["evaluate", *base, *fixed, "--ep", "8", "--etp", "1", "--json"],
                              capsys)
    js = json.loads(out)
    assert code == 0 and (js["tp"], js["dp"], js["ep"], js["etp"]) == (4, 2, 8, 1), err
    code, out, err = run_exit(["plan", *base, "--tp", "4", "--ep", "8", "--etp", "1", "--json",
                               "--top", "1"], capsys)
    js = json.loads(out)
    assert code == 0 and js["ep"] == 8 and js["dp"] * js["cp"] < 8, err
    code, _, err = run_exit(["evaluate", *base, *fixed, "--ep", "8", "--etp", "4"], capsys)
    assert code == 2 and "etp·ep = 4·8 must divide tp·cp·dp = 8" in err


def test_tp_must_divide_kv_heads(capsys):
    args = ["evaluate", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr", "--gpus", "48",
            "--tp", "6", "--pp", "1", "--mbs", "1", "--global-batch", "64", "--seq-len", "4096"]
    code, _, err = run_exit(args, capsys)
    assert code == 2 and "tp: got 6; must divide heads = 64" in err


def test_hf_config_path_as_model(shared, capsys):
    path = str(shared / "data" / "hf_configs" / "llama3-8b.json")
    code, out, _ = run(["evaluate", "--model", path, "--cluster", "dgx-h100-ndr", "--gpus", "8",
                        "--tp", "1", "--pp", "1", "--cp", "2", "--mbs", "1", "--global-batch", "8",
                        "--seq-len", "8192", "--zero", "1", "--precision", "fp8", "--json"], capsys)
    assert code == 0 and json.loads(out)["fits"] is True


def test_malformed_hf_config(tmp_path, capsys):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    code, _, err = run_exit(swap(BASE, "--model", str(p)), capsys)
    assert code == 2 and "not valid JSON" in err


def test_tp_must_divide_or_be_a_multiple_of_kv_heads(capsys):
    args = ["evaluate", "--model", "mixtral-8x22b", "--cluster", "dgx-h100-ndr", "--gpus", "96",
            "--tp", "12", "--pp", "1", "--mbs", "1", "--global-batch", "64", "--seq-len", "4096",
            "--sp"]
    code, _, err = run_exit(args, capsys)
    assert code == 2 and "tp: got 12; must divide kv_heads = 8 or be a multiple of it" in err


def test_unknown_accelerator_in_cluster_file(tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_text('name = "x"\naccelerator = "h900"\n[[levels]]\nname = "n"\nsize = 8\n'
                 'bandwidth_GBps = 450\nlatency_us = 2\n')
    code, _, err = run_exit(swap(BASE, "--cluster", str(p)), capsys)
    assert code == 2 and "accelerator: got 'h900'; unknown accelerator; catalog names" in err


def test_gpus_beyond_cluster_capacity(capsys):
    code, _, err = run_exit(swap(swap(BASE, "--gpus", "8192"), "--dp", "128"), capsys)
    assert code == 2 and "gpus: got 8192; cluster selene-a100-hdr holds at most 4480" in err


def test_validate_command(shared, capsys):
    code, out, _ = run(["validate", "--csv", str(shared / "data" / "published_runs.csv")], capsys)
    assert code == 0 and "mean |error|" in out and ": ok" in out


def test_validate_missing_file(capsys):
    code, _, err = run_exit(["validate", "--csv", "/nonexistent.csv"], capsys)
    assert code == 2 and "--csv: got '/nonexistent.csv'; no such file" in err


@pytest.mark.parametrize("changes, message", [
    ({"gpu": "A100-SXM4-40GB"}, "line 2 (nar21-t1-1p7b).gpu: got 'A100-SXM4-40GB'; known (any case): "),
    ({"tp": "two"}, ".tp: got 'two'; must be a whole number"),
    ({"metric": "tokens"}, ".metric: got 'tokens'; allowed: step_time, layer_fwd_bwd_time"),
    ({"stack": "jax"}, "(nar21-t1-1p7b): stack: got 'jax'; unknown stack; catalog names: composer"),
    ({"step_time_s": "-1"}, ".step_time_s: got '-1'; must be a number of seconds in [1e-06, 1e+07]"),
    ({"heads": "25"}, ".heads: got 25; must divide hidden = 2304"),
    ({"cluster": "nonesuch"}, "(nar21-t1-1p7b): cluster: got 'nonesuch'"),
    ({"cluster": "racks/mine.toml"}, "(nar21-t1-1p7b).cluster: got 'racks/mine.toml'; no such file"),
    ({"step_time_s": "inf"}, ".step_time_s: got 'inf'; must be a number of seconds in [1e-06, 1e+07]"),
    ({"sequence_parallel": "maybe"},
     ".sequence_parallel: got 'maybe'; allowed: yes, no (or true, false), or blank"),
    ({"dp": "3"}, "line 2 (nar21-t1-1p7b): dp: got 3"),
    ({"layers": "", "model": "configs/none.json"}, ".model: got 'configs/none.json'; no such file"),
    ({"etp": "2"}, "line 2 (nar21-t1-1p7b): etp: got 2; GPT-1.7B has no experts"),
])
def test_validate_rejects_a_malformed_row(runs_csv, capsys, changes, message):
    code, out, err = run_exit(["validate", "--csv", runs_csv(**changes)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and message in lines[0], err


def test_validate_says_when_a_row_is_ten_times_off(runs_csv):
    """A step time given in milliseconds shows -99.9 %; validate says what that likely is, as
    calibrate refuses such a row (a user trial's had no word)."""
    from console import cli

    path = runs_csv()
    with open(path) as f:
        row = next(csv.DictReader(f))
    code, out, err = cli("validate", "--csv", runs_csv(step_time_s=str(
        float(row["step_time_s"]) * 1000)))
    assert code == 1 and "-99.9%" in out
    assert "1 of 1 rows are predicted 10 or more times from their measurement" in err
    assert "step_time_s is seconds per step; check the units" in err
    code, out, err = cli("validate", "--csv", runs_csv())
    assert "10 or more times" not in err


def test_validate_names_missing_columns(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    path.write_text("id,model\nx,y\n")
    code, _, err = run_exit(["validate", "--csv", str(path)], capsys)
    assert code == 2 and ("columns: got 'id, model'; missing seq_len, num_gpus, metric, "
                          "step_time_s; every runs CSV has id, model") in err


def test_a_runs_file_without_a_needed_column_or_a_global_batch_says_so(tmp_path):
    """A runs file without a ``tp`` column is told so, not that a cell is blank; rows without a
    global batch are read as one micro-batch per replica, which a note now says (a torchtitan
    trial's file without the column was calibrated without a word)."""
    from console import cli, one_line_error

    path = tmp_path / "runs.csv"
    path.write_text("id,model,gpu,num_gpus,seq_len,global_batch,micro_batch,metric,step_time_s\n"
                    "mine,llama3-8b,H100,8,8192,64,1,step_time,4.0\n")
    assert one_line_error(*cli("validate", "--csv", path), "(mine).tp: got ''; must be given: "
                          "the file has no tp column")
    path.write_text("id,model,gpu,num_gpus,tp,seq_len,micro_batch,metric,step_time_s\n"
                    "a,llama3-8b,H100,8,1,8192,1,step_time,1.0\n"
                    "b,llama3-8b,H100,8,1,8192,1,step_time,1.0\n")
    code, _, err = cli("validate", "--csv", path)
    assert code in (0, 1), err
    assert ("runs.csv: rows a, b give no global_batch: each step read as one micro-batch per "
            "data-parallel replica (micro_batch x dp, no gradient accumulation)") in err
    path.write_text("id,model,gpu,num_gpus,tp,seq_len,global_batch,micro_batch,metric,"
                    "step_time_s\na,llama3-8b,H100,8,1,8192,8,1,step_time,1.0\n")
    code, _, err = cli("validate", "--csv", path)
    assert code in (0, 1) and "no global_batch" not in err, err


def test_validate_takes_a_csv_with_only_the_columns_its_rows_need(tmp_path, capsys):
    """A catalog model and a GPU need none of the shared files' size and bookkeeping columns."""
    path = tmp_path / "runs.csv"
    path.write_text("id,model,gpu,num_gpus,tp,seq_len,global_batch,micro_batch,metric,step_time_s\n"
                    "mine,llama3-8b,H100,8,1,8192,64,1,step_time,4.0\n")
    code, out, err = run_exit(["validate", "--csv", str(path), "--json"], capsys)
    assert code in (0, 1), err
    assert json.loads(out)["rows"][0]["id"] == "mine"



def test_validate_says_which_rows_it_read_on_the_default_stack(tmp_path):
    """A row that names no stack, whose source no catalog stack names either, is predicted on the
    default stack, and validate says so (a user's own CSV without a stack column); a row read as
    bf16 for want of a precision is not noted (the shipped runs leave it blank, see
    ``notes.runs.filled_in``), nor does --stack, which sets the rows' own stacks aside."""
    from console import cli

    head = "id,model,gpu,num_gpus,tp,seq_len,global_batch,micro_batch,metric,step_time_s,stack\n"
    path = tmp_path / "runs.csv"
    path.write_text(head + "mine,llama3-8b,H100,8,1,8192,64,1,step_time,4.0,\n"
                    "theirs,llama3-8b,H100,8,1,8192,64,1,step_time,4.0,torchtitan\n")
    code, out, err = cli("validate", "--csv", path)
    assert code in (0, 1), err
    assert ("1 row (mine) names no stack (a stack column) and no source a catalog stack names: "
            "read as run on megatron-core, the default") in err
    assert "theirs" not in err and "bf16" not in err
    code, out, err = cli("validate", "--csv", path, "--stack", "torchtitan")
    assert code in (0, 1) and "names no stack" not in err, err
    code, out, err = cli("validate")  # the shipped runs: every row's source names its stack
    assert code in (0, 1) and "no stack" not in err and "bf16" not in err, err


def test_validate_stack_leaves_out_the_rows_that_stack_cannot_run(tmp_path):
    """``validate --stack X`` asks how X predicts the rows: a row whose plan X cannot run (TP on
    DeepSpeed's stack, which has none) is left out with a note naming it and listed under
    ``set_aside`` by --json, not an error that ends the command; when X runs none of them, exit
    2 and one line. A row that is wrong on its own stack, by its plan or by a memory far beyond its
    devices, stays an error."""
    from console import cli, one_line_error

    head = "id,model,gpu,num_gpus,tp,seq_len,global_batch,micro_batch,metric,step_time_s,stack\n"
    path = tmp_path / "runs.csv"
    path.write_text(head + "tp1,llama3-8b,H100,8,1,8192,64,1,step_time,4.0,torchtitan\n"
                    "tp2,llama3-8b,H100,8,2,8192,64,1,step_time,4.0,megatron-core\n")
    code, out, err = cli("validate", "--csv", path, "--stack", "deepspeed", "--json")
    assert code in (0, 1), err
    got = json.loads(out)
    assert [r["id"] for r in got["rows"]] == ["tp1"] and got["count"] == 1
    assert [r["id"] for r in got["set_aside"]] == ["tp2"]
    assert "tensor parallelism" in got["set_aside"][0]["why"]
    assert "--stack deepspeed cannot run the plans of 1 of the 2 rows" in err
    assert "tp2 (tp: got 2; stack deepspeed has no tensor parallelism)" in err
    # rows refused alike are one reason, without the value where theirs differ, and without the
    # refusal's advice ("use tp = 1"), which a run that ran its plan cannot take
    path.write_text(head + "tp1,llama3-8b,H100,8,1,8192,64,1,step_time,4.0,torchtitan\n"
                    "tp2,llama3-8b,H100,8,2,8192,64,1,step_time,4.0,megatron-core\n"
                    "tp4,llama3-8b,H100,8,4,8192,64,1,step_time,4.0,megatron-core\n")
    code, out, err = cli("validate", "--csv", path, "--stack", "deepspeed", "--json")
    assert "tp2, tp4 (tp: stack deepspeed has no tensor parallelism)" in err, err
    assert [r["why"] for r in json.loads(out)["set_aside"]] == [
        f"tp: got {n}; stack deepspeed has no tensor parallelism" for n in (2, 4)]
    assert "use tp" not in err + out
    path.write_text(head + "tp2,llama3-8b,H100,8,2,8192,64,1,step_time,4.0,megatron-core\n")
    assert one_line_error(*cli("validate", "--csv", path, "--stack", "deepspeed"),
                          "--stack: got 'deepspeed'; runs none of the rows' plans (first: tp2: tp: got 2")
    # tp 2 on its own stack, DeepSpeed's, which has no TP: wrong there, whatever --stack refuses
    path.write_text(head + "own,llama3-8b,H100,8,2,8192,64,1,step_time,4.0,deepspeed\n")
    assert one_line_error(*cli("validate", "--csv", path, "--stack", "composer"),
                          "runs.csv line 2 (own): tp: got 2; stack deepspeed has no tensor "
                          "parallelism")
    # a plan that by far cannot fit under --stack (a stack file reserving 170 GiB) is left out;
    # one that cannot fit under its own stack either is refused as without --stack
    (tmp_path / "fat.toml").write_text('base = "megatron-core"\nname = "fat"\nreserved_GiB = 170\n')
    head = head.replace("\n", ",zero_stage,recompute\n")
    path.write_text(head + "ok,llama3-8b,H100,8,1,8192,64,1,step_time,4.0,megatron-core,1,full\n")
    assert one_line_error(*cli("validate", "--csv", path, "--stack", tmp_path / "fat.toml"),
                          "runs none of the rows' plans (first: ok: plan: got 't1 p1 d8 z1 full "
                          "b1'; needs 235.6 GiB")
    path.write_text(head + "big,llama3-70b,H100,8,1,8192,64,1,step_time,4.0,megatron-core,0,none\n")
    assert one_line_error(*cli("validate", "--csv", path, "--stack", tmp_path / "fat.toml"),
                          "row big: plan: got 't1 p1 d8 z0 none b1'; needs 1366.7 GiB on a device "
                          "of 79.6 GiB by this memory model on stack megatron-core")


def test_validate_fails_when_a_run_is_off(runs_csv, capsys):
    # the measured time halved: the prediction is twice it, far outside the tolerance
    half = str(float(runs_csv.row["step_time_s"]) / 2)
    code, out, _ = run(["validate", "--csv", runs_csv(step_time_s=half)], capsys)
    # (one row: its error is the mean too, so both are named)
    error = out.split("worst nar21-t1-1p7b ")[1].split()[0].lstrip("+")
    assert code == 1 and f"FAILED (1 row over, mean {error})" in out


def test_validate_knows_gpu_aliases_and_catalog_clusters(runs_csv, capsys):
    # the same run named with the catalog's spelling of its GPU, then with its cluster named
    for changes in ({"gpu": "A100-SXM-80GB"}, {"gpu": "", "cluster": "selene-a100-hdr"}):
        code, out, _ = run(["validate", "--csv", runs_csv(**changes)], capsys)
        assert code == 0 and "nar21-t1-1p7b" in out and ": ok" in out


def test_python_dash_m_runs_the_command():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "nestplan", "list", "stacks"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "megatron-core" in p.stdout, p.stderr


def test_block_ranges_read_as_people_write_them():
    from nestplan.textfmt import block_range

    assert [block_range(*r) for r in ((3, 8), (5, 6), (4, 4))] == ["3-7", "5", "none"]



@pytest.mark.parametrize("args", [
    ["plan", "--model", "llama3-8b", "--gpus", "8", "--tp", "3"],
    ["compare", "--model", "llama3-8b", "--gpus", "8", "--tp", "3"],
    ["plan", "--model", "deepseek-v3", "--gpus", "64", "--vp", "4"],  # the split rule
    ["plan", "--model", "llama3-8b", "--gpus", "8", "--pp", "4", "--vp", "2", "--schedule",
     "dualpipe", "--stack", "{stack}"],  # a schedule the search does not run
])
def test_plan_refuses_a_bad_flag_before_loading_the_search(args, tmp_path):
    """plan and compare check their flags before the search and its numerical libraries load:
    a mistake costs an interpreter's start, not numpy's import (the bad-input campaign runs
    hundreds of them)."""
    stack = tmp_path / "dualpipe.toml"
    stack.write_text('base = "torchtitan"\nname = "dp"\nschedules = ["1f1b", "dualpipe"]\n')
    argv = [a.format(stack=stack) for a in args] + ["--cluster", "dgx-h100-ndr"]
    code = (f"import sys\nfrom nestplan.cli import main\nrc = main({argv!r})\n"
            "print(rc, 'numpy' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["2", "False"], (p.stdout, p.stderr)


def test_a_closed_standard_output_is_one_line_not_a_traceback():
    """Started with its standard output closed (``nestplan list stacks >&-``): nothing can be
    written, which it says in one line (exit 1: the environment, not the input)."""
    import os
    import subprocess

    from console import NESTPLAN

    r = subprocess.run([NESTPLAN, "list", "stacks"], stdout=None, stderr=subprocess.PIPE,
                       text=True, preexec_fn=lambda: os.close(1), timeout=60)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "nestplan: error: cannot write the output: standard output is closed"], r.stderr


def test_a_saved_plan_is_evaluated_on_another_cluster(tmp_path):
    """``evaluate --plan P --cluster C``: the saved plan on another cluster, as its flags would
    give it there (an architect's comparison of fabrics); other plan flags stay refused."""
    from console import cli

    flags = ["--model", "llama3-70b", "--gpus", 256, "--tp", 8, "--pp", 4, "--mbs", 1,
             "--global-batch", 512, "--seq-len", 4096, "--json"]
    path = tmp_path / "p.json"
    code, out, err = cli("evaluate", "--cluster", "dgx-h100-ndr", *flags, "--save", path)
    assert code == 0, err
    code, moved, err = cli("evaluate", "--plan", path, "--cluster", "nest-h100-spineleaf",
                           "--json")
    assert code == 0, err
    code, direct, err = cli("evaluate", "--cluster", "nest-h100-spineleaf", *flags)
    assert code == 0, err
    assert json.loads(moved)["step_time_s"] == json.loads(direct)["step_time_s"]
    assert json.loads(moved)["step_time_s"] != json.loads(out)["step_time_s"]
    code, _, err = cli("evaluate", "--plan", path, "--cluster", "dgx-h100-ndr", "--tp", 4)
    assert code == 2 and "drop --tp" in err


def test_a_compared_plan_moved_to_another_cluster_drops_the_comparison(tmp_path):
    """``compare --save`` keeps every method's figures in the plan file; evaluated again as saved
    they stay; moved to another cluster (``--cluster``) or margin (``--memory-headroom``) they are
    dropped: they were not found there."""
    from console import cli

    saved, same, moved = (tmp_path / f"{n}.json" for n in ("saved", "same", "moved"))
    code, _, err = cli("compare", "--model", "llama2-7b", "--cluster", "dgx-h100-ndr", "--gpus", 16,
                       "--global-batch", 64, "--save", saved)
    assert code == 0, err
    assert "comparison" in json.loads(saved.read_text())
    assert cli("evaluate", "--plan", saved, "--save", same)[0] == 0
    assert json.loads(same.read_text())["comparison"] == json.loads(saved.read_text())["comparison"]
    code, _, err = cli("evaluate", "--plan", saved, "--cluster", "nest-h100-spineleaf", "--save",
                       moved)
    assert code == 0 and "comparison" not in json.loads(moved.read_text())
    assert "are not saved: their results are for its cluster" in err  # (without a word, before)
    # nor is it found by the search there: the report had said "found by nest" (a trial's)
    assert json.loads(saved.read_text())["method"] == "nest"
    assert "method" not in json.loads(moved.read_text())
    assert "searched on dgx-h100-ndr and is only evaluated on nest-h100-spineleaf" in err
    code, _, err = cli("evaluate", "--plan", saved, "--memory-headroom", 20, "--save", moved)
    assert code == 0 and "comparison" not in json.loads(moved.read_text())  # (fits moved too)
    assert "their results are for its memory headroom" in err
    assert json.loads(moved.read_text())["method"] == "nest"  # (the cluster it was found on)
    # its own cluster named again moves nothing: they stay (they had been dropped)
    assert cli("evaluate", "--plan", saved, "--cluster", "dgx-h100-ndr", "--save", same)[0] == 0
    assert json.loads(same.read_text())["comparison"] == json.loads(saved.read_text())["comparison"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads Linux's /proc")
@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupted_compare_stops_its_searches_and_says_so(sig, code):
    """Ctrl-C (to the whole process group, as a terminal sends it) or SIGTERM (to nestplan only)
    while compare's methods run side by side: one line last, after the notes the command had
    made, the shell's code, and no search left running (a Ctrl-C had printed a traceback)."""
    import signal
    import time

    from console import NESTPLAN
    from nestplan.processes import cores
    from procs import children, running

    if NESTPLAN is None:
        pytest.skip("the nestplan console script is not installed")
    if cores() < 2:
        pytest.skip("compare runs its methods side by side only on two cores or more")
    p = subprocess.Popen([NESTPLAN, "compare", "--model", "qwen3-235b-a22b", "--cluster",
                          "dgx-h100-ndr", "--gpus", "512"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (workers := children(p.pid)) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert workers, "compare started no worker"
        time.sleep(0.5)  # the workers are searching
        workers = children(p.pid)  # all of them by now, not only the first to start
        if sig == "SIGINT":
            os.killpg(p.pid, signal.SIGINT)
        else:
            os.kill(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=5)  # well before any search would finish by itself
        left = [w for w in workers if running(w)]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert (p.returncode, out) == (code, "")
    *noted, last = err.splitlines()  # its notes of the scenario (the defaults it took), then
    assert last == "nestplan: interrupted"  # the one line of how it ended
    assert noted and all(line.startswith("nestplan: note: ") for line in noted), err
    assert not left


def test_selective_recomputation_that_keeps_more_than_none_is_noted():
    """Megatron's selective (core_attn) under flash attention keeps the fused QKV output alive
    and drops no score matrix: evaluate says it keeps more than none (a user from Megatron
    expects it to save memory); a policy that does save says nothing."""
    from console import cli

    flags = ["evaluate", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr", "--gpus", 64, "--tp",
             8, "--pp", 4, "--mbs", 1, "--global-batch", 1024, "--seq-len", 8192, "--json"]
    code, out, err = cli(*flags, "--recompute", "selective")
    _, bare, _ = cli(*flags, "--recompute", "none")
    assert code == 0 and json.loads(out)["peak_memory_gib"] > json.loads(bare)["peak_memory_gib"]
    assert "recompute selective keeps more memory than none" in err and "fused QKV" in err, err
    assert json.loads(out)["step_time_s"] > json.loads(bare)["step_time_s"]
    assert "and costs time" in err
    code, _, err = cli(*flags, "--recompute", "fine-grained")
    assert code == 0 and "keeps more memory" not in err, err
    # recomputing on a stage with slack can shorten the step (its longer backward hides more of
    # its gradient sync): the note says by how little, where it had said "costs time" (a
    # hardware trial's 405B plan)
    flags = ["evaluate", "--model", "llama3-405b", "--cluster", "dgx-b300-xdr", "--gpus", 1152,
             "--tp", 2, "--pp", 9, "--cp", 4, "--vp", 7, "--mbs", 1, "--global-batch", 1024,
             "--seq-len", 8192, "--precision", "fp8", "--json"]
    code, out, err = cli(*flags, "--recompute", "selective,none*8")
    _, bare, _ = cli(*flags, "--recompute", "none")
    assert code == 0 and json.loads(out)["step_time_s"] < json.loads(bare)["step_time_s"]
    assert "keeps more memory than none, and saves only " in err and "costs time" not in err, err


def test_the_moe_workload_settings_are_printed_with_the_plan(capsys):
    """--moe-imbalance, --moe-capacity-factor and the MTP depths change the prediction, so the
    text header and the JSON say them (a user could not reproduce a printed step without)."""
    args = ["evaluate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-ndr", "--gpus", "16",
            "--tp", "1", "--pp", "2", "--ep", "8", "--mbs", "1", "--global-batch", "128",
            "--seq-len", "4096", "--moe-imbalance", "1.5", "--moe-capacity-factor", "1.25"]
    code, out, _ = run(args, capsys)
    assert code == 0 and "MoE imbalance 1.5, capacity factor 1.25" in out.splitlines()[0]
    code, out, _ = run([*args, "--json"], capsys)
    js = json.loads(out)
    assert (js["moe_imbalance"], js["moe_capacity_factor"], js["mtp_layers"]) == (1.5, 1.25, 0)
    code, out, _ = run(["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus",
                        "8", "--tp", "1", "--pp", "1", "--mbs", "1", "--global-batch", "64",
                        "--seq-len", "4096", "--mtp-layers", "1", "--json"], capsys)
    js = json.loads(out)
    assert js["moe_imbalance"] is None and js["mtp_layers"] == 1


def test_a_pipeline_the_micro_batches_keep_from_interleaving_is_said(capsys):
    """16 micro-batches over pp 3 are no whole number of torch's 5 rounds: plan says why its
    compiled-torchtitan plan (whose only interleaved schedule is looped) does not interleave (a
    user trial saw fewer GPUs train faster without a word); 18 can, and get no note
    (micro-batches of one sequence: with two, 8 per replica run in 2 rounds of 4; Megatron-Core
    runs 16 in 4 rounds of 4)."""
    plan = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", "24", "--tp",
            "8", "--pp", "3", "--mbs", "1", "--seq-len", "4096", "--stack", "torchtitan-compile",
            "--global-batch"]
    code, out, err = run(plan + ["16"], capsys)
    assert code == 0 and "vp=1" in out
    assert ("no interleaving: interleaved-1f1b cannot run this plan's 16 micro-batches per "
            "replica (stack torchtitan-compile runs interleaved-1f1b in max(1, m // pp) rounds "
            "(pp = 3), of which m must be a multiple: 16 makes 5; the nearest counts it runs are "
            "15 and 18)") in err
    code, out, err = run(plan + ["18"], capsys)
    assert code == 0 and "no interleaving" not in err


def test_a_step_mostly_host_time_is_said(capsys):
    """BERT-large on 4,096 GPUs, one short sequence each: the stack's per-step host time is
    most of the step, and a note says the GPUs have little work (a user trial saw MFU 0.5 %
    without a word); a plan with work enough gets none."""
    idle = ["evaluate", "--model", "bert-large", "--cluster", "dgx-h100-ndr", "--gpus", "4096",
            "--tp", "1", "--pp", "1", "--mbs", "1", "--global-batch", "4096", "--seq-len", "512",
            "--json"]
    code, out, err = run(idle, capsys)
    js = json.loads(out)
    share = js["time_s"]["step_host"] / js["step_time_s"]
    assert code == 0 and share > 0.5
    assert f"{share:.0%} of the step is per-step host time" in err and "4,096 GPUs" in err
    code, out, err = run(BASE, capsys)
    assert code == 0 and "host time" not in err


def test_a_plan_files_edited_catalog_entries_say_so(tmp_path):
    """A plan file's model or accelerator edited by hand under its catalog name is costed with
    its own values, and a note says that outputs label them with the catalog's name (an
    accelerator of 5,000 TFLOP/s labelled h100-sxm-80gb had been costed without a word); an
    unedited file says nothing."""
    from console import cli

    saved = tmp_path / "p.json"
    assert cli(*SAVE_8B, saved)[0] == 0
    assert "note" not in cli("evaluate", "--plan", saved)[2]
    data = json.loads(saved.read_text())
    # a file saved before compute_capability existed is the catalog's accelerator still
    older = tmp_path / "older.json"
    del data["cluster"]["accelerator"]["compute_capability"]
    older.write_text(json.dumps(data))
    assert "note" not in cli("evaluate", "--plan", older)[2]
    data = json.loads(saved.read_text())
    data["cluster"]["accelerator"]["peak_tflops_bf16"] *= 5
    data["cluster"]["accelerator"]["peak_tflops_fp8"] *= 5  # (fp8's below bf16's is refused)
    data["model"]["ffn_hidden"] = 12288
    saved.write_text(json.dumps(data))
    code, out, err = cli("evaluate", "--plan", saved)
    assert code == 0 and "h100-sxm-80gb" in out
    for kind, name, key in (("model", "llama3-8b", "ffn_hidden"),
                            ("accelerator", "h100-sxm-80gb", "peak_tflops_bf16, peak_tflops_fp8")):
        assert (f"the plan file's {kind} is named {name} but is not this nestplan's catalog "
                f"{name} (it differs in {key}): its own values are used") in err, err
    # another catalog accelerator in a catalog cluster; not the MTP depths the command set
    data = json.loads(saved.read_text())
    data["model"]["ffn_hidden"] = 14336
    data["cluster"]["accelerator"] = "h200-sxm-141gb"
    saved.write_text(json.dumps(data))
    err = cli("evaluate", "--plan", saved)[2]
    assert "the plan file's cluster is named dgx-h100-ndr" in err and "in accelerator)" in err
    assert "the plan file's model" not in err
    assert "predicted.step_time_s" in err  # (edited: its saved prediction is another cluster's)
    assert cli("evaluate", "--model", "deepseek-v3", "--cluster", "dgx-h100-ndr", "--gpus", 1024,
               "--tp", 1, "--pp", 16, "--ep", 64, "--mbs", 1, "--global-batch", 4096,
               "--seq-len", 4096, "--mtp-layers", 0, "--save", saved)[0] == 0
    assert "is not this nestplan's catalog" not in cli("evaluate", "--plan", saved)[2]


def test_expert_loads_on_a_dense_model_say_they_are_ignored(tmp_path):
    """A dense model's plan file stating an expert load, and a sweep varying one over a dense
    model, say that the load changes nothing there (as evaluate says of --moe-imbalance)."""
    from console import cli

    saved = tmp_path / "p.json"
    assert cli(*SAVE_8B, saved)[0] == 0
    data = json.loads(saved.read_text())
    data["training"]["moe_imbalance"] = 2.0
    saved.write_text(json.dumps(data))
    code, out, err = cli("evaluate", "--plan", saved)
    assert code == 0 and "training.moe_imbalance = 2.0: llama3-8b has no experts; ignored" in err
    grid = tmp_path / "s.toml"
    grid.write_text('[grid]\nmodel = ["llama3-8b"]\ncluster = ["dgx-h100-ndr"]\ngpus = [8]\n'
                    "moe_imbalance = [1.0, 1.5]\n")
    code, out, err = cli("sweep", grid, "--dry-run")
    assert code == 0 and "grid.moe_imbalance: no model of the grid has experts" in err
    grid.write_text(grid.read_text().replace('["llama3-8b"]', '["llama3-8b", "mixtral-8x7b"]'))
    err = cli("sweep", grid, "--dry-run")[2]
    assert "no model of the grid" not in err  # one of them has: its points differ
    # a user trial's: the dense model's points had repeated each other without a word
    assert ("grid.moe_imbalance: llama3-8b has no experts, so its values change nothing there "
            "and the points of that model repeat each other") in err
    grid.write_text(grid.read_text().replace('["llama3-8b", "mixtral-8x7b"]', '["mixtral-8x7b"]'))
    assert "no experts" not in cli("sweep", grid, "--dry-run")[2]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="counts threads in /proc")
@pytest.mark.parametrize("given, threads", [(None, 1), ("2", 2)])
def test_the_command_line_keeps_blas_to_one_thread_unless_told(given, threads):
    """The command line sets ``OPENBLAS_NUM_THREADS`` before numpy loads (a thread per core cost a
    fifth of a short command's CPU), so an evaluation's process runs one thread, and leaves a
    value the user gave (two threads there); a caller of ``main(argv)`` keeps its own
    environment."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    probe = ("import contextlib, io, os, sys\n"
             "from nestplan.cli import main\n"
             "main(['list', 'models'])\n"
             "inside = os.environ.get('OPENBLAS_NUM_THREADS')\n"
             "sys.argv = ['nestplan', 'evaluate', '--model', 'llama3-8b', '--cluster',\n"
             "            'dgx-h100-ndr', '--gpus', '8', '--tp', '1', '--pp', '1', '--mbs', '1',\n"
             "            '--global-batch', '8', '--seq-len', '2048']\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    main()\n"
             "status = open('/proc/self/status').read().split('Threads:')[1].split()[0]\n"
             "print('numpy' in sys.modules, inside, status, file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr.split()[-3:] == ["True", str(given), str(threads)], p.stderr


def test_an_edited_dense_plan_file_names_the_knob_edited(tmp_path):
    """A dense model's plan file holds etp (as tp); edited to another tp, the file was refused
    naming etp ("leave etp unset", a field nestplan itself wrote) rather than the tp the stack
    cannot run (a user trial's). And a stack without experts names every catalog stack with
    them (deepspeed had been left out of the list)."""
    from console import cli, one_line_error

    saved = tmp_path / "p.json"
    assert cli(*SAVE_8B[:-1], "--stack", "deepspeed", "--save", saved)[0] == 0
    data = json.loads(saved.read_text())
    assert data["plan"]["etp"] == 1
    data["plan"].update(tp=2, dp=4)
    saved.write_text(json.dumps(data))
    assert one_line_error(*cli("evaluate", "--plan", saved),
                          "tp: got 2; stack deepspeed has no tensor parallelism")
    assert one_line_error(*cli("evaluate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ndr",
                               "--gpus", 64, "--mbs", 1, "--global-batch", 1024, "--seq-len",
                               4096, "--stack", "megatron-deepspeed", "--tp", 2, "--pp", 2),
                          "use a stack that does (composer, composer-pure, deepspeed, megatron-core")


def test_a_plan_file_whose_saved_prediction_differs_says_so(tmp_path):
    """A saved prediction that is not this release's (edited, or an older release's) had been
    replaced by this one's without a word (the report showed both, unexplained)."""
    from console import cli

    saved = tmp_path / "p.json"
    assert cli(*SAVE_8B, saved)[0] == 0
    assert "predicted.step_time_s" not in cli("evaluate", "--plan", saved)[2]
    data = json.loads(saved.read_text())
    data["predicted"]["step_time_s"] = 1.0
    saved.write_text(json.dumps(data))
    code, out, err = cli("evaluate", "--plan", saved)
    assert code == 0 and "predicted.step_time_s: 1 s when saved" in err and "edited" in err
    assert code == 0 and "another release" not in err
    # a difference beyond four digits is shown with as many as tell the two apart (a user
    # trial's edit read "63.54 s when saved, 63.54 s now")
    step = json.loads(cli("evaluate", "--plan", saved, "--json")[1])["step_time_s"]
    data["predicted"]["step_time_s"] = step * (1 + 3e-5)
    saved.write_text(json.dumps(data))
    said = re.search(r"step_time_s: ([\d.]+) s when saved, ([\d.]+) s now", cli(
        "evaluate", "--plan", saved)[2])
    assert said and said[1] != said[2], said


def test_a_global_batch_far_beyond_any_published_runs_is_noted():
    """A global batch of billions of tokens is likely tokens given as sequences (a DeepSpeed
    user's trial planned a 17-hour step without a word); DeepSeek-V3's 63M tokens is not noted."""
    from console import cli

    plan = ("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 64, "--tp",
            1, "--pp", 1, "--mbs", 1, "--seq-len", 4096, "--global-batch")
    code, _, err = cli(*plan, 4194304)
    assert code == 0 and ("--global-batch 4,194,304 sequences of 4,096 tokens is 17.2 billion "
                          "tokens a step") in err and "this one would be 1,024 sequences" in err
    code, _, err = cli(*plan, 15360)
    assert code == 0 and "--global-batch" not in err, err
    # the default batch at a long sequence: said as the default (a review's: it had read as the
    # user's, with advice of 1 sequences)
    code, _, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-b200-ndr", "--gpus", 64,
                       "--seq-len", 1048576)
    assert code == 0 and ("the default --global-batch of 1,024 sequences of 1,048,576 tokens is "
                          "1.1 billion tokens a step") in err and "would be" not in err, err


def test_the_json_names_the_peak_mfu_is_over():
    """MFU and HFU are over the peak of the plan's matmul precision: the JSON gives it, since a
    sweep over precisions had mixed the bf16 and fp8 peaks in one column unsaid (a user trial)."""
    from console import cli

    base = ("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8, "--tp", 1,
            "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len", 4096, "--json")
    for precision, peak in (("bf16", 989.4), ("fp8", 1978.9)):
        code, out, err = cli(*base, "--precision", precision)
        js = json.loads(out)
        assert code == 0 and js["mfu_peak_tflops"] == pytest.approx(peak), err
        assert js["mfu"] == pytest.approx(js["model_tflops_per_gpu"] / peak)


def test_a_plan_file_from_before_trained_context_is_still_the_catalogs_model(tmp_path):
    """A catalog model's trained context (a RoPE model's max_position_embeddings, kept since
    2026-12-06) costs nothing: a plan file saved before it existed, whose model lacks it, is not
    told its model differs from the catalog's."""
    from console import cli

    saved = tmp_path / "p.json"
    code, _, err = cli("evaluate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-ndr",
                       "--gpus", 16, "--tp", 1, "--pp", 1, "--ep", 8, "--mbs", 1,
                       "--global-batch", 16, "--seq-len", 4096, "--save", saved)
    assert code == 0, err
    data = json.loads(saved.read_text())
    assert data["model"].pop("trained_context") == 40960
    saved.write_text(json.dumps(data))
    code, _, err = cli("evaluate", "--plan", saved)
    assert code == 0 and "not this nestplan's catalog" not in err, err


def test_outputs_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """Plan files, exports, reports and sweep plots are written beside their path and renamed
    over it (``loaders.write_text_atomic``): a write that fails leaves the old file and no
    stray one (a pipeline engineer's trial found them written in place, a killed command
    leaving half a file); a link is followed, the file it names replaced and the link kept."""
    import os

    from nestplan import loaders

    path = tmp_path / "plan.json"
    path.write_text("old")
    real = os.replace

    def failing(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError):
        loaders.write_text_atomic(path, "new")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    monkeypatch.setattr(os, "replace", real)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    path.chmod(0o600)  # (its mode kept: a review's file had come back 0644)
    loaders.write_text_atomic(link, "new")
    assert link.is_symlink() and path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "plan.json"]
    # what is no regular file is written in place, not replaced (a review's /dev/null had been)
    import stat
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    read = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_text()))
    reader.start()
    loaders.write_text_atomic(fifo, "through")
    reader.join(timeout=10)
    assert read == ["through"] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_export_to_dash_prints_and_writes_no_file(tmp_path):
    """``export -o -`` prints the launch configuration, as without -o, and writes no file named
    "-" (a pipeline engineer's trial got one)."""
    from console import cli

    plan = tmp_path / "p.json"
    code, _, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                       "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len", 4096,
                       "--save", plan)
    assert code == 0, err
    plain = cli("export", plan, "--format", "megatron", cwd=tmp_path)
    dash = cli("export", plan, "--format", "megatron", "-o", "-", cwd=tmp_path)
    assert dash == plain and plain[0] == 0 and plain[1].startswith("# nestplan export")
    assert not (tmp_path / "-").exists()


def test_written_files_are_named_on_stderr_with_the_prefix(tmp_path):
    """What ``export -o`` wrote is said on stderr as every other line nestplan writes there
    (``nestplan: ...``), so a pipeline that reads the prefix sees it (a pipeline engineer's trial:
    a bare "wrote" line among prefixed notes)."""
    from console import cli

    plan = tmp_path / "p.json"
    code, _, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                       "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len", 4096,
                       "--save", plan)
    assert code == 0, err
    code, out, err = cli("export", plan, "--format", "megatron", "-o", tmp_path / "run.args")
    assert code == 0 and out == "" and (tmp_path / "run.args").is_file()
    assert [ln for ln in err.splitlines() if "wrote" in ln] == [
        f"nestplan: wrote {tmp_path / 'run.args'}"]


def test_save_refuses_the_stream_the_results_go_to(tmp_path):
    """--save /dev/stdout with stdout sent to a file had renamed the plan file over it, the results
    gone and exit 0; on a pipe it said "no such file" (a fuzzing trial). Now refused before the
    work, exit 2, as is standard error; /dev/null, where nothing is lost, is taken."""
    from console import NESTPLAN

    flags = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", "8",
             "--tp", "2", "--pp", "1", "--mbs", "1", "--global-batch", "64", "--seq-len", "4096"]
    out = tmp_path / "out.txt"
    for stream in ("/dev/stdout", "/dev/stderr"):
        with open(out, "w") as f:  # (the stream named sent to the file, the other piped)
            own = stream == "/dev/stdout"
            p = subprocess.run([NESTPLAN, *flags, "--save", stream],
                               stdout=f if own else subprocess.PIPE,
                               stderr=subprocess.PIPE if own else f, text=True, timeout=120)
        assert p.returncode == 2
        err = out.read_text() if stream == "/dev/stderr" else p.stderr
        name = "standard output" if stream == "/dev/stdout" else "standard error"
        assert f"--save: got '{stream}'; is {name}, where the results go" in err, err
    p = subprocess.run(f"{NESTPLAN} {' '.join(flags)} --save /dev/stdout | cat", shell=True,
                       capture_output=True, text=True, timeout=120)
    assert "is standard output, where the results go" in p.stderr, p.stderr
    p = subprocess.run([NESTPLAN, *flags, "--save", "/dev/null"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_evaluate_of_a_plan_file_says_what_its_flags_say_of_the_sequence(tmp_path):
    """A RoPE model beyond the context it was built for is noted by evaluate of the plan's flags
    and by evaluate --plan alike (a long-context trial's plan file had lost the note)."""
    from console import cli

    plan = tmp_path / "p.json"
    code, _, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus",
                       64, "--tp", 1, "--pp", 1, "--cp", 16, "--mbs", 1, "--global-batch", 4,
                       "--seq-len", 131072, "--recompute", "full", "--save", plan)
    assert code == 0 and "llama3-8b was built for 8,192 tokens" in err, err
    code, _, again = cli("evaluate", "--plan", plan)
    assert code == 0
    said = [line for line in err.splitlines() if "was built for" in line]
    assert said and said == [line for line in again.splitlines() if "was built for" in line]
