"""Training stacks: the catalog, stack files, plans a stack can run, calibration, FSDP runs."""

import csv
import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from nestplan import graph as G
from nestplan.catalog import get_accelerator, get_stack, list_names
from nestplan.errors import SpecError
from nestplan.evaluate import evaluate, layer_graph, scenario_from_names
from nestplan.loaders import later_keys_filled, stack_from_table, stack_to_table
from nestplan.specs import Parallelism, check_plan
from nestplan.validation import hbm_ratios, load_cases, run, table

from console import cli, flags, one_line_error

DATA = Path(__file__).parent / "data"
NO_SIZES = dict.fromkeys(("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab"), "")
ISSUE_STACKS = ("megatron-core", "nemo", "megatron-2021", "megatron-2022", "megatron-deepspeed",
                "deepspeed", "torchtitan", "composer")


def test_catalog_has_every_stack_and_each_round_trips():
    names = list_names("stacks")
    assert set(ISSUE_STACKS) <= set(names)
    for name in names:
        st = get_stack(name)
        assert st.name == name and st.description
        assert stack_from_table(stack_to_table(st)) == st


def test_bases_carry_over_and_overrides_win():
    core, nemo, old = get_stack("megatron-core"), get_stack("nemo"), get_stack("megatron-2021")
    assert nemo.grad_bytes == 2 and core.grad_bytes == 4
    assert nemo.zero_stages == core.zero_stages and nemo.export_format == "megatron"
    assert old.attention.value == "materialized" and old.zero_stages == (0,)
    assert get_stack("megatron-2022").tp_overlap.value == "backward"


def test_a_variant_under_a_calibration_is_a_file_based_on_the_calibrated_one(tmp_path):
    """``calibrated_as`` gives a variant stack (behaviour set, calibration inherited) the
    calibration of a calibrated stack: the same stack as a variant file whose base is the
    calibrated file that ``nestplan calibrate`` writes."""
    import dataclasses

    from nestplan.tomlfmt import dumps

    from nestplan.calibrate import PARAMETERS, _apply
    from nestplan.stack import CALIBRATION

    nemo = get_stack("nemo")
    # every field calibrate may fit is part of a stack's calibration
    fitted = _apply(nemo, PARAMETERS, [0.1] * len(PARAMETERS))
    changed = {f.name for f in dataclasses.fields(nemo)
               if getattr(fitted, f.name) != getattr(nemo, f.name)}
    assert changed and changed <= set(CALIBRATION) and "allocator_overhead" in CALIBRATION
    calibrated = replace(nemo, name="mine", matmul_scale=0.8, attention_scale=0.9,
                         memory_scale=0.7, network_scale=(0.9, 0.8), kernel_overhead=2e-6,
                         moe_layer_host=0.004, attention_host_share=0.3,
                         overlap_efficiency=0.6, step_overhead=0.1,
                         allocator_overhead=0.07, fitted_on=("run-1",),
                         fitted_seq_len=(4096, 8192), fitted_accelerators=("h100-sxm-80gb",),
                         fitted_gpus=(8, 64), fitted_kinds=("dense",))
    assert all(getattr(calibrated, f) != getattr(nemo, f) for f in CALIBRATION)
    (tmp_path / "mine.toml").write_text(dumps({"base": "nemo", **{
        k: v for k, v in stack_to_table(calibrated).items()
        if v != stack_to_table(nemo).get(k) or k in ("name", "fitted_on")}}))
    variant_text = ('name = "v"\nmoe_dispatcher = "flex"\nmoe_overlap = "batch"\n'
                    'recompute = ["none", "selective"]\n')
    (tmp_path / "v.toml").write_text('base = "nemo"\n' + variant_text)
    (tmp_path / "v-mine.toml").write_text('base = "mine.toml"\n' + variant_text)
    variant = get_stack(str(tmp_path / "v.toml"))
    assert variant.matmul_scale == nemo.matmul_scale  # a variant shares its base's calibration
    assert variant.calibrated_as(calibrated) == get_stack(str(tmp_path / "v-mine.toml"))
    assert variant.calibrated_as(calibrated).moe_dispatcher == "flex"


def test_a_stack_refuses_plans_it_cannot_run():
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=64,
                             stack="torchtitan")
    with pytest.raises(SpecError, match="zero: got 1; stack torchtitan runs ZeRO stages 0, 2, 3"):
        evaluate(sc, Parallelism(dp=8, zero=1))
    # torchtitan shards over the CP ranks whenever cp > 1: a ZeRO-0 plan with CP is none it runs,
    # and its search offers none (a user trial's best torchtitan plan had been one)
    with pytest.raises(SpecError, match="zero: got 0; stack torchtitan shards the weights over "
                                        "the context-parallel ranks whenever cp > 1; use zero = 2 "
                                        "or 3"):
        evaluate(sc, Parallelism(dp=4, cp=2, zero=0))
    assert evaluate(sc, Parallelism(dp=4, cp=2, zero=2)).fits
    assert sc.stack.zeros_for(Parallelism(dp=4, cp=2)) == [2, 3]
    assert sc.stack.zeros_for(Parallelism(dp=8)) == [0, 2, 3]
    assert get_stack("megatron-core").zeros_for(Parallelism(dp=4, cp=2))[0] == 0
    comp = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=64,
                               stack="composer")
    with pytest.raises(SpecError, match="tp: got 2; stack composer has no tensor parallelism"):
        evaluate(comp, Parallelism(tp=2, dp=4, zero=3))
    with pytest.raises(SpecError, match="recompute: got 'selective'; stack composer offers"):
        evaluate(comp, Parallelism(dp=8, zero=3, recompute=("selective",)))


def test_composer_loss_keeps_the_bf16_logits():
    """llm-foundry's fused cross-entropy keeps the bf16 logits (2 bytes each) and writes a bf16
    gradient; eager cross-entropy on upcast logits keeps fp32 log-probabilities (4) beside 6 bytes
    at its peak. The difference is all in the loss, and the fused loss moves fewer bytes."""
    comp = get_stack("composer")
    assert (comp.loss_saved_bytes, comp.loss_transient_bytes) == (2, 2)
    eager = replace(comp, loss_saved_bytes=4, loss_transient_bytes=6)
    sc = scenario_from_names("llama3-8b", "selene-a100-hdr", 8, seq_len=2048, global_batch=64,
                             stack="composer")
    par = Parallelism(dp=8, zero=3, recompute=("full",), mbs=2)
    fused, plain = evaluate(sc, par), evaluate(replace(sc, stack=eager), par)
    logits = par.mbs * 2048 * G.padded_vocab(sc.model.vocab, 1)
    m_f, m_p = fused.stages[0].memory, plain.stages[0].memory
    assert m_p.activations - m_f.activations == pytest.approx(2 * logits)
    assert m_p.transient - m_f.transient == pytest.approx(4 * logits)
    assert m_p.weights + m_p.optimizer == m_f.weights + m_f.optimizer
    assert fused.step_time < plain.step_time


def test_every_llm_foundry_run_fits_its_a100(shared):
    """The llm-foundry runs ran, so none of their plans may need more than the A100's HBM. Before
    the fused loss, 16 of the 61 were put at 80.5-85.8 GiB (benchmarks/runs_fit.py)."""
    cases = [c for c in load_cases(shared / "data" / "fsdp_runs.csv") if c.id.startswith("llmf_")]
    assert len(cases) == 61
    over = [(c.id, round(r, 3)) for r, c in hbm_ratios(cases) if r > 1]
    assert not over, over


def test_fsdp_stacks_keep_fsdp_model_states():
    # FSDP with fp32 parameters and gradients: 16 bytes per parameter, all sharded
    kw = dict(seq_len=4096, global_batch=64)
    tt = evaluate(scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, stack="torchtitan", **kw),
                  Parallelism(dp=8, zero=3, recompute=("full",)))
    mc = evaluate(scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, **kw),
                  Parallelism(dp=8, zero=3, recompute=("full",)))
    m_tt, m_mc = tt.stages[0].memory, mc.stages[0].memory
    states_tt = m_tt.weights + m_tt.gradients + m_tt.optimizer
    states_mc = m_mc.weights + m_mc.gradients + m_mc.optimizer
    assert states_tt / states_mc == pytest.approx(16 / 18)
    # whole-block gathers and an eager loss hold more transient memory than Megatron's
    assert m_tt.transient > m_mc.transient


def test_plan_with_a_stack_returns_only_what_it_runs(tmp_path):
    code, out, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus",
                         16, "--seq-len", 4096, "--global-batch", 64, "--stack", "torchtitan",
                         "--top", 3, "--json", "--save", tmp_path / "p.json")
    assert code == 0, err
    js = json.loads(out)
    assert js["stack"] == "torchtitan" and js["zero"] in (0, 2, 3)
    assert "," not in js["recompute"]  # one policy on every stage
    code, out, err = cli("evaluate", "--plan", tmp_path / "p.json", "--json")
    assert code == 0, err
    again = json.loads(out)
    assert again["stack"] == "torchtitan"
    assert again["step_time_s"] == pytest.approx(js["step_time_s"])


@pytest.mark.parametrize("text, message", [
    ('name = "x"\nbase = "megatron-core"\ncolour = 1\n', "stack.colour: got 1; unknown key"),
    ('base = "megatron-core"\nmatmul_scale = -1\n',
     "matmul_scale: got -1.0; must be a multiplier in [0.01, 10]"),
    ('base = "megatron-core"\ngrad_bytes = "four"\n', "grad_bytes: got 'four'; must be an integer"),
    ('base = "megatron-core"\nzero_stages = [0, 5]\n', "zero_stages: got 5; allowed: 0, 1, 2, 3"),
    ('base = "nonesuch"\n', "stack.base: got 'nonesuch'; unknown stack; catalog names: composer"),
    ('base = "mine.toml"\n', "bases form a cycle"),
    ('base = "megatron-core"\nrecompute = {none = "none", x = "modules:attention"}\n',
     "stack.recompute.x: got 'modules:attention'; allowed: none, full, modules:NAME"),
    ('base = "megatron-core"\nrecompute = {full = "full", none = "none"}\n',
     "its first policy must be none = \"none\""),
    ('base = "megatron-core"\nrecompute = ["none", "half"]\n',
     "stack.recompute: got 'half'; allowed: none, selective, full (or a table"),
    ('base = "megatron-core"\ndefault_recompute = "half"\n',
     "default_recompute: got 'half'; must be one of its recompute policies"),
])
def test_bad_stack_files_are_one_line(tmp_path, text, message):
    (tmp_path / "mine.toml").write_text(text)
    code, out, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus",
                         8, "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len",
                         2048, "--stack", "mine.toml", cwd=tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and message in lines[0], err


def test_unknown_stack_lists_the_catalog():
    code, out, err = cli("list", "stacks")
    assert code == 0 and "torchtitan" in out and "composer" in out
    code, out, err = cli("validate", "--stack", "titan")
    assert code == 2 and "stack: got 'titan'; unknown stack; catalog names: composer" in err
    assert len(err.strip().splitlines()) == 1


def test_validate_json_has_rows_and_memory(shared):
    code, out, err = cli("validate", "--csv", shared / "data" / "fsdp_runs.csv", "--json")
    js = json.loads(out)
    assert code == (0 if js["ok"] else 1) and js["count"] == 82
    row = next(r for r in js["rows"] if r["id"] == "tt24_t1_8b_g8_FSDP")
    assert set(row) >= {"id", "metric", "measured_s", "predicted_s", "error",
                        "measured_memory_gib", "predicted_memory_gib"}
    # a 2024 run: the stack of torchtitan as it then ran (the catalog's torchtitan is 0.3's)
    assert row["stack"] == "torchtitan-2024" and row["measured_memory_gib"] == 82.4
    # the plan as the text table gives it (a calibrating user's trial missed it in the JSON)
    assert row["plan"] == "t1 p1 d8 z3 selective b2"
    assert js["memory_rows"] == 10
    assert js["memory_rows_over"] == 0 and js["memory_max_abs_error"] <= 0.10


def test_validate_fails_on_a_peak_memory_beyond_its_tolerance(runs_csv):
    """A measured peak the prediction misses by more than 10 % fails the check (exit 1), as a step
    time beyond 15 % does (a user trial's row at +5,761 % had passed); the step alone passes."""
    code, out, err = cli("validate", "--csv", runs_csv())
    assert code == 0, out + err
    code, out, err = cli("validate", "--csv", runs_csv(other_metrics="peak_memory_gib=1"))
    assert code == 1 and "FAILED (1 peak memory over)" in out, out + err


def test_fsdp_runs_memory_within_ten_percent(shared, record_property):
    outcomes = run(shared / "data" / "fsdp_runs.csv")
    record_property("print", table(outcomes))
    mem = {o.case.id: o.memory_error for o in outcomes if o.memory_error is not None}
    assert len(mem) == 10
    over = {k: f"{v:+.1%}" for k, v in mem.items() if abs(v) > 0.10}
    assert not over, over


# Step-time errors of fsdp_runs.csv by group (mean |error| %, as README's accuracy table reports
# them). Not targets: a change that moves one by more than half a point updates the README too.
FSDP_GROUPS = {"llmf_": 4.3, "tt24old_a100": 3.1, "tt24old_h100": 12.7, "tt24_": 8.5}


def test_fsdp_runs_are_predicted_as_reported(shared):
    outcomes = run(shared / "data" / "fsdp_runs.csv")
    for prefix, reported in FSDP_GROUPS.items():
        errs = [abs(o.error) for o in outcomes if o.case.id.startswith(prefix)]
        assert sum(errs) / len(errs) * 100 == pytest.approx(reported, abs=0.5), prefix


def test_calibrate_writes_a_stack_that_validate_accepts(tmp_path, shared):
    # three torchtitan rows in, a stack file out; --stack takes it back
    src = shared / "data" / "fsdp_runs.csv"
    lines = src.read_text().splitlines()
    keep = [lines[0]] + [ln for ln in lines[1:] if ln.startswith("tt24old_a100_llama213b")]
    runs = tmp_path / "mine.csv"
    runs.write_text("\n".join(keep) + "\n")
    code, out, err = cli("calibrate", runs, "--stack", "torchtitan", "-o", tmp_path / "mine.toml")
    assert code == 0, err
    assert "left out" in out and out.count("tt24old_a100_llama213b") == 3
    text = (tmp_path / "mine.toml").read_text()
    assert 'base = "torchtitan"' in text and "fitted_on" in text
    code, out, err = cli("validate", "--csv", runs, "--stack", tmp_path / "mine.toml", "--json")
    js = json.loads(out)
    assert js["mean_abs_error"] < 0.05, js


def test_calibrate_fits_the_plans_validate_chooses_with_its_file(tmp_path):
    """A row that leaves its recomputation and micro-batch blank has them chosen by the model
    (the fastest that fits) under the stack in use: the fit is made on the fitted stack's own
    choice, so that validate --stack of the file prints the errors calibrate printed (a user
    trial: fitted on the base's selective at micro-batch 2, validated with the file at none and
    1, its memory error +9 % in calibrate's table, +24 % in validate's), and a note says so."""
    runs = tmp_path / "free.csv"
    runs.write_text(
        "id,model,gpu,num_gpus,tp,pp,seq_len,global_batch,micro_batch,recompute,metric,"
        "step_time_s,stack,precision,other_metrics\n"
        "a,llama3-8b,H100-SXM5-96GB-HBM2e-500W,8,1,1,8192,16,,,step_time,2.95,torchtitan-2024,"
        "bf16,peak_memory_gib=66\n"
        "b,llama3-8b,H100-SXM5-96GB-HBM2e-500W,8,1,1,4096,32,2,selective,step_time,2.9,"
        "torchtitan-2024,bf16,peak_memory_gib=36\n")
    code, out, err = cli("calibrate", runs, "-o", tmp_path / "mine.toml")
    assert code == 1, err
    printed = {line.split()[0]: line for line in out.splitlines()[1:3]}
    assert "a: t1 p1 d8 z3 none b1 (the base chose selective b2)" in err, err
    code, vout, err = cli("validate", "--csv", runs, "--stack", tmp_path / "mine.toml", "--json")
    for row in json.loads(vout)["rows"]:
        after = printed[row["id"]].split()[3]
        assert after == f"{row['error'] * 100:+.1f}%", (row, printed)
        memory = printed[row["id"]].split("-> ")[1]
        assert memory == f"{(row['predicted_memory_gib'] / row['measured_memory_gib'] - 1) * 100:+.1f}%"


def test_calibrate_rejects_bad_input(tmp_path, runs_csv):
    code, out, err = cli("calibrate", tmp_path / "none.csv", "-o", tmp_path / "x.toml")
    assert code == 2 and "RUNS.csv: got" in err and len(err.strip().splitlines()) == 1
    code, out, err = cli("calibrate", runs_csv(stack="jax"), "--stack", "megatron-2021",
                         "-o", tmp_path / "x.toml")
    assert code == 0, err  # --stack overrides the column
    # so a likely slip, another framework's name near a catalog one, or someone else's file is
    # set aside with it; the slip's note says what it was likely meant as (a calibrating user's
    # "torchtitn" had read as a stack that merely does not load; a review: refusing it refused
    # "megatron-lm" and a missing torchtitan.toml too)
    for cell, said in (("torchtitn", "torchtitn (does not load; did you mean 'torchtitan'?)"),
                       ("megatron-lm", "megatron-lm (does not load; did you mean "
                                       "'megatron-core'?)"),
                       ("torchtitan.toml", "torchtitan.toml (does not load)")):
        code, out, err = cli("calibrate", runs_csv(stack=cell), "--stack", "megatron-2021",
                             "-o", tmp_path / "x.toml")
        assert code == 0 and said in err, err


def test_calibrate_writes_paths_into_its_comment_escaped(tmp_path, runs_csv):
    """A runs CSV whose name holds line breaks had put live TOML lines into the stack file's
    first comment (a fuzzer's ``attention_scale = 9.0``); they are escaped."""
    named = tmp_path / "r\nattention_scale = 9.0\n#.csv"
    named.write_text(Path(runs_csv()).read_text())
    code, out, err = cli("calibrate", named, "-o", tmp_path / "mine.toml")
    assert code == 0, err
    text = (tmp_path / "mine.toml").read_text()
    assert text.splitlines()[0].endswith(f"r\\nattention_scale = 9.0\\n#.csv (base: the rows' "
                                         f"stack, megatron-2021) -o {tmp_path / 'mine.toml'}")
    assert get_stack(str(tmp_path / "mine.toml")).attention_scale == pytest.approx(
        get_stack("megatron-2021").attention_scale * (
            get_stack(str(tmp_path / "mine.toml")).matmul_scale
            / get_stack("megatron-2021").matmul_scale))  # the one compute scale, nothing else


def test_calibrate_writes_nothing_that_would_not_load(tmp_path, runs_csv):
    """Over a chain of stacks as long as a stack may have (31 files, megatron-2021 and its base
    megatron-core: a chain of 32 bases), the fitted file would make it one longer: refused, an
    earlier file of that name kept, and nothing left behind."""
    for i in range(1, 32):
        base = f'"c{i + 1}.toml"' if i < 31 else '"megatron-2021"'
        (tmp_path / f"c{i}.toml").write_text(f'base = {base}\nname = "c{i}"\n')
    assert get_stack(str(tmp_path / "c1.toml")).name == "c1"
    out = tmp_path / "out.toml"
    out.write_text("# an earlier calibration\n")  # (a reviewer's: it had been deleted)
    code, _, err = cli("calibrate", runs_csv(), "--stack", tmp_path / "c1.toml", "-o", out)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "the fitted stack file would not load" in err and "chain of more than 32" in err
    assert out.read_text() == "# an earlier calibration\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_calibrate_names_a_value_the_fit_would_take_out_of_bounds():
    """A fit that would push a stack value past its bounds says so as the fit's, not as an error
    in the user's file (which had read as 'stack.step_overhead_s: got 90.68')."""
    from nestplan import calibrate as C

    base = get_stack("megatron-core")
    with pytest.raises(SpecError) as e:
        C._apply(base, ("step_overhead_s",), [math.log(90.0 / base.step_overhead)])
    assert e.value.field == "calibrate (stack.step_overhead_s)"
    assert "the fit would take it there" in str(e.value)


def test_a_multiplier_on_an_accelerators_least_efficiency_is_floored_not_refused():
    """matmul_scale 0.02 is in its range and H100's smallest GEMMs are at a few percent: the
    product, below the least efficiency a file may state, had been refused naming the
    accelerator; it is held at that floor (0.1 %)."""
    from nestplan.cost.hardware import effective
    from nestplan.specs import MIN_EFFICIENCY

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=8)
    slow = replace(get_stack("megatron-core"), name="slow", matmul_scale=0.02)
    acc = effective(sc.cluster, slow).accelerator
    assert min(e for _, e in acc.matmul_efficiency_bf16) == MIN_EFFICIENCY
    ev = evaluate(replace(sc, stack=slow), Parallelism(dp=8, zero=1, mbs=1))
    assert ev.step_time > 20 * evaluate(sc, Parallelism(dp=8, zero=1, mbs=1)).step_time


def test_calibrate_fits_the_stack_the_rows_ran_on(tmp_path, shared):
    """Rows without a stack column ran on the stack their source names (as validate reads
    them): Narayanan et al.'s on megatron-2021, not on the default stack."""
    lines = (shared / "data" / "published_runs.csv").read_text().splitlines()
    runs = tmp_path / "nar.csv"
    runs.write_text("\n".join(lines[:3]) + "\n")
    assert all(ln.startswith("nar21-") for ln in lines[1:3])
    code, out, err = cli("calibrate", runs, "-o", tmp_path / "m.toml")
    assert code == 0 and "over megatron-2021" in out, err
    assert 'base = "megatron-2021"' in (tmp_path / "m.toml").read_text()
    notes = [ln for ln in err.splitlines() if "note:" in ln]
    assert notes == ["nestplan: note: 2 rows (nar21-t1-1p7b, nar21-t1-3p6b) give no precision: read "
                     "as bf16"], err  # (no stack set aside, none filled in)
    code, out, err = cli("calibrate", runs, "--stack", "megatron-core", "-o", tmp_path / "m.toml")
    assert code == 0 and "the rows' own stacks (megatron-2021) are set aside" in err


def test_calibrate_counts_one_plan_measured_thrice_as_one_row(tmp_path, shared):
    """Three measurements of one plan identify one compute scale, not three efficiencies."""
    lines = (shared / "data" / "published_runs.csv").read_text().splitlines()
    runs = tmp_path / "thrice.csv"
    runs.write_text("\n".join([lines[0]] + [lines[1].replace("nar21-t1-1p7b,", f"r{i},", 1)
                                            for i in range(3)]) + "\n")
    code, out, err = cli("calibrate", runs, "-o", tmp_path / "m.toml")
    assert code == 0 and "over megatron-2021: compute_scale" in out, err
    # and says so where it counts its rows (it had said "fitted on 3 rows")
    assert "fitted on 3 rows (1 distinct: a plan measured again counts once)" in out


def test_calibrate_sets_nothing_aside_when_the_rows_name_the_given_file(tmp_path, runs_csv):
    (tmp_path / "mine.toml").write_text('base = "megatron-2021"\nname = "mine"\n')
    runs = runs_csv(stack="mine.toml")  # beside the CSV
    code, out, err = cli("calibrate", runs, "--stack", tmp_path / "mine.toml",
                         "-o", tmp_path / "fitted.toml")
    assert code == 0 and "over mine" in out and "set aside" not in err, err


def test_calibrate_solver_reaches_the_optimum_of_a_kinked_model():
    """Step times that are a roofline (the larger of a compute and a memory time) in the
    multipliers: the fit ends where a fine grid finds the least objective."""
    import itertools
    from types import SimpleNamespace as Row

    import numpy as np

    from nestplan import calibrate as C

    base = get_stack("megatron-core")
    compute, memory = np.array([1.0, 0.6, 0.9, 0.3]), np.array([0.5, 0.9, 0.85, 1.0])

    def seconds(st):
        return np.maximum(compute / st.matmul_scale, memory / st.memory_scale)

    measured = seconds(Row(matmul_scale=0.8, memory_scale=1.3)) * [1.03, 0.98, 1.01, 0.99]
    rows = _fake_rows(measured, seq_lens=[2048, 4096, 2048, 4096])
    names = C._names(rows, base)
    assert names == ("matmul_scale", "attention_scale", "memory_scale")
    # at one sequence length the attention's share is not told apart from the GEMMs': not fitted
    assert C._names(_fake_rows(measured, seq_lens=[4096] * 4), base) == ("matmul_scale", "memory_scale")

    def predictions(cases, st):
        return seconds(st)[[c.i for c in cases]]

    def objective(x):
        r = np.log(predictions(rows, C._apply(base, names, x)) / measured) / C.NOISE
        return r @ r + (x / C.PRIOR) @ (x / C.PRIOR)

    x = C._solve(rows, base, names, predictions)
    grid = min(objective(np.array([u, 0.0, v])) for u, v in itertools.product(
        np.linspace(-0.5, 0.2, 71), np.linspace(-0.2, 0.6, 81)))
    assert objective(x) <= grid + C.SETTLED
    assert x[1] == 0.0  # nothing in these rows depends on attention: the prior keeps it
    # leave-one-out fits start from this one; they end where fits from the base end
    for i, row in enumerate(rows):
        rest = rows[:i] + rows[i + 1:]
        warm, cold = (C._solve(rest, base, names, predictions, start=s) for s in (x, None))
        left_out = [predictions([row], C._apply(base, names, f))[0] for f in (warm, cold)]
        assert left_out[0] == pytest.approx(left_out[1], rel=2e-3)


def _fake_rows(measured, seq_lens):
    """Rows for calibrate's solver alone: a measured time, an index for the fake predictions, and
    the scenario fields that tell rows apart (one plan each)."""
    from collections import namedtuple
    from types import SimpleNamespace as Row

    sc, tr = namedtuple("Sc", "training model"), namedtuple("Tr", "seq_len attention_span")
    dense = namedtuple("Model", "moe")(None)
    return [Row(measured=m, i=i, scenario=sc(tr(s, None), dense), plan=i, metric="step_time")
            for i, (m, s) in enumerate(zip(measured, seq_lens))]


def test_calibrate_lowers_a_multiplier_whose_efficiency_is_capped():
    """A base whose memory-bound efficiency already sits at the cap of 1 (torchtitan-compile's
    memory_scale 1.25 on an 80 % efficient HBM): raising it moves nothing, so the fit probes
    downward and finds the slower memory the rows measured."""
    from types import SimpleNamespace as Row

    import numpy as np

    from nestplan import calibrate as C

    base = get_stack("megatron-core")

    def seconds(st):  # compute plus memory time, the memory efficiency capped at 1
        return np.array([1.0, 0.5, 0.2]) + np.array([0.2, 0.6, 1.0]) / min(st.memory_scale, 1.0)

    measured = seconds(Row(memory_scale=0.7))
    rows = _fake_rows(measured, seq_lens=[2048, 4096, 8192])
    names = C._names(rows, base)
    x = C._solve(rows, base, names, lambda cases, st: seconds(st)[[c.i for c in cases]])
    memory = math.exp(x[names.index("memory_scale")])
    assert 0.68 < memory < 0.75  # the prior holds it a little above the rows' 0.7


@pytest.mark.parametrize("peak_gib, ok", [(80, True), (79, False), (5000, False)])
def test_calibrate_fits_an_allocator_share_above_1_and_refuses_an_absurd_one(tmp_path, runs_csv,
                                                                             peak_gib, ok):
    """A peak some GiB above the predicted tensors fits an allocator share above 1 (the stack
    file it writes loads again); one that no allocator explains is refused naming the rows: 79
    GiB for a plan of 256-token sequences whose activations and transients are 2.4 GiB, and
    5,000 GiB, more than the A100's HBM."""
    short = {"seq_len": "256", "step_time_s": "0.4"} if peak_gib == 79 else {}
    csv = runs_csv(other_metrics=f"peak_memory_gib={peak_gib}", **short)
    out_path = tmp_path / "m.toml"
    code, out, err = cli("calibrate", csv, "--stack", "megatron-core", "-o", out_path)
    if ok:
        assert code == 0, err
        assert get_stack(str(out_path)).allocator_overhead > 1
    else:
        assert code == 2 and len(err.strip().splitlines()) == 1 and "peak_memory_gib" in err
        assert runs_csv.row["id"] in err and "Traceback" not in err
        assert ("more than the 80 GiB of HBM" if peak_gib > 80 else
                "an allocator overhead above 10") in err  # why, not only where


def test_the_stated_bounds_themselves_load(tmp_path):
    """A file's value at its bound survives the conversion to SI units (1000 us is 1e-3 s)."""
    from nestplan.loaders import cluster_from_table

    stack = tmp_path / "k.toml"
    stack.write_text('base = "megatron-core"\nname = "k"\nkernel_overhead_us = 1000\n'
                     'allocator_overhead = 10\nmoe_layer_host_ms = 1000\nstep_overhead_s = 60\n')
    assert get_stack(str(stack)).kernel_overhead == pytest.approx(1e-3)
    cluster = cluster_from_table({"name": "c", "accelerator": {"base": "h100-sxm-80gb",
                                                                "name": "a",
                                                                "kernel_overhead_us": 1000},
                                  "levels": [{"name": "n", "bandwidth_GBps": 450,
                                              "latency_us": 2}]}, get_accelerator)
    assert cluster.accelerator.kernel_overhead == pytest.approx(1e-3)


def test_runs_csv_stack_column_names_a_catalog_stack(runs_csv):
    cases = load_cases(Path(runs_csv(stack="megatron-2022")))
    assert cases[0].scenario.stack.name == "megatron-2022"


def test_a_plan_searched_for_a_stack_exports_unchanged(tmp_path):
    path = tmp_path / "p.json"
    code, out, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 16,
                         "--seq-len", 4096, "--global-batch", 64, "--stack", "torchtitan",
                         "--top", 1, "--save", path)
    assert code == 0, err
    code, out, err = cli("export", path, "--format", "torchtitan")
    # the plan goes out as searched: no closest-plan change, no word about another stack
    assert code == 0 and "exported plan: predicted" not in err and "searched for stack" not in err
    code, out, err = cli("export", path, "--format", "megatron")
    assert code == 0 and "searched for stack torchtitan (exports as torchtitan), not for megatron" in err


@pytest.mark.parametrize("model", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_an_moe_plan_searched_for_torchtitan_exports_unchanged(tmp_path, model):
    """torchtitan lays experts over the FSDP-sharded ranks only and has no expert TP of its own:
    the search had returned ZeRO-0 with EP over DDP replicas and etp = tp, which the export had
    to turn into ZeRO-2 and etp 1 (Mixtral 10.3 s -> 19.5 s)."""
    path = tmp_path / "p.json"
    code, out, err = cli("plan", "--model", model, "--cluster", "dgx-h100-ndr", "--gpus", 64,
                         "--stack", "torchtitan", "--top", 1, "--save", path)
    assert code == 0, err
    code, out, err = cli("export", path, "--format", "torchtitan")
    assert code == 0 and "exported plan: predicted" not in err, err
    assert "expert tensor parallelism" not in err and "ZeRO-0 replicates" not in err


def test_torchtitan_refuses_experts_over_replicas_and_expert_tp():
    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=64,
                             stack="torchtitan")
    base = Parallelism(tp=2, sp=True, dp=32, ep=8, etp=1, zero=2, mbs=1)
    check_plan(sc, base)  # FSDP-sharded ranks hold the experts
    with pytest.raises(SpecError, match="ZeRO-0's are replicas: ep must divide cp·tp = 2"):
        check_plan(sc, base.with_(zero=0))
    check_plan(sc, replace(base, ep=2, zero=0))  # over the TP ranks it can
    with pytest.raises(SpecError, match="etp must be 1 with ep > 1"):
        check_plan(sc, replace(base, etp=2))
    with pytest.raises(SpecError, match="etp must be tp = 2 without expert parallelism"):
        check_plan(sc, replace(base, ep=1, etp=1))
    megatron = replace(sc, stack=get_stack("megatron-core"))
    check_plan(megatron, replace(base, zero=0, etp=2))  # Megatron-Core runs both


@pytest.mark.parametrize("stack, fmt", [("deepspeed", "deepspeed"), ("megatron-core", "megatron")])
def test_plans_of_other_stacks_export_unchanged_too(tmp_path, stack, fmt):
    """megatron-core's plan here mixes recompute policies per stage (none, fine-grained x2,
    none when this was written), which the Megatron export runs through its stage script."""
    path = tmp_path / "p.json"
    code, out, err = cli("plan", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr", "--gpus",
                         64, "--seq-len", 4096, "--global-batch", 256, "--stack", stack,
                         "--top", 1, "--save", path)
    assert code == 0, err
    code, out, err = cli("export", path, "--format", fmt)
    assert code == 0 and "exported plan: predicted" not in err + out, err + out
    assert "searched for stack" not in err + out


def test_unfused_kernels_change_only_what_they_name():
    # a GELU MLP has no gated activation to fuse: on every stack its activation reads and writes
    # its tensor once forward and twice backward, and keeps its input
    from nestplan.catalog import get_model

    gpt = get_model("gpt3-175b")
    tr = scenario_from_names("gpt3-175b", "selene-a100-hdr", 8, seq_len=2048,
                             global_batch=8).training
    elements = 2048 * gpt.ffn_hidden
    for name in ("megatron-core", "composer", "torchtitan"):
        act = next(o for o in layer_graph(gpt, Parallelism(dp=8), tr, get_stack(name)).dense.ops
                   if o.name == "act")
        assert (act.nbytes, act.bwd_nbytes, act.saved) == (
            2 * G.E * elements, 4 * G.E * elements, G.E * elements), name


def test_validate_json_on_every_shared_file(shared):
    for name in ("published_runs.csv", "fsdp_runs.csv"):
        code, out, err = cli("validate", "--csv", shared / "data" / name, "--json")
        js = json.loads(out)
        assert code == (0 if js["ok"] else 1) and js["count"] == len(js["rows"]), err


def test_calibrate_over_a_stack_file_names_it_so_the_result_loads(tmp_path, shared):
    lines = (shared / "data" / "fsdp_runs.csv").read_text().splitlines()
    runs = tmp_path / "mine.csv"
    runs.write_text("\n".join([lines[0]] + [ln for ln in lines[1:]
                                            if ln.startswith("tt24old_a100_llama38b")]) + "\n")
    (tmp_path / "ours.toml").write_text('base = "torchtitan"\nname = "ours"\n')
    (tmp_path / "out").mkdir()
    code, out, err = cli("calibrate", runs, "--stack", "ours.toml", "-o", "out/fitted.toml",
                         cwd=tmp_path)
    assert code == 0, err
    code, out, err = cli("validate", "--csv", runs, "--stack", tmp_path / "out" / "fitted.toml")
    assert code in (0, 1) and "fitted" in out, err
    # named from the new file's folder, the pair moves together (a trial found an absolute path)
    assert 'base = "../ours.toml"' in (tmp_path / "out" / "fitted.toml").read_text()
    moved = tmp_path / "moved"
    moved.mkdir()
    (tmp_path / "out").rename(moved / "out")
    (tmp_path / "ours.toml").rename(moved / "ours.toml")
    code, out, err = cli("validate", "--csv", runs, "--stack", moved / "out" / "fitted.toml")
    assert code in (0, 1) and "fitted" in out, err
    # a base beside the new file, named without an extension, is not taken for a catalog name
    (moved / "out" / "mybase").write_text('base = "torchtitan"\nname = "mybase"\n')
    code, out, err = cli("calibrate", runs, "--stack", "out/mybase", "-o", "out/again.toml",
                         cwd=moved)
    assert code == 0, err
    assert 'base = "./mybase"' in (moved / "out" / "again.toml").read_text()
    code, out, err = cli("validate", "--csv", runs, "--stack", moved / "out" / "again.toml")
    assert code in (0, 1) and "again" in out, err


POLICIES = ('base = "megatron-core"\nname = "mine"\nrecompute = {none = "none", '
            'attn = "modules:core_attn", half = "every:2", full = "full"}\n')


def test_a_stack_names_its_own_recompute_policies(tmp_path):
    """Policies are the stack's names for rules: a new name for Megatron's selective policy
    costs the same, and full recomputation of every second block lies between none and full."""
    (tmp_path / "mine.toml").write_text(POLICIES)
    args = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
            "--tp", 2, "--pp", 2, "--mbs", 1, "--global-batch", 32, "--seq-len", 4096, "--json"]

    def run(policy, stack="mine.toml"):
        code, out, err = cli(*args, "--recompute", policy, "--stack", stack, cwd=tmp_path)
        assert code == 0, err
        return json.loads(out)

    none, half, full = run("none"), run("half"), run("full")
    assert none["peak_memory_gib"] > half["peak_memory_gib"] > full["peak_memory_gib"]
    assert none["step_time_s"] < half["step_time_s"] < full["step_time_s"]
    assert run("attn")["step_time_s"] == pytest.approx(
        run("selective", "megatron-core")["step_time_s"], rel=1e-12)
    # per stage, as the summary prints it, and back
    mixed = run("half,full")
    assert mixed["recompute"] == "half,full"
    code, out, err = cli(*args, "--recompute", "selective", "--stack", "mine.toml", cwd=tmp_path)
    assert code == 2 and "recompute: got 'selective'; stack mine offers none, attn, half, full" in err
    for bad in ("", ",", "full,"):
        code, out, err = cli(*args, "--recompute", bad, "--stack", "mine.toml", cwd=tmp_path)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "recompute: got" in err, err


def test_plan_searches_a_stacks_own_policies(tmp_path):
    (tmp_path / "mine.toml").write_text(POLICIES)
    code, out, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                         "--seq-len", 8192, "--global-batch", 32, "--recompute", "half",
                         "--stack", "mine.toml", "--json", "--top", 1, cwd=tmp_path)
    assert code == 0, err
    assert json.loads(out)["recompute"] == "half"


def test_plans_keep_the_memory_headroom(tmp_path):
    """``plan`` recommends only plans whose predicted peak leaves the headroom free (default 6 %
    of HBM); ``evaluate`` reports the margin of any plan; the plan file keeps the headroom."""
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
            "--seq-len", 8192, "--global-batch", 64, "--top", 3, "--json"]
    code, out, err = cli(*args, "--save", tmp_path / "p.json")
    assert code == 0, err
    js = json.loads(out)
    for plan in [js] + js["top"]:
        assert plan["peak_memory_gib"] <= 0.94 * js["capacity_gib"] + 1e-9
    assert js["within_headroom"] and js["margin_gib"] == pytest.approx(
        js["capacity_gib"] - js["peak_memory_gib"])
    assert js["memory_headroom_gib"] == pytest.approx(0.06 * js["capacity_gib"])
    code, out, err = cli(*args, "--memory-headroom", 0)
    tight = json.loads(out)
    assert code == 0 and tight["step_time_s"] <= js["step_time_s"]
    assert json.loads(tmp_path.joinpath("p.json").read_text())["memory_headroom"] == 0.06
    code, out, err = cli("evaluate", "--plan", tmp_path / "p.json", "--memory-headroom", 49)
    assert code == 0 and "not recommended" in out, out
    for bad in ("-1", "50"):
        code, out, err = cli(*args, "--memory-headroom", bad)
        assert code == 2 and len(err.strip().splitlines()) == 1
        assert f"memory-headroom: got {float(bad)}; must be a percent of HBM in [0, 50)" in err
    code, out, err = cli(*args, "--memory-headroom", "nan")
    assert code == 2 and "memory-headroom: got 'nan'; must be a decimal number" in err
    # a plan file's share given as the flag's percent is taken, and said (a user trial's)
    code, out, err = cli(*args, "--memory-headroom", 0.06)
    assert code == 0 and "--memory-headroom 0.06 is 0.06 % of HBM; for 6 %" in err, err
    code, out, err = cli(*args, "--memory-headroom", 0.6)  # no share: 60 % is refused
    assert code == 0 and "--memory-headroom 0.6 is" not in err, err


def test_allgather_context_parallelism_hides_behind_one_block_only():
    """torch's context_parallel all-gathers K/V behind the first sub-attention (SDPA's rotater:
    torchtitan-2024's cp_exchange); a ring passes K/V on behind every block (Megatron)."""

    ring = get_stack("megatron-core")
    gather = replace(ring, name="gather", cp_exchange="allgather")
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=16384, global_batch=2)
    par = Parallelism(tp=1, pp=1, dp=1, cp=8, mbs=1)  # CP over NVLink

    def comms(stack):
        layer = layer_graph(sc.model, par, sc.training, stack).dense
        return {c.name: c.kind for c in layer.comms}

    assert comms(ring) == {"cp_kv": G.CollKind.RING_EXCHANGE,
                           "cp_kv_bwd": G.CollKind.RING_EXCHANGE}
    assert comms(gather) == {"cp_kv_ag": G.CollKind.ALL_GATHER,
                             "cp_kv_ag_bwd": G.CollKind.ALL_GATHER,
                             "cp_dkv_bwd": G.CollKind.RING_EXCHANGE}
    assert (evaluate(replace(sc, stack=gather), par).time.cp
            > evaluate(replace(sc, stack=ring), par).time.cp)


def test_a_power_capped_part_runs_compute_at_its_sustained_share():
    """Compute-bound kernels run at peak times the accelerator's sustained share (the 500 W
    H100 of torchtitan's runs); the peak, and so MFU, stays the datasheet's."""

    from nestplan.cost.compute import op_time
    from nestplan.options import AttentionImpl, Precision

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=8)
    acc = sc.cluster.accelerator
    half = replace(acc, sustained_share=0.5)
    ops = G.build(sc.model, G.Local(1, False, 1, 1, 1, 1, 4096, Precision.BF16,
                                    AttentionImpl.FLASH)).dense.ops
    big = max((o for o in ops if o.kind is G.OpKind.GEMM), key=lambda o: o.flops)
    assert op_time(big, half, Precision.BF16, False) == pytest.approx(
        2 * op_time(big, acc, Precision.BF16, False), rel=0.05)
    assert half.peak_flops(Precision.BF16) == acc.peak_flops(Precision.BF16)
    with pytest.raises(SpecError, match="sustained_share"):
        replace(acc, sustained_share=1.5)


def test_an_edited_file_is_read_again_in_a_long_lived_process(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('base = "megatron-core"\nname = "first"\n')
    assert get_stack(str(path)).name == "first"
    path.write_text('base = "megatron-core"\nname = "second-name"\n')  # another size, too
    assert get_stack(str(path)).name == "second-name"
    assert get_stack("megatron-core") is get_stack("megatron-core")  # catalog names stay cached


def test_an_edited_base_or_accelerator_file_is_read_again(tmp_path):
    """Not only the named file: a stack's base file and a cluster's accelerator file, which the
    process read through it, are watched too."""
    from nestplan.catalog import get_cluster

    base, top = tmp_path / "base.toml", tmp_path / "top.toml"
    base.write_text('base = "megatron-core"\nstep_overhead_s = 0.05\n')
    top.write_text('base = "base.toml"\nname = "top"\n')
    assert get_stack(str(top)).step_overhead == 0.05
    base.write_text('base = "megatron-core"\nstep_overhead_s = 0.125\n')
    assert get_stack(str(top)).step_overhead == 0.125
    assert get_stack(str(top)) is get_stack(str(top))  # unchanged files: the cached entry

    acc, cluster = tmp_path / "gpu.toml", tmp_path / "cluster.toml"
    acc.write_text('base = "h100-sxm-80gb"\nname = "mine"\nhbm_GiB = 80\n')
    cluster.write_text('name = "c"\naccelerator = "gpu.toml"\n'
                       '[[levels]]\nname = "node"\nsize = 8\nbandwidth_GBps = 450\nlatency_us = 3\n'
                       '[[levels]]\nname = "net"\nbandwidth_GBps = 50\nlatency_us = 10\n')
    assert get_cluster(str(cluster)).accelerator.hbm_bytes == 80 * 2**30
    acc.write_text('base = "h100-sxm-80gb"\nname = "mine"\nhbm_GiB = 96.5\n')  # another size
    assert get_cluster(str(cluster)).accelerator.hbm_bytes == 96.5 * 2**30


def test_fp8_gathers_halve_what_they_name():
    """torchao Float8 with FSDP2 and TP (the torchtitan-float8 stack): blocks' weights are
    all-gathered in fp8, and so are the TP all-gathers around fp8 linear layers; reduce-scatters,
    the embedding and the output layer stay bf16. Without fp8 precision nothing changes."""

    from nestplan.cost import memory as M
    from nestplan.options import Precision

    base = get_stack("torchtitan-compile")
    fp8 = get_stack("torchtitan-float8")
    assert fp8.fp8_param_gather and fp8.fp8_tp_gather and not base.fp8_param_gather
    assert get_stack("torchtitan-float8-asynctp").tp_overlap.value == "full"
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=64,
                             precision=Precision.FP8)
    par = Parallelism(tp=8, sp=True, dp=8, zero=3, mbs=1, recompute=("full",))
    mg = layer_graph(sc.model, par, sc.training, fp8)
    for zero in (0, 3):
        assert M.gather_bytes(mg.dense, fp8, Precision.FP8, zero) == 1
        assert M.gather_bytes(mg.head, fp8, Precision.FP8, zero) == 2
        assert M.gather_bytes(mg.dense, fp8, Precision.BF16, zero) == 2
        assert M.expert_gather_bytes(fp8, Precision.FP8, zero) == 2  # (grouped: no nn.Linear)

    def tp_bytes(stack):
        layer = layer_graph(sc.model, par, sc.training, stack).dense
        return {c.name: c.nbytes for c in layer.comms}

    plain, halved = tp_bytes(base), tp_bytes(fp8)
    assert plain.keys() == halved.keys()
    for name, nbytes in plain.items():
        want = nbytes / 2 if name.endswith((".ag", ".ag_bwd")) else nbytes
        assert halved[name] == want, name
    head = layer_graph(sc.model, par, sc.training, fp8).head
    assert all(c.nbytes == n for c, n in zip(
        head.comms, (c.nbytes for c in layer_graph(sc.model, par, sc.training, base).head.comms)))

    only_gathers = replace(fp8, name="gathers", fp8_tp_gather=False)
    ev_base = evaluate(replace(sc, stack=base), par)
    ev_fp8 = evaluate(replace(sc, stack=only_gathers), par)
    assert ev_fp8.time.zero < ev_base.time.zero
    assert ev_fp8.time.tp == ev_base.time.tp
    bf16 = replace(sc.training, precision=Precision.BF16)
    assert (evaluate(replace(sc, stack=only_gathers, training=bf16), par).step_time
            == evaluate(replace(sc, stack=base, training=bf16), par).step_time)


def test_megatron_fp8_primary_weights_gather_as_bytes():
    """Megatron-LM's --fp8-param-gather (``fp8_primary_weights``, which the megatron-core stack
    and its export set in fp8 under a sharded optimizer) keeps Transformer Engine's weights
    quantized, and its parameter buffer moves them as bytes: the distributed optimizer's
    all-gather of the blocks' and the experts' weights is half its bf16 size; embedding and
    output layer stay bf16. They had been costed in bf16."""
    from nestplan.cost import memory as M
    from nestplan.options import Precision

    core = get_stack("megatron-core")
    assert core.fp8_primary_weights and not core.fp8_param_gather
    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256,
                             precision=Precision.FP8)
    par = Parallelism(tp=2, sp=True, pp=1, dp=32, ep=8, etp=1, zero=1, mbs=1, recompute=("full",))
    mg = layer_graph(sc.model, par, sc.training, core)
    assert M.gather_bytes(mg.moe, core, Precision.FP8, 1) == 1
    assert M.expert_gather_bytes(core, Precision.FP8, 1) == 1
    assert M.gather_bytes(mg.embedding, core, Precision.FP8, 1) == 2
    assert M.gather_bytes(mg.moe, core, Precision.FP8, 0) == 2  # (no sharded optimizer)
    assert M.expert_gather_bytes(core, Precision.BF16, 1) == 2
    # a head's multi-token-prediction depths are Transformer Engine blocks: fp8, the head bf16
    ds = scenario_from_names("deepseek-v3", "dgx-h100-ndr", 256, seq_len=4096, global_batch=256,
                             precision=Precision.FP8)
    head = layer_graph(ds.model, Parallelism(tp=2, sp=True, pp=8, dp=16, ep=16, etp=1, zero=1,
                                             mbs=1), ds.training, core).head
    # a depth: its block, eh_proj (2h x h over TP 2), the enorm, hnorm and final norm
    h = ds.model.hidden
    depth = head.depths * (head.depth_block.params + 2 * h * h / 2 + 3 * h)
    assert M.gather_bytes(head, core, Precision.FP8, 1) == pytest.approx(
        (depth + 2 * (head.params - depth)) / head.params)
    assert 1 < M.gather_bytes(head, core, Precision.FP8, 1) < 2
    ev = evaluate(sc, par)
    bf16_gathers = evaluate(replace(sc, stack=replace(core, name="bf16-gathers",
                                                       fp8_primary_weights=False)), par)
    assert ev.time.dp < bf16_gathers.time.dp


def test_composer_rows_reduce_gradients_as_they_state(shared):
    """llm-foundry rows stating fsdp_mixed_precision=PURE run on composer-pure (bf16 reduce);
    DEFAULT rows on composer (fp32 reduce, Composer's default)."""
    cases = {c.id: c for c in load_cases(shared / "data" / "fsdp_runs.csv")}
    pure = [c for c in cases.values() if c.scenario.stack.name == "composer-pure"]
    assert {c.id for c in pure} == {"llmf_a100_80_70b_s2048_g64_mb8",
                                    "llmf_a100_80_70b_s2048_g32_mb2"}
    assert cases["llmf_a100_80_125m_s512_g8_mb128"].scenario.stack.grad_bytes == 4
    assert pure[0].scenario.stack.grad_bytes == 2


def test_full_tp_overlap_hides_the_forward_only_with_sequence_parallelism():
    """Userbuffers (Megatron's --tp-comm-overlap) and torch's async TP overlap the all-gathers and
    reduce-scatters of sequence parallelism; without it the forward all-reduce shows, half of the
    TP traffic, and Megatron-LM refuses --tp-comm-overlap (the export leaves it out)."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=64)
    assert sc.stack.tp_overlap.value == "full"
    shares = {}
    for sp in (True, False):
        ev = evaluate(sc, Parallelism(tp=8, sp=sp, dp=8, zero=1, mbs=1))
        shares[sp] = ev.time.tp / ev.link_time["tp"]
    assert shares[True] < 0.5 <= shares[False]


def test_the_megatron_export_asks_for_the_tp_overlap_its_stack_assumes(tmp_path):
    runs = {}
    for stack, sp in (("megatron-core", "--sp"), ("megatron-core", "--no-sp"),
                      ("megatron-2022", "--sp")):
        path = tmp_path / f"{stack}{sp}.json"
        code, _, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                           "--gpus", 8, "--tp", 4, "--pp", 1, sp, "--mbs", 1, "--global-batch", 8,
                           "--seq-len", 4096, "--stack", stack, "--save", path)
        assert code == 0, err
        code, out, err = cli("export", path, "--format", "megatron")
        assert code == 0, err
        runs[stack, sp] = "--tp-comm-overlap" in out
    assert runs == {("megatron-core", "--sp"): True, ("megatron-core", "--no-sp"): False,
                    ("megatron-2022", "--sp"): False}


@pytest.mark.parametrize("stack, extra, zero, sp", [
    ("megatron-core", [], 1, True), ("torchtitan", [], 3, True), ("megatron-2021", [], 0, False),
    ("megatron-core", ["--zero", 0, "--no-sp"], 0, False)])
def test_evaluate_fills_what_it_is_not_told_as_the_stack_does(stack, extra, zero, sp):
    code, out, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus",
                         8, "--tp", 2, "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len",
                         4096, "--stack", stack, "--json", *extra)
    assert code == 0, err
    got = json.loads(out)
    assert (got["zero"], got["sp"]) == (zero, sp)


def test_the_megatron_export_gives_the_rope_base_of_the_model(tmp_path):
    """Llama 3's RoPE base is 500,000 (its config.json; Megatron-LM's default is 10,000)."""
    path = tmp_path / "p.json"
    code, _, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                       "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len", 4096,
                       "--save", path)
    assert code == 0, err
    code, out, err = cli("export", path, "--format", "megatron")
    assert code == 0 and "--rotary-base 500000" in out, err


def test_a_relative_file_name_is_the_file_in_the_working_directory(tmp_path, monkeypatch):
    """The cache keys a path as resolved: the same relative name elsewhere is another file."""
    for folder, name in (("a", "first"), ("b", "second")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mine.toml").write_text(f'base = "megatron-core"\nname = "{name}"\n')
    monkeypatch.chdir(tmp_path / "a")
    assert get_stack("mine.toml").name == "first"
    monkeypatch.chdir(tmp_path / "b")
    assert get_stack("mine.toml").name == "second"


def test_nest_finds_torchtitan_moe_plans_that_need_a_sharded_zero():
    """Experts over 8 ranks with tp = cp = 1 need FSDP-sharded data parallelism on torchtitan:
    the search had checked each shape with ZeRO-0 and dropped them all ("no configuration fits")."""
    from nestplan.search.constraints import Constraints
    from nestplan.search.methods import run_method

    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256,
                             stack="torchtitan")
    best = run_method("nest", sc, Constraints(tp=1, cp=1, ep=8), top=1).best
    assert best.plan.ep == 8 and best.plan.zero in (2, 3)


def test_save_through_a_link_to_a_file_yet_to_be_made(tmp_path):
    link, target = tmp_path / "p.json", tmp_path / "plans" / "p.json"
    target.parent.mkdir()
    link.symlink_to(target)
    code, _, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                       "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len", 4096,
                       "--save", link)
    assert code == 0 and target.is_file(), err
    assert [p.name for p in target.parent.iterdir()] == ["p.json"]  # no probe left behind


def test_transformers_v5_configs_give_rope_theta_under_rope_parameters(tmp_path):
    from nestplan.hf import model_from_hf_config

    cfg = json.loads((Path(__file__).parent / "data" / "qwen3-30b-a3b.json").read_text())
    theta = cfg.pop("rope_theta")
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert model_from_hf_config(path).rope_theta == theta == 1e6


def test_a_searched_plan_is_reproduced_by_the_flags_it_prints():
    """The plan line gives an uneven split as --stage-layers, which evaluate takes (the searched
    plan had been 11.1 s and the same printed degrees 15.8 s under evaluate's even split)."""
    scenario = ["--model", "llama3-70b", "--cluster", "dgx-h100-ndr", "--gpus", 64, "--seq-len",
                4096, "--global-batch", 256]
    code, out, err = cli("plan", *scenario, "--top", 1, "--pp", 4, "--json")
    assert code == 0, err
    best = json.loads(out)  # the best plan's evaluation, with the search's statistics
    code, out, err = cli("plan", *scenario, "--top", 1, "--pp", 4)
    line = next(x for x in out.splitlines() if x.startswith("plan: "))
    flags = []
    for item in line.removeprefix("plan: ").split("  (")[0].split():
        key, value = item.split("=")
        if key == "sp":
            flags.append("--sp" if value == "on" else "--no-sp")
        elif key not in ("dp", "etp") and not (key == "schedule" and value == "1f1b"):
            flags += [f"--{key}", value]
    code, out, err = cli("evaluate", *scenario, *flags, "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)


def test_per_step_host_time_is_its_own_part():
    from nestplan.evaluate import evaluate

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=8)
    ev = evaluate(sc, Parallelism(tp=1, dp=8, zero=1, mbs=1))
    assert ev.time.step_host == sc.stack.step_overhead > 0
    assert ev.time.optimizer < sc.stack.step_overhead  # the optimizer step alone


def test_a_scale_up_domain_that_does_not_divide_the_job_is_noted(tmp_path):
    cluster = tmp_path / "nvl72.toml"
    cluster.write_text('name = "nvl72"\naccelerator = "gb200"\n[[levels]]\nname = "nvlink"\n'
                       'size = 72\nbandwidth_GBps = 900\nlatency_us = 3\n[[levels]]\n'
                       'name = "net"\nbandwidth_GBps = 50\nlatency_us = 10\n')
    notes = {}
    for gpus in (128, 144):
        code, out, err = cli("evaluate", "--model", "llama3-8b", "--cluster", cluster, "--gpus",
                             gpus, "--tp", 8, "--pp", 1, "--mbs", 1, "--global-batch", 144 * 8,
                             "--seq-len", 4096)
        assert code == 0, err
        notes[gpus] = "groups straddle domains" in err
    assert notes == {128: True, 144: False}


def test_json_gives_no_expert_tp_for_a_dense_model():
    code, out, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus",
                         8, "--tp", 2, "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len",
                         4096, "--json")
    assert code == 0 and json.loads(out)["etp"] is None, err


def test_export_checks_its_extra_files_before_writing_any(tmp_path):
    plan = tmp_path / "p.json"
    code, _, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 16,
                       "--tp", 2, "--pp", 1, "--cp", 2, "--mbs", 1, "--global-batch", 16,
                       "--seq-len", 4096, "--rank-order", "tp-dp-cp-pp", "--save", plan)
    assert code == 0, err
    (tmp_path / "run.args.ranks.csv").mkdir()  # the rank map cannot be written there
    code, _, err = cli("export", plan, "--format", "megatron", "-o", tmp_path / "run.args")
    assert code == 2 and "run.args.ranks.csv'; a directory" in err, err
    assert not (tmp_path / "run.args").exists()  # nothing half-written


def test_the_closest_policy_of_another_stack():
    """Across stacks a policy maps to the same rule, else the same kind, else the other partial
    kind (Megatron's modules and torchtitan's per-op selective stand in for each other), every:N
    to full; nothing when the other stack has none of those."""
    from nestplan.recompute import Policy, closest

    titan = get_stack("torchtitan").recompute
    core = get_stack("megatron-core").recompute
    deepspeed = get_stack("deepspeed").recompute
    assert closest(Policy("x", "modules:core_attn"), core).name == "selective"
    assert closest(Policy("x", "modules:mlp"), core).name == "selective"  # same kind
    assert closest(Policy("x", "modules:core_attn"), titan).name == "selective"
    assert closest(Policy("x", "matmul-outputs"), core).name == "selective"
    assert closest(Policy("x", "every:2"), titan).name == "full"
    assert closest(Policy("x", "none"), deepspeed).name == "none"
    assert closest(Policy("x", "matmul-outputs"), deepspeed) is None


_TITAN_RUNS = ("id,model,gpu,cluster,num_gpus,tp,seq_len,global_batch,micro_batch,recompute,stack,"
               "metric,step_time_s,other_metrics\n" + """\
tt_8b_fsdp8,llama3-8b,,dgx-h100-ndr,8,1,8192,8,1,selective,torchtitan,step_time,{first},peak_memory_gib=47.3
tt_8b_fsdp64,llama3-8b,,dgx-h100-ndr,64,1,8192,64,1,selective,torchtitan,step_time,1.26,
tt_70b_fsdp8_tp8,llama3-70b,,dgx-h100-ndr,64,8,8192,16,2,full,torchtitan,step_time,3.95,peak_memory_gib=27.9
tt_70b_fsdp64,llama3-70b,,dgx-h100-ndr,64,1,8192,64,1,full,torchtitan,step_time,9.10,peak_memory_gib=54.1
tt_70b_fsdp32_tp4,llama3-70b,,dgx-h100-ndr,128,4,8192,32,1,full,torchtitan,step_time,3.55,
""")
"""Five made-up torchtitan runs of a user trial, at one sequence length, three with peaks."""


def test_calibrate_weighs_a_plan_once_and_fits_what_the_rows_tell_apart(tmp_path):
    """Rows at one sequence length fit no attention multiplier; a plan measured many times weighs
    one row (a trial's 200 copies had outweighed the prior); the allocator share is the least
    squares one, so the memory rows' squared errors do not grow; a row in the wrong unit is
    named by its leave-one-out error."""
    from nestplan import calibrate as C

    path = tmp_path / "runs.csv"
    path.write_text(_TITAN_RUNS.format(first="1.22"))
    cases = load_cases(path)
    assert "attention_scale" not in C._names(cases, get_stack("torchtitan"))
    one = C.fit(cases, get_stack("torchtitan"), leave_one_out=False)
    many = C.fit(cases + [replace(cases[1], id=f"copy{i}") for i in range(20)],
                 get_stack("torchtitan"), leave_one_out=False)
    for k, v in one.params.items():
        assert many.params[k] == pytest.approx(v, rel=0.02), k
    before = sum(e * e for e in one.memory_before if e is not None)
    after = sum(e * e for e in one.memory_after if e is not None)
    assert after <= before
    path.write_text(_TITAN_RUNS.format(first="12.2"))  # milliseconds / 100: a slip
    code, out, err = cli("calibrate", path, "-o", tmp_path / "m.toml")
    assert code == 1 and "fitted without it, each of these rows is predicted far off: " \
        "tt_8b_fsdp8 -" in err, err
    assert "x the base's" in out and "allocator_overhead 0." in out
    assert " of the activation and working bytes" in out
    assert "measured peaks are" not in err
    # a peak far above the others' fit is named with the rest it pulls (a user trial's outlier
    # moved a good row from -8 % to +14 % without a word)
    path.write_text(_TITAN_RUNS.format(first="1.22").replace("peak_memory_gib=27.9",
                                                             "peak_memory_gib=60.0"))
    code, out, err = cli("calibrate", path, "-o", tmp_path / "m2.toml")
    assert code == 1 and "measured peaks are still beyond 10% (" in err, err
    assert "tt_70b_fsdp8_tp8" in err.split("measured peaks are still beyond")[1]


def test_calibrate_says_when_its_fit_explains_nothing_or_hits_the_peak(tmp_path, runs_csv):
    """A row measured 6 times faster than predicted is fitted with every efficiency at the
    accelerator's peak and still far off: calibrate says both (a user trial's 4x fit had gone
    without a word, and plans with it at 99 % MFU); a row it explains gets neither note."""
    code, out, err = cli("calibrate", runs_csv(), "-o", tmp_path / "ok.toml")
    assert code == 0 and "still beyond" not in err and "to the cap" not in err, err
    fast = float(runs_csv.row["step_time_s"]) / 6
    code, out, err = cli("calibrate", runs_csv(step_time_s=f"{fast:.4f}"), "-o",
                         tmp_path / "fast.toml")
    # exit 1 where the fit leaves rows out of validate's tolerance, as validate's (a fuzzing
    # trial: 495 % off had exited 0); the file is written all the same
    assert code == 1, err
    assert out.splitlines()[-1].startswith("after the fit, tolerance: every row within 15%, "
                                           "mean within 7%: FAILED (1 row over, mean ")
    assert (tmp_path / "fast.toml").exists()
    assert "after the fit 1 of 1 rows are still beyond 15%" in err
    assert "to the cap of the accelerator's peak" in err
    assert "the fit moves" not in err  # at the cap: said so instead
    # a row 3 times slower is fitted, with efficiencies a third of the base's: said to be more
    # likely a miss the multiplier absorbs (a user trial's MoE rows had fitted attention at
    # 0.275x without a word, and dense plans then ran 2.5 times slower)
    slow = float(runs_csv.row["step_time_s"]) * 3
    code, out, err = cli("calibrate", runs_csv(step_time_s=f"{slow:.4f}"), "-o",
                         tmp_path / "slow.toml")
    assert code == 0 and "still beyond" not in err, err
    assert "the fit moves matmul_scale to 0.34" in err and "x the base's (megatron-2021's)" in err


_CALIBRATING_USER = """\
id,model,gpu,num_gpus,tp,pp,dp,cp,zero_stage,sequence_parallel,recompute,seq_len,micro_batch,\
global_batch,precision,metric,step_time_s,other_metrics,stack
tt_8b_fsdp8,llama3-8b,H100-SXM5-80GB,8,1,1,8,1,3,,selective,8192,2,16,bf16,step_time,2.95,,torchtitan
tt_70b_fsdp8_tp8,llama3-70b,H100-SXM5-80GB,64,8,1,8,1,3,true,full,8192,4,32,bf16,step_time,{s70},,\
torchtitan
"""
"""Two made-up torchtitan rows of a calibrating user's trial (its 70B step given as ``s70``)."""


def test_calibrate_says_what_its_fit_made_worse_and_every_wide_multiplier(tmp_path):
    """A row within the tolerance before the fit and beyond it after is said so, not "still"
    beyond; a fit that leaves the rows' mean |error| worse than the base's says so; a multiplier
    moved beyond twice the base's is said whatever another does at its cap (a calibrating
    user's trial: the attention at 3.25x had gone unsaid beside a memory share at its cap)."""
    path = tmp_path / "two.csv"
    path.write_text(_CALIBRATING_USER.format(s70="6.05"))
    code, out, err = cli("calibrate", path, "--stack", "torchtitan", "-o", tmp_path / "a.toml")
    assert code == 1, err
    assert ("the fit takes 1 of 2 rows beyond 15% that were within it on torchtitan "
            "(tt_70b_fsdp8_tp8)") in err and "still beyond 15%" not in err, err
    assert "the fit leaves the rows' mean |error| worse than torchtitan's" in err
    # a long-context row beside it, and the 70B step slipped 4 times: the attention and the
    # memory-bound kernels to their caps, and the GEMMs pulled far down, said too
    path.write_text(_CALIBRATING_USER.format(s70="24.2") + "tt_8b_cp2_32k,llama3-8b,"
                    "H100-SXM5-80GB,8,1,1,4,2,3,,full,32768,1,4,bf16,step_time,4.75,,torchtitan\n")
    code, out, err = cli("calibrate", path, "--stack", "torchtitan", "-o", tmp_path / "b.toml")
    assert code == 1 and "to the cap of the accelerator's peak" in err, err
    assert "the fit moves matmul_scale to 0.2" in err, err


def test_a_calibrated_stack_says_when_a_plan_is_far_from_its_runs_size_or_kind(tmp_path):
    """The file records its rows' device counts and kinds of model; a plan on more than twice
    (or under half) their GPUs, or on a model of the other kind, is noted (a calibrating user's
    trial: a fit on 8-64 GPU dense runs moved a 512-GPU plan and an MoE model's without a
    word); one within them is not."""
    path = tmp_path / "two.csv"
    path.write_text(_CALIBRATING_USER.format(s70="6.05"))
    code, out, err = cli("calibrate", path, "--stack", "torchtitan", "-o", tmp_path / "one.toml")
    assert code == 1, err
    text = (tmp_path / "one.toml").read_text()
    assert "fitted_gpus = [8, 64]" in text and 'fitted_kinds = ["dense"]' in text
    moe = ["evaluate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ndr", "--gpus", 512,
           "--tp", 2, "--pp", 1, "--ep", 8, "--mbs", 1, "--global-batch", 1024, "--seq-len", 8192,
           "--recompute", "full", "--stack", tmp_path / "one.toml"]
    code, out, err = cli(*moe)
    assert code == 0, err
    assert ("stack one was calibrated on runs of 8 to 64 GPUs; on 512 its groups reach the "
            "spine level, beyond the runs' leaf on this cluster") in err, err
    assert "stack one was calibrated on dense models' runs only; mixtral-8x7b's experts" in err
    code, out, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus",
                         16, "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 64, "--seq-len",
                         8192, "--zero", 3, "--stack", tmp_path / "one.toml")
    assert code == 0 and "was calibrated on" not in err, err
    # validate of other runs with it names the rows beyond its runs, by how (it had said nothing
    # of them: a Composer trial's)
    other = tmp_path / "other.csv"
    other.write_text(_CALIBRATING_USER.format(s70="6.05").replace(",torchtitan\n", ",\n")
                     + "tt_8b_a100,llama3-8b,A100-SXM4-80GB,8,1,1,8,1,3,,selective,8192,2,16,"
                     "bf16,step_time,6.1,,\ntt_8b_64k,llama3-8b,H100-SXM5-80GB,8,1,1,4,2,3,,full,"
                     "65536,1,4,bf16,step_time,12.0,,\n")
    code, out, err = cli("validate", "--csv", other, "--stack", tmp_path / "one.toml")
    assert ("2 of 4 rows lie beyond the runs their stack was calibrated on, which evaluate and "
            "plan say of such a scenario (sequence length: tt_8b_64k; accelerator: tt_8b_a100)"
            ) in err, err
    code, out, err = cli("validate", "--csv", path, "--stack", tmp_path / "one.toml")
    assert "beyond the runs their stack" not in err, err


def test_the_calibration_size_note_counts_the_levels_a_plan_crosses():
    """A fit on one 8-GPU node used on 16 GPUs, within twice its count, is noted: the plan
    crosses the network, which its runs did not (a review's); a plan on far fewer GPUs than the
    runs' is noted as such."""
    import warnings

    from nestplan.notes.plan import beyond_calibration

    def said(fitted: tuple[int, int], gpus: int) -> list[str]:
        st = replace(get_stack("torchtitan"), name="mine", fitted_gpus=fitted)
        sc = replace(scenario_from_names("llama3-8b", "dgx-h100-ndr", gpus, seq_len=8192,
                                         global_batch=64), stack=st)
        ev = evaluate(sc, Parallelism(tp=1, pp=1, dp=gpus, zero=3, mbs=1))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            beyond_calibration(ev)
        return [str(w.message) for w in caught if "GPUs" in str(w.message)]

    assert said((8, 8), 16) == ["stack mine was calibrated on runs of 8 GPUs; on 16 its groups "
                                "reach the leaf level, beyond the runs' nvlink on this cluster, "
                                "and what the fit gave the runs' mix of compute and "
                                "communication may not carry (calibrate on runs nearer this "
                                "size)"]
    assert said((8, 32), 16) == [] and said((64, 64), 32) == []
    assert "on 16 communication weighs less than in them" in said((64, 64), 16)[0]


def test_calibrate_records_its_rows_and_says_what_it_filled_in(tmp_path, runs_csv):
    """The fitted file's comments give each row's measured step and its error before and after
    (``fitted_on`` names the rows only); rows read with a value they do not give, the default
    stack or bf16, are named in a note (a user trial found them filled in silently)."""
    code, out, err = cli("calibrate", runs_csv(precision=""), "-o", tmp_path / "one.toml")
    assert code == 0, err
    measured = float(runs_csv.row["step_time_s"])
    comments = [ln for ln in (tmp_path / "one.toml").read_text().splitlines() if ln.startswith("#")]
    row = next(ln for ln in comments if "nar21-t1-1p7b" in ln)
    before, after = (float(x.strip(" %")) for x in row.split(" s, ")[1].split("->"))
    assert f"{measured:.4f} s" in row and abs(after) < abs(before)
    assert "1 row (nar21-t1-1p7b) gives no precision: read as bf16" in err
    assert "name no stack" not in err and "names no stack" not in err  # its source names one
    code, out, err = cli("calibrate", runs_csv(source="my cluster", precision="bf16"), "-o",
                         tmp_path / "two.toml")
    assert code == 0, err
    assert ("1 row (nar21-t1-1p7b) names no stack (a stack column) and no source a catalog stack "
            "names: read as run on megatron-core, the default") in err
    assert "no precision" not in err


def test_calibrate_names_the_given_stack_when_it_cannot_run_a_row(tmp_path, runs_csv):
    """``calibrate --stack X`` on a row X cannot run (TP on DeepSpeed's stack) blames X, not the
    row (which ran that plan); a row wrong on its own stack keeps its own error."""
    code, out, err = cli("calibrate", runs_csv(tp="2", dp="16"), "--stack", "deepspeed", "-o",
                         tmp_path / "x.toml")
    assert one_line_error(code, out, err, "runs.csv line 2 (nar21-t1-1p7b): --stack: got "
                          "'deepspeed'; cannot run this row's plan (tp: got 2; stack deepspeed has "
                          "no tensor parallelism); give a stack that runs every row")
    code, out, err = cli("calibrate", runs_csv(tp="3"), "--stack", "deepspeed", "-o",
                         tmp_path / "x.toml")
    assert code == 2 and "--stack: got" not in err and "(nar21-t1-1p7b)" in err, err
    assert not (tmp_path / "x.toml").exists()


def test_calibrate_replaces_no_file_its_rows_name(tmp_path, runs_csv):
    """calibrate -o may not replace a cluster, model or stack file that a row of its runs CSV
    names (a user trial's -o had replaced the rows' cluster file, which validate then refused)."""
    cluster = tmp_path / "jz.toml"
    cluster.write_text((Path(__file__).parent / "data" / "jean-zay-a100-opa.toml").read_text())
    runs = runs_csv(cluster="jz.toml")
    code, out, err = cli("validate", "--csv", runs)
    assert code in (0, 1), err
    before = cluster.read_text()
    code, out, err = cli("calibrate", runs, "-o", cluster)
    assert code == 2 and "a file its rows name" in err and len(err.strip().splitlines()) == 1
    assert cluster.read_text() == before


def test_a_plan_file_of_before_tp_overlap_beyond_domain_keeps_torchtitans_none():
    """Plan files store their stack whole, without a base: one saved before the key existed
    reads a torchtitan stack's as none (torch's async TP pairs NVLink peers only), not the
    default, which had costed a TP 16 plan 6.7 % faster (a reviewer's); so does a torchtitan
    stack of the user's own name."""
    from nestplan.planfile import saved_stack

    table = stack_to_table(get_stack("torchtitan-float8-asynctp"))
    assert table.pop("tp_overlap_beyond_domain") == "none"
    assert saved_stack(table).tp_overlap_beyond_domain.value == "none"
    assert saved_stack({**table, "name": "my-titan"}).tp_overlap_beyond_domain.value == "none"
    core = stack_to_table(get_stack("megatron-core"))
    del core["tp_overlap_beyond_domain"]
    assert saved_stack(core).tp_overlap_beyond_domain.value == "backward"
    assert saved_stack({**core, "name": "mine"}).tp_overlap_beyond_domain.value == "backward"


def test_a_plan_file_of_before_tp_keeps_gathered_input_reads_as_torchtitan_does():
    """A torchtitan stack saved before tp_keeps_gathered_input existed keeps its TP linears'
    gathered inputs, as torchtitan does (the catalog's, with no note that it differs; and one of
    the user's own name); another stack keeps the default, Megatron-Core's shard."""
    from nestplan.planfile import saved_stack

    for name in ("torchtitan", "torchtitan-float8-asynctp"):
        table = stack_to_table(get_stack(name))
        assert table.pop("tp_keeps_gathered_input") is True
        assert saved_stack(table) == get_stack(name)
        assert saved_stack({**table, "name": "my-titan"}).tp_keeps_gathered_input is True
    core = stack_to_table(get_stack("megatron-core"))
    assert core.pop("tp_keeps_gathered_input") is False
    assert saved_stack(core).tp_keeps_gathered_input is False
    assert saved_stack({**core, "name": "mine"}).tp_keeps_gathered_input is False


def test_a_whole_torchtitan_stack_file_of_before_the_later_keys_reads_as_torchtitan(tmp_path):
    """A stack file without a base (as ``list stacks`` prints one), written before the TP keys
    existed under a name of the user's, reads them as torchtitan does, as a plan file's stack
    does (it had taken Megatron-Core's defaults: a reviewer's)."""
    from nestplan.tomlfmt import document

    table = stack_to_table(get_stack("torchtitan"))
    for key in ("tp_overlap_beyond_domain", "tp_keeps_gathered_input", "interleaved_rounds"):
        del table[key]
    path = tmp_path / "mytitan.toml"
    path.write_text(document({**table, "name": "mytitan"}))
    mine = get_stack(str(path))
    assert mine.tp_keeps_gathered_input is True
    assert mine.tp_overlap_beyond_domain.value == "none"
    assert mine.interleaved_rounds == "pp"  # (every stack's then)


def test_a_plan_files_stack_without_keys_added_since_reads_as_its_catalog_stack():
    """A plan file saved before keys were added to stacks (seventeen since plan files held one)
    loads its catalog stack's values for them; a stack of the user's own name without a key is
    refused (it had taken the generic default under its own name: a fifth fuzzing round's), and
    a whole DeepSpeed stack without expert_layer_injected reads it as its export did then (no
    TP axis: AutoEP)."""
    from nestplan import planfile

    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    for name in ("megatron-core", "deepspeed"):
        plan = Parallelism(tp=1, pp=1, dp=16, ep=8, etp=1, zero=1, mbs=1)
        ev = evaluate(replace(sc, stack=get_stack(name)), plan)
        data = planfile.to_dict(ev)
        for key in ("pipeline_bf16_optimizer", "expert_tp_with_ep", "loss_saved_bytes",
                    "expert_layer_injected"):
            del data["stack"][key]
        assert planfile.from_dict(data).scenario.stack == get_stack(name)
        data["stack"]["name"] = "mine"
        with pytest.raises(SpecError, match="stack.expert_tp_with_ep: missing; a plan "
                                            "file holds a stack of its own whole"):
            planfile.from_dict(data)
    mine = stack_to_table(get_stack("deepspeed"))
    del mine["expert_layer_injected"]
    assert stack_from_table(later_keys_filled({**mine, "name": "my-ds"})).expert_layer_injected
    # the fp8 weight keys (2026-12-04): a stack of the user's own name saved before them loads
    # with the defaults, what every stack did then (a reviewer: it had been refused)
    ev = evaluate(sc, Parallelism(tp=1, pp=1, dp=16, ep=8, etp=1, zero=1, mbs=1))
    data = planfile.to_dict(ev)
    data["stack"]["name"] = "mine"
    for key in ("fp8_weight_cache_bytes", "fp8_primary_weights"):
        del data["stack"][key]
    old = planfile.from_dict(data).scenario.stack
    assert (old.fp8_weight_cache_bytes, old.fp8_primary_weights) == (0.0, False)


def test_a_comparison_row_may_state_an_mfu_above_one():
    """Model FLOPs count causal attention whole, so MFU can exceed 1 (``Evaluation.mfu``); a
    compared plan's row keeps such a figure, up to twice the peak."""
    from nestplan import planfile
    from nestplan.cli import _top_entry

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=8)
    ev = evaluate(sc, Parallelism(tp=1, pp=1, dp=8, zero=1, mbs=1))
    row = {"method": "manual", **_top_entry(ev), "search_seconds": 0.1}
    for mfu, ok in ((1.2, True), (planfile.MOST_MFU + 0.1, False)):
        # (its step and tokens/s as that MFU gives them: the row's figures must agree; a file of
        # no method's plan, so that no row is held to be the fastest's)
        step = ev.step_time * ev.mfu / mfu
        faster = {**row, "mfu": mfu, "step_time_s": step, "tokens_per_s": 8 * 4096 / step}
        data = planfile.to_dict(ev, None, {"methods": [faster], "errors": {}})
        if ok:
            assert planfile.from_dict(data).comparison["methods"][0]["mfu"] == mfu
        else:
            with pytest.raises(SpecError, match="must be a share of the peak FLOP/s, at most 2"):
                planfile.from_dict(data)


def test_a_plan_file_of_before_a_schedule_needed_a_pipeline_still_loads(tmp_path):
    """Files of before 2026-12-03 named a schedule for plans without a pipeline too: such a file
    loads, with a note that the schedule is read as none (a reviewer's)."""
    saved = tmp_path / "p.json"
    code, out, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus",
                         8, "--tp", 8, "--pp", 1, "--mbs", 1, "--global-batch", 64, "--seq-len",
                         4096, "--save", saved)
    assert code == 0, err
    data = json.loads(saved.read_text())
    data["plan"]["schedule"] = "gpipe"
    saved.write_text(json.dumps(data))
    code, out, err = cli("evaluate", "--plan", saved, "--json")
    assert code == 0, err
    assert "plan.schedule gpipe is read as none: the plan has no pipeline (pp = 1)" in err
    assert json.loads(out)["schedule"] is None


def test_a_plan_file_of_before_interleaved_rounds_reads_as_its_catalog_stack(tmp_path):
    """A plan file saved before interleaved_rounds existed has no such key in its stack: a
    torchtitan one reads as the catalog's torchtitan (torch's rounds), with no note that it
    differs (a reviewer's); a stack of the user's own name keeps the default, rounds of pp."""
    import json

    saved = tmp_path / "p.json"
    code, out, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                         "--gpus", "8", "--tp", "2", "--pp", "4", "--vp", "2", "--mbs", "1",
                         "--global-batch", "8", "--seq-len", "4096", "--stack", "torchtitan",
                         "--save", saved)
    assert code == 0, err
    data = json.loads(saved.read_text())
    assert data["stack"].pop("interleaved_rounds") == "floor"
    saved.write_text(json.dumps(data))
    code, out, err = cli("evaluate", "--plan", saved, "--json")
    assert code == 0 and "is not this nestplan's catalog" not in err, err
    assert json.loads(out)["stack"] == "torchtitan"
    data["stack"]["name"] = "my-titan"
    saved.write_text(json.dumps(data))
    from nestplan.planfile import load

    assert load(saved).scenario.stack.interleaved_rounds == "pp"


def test_calibrate_drafts_under_a_name_no_file_it_reads_has(tmp_path, runs_csv):
    """The draft had a fixed name beside -o: a base stack file of that name was overwritten and
    then deleted (a reviewer's)."""
    base = tmp_path / ".fit.draft.toml"
    base.write_text('base = "megatron-2021"\nname = "mine"\n')
    code, out, err = cli("calibrate", runs_csv(), "--stack", base, "-o", tmp_path / "fit.toml")
    assert code == 0, err
    assert base.read_text() == 'base = "megatron-2021"\nname = "mine"\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fit.draft.toml", "fit.toml",
                                                         "runs.csv"]


def test_calibrate_writes_its_file_with_the_mode_a_new_file_gets(tmp_path, runs_csv):
    """The fitted file was the temporary draft renamed, readable by its owner alone (0600, a
    fuzzing helper's); it takes the umask's mode, and a file it replaces keeps its own."""
    out = tmp_path / "fit.toml"
    umask = os.umask(0o022)
    try:
        code, out_text, err = cli("calibrate", runs_csv(), "-o", out)
        assert code == 0, err
        assert out.stat().st_mode & 0o777 == 0o644
        out.chmod(0o640)
        code, out_text, err = cli("calibrate", runs_csv(), "-o", out)
        assert code == 0, err
        assert out.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(umask)


def test_validate_says_when_stack_sets_the_rows_own_aside(runs_csv):
    """validate --stack, like calibrate --stack, says which of the rows' own stacks it sets aside
    (a user trial's variant stack had been replaced without a word); the rows' own stack given
    again gets no note."""
    runs = runs_csv()
    code, out, err = cli("validate", "--csv", runs, "--stack", "nemo")
    assert code in (0, 1), err
    assert ("the rows' own stacks (megatron-2021) are set aside: the rows are predicted as "
            "--stack nemo") in err
    code, out, err = cli("validate", "--csv", runs, "--stack", "megatron-2021")
    assert code in (0, 1) and "set aside" not in err, err
    # rows that name no stack have none of their own to set aside (the default had been named)
    code, out, err = cli("validate", "--csv", runs_csv(id="r1", source="mine"), "--stack", "nemo")
    assert code in (0, 1) and "set aside" not in err, err


def test_every_n_is_bounded_by_the_most_blocks_a_model_may_have():
    """``every:N`` beyond any model's block count is refused (the bound is ``specs.MAX_LAYERS``,
    restated in recompute, which specs imports)."""
    from nestplan.recompute import MAX_EVERY, parse_rule
    from nestplan.specs import MAX_LAYERS

    assert MAX_EVERY == MAX_LAYERS
    assert parse_rule("r", f"every:{MAX_LAYERS}") == f"every:{MAX_LAYERS}"
    with pytest.raises(SpecError):
        parse_rule("r", f"every:{MAX_LAYERS + 1}")


def test_a_float8_stack_at_bf16_says_so():
    """A stack whose behaviour is fp8's (its all-gathers move fp8) says, when the run is bf16,
    that it is costed as bf16 (a user trial's Float8 stack had been, without a word); at fp8, or
    on a stack without fp8 gathers, nothing is said."""
    args = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8, "--tp", 1,
            "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len", 2048, "--zero", 3]
    said = "stack torchtitan-float8 moves fp8 in its all-gathers in fp8 training; this run is bf16"
    code, out, err = cli(*args, "--stack", "torchtitan-float8")
    assert code == 0 and said in err, err
    code, out, err = cli(*args, "--stack", "torchtitan-float8", "--precision", "fp8")
    assert code == 0 and "this run is bf16" not in err, err
    code, out, err = cli(*args, "--stack", "torchtitan")
    assert code == 0 and "this run is bf16" not in err, err


def test_a_stack_fitted_on_no_run_says_so():
    """evaluate and plan say when the stack was fitted on no measured run (deepspeed's figures
    had read as firmly as megatron-core's: a user trial's); a calibrated stack says nothing."""
    assert not get_stack("deepspeed").fitted_on and get_stack("megatron-core").fitted_on
    scenario = ["--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                "--global-batch", 8, "--seq-len", 2048]
    plan = ["--tp", 1, "--pp", 1, "--mbs", 1, "--zero", 3]
    said = "stack deepspeed was fitted on no measured run of its own"
    for command in (["evaluate", *scenario, *plan], ["plan", *scenario, "--zero", 3]):
        code, out, err = cli(*command, "--stack", "deepspeed")
        assert code == 0 and said in err, err
        code, out, err = cli(*command, "--stack", "megatron-core")
        assert code == 0 and "fitted on no measured run" not in err, err


def test_attention_within_packed_documents_is_a_flag(tmp_path):
    """--attention-span costs attention within documents of N tokens (torchtitan 0.3 masks every
    document; a user trial could state it only in a runs CSV): the step shortens, the header and
    the JSON say it, a saved plan keeps it, and the torchtitan export asks for it only when the
    plan assumes documents that fill the sequence."""
    base = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
            "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 64, "--seq-len", 32768,
            "--stack", "torchtitan", "--zero", 3, "--recompute", "full"]
    steps = {}
    for span in (None, 2048):
        flags = [] if span is None else ["--attention-span", span]
        code, out, err = cli(*base, *flags, "--json")
        assert code == 0, err
        js = json.loads(out)
        assert js["attention_span"] == span
        steps[span] = js["step_time_s"]
        saved = tmp_path / f"{span}.json"
        code, out, err = cli(*base, *flags, "--save", saved)
        assert code == 0 and ("attention within documents of 2,048 tokens" in out) == bool(span)
        code, out, err = cli("evaluate", "--plan", saved, "--json")
        assert code == 0 and json.loads(out)["step_time_s"] == pytest.approx(steps[span])
        code, _, err = cli("export", saved, "--format", "torchtitan", "-o", tmp_path / "t.args")
        asked = "masks attention per document" in (tmp_path / "t.args").read_text()
        assert code == 0 and asked == (span is None), err
    assert steps[2048] < 0.6 * steps[None]
    # a span that is not below the sequence changes nothing, and says so (a user trial's)
    code, out, err = cli(*base, "--attention-span", 40000, "--json")
    assert code == 0 and json.loads(out)["step_time_s"] == pytest.approx(steps[None])
    assert "--attention-span 40000 is not below the sequence (32768)" in err


def test_torchtitan_moe_layers_wait_on_the_host_as_its_dispatcher_syncs():
    """torchtitan's all-to-all dispatcher copies the token counts to the host every MoE layer
    under expert parallelism,
    as Megatron-Core's and DeepSpeed's do: a small MoE plan waits on the host there too (its
    wait had been 0, a third faster than DeepSpeed's for the same eager exchange)."""
    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64,
                             stack="torchtitan")
    ev = evaluate(sc, Parallelism(tp=1, pp=1, dp=16, ep=16, etp=1, zero=3, mbs=1))
    assert ev.time.host > 0.1 * ev.step_time
    # at EP 1 it reorders tokens locally, the counts on the device: no wait (a review's), where
    # Megatron-Core's dispatcher still copies them to the host
    local = Parallelism(tp=1, pp=1, dp=16, ep=1, etp=1, zero=3, mbs=1)
    assert evaluate(sc, local).time.host == 0.0
    mcore = replace(sc, stack=get_stack("megatron-core"))
    assert evaluate(mcore, local.with_(zero=1)).time.host > 0.0


def test_megatron_and_deepspeed_exports_say_what_a_document_span_needs(tmp_path):
    """A plan costed with --attention-span exports for Megatron-LM and DeepSpeed with a note
    naming how that framework masks per document and the step over the whole sequence (a review:
    the Megatron export quoted the per-document step without a word)."""
    saved = tmp_path / "p.json"
    base = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
            "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 64, "--seq-len", 32768,
            "--recompute", "full"]
    code, out, err = cli(*base, "--json")
    whole = json.loads(out)["step_time_s"]
    assert cli(*base, "--attention-span", 2048, "--save", saved)[0] == 0
    for fmt, words in (("megatron", "the export asks Megatron-LM to mask attention per document "
                                    "(--dataloader-inter-document-masking"),
                       ("deepspeed", "your model code must mask it per document")):
        code, _, err = cli("export", saved, "--format", fmt, "-o", tmp_path / fmt)
        assert code == 0 and words in err, err
        assert f"the step is predicted at {whole:.3f} s (stack megatron-core's" in err, err
    # the Megatron launch carries the flag (a long-context trial's had left it to the user); a
    # plan over whole sequences does not
    assert "--dataloader-inter-document-masking" in (tmp_path / "megatron").read_text().split()
    assert cli(*base, "--save", tmp_path / "w.json")[0] == 0
    assert cli("export", tmp_path / "w.json", "--format", "megatron", "-o", tmp_path / "w")[0] == 0
    assert "--dataloader-inter-document-masking" not in (tmp_path / "w").read_text()
    # with context parallelism, what TE then does with the documents (a review's)
    cp = [a if a != 8 else 32 for a in base] + ["--cp", 4]
    assert cli(*cp, "--attention-span", 2048, "--save", tmp_path / "cp.json")[0] == 0
    code, out, err = cli("export", tmp_path / "cp.json", "--format", "megatron")
    assert code == 0 and ("--dataloader-inter-document-masking hands Transformer Engine each "
                          "document as a THD sub-sequence") in out, err


def test_torchtitan_keeps_its_weights_gathered_under_a_pipeline_by_default(tmp_path, runs_csv):
    """torchtitan's default reshard policy is `not pp_enabled` (get_fsdp_reshard_after_forward_
    policy, torchtitan/distributed/fsdp.py, 0.3.0 wheel): a plan or row that leaves the ZeRO stage
    out is ZeRO-3 without a pipeline and ZeRO-2 with one (a user trial: it had been ZeRO-3, a
    weight gather every micro-batch torchtitan does not make)."""
    st = get_stack("torchtitan")
    assert (st.default_zero_for(1), st.default_zero_for(2)) == (3, 2)
    assert get_stack("torchtitan-float8-asynctp").default_zero_for(8) == 2  # (its variants too)
    assert get_stack("megatron-core").default_zero_for(4) == 1
    # DeepSpeed ZeRO-3 of 2021 is ZeRO-3 where a plan does not say (a new user's trial got
    # DeepSpeed's own default, 0, and 2.6 TB a device), at most ZeRO-1 with its pipeline
    st = get_stack("deepspeed-2021")
    assert (st.default_zero_for(1), st.default_zero_for(2)) == (3, st.max_zero_with_pp) == (3, 1)
    scenario = ["--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", "16", "--tp", "1",
                "--mbs", "1", "--global-batch", "32", "--seq-len", "4096", "--stack", "torchtitan",
                "--json"]
    for pp, zero in ((1, 3), (2, 2)):
        code, out, err = cli("evaluate", *scenario, "--pp", pp)
        assert code == 0, err
        assert json.loads(out)["zero"] == zero
    (case,) = load_cases(Path(runs_csv(model="llama3-8b", **NO_SIZES, gpu="H100-SXM5-80GB",
                                       num_gpus="16", tp="1", pp="2", dp="8", zero_stage="",
                                       micro_batch="1", global_batch="32", seq_len="4096",
                                       stack="torchtitan")))
    assert case.plan.zero == 2
    # a file over it that sets its own default keeps it under PP too (a review's)
    ddp = tmp_path / "ddp.toml"
    ddp.write_text('base = "torchtitan"\nname = "ddp"\ndefault_zero = 0\n')
    code, out, err = cli("evaluate", *scenario[:-3], "--stack", ddp, "--pp", 2, "--json")
    assert code == 0 and json.loads(out)["zero"] == 0, err
    # a stack file's own default under PP must be a stage it runs there
    bad = tmp_path / "z.toml"
    bad.write_text('base = "deepspeed"\nname = "z"\ndefault_zero_with_pp = 3\n')
    assert one_line_error(*cli("evaluate", *scenario[:-3], "--stack", bad, "--pp", 2),
                          "default_zero_with_pp")


def test_validate_names_rows_whose_plans_it_puts_above_hbm(runs_csv):
    """A measured run whose plan the memory model puts above HBM (but within MOST_OVER_HBM) ran:
    validate says the model over-counts it or the row misstates it (a user trial: it had been
    listed without a word)."""
    code, out, err = cli("validate", "--csv", runs_csv(micro_batch="4", recompute="none"))
    assert "Traceback" not in err and code in (0, 1)
    assert "nar21-t1-1p7b's plan is predicted at 1.1" in err and "misstates its plan" in err
    code, out, err = cli("validate", "--csv", runs_csv())
    assert "above" not in err and "predicted at" not in err


def _two_gpus_csv(tmp_path, shared) -> Path:
    """Published runs' first row as it ran (A100) and again on H100s, 20 % faster."""
    with open(shared / "data" / "published_runs.csv", newline="") as f:
        reader = csv.DictReader(f)
        first, fields = next(reader), list(reader.fieldnames)
    path = tmp_path / "two.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerow(first)
        w.writerow(first | {"id": "on-h100", "gpu": "H100-SXM5-80GB",
                            "step_time_s": str(float(first["step_time_s"]) * 0.8)})
    return path


def test_calibrate_says_when_rows_span_accelerators(tmp_path, shared):
    code, out, err = cli("calibrate", _two_gpus_csv(tmp_path, shared), "--stack", "megatron-core",
                         "-o", tmp_path / "f.toml")
    assert code == 1, err
    assert "the rows ran on 2 accelerators (a100-sxm-80gb, h100-sxm-80gb)" in err


def test_calibrate_says_when_peaks_are_below_every_tensor(tmp_path, runs_csv):
    """A measured peak below what the model predicts with no allocator share fits a share of 0
    and says why the memory errors stay (a user trial: fitted silently)."""
    path = runs_csv()
    (case,) = load_cases(Path(path))
    ev = evaluate(case.scenario, case.plan)
    low = ev.peak_memory / 2**30 * 0.6
    code, out, err = cli("calibrate", runs_csv(other_metrics=f"peak_memory_gib={low:.1f}"),
                         "--stack", "megatron-2021", "-o", tmp_path / "m.toml")
    assert code == 1, err
    assert "allocator_overhead is 0" in err and "measured peaks are below" in err
    assert get_stack(str(tmp_path / "m.toml")).allocator_overhead == 0


def test_calibrate_tells_a_trade_between_efficiencies_from_rows_beyond_the_peak():
    """A fit that lowers one efficiency and takes another to the cap says the rows do not tell
    them apart, not that they ran beyond the peak (a user trial's rows ran 15 % slow)."""
    import warnings

    from nestplan.calibrate import Fit
    from nestplan.notes.runs import fit_limits

    base = get_stack("torchtitan")
    (case,) = [c for c in load_cases(DATA / "held_out_runs.csv") if c.id == "tt24_t4_70b_g256_2D"]
    acc = case.scenario.cluster.accelerator
    traded = replace(base, matmul_scale=base.matmul_scale * 0.8,
                     memory_scale=1.01 / acc.memory_efficiency)
    faster = replace(base, matmul_scale=base.matmul_scale * 1.1,
                     memory_scale=1.01 / acc.memory_efficiency)
    said = {}
    for name, st in (("traded", traded), ("faster", faster)):
        fit = Fit(st, {}, [0.0], [0.0], None, [None], [None], [None])
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fit_limits([case], fit, base)
        said[name] = " ".join(str(x.message) for x in w)
    assert "while it lowers matmul_scale" in said["traded"] and "beyond" not in said["traded"]
    assert "ran at or beyond what it allows" in said["faster"]


def test_calibrate_says_when_a_multiplier_moves_far_beyond_the_rows_errors():
    """A fitted efficiency moved much further than the farthest row was off (the kernels it
    stands for are a small share of those rows' steps) is said so, since it carries in full into
    workloads where they are the step (a user trial: host-bound MoE rows 12.7 % fast had fitted
    the GEMMs at 0.58x, a dense plan then 54 % slower, without a word); a move the errors account
    for is not."""
    import warnings

    from nestplan.calibrate import Fit
    from nestplan.notes.runs import fit_limits

    base = get_stack("megatron-core")
    (case,) = [c for c in load_cases(DATA / "held_out_runs.csv") if c.id == "tt24_t4_70b_g256_2D"]
    said = {}
    for factor in (0.6, 0.85):
        st = replace(base, matmul_scale=base.matmul_scale * factor)
        fit = Fit(st, {}, [-0.12], [0.0], None, [None], [None], [None])
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fit_limits([case], fit, base)
        said[factor] = " ".join(str(x.message) for x in w)
    assert "moves matmul_scale to 0.6x the base's to correct rows at most 12.0% off" in said[0.6]
    assert "the fit moves" not in said[0.85]
    # the MoE layers' host wait, which calibrate fits for MoE rows, is said of beyond 2x too
    fit = Fit(replace(base, moe_layer_host=base.moe_layer_host * 3), {}, [-0.12], [0.0], None,
              [None], [None], [None])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fit_limits([case], fit, base)
    assert "the fit moves moe_layer_host_ms to 3x the base's" in " ".join(
        str(x.message) for x in w)


_HOST_BOUND_MOE = """\
id,model,gpu,num_gpus,gpus_per_node,tp,pp,cp,ep,etp,zero_stage,sequence_parallel,recompute,\
micro_batch,global_batch,seq_len,precision,metric,step_time_s,stack
run1,qwen3-30b-a3b,H100-SXM5-80GB,16,8,1,2,1,8,1,1,no,none,1,512,4096,bf16,step_time,20.9,megatron-core
run2,qwen3-30b-a3b,H100-SXM5-80GB,16,8,2,1,1,8,1,1,yes,selective,2,512,4096,bf16,step_time,22.4,\
megatron-core
run3,qwen3-30b-a3b,H100-SXM5-80GB,16,8,1,1,1,16,1,1,no,full,2,512,4096,bf16,step_time,26.1,megatron-core
"""
"""A calibrating MoE user's three made-up runs (Qwen3-30B-A3B on 16 H100), which megatron-core
predicts 9-17 % fast with a third of each step on the MoE layers' host wait."""


def test_calibrating_moe_rows_fits_the_host_wait_of_their_moe_layers(tmp_path):
    """MoE rows on a stack whose MoE layers wait on the host fit that wait too: beside the GEMMs
    from three rows (it had been left to the GEMMs alone, 0.58x the base's, which then made a
    dense plan 54 % slower: a user trial's), and with the one compute scale from one row (the
    whole layer at one pace); dense rows fit no wait."""
    from nestplan.calibrate import fit
    from nestplan.units import MS

    path = tmp_path / "runs.csv"
    path.write_text(_HOST_BOUND_MOE)
    base = get_stack("megatron-core")
    cases = load_cases(path)
    three = fit(cases, base, leave_one_out=False)
    assert list(three.params) == ["matmul_scale", "moe_host_scale", "memory_scale"]
    assert three.params["matmul_scale"] > 0.65 and three.params["moe_host_scale"] > 1.05
    assert three.stack.moe_layer_host == pytest.approx(
        base.moe_layer_host * three.params["moe_host_scale"])
    assert max(map(abs, three.after)) < 0.05
    one = fit(cases[:1], base, leave_one_out=False)
    (scale,) = one.params.values()
    assert scale < 1 and one.stack.moe_layer_host / MS == pytest.approx(
        base.moe_layer_host / MS / scale)
    assert abs(one.after[0]) < 0.01
    dense = [c for c in load_cases(DATA / "held_out_runs.csv") if c.id.startswith("tt24_t6")]
    assert "moe_host_scale" not in fit(dense, get_stack("torchtitan-float8-asynctp"),
                                       leave_one_out=False).params
    code, out, err = cli("calibrate", path, "-o", tmp_path / "mine.toml")
    assert code == 0, err
    assert "moe_host_scale" in out and " ms per MoE layer)" in out
    assert get_stack(str(tmp_path / "mine.toml")).moe_layer_host == pytest.approx(
        three.stack.moe_layer_host, rel=1e-6)


def test_the_stack_file_a_module_name_is_pointed_to_runs(tmp_path):
    """The stack file that ``--recompute moe_act``'s refusal describes loads, and its policy of
    Megatron's modules runs (a review: the hint had left out the none policy a [recompute] table
    must begin with, so the file it described was refused)."""
    path = tmp_path / "mine.toml"
    path.write_text('base = "megatron-core"\nname = "mine"\n[recompute]\nnone = "none"\n'
                    'mine = "modules:layernorm,moe_act"\n')
    stack = get_stack(str(path))
    assert stack.policy("mine").modules == ("layernorm", "moe_act")
    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64,
                             stack=str(path))
    assert evaluate(sc, Parallelism(tp=1, pp=2, dp=8, ep=8, recompute=("mine",), mbs=1)).fits


def test_a_module_policy_without_its_modules_in_the_model_says_so():
    """Megatron-Core's fine-grained set (layernorm, mla_up_proj, moe_act) recomputes nothing in
    Llama 3 on megatron-core, whose norms are fused into the next linear layer: evaluate says it
    is costed as none (a user trial: none's figures, without a word); Mixtral's experts have
    moe_act."""
    flags = ["--cluster", "dgx-h100-ndr", "--gpus", 8, "--tp", 1, "--pp", 1, "--mbs", 1,
             "--global-batch", 8, "--seq-len", 4096, "--recompute", "fine-grained", "--json"]
    code, out, err = cli("evaluate", "--model", "llama3-8b", *flags)
    assert code == 0, err
    assert "recompute fine-grained recomputes nothing here" in err
    code, none, _ = cli("evaluate", "--model", "llama3-8b", *flags[:-2], "none", "--json")
    assert json.loads(out)["step_time_s"] == json.loads(none)["step_time_s"]
    code, out, err = cli("evaluate", "--model", "mixtral-8x7b", "--ep", 8, *flags)
    assert code == 0 and "recomputes nothing" not in err, err


def test_only_megatron_core_runs_tp_beyond_the_kv_heads():
    """Megatron-Core gathers each rank's share of every head's projection when TP exceeds the KV
    heads (tests/test_framework_comm.py); torchtitan and Megatron-DeepSpeed's attention split
    whole KV heads and refuse it (a review: megatron-deepspeed had costed the gather)."""
    from nestplan.catalog import get_model
    from nestplan.specs import kv_heads_refusal

    llama = get_model("llama3-70b")  # 8 KV heads
    runs = {n: kv_heads_refusal(llama, get_stack(n), 16) is None for n in list_names("stacks")
            if "tp" in get_stack(n).axes}
    assert runs == {n: get_stack(n).export_format == "megatron"
                    and n not in ("megatron-2021", "megatron-2022", "megatron-deepspeed",
                                  "deepspeed-2021") for n in runs}, runs
    assert all(kv_heads_refusal(llama, get_stack(n), 4) is None for n in runs)


def test_torchtitan_runs_no_pipeline_for_tied_embeddings():
    """torchtitan 0.3 refuses a pipeline for a model whose output layer shares the embedding's
    weights (Decoder.Config.update_from_config): plan --stack torchtitan had ranked such plans
    (a user trial's Qwen3-4B at pp 2), evaluate had run them, --tp 16 beyond 8 KV heads had
    been told 'no feasible plan' where evaluate names the KV heads."""
    base = ["--model", "gpt3-175b", "--cluster", "dgx-h100-ndr", "--gpus", 128, "--seq-len",
            2048, "--global-batch", 256, "--stack", "torchtitan"]
    assert one_line_error(*cli("evaluate", *base, "--tp", 8, "--pp", 2, "--mbs", 1),
                          "pp: got 2; stack torchtitan runs no pipeline for a model whose "
                          "output layer shares the embedding's weights")
    assert one_line_error(*cli("plan", *base, "--pp", 4), "tied embeddings")
    code, out, err = cli("plan", *base, "--top", 5, "--json")
    assert code == 0, err
    best = json.loads(out)
    assert {p["pp"] for p in best["top"]} == {1}
    code, out, err = cli("plan", *flags(*base, "--stack", "megatron-core"), "--top", 5, "--json")
    assert code == 0 and max(p["pp"] for p in json.loads(out)["top"]) > 1  # Megatron ties them
    assert one_line_error(*cli("plan", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr",
                               "--gpus", 256, "--tp", 16, "--stack", "torchtitan"),
                          "tp: got 16; must divide kv_heads = 8 on stack torchtitan")
    # a schedule or virtual stages ask for a pipeline too (they had been told "no feasible plan")
    for flag, value in (("--schedule", "1f1b"), ("--vp", 2)):
        assert one_line_error(*cli("plan", *base, flag, value),
                              f"tied embeddings); leave out {flag}")


def test_a_gpt_row_that_ran_a_pipeline_on_torchtitan_was_untied(tmp_path):
    """A runs CSV's GPT-style row reads as tied embeddings (Megatron's GPT), but one measured on
    a stack that pipelines no tied model at pp 2 ran untied: validate takes it (it had refused
    the row, "use pp = 1", a review's); at pp 1 it stays tied. A tied plan of another stack
    exported to torchtitan at pp 2 says torchtitan will not start it."""
    from nestplan import planfile
    from nestplan.exports import export

    runs = tmp_path / "runs.csv"
    runs.write_text(
        "id,model,layers,hidden,heads,seq_len,num_gpus,tp,pp,dp,micro_batch,global_batch,"
        "recompute,stack,gpu,metric,step_time_s\n"
        "pp2,GPT-1.3B,24,2048,16,2048,16,1,2,8,1,64,none,torchtitan,H100,step_time,0.5\n"
        "pp1,GPT-1.3B,24,2048,16,2048,16,1,1,16,1,64,none,torchtitan,H100,step_time,0.5\n")
    cases = {c.id: c for c in load_cases(runs)}
    assert not cases["pp2"].scenario.model.tied_embeddings
    assert cases["pp1"].scenario.model.tied_embeddings
    sc = scenario_from_names("gpt-1p7b", "dgx-h100-ndr", 16, seq_len=2048, global_batch=64)
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, Parallelism(
        tp=1, pp=2, dp=8, mbs=1, recompute=("none",)))))
    assert any(n.startswith("torchtitan will not start this plan") and "untie" in n
               for n in export(pf, "torchtitan").notes)


def test_a_torchtitan_plan_near_its_memory_says_what_the_model_missed_on_such_runs():
    """The memory model fell short of torchtitan's measured peaks by up to 22 % on held-out runs
    with PP and CP, and the default headroom covers the development rows' 5.5 %: a torchtitan
    CP plan that leaves less than that shortfall says so, with the headroom that covers it, and
    a plan searched with that headroom does not (a long-context trial's CP 32 plan at 7.7 GiB
    free); the plan names how its stack exchanges K/V (it had been named nowhere)."""
    base = ["--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 1024, "--seq-len",
            1048576, "--global-batch", 4, "--stack", "torchtitan"]
    code, out, err = cli("plan", *base)
    assert code == 0, err
    assert "fell short of torchtitan's measured peaks by up to 22%" in err
    assert "--memory-headroom 23 plans only peaks that such a shortfall leaves within HBM" in err
    peak, would = (float(err.split(w)[1].split(" GiB")[0]) for w in ("predicted peak of ",
                                                                        "GiB would be "))
    assert would == pytest.approx(peak / (1 - 0.223), abs=0.1)  # the held-out runs' 22.3 %
    assert "context parallelism exchanges K/V as an all-gather of the whole K/V" in out
    code, _, err = cli("plan", *base, "--memory-headroom", 23)
    assert code == 0 and "fell short" not in err, err
    code, out, err = cli("evaluate", *flags(*base, "--stack", "megatron-core"), "--tp", 8,
                         "--cp", 32, "--pp", 1, "--mbs", 1)
    assert code == 0 and "fell short" not in err  # (another stack's runs)
    assert "context parallelism exchanges K/V as a ring" in out


def test_a_torchtitan_tp_plan_near_its_memory_says_so_and_its_export_too(tmp_path):
    """A torchtitan plan with TP alone, the held-out 70B rows' shape (FSDP and TP 8, peaks missed
    by up to 13 %), that leaves less than that shortfall says so, and so does its exported
    launch file (a torchtitan 405B trial's TP 8 plan at 69.5 GiB of 79.6 got no word, and its
    export, "fits, leaves the headroom", none of what plan had said of a PP plan)."""
    plan = tmp_path / "p.json"
    code, out, err = cli("evaluate", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr",
                         "--gpus", 256, "--tp", 8, "--pp", 1, "--mbs", 18, "--global-batch", 576,
                         "--seq-len", 8192, "--stack", "torchtitan-float8", "--precision", "fp8",
                         "--recompute", "full", "--zero", 3, "--save", plan)
    assert code == 0, err
    said = [n for n in err.splitlines() if "fell short of torchtitan" in n]
    assert said and "by up to 13% on held-out runs with tensor parallelism" in said[0]
    assert "--memory-headroom 14 plans only peaks" in said[0]
    code, out, err = cli("export", plan, "--format", "torchtitan")
    assert code == 0 and "by up to 13% on held-out runs with tensor parallelism" in out, err


def test_a_length_context_parallelism_cannot_split_is_named_when_nothing_fits():
    """An odd sequence length leaves context parallelism nothing to split: when nothing fits,
    that is a hint beside more GPUs (only more GPUs had been: a long-context trial's)."""
    code, _, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 256,
                       "--seq-len", 1048577, "--global-batch", 8)
    assert code == 3, err
    assert ("try more GPUs, a sequence length context parallelism can split (1,048,577 is a "
            "multiple of 2·cp for no cp that divides the GPUs") in err
    code, _, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                       "--seq-len", 1048576, "--global-batch", 8)
    assert code == 3 and "context parallelism can split" not in err, err


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_communication_a_stack_does_not_overlap_shows_in_full(zero):
    """ZeRO-2's reduce-scatters and ZeRO-3's gathers per micro-batch hide behind compute only when
    the stack overlaps them (overlap_grad_reduce, overlap_param_gather); the DeepSpeed export
    writes the first as overlap_comm, and a stack without it had been costed as overlapped (a
    DeepSpeed user's trial): not overlapped, they show in full, once (an overlapped stack that
    hides nothing, efficiency 0, still adds the first layer's share prefetching cannot reach)."""
    from nestplan import planfile
    from nestplan.exports import export

    sc = scenario_from_names("llama3-8b", "selene-a100-hdr", 64, seq_len=4096, global_batch=256,
                             stack="deepspeed")
    par = Parallelism(dp=64, zero=zero, mbs=1, recompute=("full",))
    st = sc.stack
    on = evaluate(sc, par).time.zero
    off = evaluate(replace(sc, stack=replace(st, name="no-overlap", overlap_grad_reduce=False,
                                             overlap_param_gather=False)), par).time.zero
    unhidden = evaluate(replace(sc, stack=replace(st, name="unhidden", overlap_efficiency=0.0)),
                        par).time.zero
    assert on < off < unhidden
    assert unhidden / off - 1 < 0.1  # (that share: a layer's of 32)
    # each flag its own traffic: the reductions, and (ZeRO-3) the gathers
    grads = evaluate(replace(sc, stack=replace(st, name="g", overlap_grad_reduce=False)),
                     par).time.zero
    assert on < grads <= off
    if zero == 3:
        gathers = evaluate(replace(sc, stack=replace(st, name="p", overlap_param_gather=False)),
                           par).time.zero
        assert on < gathers < off
        # DeepSpeed's one overlap_comm covers both: the export says which way it launches
        ev = evaluate(replace(sc, stack=replace(st, name="p", overlap_param_gather=False)), par)
        exp = export(planfile.from_dict(planfile.to_dict(ev)), "deepspeed")
        assert ("DeepSpeed's overlap_comm overlaps ZeRO-3's gathers and reductions alike; stack p "
                "overlaps its reductions but not its gathers: exported as overlap_comm = true, "
                "so the launched run overlaps its gathers too, faster than predicted") in exp.notes
    else:
        ev = evaluate(replace(sc, stack=replace(st, name="p", overlap_param_gather=False)), par)
        exp = export(planfile.from_dict(planfile.to_dict(ev)), "deepspeed")
        assert not [n for n in exp.notes if "overlap_comm" in n]


def test_a_policys_modules_the_model_lacks_are_said_apart():
    """The recompute line names a policy's modules the model has, and those it lacks apart (a
    hardware trial read "mla_up_proj" on Qwen3's plan, which has no MLA, as a mistake); a model
    with every module keeps the rule as the stack gives it."""
    args = ["--cluster", "gb200-nvl72-ndr", "--gpus", 64, "--tp", 1, "--pp", 1, "--ep", 8, "--mbs",
            1, "--global-batch", 512, "--seq-len", 4096, "--stack", "nemo-moe-blackwell",
            "--recompute", "fine-grained"]
    code, out, err = cli("evaluate", "--model", "qwen3-30b-a3b", *args)
    assert code == 0, err
    assert ("fine-grained = modules:layernorm,moe_act (mla_up_proj: not an operator of "
            "qwen3-30b-a3b on stack nemo-moe-blackwell)") in out, out
    code, out, err = cli("evaluate", "--model", "deepseek-v3", *flags(*args, "--gpus", 256,
                                                                     "--pp", 4, "--vp", 2,
                                                                     "--ep", 64))
    assert code == 0, err
    assert "fine-grained = modules:layernorm,mla_up_proj,moe_act (stack" in out, out


@pytest.mark.parametrize("base,keys", [("megatron-core", ("p2p_overlap_needs_interleaving",)),
                                       ("deepspeed", ("optimizer_gather_waits",
                                                      "zero_grad_allreduce"))])
def test_a_whole_stack_file_of_before_reads_its_frameworks_later_keys(tmp_path, base, keys):
    """A stack file without a base, of a name of its own, written before the keys found in the
    frameworks' code on 2026-12-06 existed, reads them as its framework runs (a review: a copy
    of megatron-core had kept hiding its sends without interleaving)."""
    from nestplan.catalog import get_stack

    code, out, _ = cli("list", "stacks", base)
    assert code == 0
    lines = [line for line in out.splitlines() if not line.startswith(keys)]
    path = tmp_path / "mine.toml"
    path.write_text("\n".join(lines).replace(f'name = "{base}"', 'name = "mine"') + "\n")
    mine = get_stack(str(path))
    assert all(getattr(mine, k) is True for k in keys)
    assert all(getattr(get_stack(base), k) is True for k in keys)


def test_fp8_on_an_eager_torchtitan_stack_says_its_casts_are_not_costed(tmp_path):
    """torchao's Float8 runs its scaling and casts as kernels of their own without torch.compile,
    which nestplan does not cost: fp8 on the eager torchtitan stack says so, in its export too (a
    torchtitan trial's eager Float8 plan was predicted faster than the compiled one); a compiled
    Float8 stack, and bf16, say nothing of it."""
    plan = tmp_path / "p.json"
    base = ["--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8, "--tp", 1, "--pp", 1,
            "--mbs", 1, "--global-batch", 8, "--seq-len", 4096]
    said = "runs torchtitan without torch.compile, under which torchao's Float8"
    code, _, err = cli("evaluate", *base, "--precision", "fp8", "--stack", "torchtitan",
                       "--save", plan)
    assert code == 0 and said in err, err
    code, out, err = cli("export", plan, "--format", "torchtitan")
    assert code == 0 and said in out, err
    for stack, precision in (("torchtitan-float8", "fp8"), ("torchtitan", "bf16")):
        code, _, err = cli("evaluate", *base, "--precision", precision, "--stack", stack)
        assert code == 0 and said not in err, (stack, precision)
    # a stack that compiles only for async TP runs eagerly where a plan's TP does without it:
    # evaluate and the export (which turns compile off) say so (both had said nothing: the note
    # took the stack's async TP for the plan's)
    asynctp = tmp_path / "asynctp.toml"
    asynctp.write_text('base = "torchtitan"\nname = "asynctp"\ntp_overlap = "full"\n')
    for tp, eager in ((1, True), (2, False)):
        code, _, err = cli("evaluate", *flags(*base, "--tp", tp), "--precision", "fp8",
                           "--stack", asynctp, "--save", plan)
        assert code == 0 and (said in err) is eager, (tp, err)
        code, out, err = cli("export", plan, "--format", "torchtitan")
        assert code == 0 and (said in out) is eager, (tp, out)
        args = out.splitlines()
        assert ("--compile.no-enable" in args) is eager and ("--compile.enable" in args) is not eager
