"""What plan, evaluate, compare and calibrate say about long sequences and context parallelism
(a long-context trial's and a calibrating user's findings of 2026-12-06)."""

import csv
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from nestplan.axes import parse_order
from nestplan.catalog import get_cluster, get_model
from nestplan.evaluate import evaluate
from nestplan.options import Precision
from nestplan.specs import Parallelism, Scenario, TrainingSpec
from nestplan.validation import run

from console import cli, flags, one_line_error

DATA = Path(__file__).parent / "data"
B200_8B = ("--model", "llama3-8b", "--cluster", "dgx-b200-ndr", "--gpus", 32, "--global-batch", 32,
           "--precision", "fp8")
H100_7B = ("evaluate", "--model", "llama2-7b", "--cluster", "dgx-h100-ndr", "--gpus", 128, "--tp",
           4, "--pp", 1, "--cp", 4, "--mbs", 1, "--global-batch", 32, "--precision", "fp8")


def runs_of(source: Path, keep, path: Path) -> Path:
    """A runs CSV at ``path`` of the rows of ``source`` that ``keep`` (a row's dict) keeps."""
    with open(source, newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if keep(r)]
        fields = reader.fieldnames
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


def notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("nestplan: note:")]


def test_a_hopper_plan_at_long_context_says_how_slow_such_runs_were_predicted():
    """NeMo's H100 rows from 64K tokens on are predicted 11-22 % slow (README "Long-context
    runs"); a Megatron-Core-family plan there says so, with the figures those rows give."""
    from nestplan.notes.plan import LONG_CONTEXT_FROM, LONG_CONTEXT_HOPPER_SLOW

    errors = [o.error for o in run(DATA / "long_context_runs.csv")
              if "-h100-" in o.case.id and o.case.scenario.training.seq_len >= LONG_CONTEXT_FROM]
    assert len(errors) == 5
    assert (round(min(errors), 3), round(max(errors), 3)) == LONG_CONTEXT_HOPPER_SLOW
    code, out, err = cli(*H100_7B, "--seq-len", 131072, "--stack", "nemo")
    assert code == 0, err
    said = [n for n in notes(err) if "long-context runs on H100" in n]
    assert len(said) == 1 and "upper bound" in said[0]
    assert "64K to 1M tokens) were predicted 11% to 22% slower" in said[0]
    # not below the length, not on Blackwell (fitted there), not on a stack whose attention was
    # fitted at length (torchtitan's)
    for changed in (("--seq-len", 32768), ("--seq-len", 131072, "--cluster", "dgx-b200-ndr"),
                    ("--seq-len", 131072, "--stack", "torchtitan")):
        code, out, err = cli(*flags(*H100_7B, *changed))
        assert code == 0, err
        assert not [n for n in notes(err) if "long-context runs on H100" in n], changed


def test_context_parallel_chunks_under_the_search_floor_are_noted():
    code, out, err = cli("evaluate", "--model", "llama2-7b", "--cluster", "dgx-h100-ndr",
                         "--gpus", 64, "--tp", 2, "--pp", 1, "--cp", 32, "--mbs", 1,
                         "--global-batch", 32, "--seq-len", 2048)
    assert code == 0, err
    assert any("cp 32: 64 tokens per rank, under the 1,024" in n for n in notes(err))


def test_a_length_no_cp_degree_splits_is_noted_and_a_fixed_cp_blames_the_length():
    code, out, err = cli("plan", *B200_8B, "--seq-len", 131071)
    assert code == 0, err
    said = [n for n in notes(err) if "no context-parallel degree splits it" in n]
    assert len(said) == 1 and "131,072 tokens would offer cp 2" in said[0]
    assert " cp=1 " in out
    code, out, err = cli("plan", *B200_8B, "--seq-len", 131072)
    assert not [n for n in notes(err) if "splits it" in n]
    # a fixed degree names what it does not divide (it had named the GPUs beside the length)
    assert one_line_error(*cli("plan", *B200_8B, "--seq-len", 131071, "--cp", 2),
                          "cp: got 2; must divide seq_len = 131071")
    assert one_line_error(*cli("plan", *B200_8B, "--seq-len", 131072, "--cp", 3),
                          "cp: got 3; must divide gpus = 32")


def test_compare_says_when_its_speedups_are_over_a_manual_plan_without_cp():
    code, out, err = cli("compare", "--model", "llama3-8b", "--cluster", "dgx-b200-ndr",
                         "--gpus", 16, "--global-batch", 4, "--seq-len", 262144, "--precision",
                         "fp8", "--pp", 1, timeout=300)
    assert code == 0, err
    assert any("manual's rules of thumb use no context parallelism" in n for n in notes(err))
    code, out, err = cli("compare", "--model", "llama3-8b", "--cluster", "dgx-b200-ndr",
                         "--gpus", 16, "--global-batch", 4, "--seq-len", 262144, "--precision",
                         "fp8", "--pp", 1, "--cp", 4, timeout=300)
    assert code == 0, err
    assert not [n for n in notes(err) if "manual's rules" in n]
    # the notes plan gives of its best plan, compare gives of the fastest (it had given none)
    code, out, err = cli("compare", "--model", "llama2-7b", "--cluster", "dgx-h100-ndr",
                         "--gpus", 16, "--global-batch", 4, "--seq-len", 65536, "--pp", 1,
                         "--stack", "nemo", timeout=300)
    assert code == 0, err
    assert [n for n in notes(err) if "long-context runs on H100" in n], err


def test_compare_says_when_manuals_rules_fit_the_model_badly():
    """A manual plan many times slower than the fastest method's is said to be Megatron's rules of
    thumb fitting the model badly (an MoE user's trial read "nest 13.19x" over TP 8 with expert
    TP 8 for Qwen3-30B-A3B's 4 KV heads and 768-wide experts); one within 3x is not."""
    import warnings

    from nestplan.notes.plan import manual_far_behind
    from nestplan.search.constraints import Constraints

    sc = Scenario(model=get_model("qwen3-30b-a3b"), cluster=get_cluster("dgx-h100-ndr"),
                  gpus=64, training=TrainingSpec(seq_len=4096, global_batch=512,
                                                 precision=Precision.BF16))
    manual = evaluate(sc, Parallelism(tp=8, dp=8, ep=8, etp=8, sp=True, zero=1,
                                      recompute=("full",), mbs=1))
    tuned = evaluate(sc, Parallelism(tp=1, dp=64, ep=8, etp=1, zero=1, recompute=("full",),
                                     mbs=2))
    assert manual.fits and tuned.fits and manual.step_time > 3 * tuned.step_time
    said = []
    for other, con in ((tuned, Constraints()), (manual, Constraints()),
                       (tuned, Constraints(mbs=1, etp=8)),
                       (tuned, Constraints(tp=8, pp=1, zero=1, mbs=1, etp=8,
                                           recompute=("full",)))):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            manual_far_behind({"manual": SimpleNamespace(best=manual),
                               "nest": SimpleNamespace(best=other)}, con)
        said.append(" ".join(str(x.message) for x in w))
    assert "manual's plan (t8 p1 d8 e8 sp z1 full b1) takes" in said[0]
    assert ("Megatron's rules of thumb (a node's TP, experts following TP, full recomputation, "
            "micro-batch 1, the fewest pipeline stages that fit, ZeRO-1;") in said[0]
    assert "not over a tuned plan" in said[0]
    assert said[1] == ""
    # the rules a fixed knob overrode are not named (they had been: a micro-batch given as 4
    # was said to be the rule's 1), and where every one was fixed, nothing is said
    assert ("rules of thumb (a node's TP, full recomputation, the fewest pipeline stages that "
            "fit, ZeRO-1;") in said[2], said[2]
    assert said[3] == ""


def test_plans_alike_but_for_their_rank_order_share_a_row():
    from nestplan.textfmt import search_result

    sc = Scenario(model=get_model("llama3-8b"), cluster=get_cluster("dgx-h100-ndr"), gpus=16,
                  training=TrainingSpec(seq_len=8192, global_batch=32, precision=Precision.BF16))
    base = Parallelism(tp=8, dp=2, mbs=1, sp=True)
    orders = ["tp-cp-dp-pp", "tp-dp-cp-pp", "dp-tp-cp-pp"]
    plans = [evaluate(sc, base.with_(rank_order=parse_order(o))) for o in orders]
    # the first two place the same groups (cp = 1), the third puts TP across nodes
    assert plans[0].step_time == plans[1].step_time < plans[2].step_time
    res = SimpleNamespace(best=plans[0], plans=plans, method="nest", solved=1, configurations=1,
                          seconds=0.0)
    text = search_result(res)
    rows = [line for line in text.splitlines() if line.lstrip().startswith(("1", "2", "3"))
            and "pp" not in line.split()[0]]
    assert rows[0].split()[0] == "1-2" and "tp-cp-dp-pp tp-dp-cp-pp" in rows[0]
    assert rows[1].split()[0] == "3"
    assert "plans alike but for their rank order" in text


def test_a_calibrated_stack_says_when_it_is_used_far_from_its_runs(tmp_path):
    """A calibration records the lengths and accelerators of its runs; a plan far from them is
    noted (a user's fit on 2K-8K runs predicted its 64K-1M runs 45 % slow without a word)."""
    runs = runs_of(DATA / "long_context_runs.csv",
                   lambda r: r["id"] == "nemo-longseq-b200-llama3-8b-8k", tmp_path / "mine.csv")
    out_file = tmp_path / "mine.toml"
    code, out, err = cli("calibrate", runs, "--stack", "nemo", "-o", out_file)
    assert code == 0, err
    assert "no row left out: that takes 3 rows or more of 2 plans or more (here 1 of 1)" in out
    text = out_file.read_text()
    assert f"by nestplan 0.1.0, from {runs.resolve()}" in text.splitlines()[1]
    assert "fitted_seq_len = [8192, 8192]" in text
    assert 'fitted_accelerators = ["b200-sxm-180gb"]' in text
    base = ("evaluate", "--model", "llama3-8b", "--gpus", 32, "--tp", 2, "--pp", 1, "--cp", 4,
            "--mbs", 1, "--global-batch", 32, "--precision", "fp8", "--stack", out_file)
    code, out, err = cli(*base, "--cluster", "dgx-b200-ndr", "--seq-len", 16384)
    assert code == 0, err

    def said(err) -> list[str]:  # (the runs' 2 GPUs against the plans' 32: said apart)
        return [n for n in notes(err) if "was calibrated on runs" in n and " GPUs; " not in n]

    assert not said(err)
    assert [n for n in notes(err) if "calibrated on runs of 2 GPUs; on 32 its groups" in n]
    code, out, err = cli(*base, "--cluster", "dgx-b200-ndr", "--seq-len", 131072)
    assert len(said(err)) == 1 and "of 8,192 tokens; at 131,072" in said(err)[0]
    code, out, err = cli(*base, "--cluster", "dgx-h100-ndr", "--seq-len", 16384)
    assert len(said(err)) == 1 and "on b200-sxm-180gb, not on h100-sxm-80gb" in said(err)[0]
    # a plan saved with it keeps what it was fitted on, and evaluate --plan says it again
    code, out, err = cli(*base, "--cluster", "dgx-b200-ndr", "--seq-len", 131072, "--save",
                         tmp_path / "p.json")
    code, out, err = cli("evaluate", "--plan", tmp_path / "p.json")
    assert code == 0, err
    assert [n for n in notes(err) if "of 8,192 tokens; at 131,072" in n]
    # its name alone is the catalog's to look up, which says where the file is
    assert one_line_error(*cli(*flags(*base, "--stack", "mine"), "--cluster", "dgx-b200-ndr",
                               "--seq-len", 16384, cwd=tmp_path),
                          "stack: got 'mine'; unknown stack (a file mine.toml is here: give that path)")


def test_calibrate_says_when_the_rows_left_out_are_predicted_worse_than_before(tmp_path):
    """Each row predicted by the fit without it: their mean beside the mean before and after,
    and a word when it is worse than before (a user's 3-row fit, 6.5 % before and 7.4 % left
    out, had said nothing)."""
    three = ("nemo2502-b200-gpt3-175b-512g", "nemo2502-b200-llama3-8b-8g",
             "nemo2502-b200-llama3-70b-64g")  # (the file's first three B200 rows)
    runs = runs_of(DATA / "held_out_runs.csv", lambda r: r["id"] in three,
                   tmp_path / "three.csv")
    code, out, err = cli("calibrate", runs, "--stack", "nemo", "-o", tmp_path / "three.toml")
    assert code == 0, err
    table = [line.split() for line in out.splitlines() if line.startswith("nemo2502-")]
    before, after, left = ([abs(float(r[i].rstrip("%"))) for r in table] for i in (2, 3, 4))
    summary = next(line for line in out.splitlines() if line.startswith("mean |error|"))
    mean = [sum(x) / 3 for x in (before, after, left)]
    said = re.match(r"mean \|error\|: before ([\d.]+)%, after ([\d.]+)%, left out ([\d.]+)%",
                    summary)
    assert said, summary
    assert [float(x) for x in said.groups()] == pytest.approx(mean, abs=0.1)  # (rows rounded)
    assert ("worse than before the fit" in summary) == (mean[2] > mean[0])


def test_plan_says_which_plans_are_too_close_to_call():
    """Plans within 3 % of the best (the published runs' mean error) are named as closer than the
    model can tell apart (a MoE trial chose between plans 3 % apart on the ranking alone)."""
    code, out, err = cli("plan", *B200_8B, "--seq-len", 131072, "--top", 40)
    assert code == 0, err
    listed = out.split("best plan:")[0].splitlines()
    rows = [(line.split()[0], float(line.split()[1])) for line in listed
            if re.fullmatch(r"\d+(-\d+)?", line.split()[0] if line.split() else "")]
    plans = [len(range(int(r.split("-")[0]), int(r.split("-")[-1]) + 1)) for r, _ in rows]
    # every listed plan counts, a row's other rank orders too (a new user's trial: rows counted)
    own = plans[0] - 1
    close = own + sum(n for n, (_, s) in zip(plans[1:], rows[1:]) if s <= 1.03 * rows[0][1])
    assert 1 <= close < sum(plans) - 1  # (some listed plans beyond 3 %)
    row = (f", {own} of them {'another rank order' if own == 1 else 'other rank orders'} "
           "in its row" if own else "")
    assert f"({close} other listed plans within 3% of the best{row}: closer than this model's" \
        in out, out
    # every listed plan close: more may be beyond the list (a new user's count grew with --top)
    code, out, err = cli("plan", *B200_8B, "--seq-len", 131072, "--top", 2)
    assert code == 0, err
    assert ("(1 other listed plan within 3% of the best, and perhaps more beyond the list (a "
            "larger --top lists them)") in out
    # a search that found fewer than --top has none beyond (a review's)
    code, out, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-b200-ndr", "--gpus", 2,
                         "--global-batch", 2, "--seq-len", 2048, "--precision", "fp8", "--mbs", 1,
                         "--recompute", "none", "--zero", 1, "--tp", 1, "--pp", 1, "--top", 100)
    assert code == 0 and "2 best plan(s)" in out, out
    assert "(1 other listed plan within 3% of the best: closer" in out


def test_a_rings_blocks_after_its_first_run_unmasked_and_faster():
    """A context-parallel ring over load-balanced causal chunks runs its first step (the rank's
    own K/V) as a causal kernel and its other cp - 1 steps with no mask, at the accelerator's
    unmasked_attention_gain; a gathered K/V, documents or a bidirectional model are not such a
    ring (the H100 long-context rows had costed every block as causal)."""
    from dataclasses import replace

    from nestplan.catalog import get_stack
    from nestplan.cost.compute import op_time
    from nestplan.evaluate import layer_graph

    acc = get_cluster("dgx-h100-ndr").accelerator
    assert acc.unmasked_attention_gain == pytest.approx(1.10)

    def core(model, cp, stack="megatron-core", span=None):
        tr = TrainingSpec(seq_len=65536, global_batch=8, attention_span=span)
        g = layer_graph(get_model(model), Parallelism(tp=1, cp=cp, dp=8 // cp, mbs=1), tr,
                        get_stack(stack))
        (op,) = [o for o in g.dense.ops if o.name == "attn_core"]
        return op

    for cp in (2, 4, 8):
        op = core("llama3-8b", cp)
        assert op.unmasked == pytest.approx(1 - 1 / cp)
        # compute-bound: the unmasked share of its FLOP runs 1.10 times as fast
        slow = op_time(op, replace(acc, unmasked_attention_gain=1.0), Precision.BF16, False)
        fast = op_time(op, acc, Precision.BF16, False)
        assert fast - acc.kernel_overhead == pytest.approx(
            (slow - acc.kernel_overhead) * (1 - op.unmasked * (1 - 1 / 1.10)))
    assert core("llama3-8b", 1).unmasked == 0  # one causal kernel
    assert core("llama3-8b", 4, "torchtitan").unmasked == 0  # K/V gathered: a masked kernel
    assert core("llama3-8b", 4, span=8192).unmasked == 0  # per-document masks in every block
    assert core("bert-large", 1).unmasked == 1  # bidirectional: no mask at all
