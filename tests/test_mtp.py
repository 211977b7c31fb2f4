"""Multi-token prediction (DeepSeek-V3's MTP depths, Megatron-Core ``--mtp-num-layers``): read from
the configs, run with the head on the last stage, checked against published counts."""

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from nestplan import graph as G
from nestplan.catalog import get_model, scenario_from_names
from nestplan.evaluate import evaluate, model_flops_per_sequence
from nestplan.hf import model_from_hf_config
from nestplan.loaders import model_from_table, model_to_table
from nestplan.options import AttentionImpl, Precision
from nestplan.specs import Parallelism

from console import cli, one_line_error

DATA = Path(__file__).parent / "data"
V3 = get_model("deepseek-v3")


def _local(tp=1, ep=1, sp=False):
    return G.Local(tp, sp, 1, ep, 1, 1, 4096, Precision.BF16, AttentionImpl.FLASH)


def test_configs_name_their_depths_and_the_catalog_entry_is_its_config():
    assert model_from_hf_config(DATA / "deepseek-v3.json").mtp_layers == 1
    assert model_from_hf_config(DATA / "hf" / "glm4.5.json").mtp_layers == 1
    assert model_from_hf_config(DATA / "hf" / "kimi-k2.json").mtp_layers == 0
    assert V3.mtp_layers == 1
    assert model_from_table(model_to_table(V3)) == V3


def test_the_depth_adds_what_nemo_counts_for_it():
    """NeMo 25.11's performance table gives DeepSeek-V3 at 4,096 tokens 260.4 GFLOP per token with
    one MTP depth and 249.7 without (Megatron-Bridge docs/performance-summary-archive.md @
    067f987df0: model TFLOP/s over tokens/s; tests/data/moe_runs.csv): the depth's own work."""
    with_mtp = model_flops_per_sequence(V3, 4096, 0) / 4096
    without = model_flops_per_sequence(replace(V3, mtp_layers=0), 4096, 0) / 4096
    assert (with_mtp - without) / 1e9 == pytest.approx(260.4 - 249.7, rel=0.03)


def test_parameters_match_the_model_card():
    """DeepSeek-V3's card: 671B main-model weights and 14B of MTP module, whose checkpoint keeps
    its own copies of the embedding and the output head (2 x 0.93B), which training shares."""
    shared = 2 * V3.vocab * V3.hidden / 1e9
    assert G.total_params(replace(V3, mtp_layers=0)) / 1e9 == pytest.approx(671, rel=0.005)
    assert G.total_params(V3) / 1e9 == pytest.approx(685 - shared, rel=0.005)


def test_the_head_runs_the_depth_with_its_block_and_a_lookup_table_when_apart():
    g0 = G.build(replace(V3, mtp_layers=0), _local(ep=8))
    g1 = G.build(V3, _local(ep=8))
    depth = g1.head.ops[len(g0.head.ops):]
    assert [o.name for o in depth if o.name.startswith("mtp_")] == [
        "mtp_embed_lookup", "mtp_enorm", "mtp_hnorm", "mtp_eh_proj", "mtp_ln_final", "mtp_lm_head",
        "mtp_cross_entropy"]
    assert sum(o.flops for o in depth) > sum(o.flops for o in g1.moe.ops)
    assert g1.head.moe_blocks == 1 and g1.moe.moe_blocks == 1 and g1.dense.moe_blocks == 0
    assert g1.head.expert_params == g1.moe.expert_params
    # on another stage than the embedding it keeps a copy of the embedding for the lookups
    assert g1.head.params - g1.head_shared.params == pytest.approx(g1.embedding.params)
    assert g0.head is g0.head_shared  # untied, no depths: one head
    tied = replace(V3, tied_embeddings=True)
    gt = G.build(tied, _local(ep=8))  # apart, the tied output weight is the lookup table too
    assert gt.head.params - gt.head_shared.params == pytest.approx(gt.embedding.params)


def test_tensor_parallel_depths_gather_the_projection():
    g = G.build(V3, _local(tp=2, ep=4, sp=True))
    names = {c.name for c in g.head.comms}
    assert {"mtp_eh_proj.ag", "mtp_eh_proj.ag_out", "mtp_eh_proj.ag_scatter_bwd",
            "mtp_lm_head.ag", "mtp_loss.ar"} <= names


def test_the_last_stage_pays_for_the_depth_and_its_embedding_gradient():
    sc = scenario_from_names("deepseek-v3", "dgx-h100-ndr", 256, seq_len=4096, global_batch=512)
    par = Parallelism(tp=1, pp=16, dp=16, ep=8, etp=1, zero=1, mbs=1,
                      stage_layers=(4,) * 15 + (1,))
    e1 = evaluate(sc, par)
    e0 = evaluate(replace(sc, model=replace(sc.model, mtp_layers=0)), par)
    last1, last0 = e1.stages[-1], e0.stages[-1]
    assert last1.time_per_microbatch > last0.time_per_microbatch
    assert last1.memory.weights > last0.memory.weights  # the block and the lookup table
    assert e1.stages[3].time_per_microbatch == pytest.approx(e0.stages[3].time_per_microbatch)
    # with the recipe's layout the last stage stays the lightest: the step barely moves
    assert last1.time_per_microbatch < e1.stages[3].time_per_microbatch
    assert e1.step_time == pytest.approx(e0.step_time, rel=0.02)
    # Megatron's default split without a layout puts the depth on a full stage: the slowest
    even = evaluate(sc, replace(par, stage_layers=None))
    assert even.stages[-1].time_per_microbatch == max(s.time_per_microbatch for s in even.stages)
    # the lookup table's gradient is all-reduced with the embedding's (first and last stage)
    from nestplan.cost.device import config_costs

    with_depth = config_costs(sc, par)
    assert with_depth.embedding_copy_params == pytest.approx(with_depth.graph.embedding.params)
    without = config_costs(replace(sc, model=replace(sc.model, mtp_layers=0)), par)
    assert without.embedding_copy_params == 0


def test_grouped_gemms_read_every_local_experts_weight():
    """A grouped GEMM over L local experts moves its tokens once and all L weight matrices
    (forward; dgrad and wgrad each read them again backward)."""
    m = get_model("qwen3-30b-a3b")  # 128 experts
    weight = 2 * m.hidden * 2 * m.moe.ffn_hidden  # bf16 w1|w3 of one expert
    for ep, local in ((16, 8), (2, 64)):
        fc1 = next(o for o in G.build(m, _local(ep=ep)).moe.ops if o.name == "expert_fc1")
        rows, k, n = fc1.shape
        tokens = 2 * (rows * k + rows * n)  # bf16 input and output
        assert fc1.nbytes == pytest.approx(tokens + local * weight)
        assert fc1.bwd_nbytes == pytest.approx(2 * (tokens + local * weight))


def test_a_depth_waits_on_the_host_as_one_more_moe_block():
    """Host-bound MoE blocks (a small model at one micro-batch): a depth adds one block's wait."""
    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    par = Parallelism(tp=1, pp=1, dp=16, ep=8, etp=1, mbs=1)
    e0 = evaluate(sc, par)
    e1 = evaluate(replace(sc, model=replace(sc.model, mtp_layers=1)), par)
    blocks = sc.model.num_moe_layers
    assert e0.time.host > 0
    assert e1.time.host == pytest.approx(e0.time.host * (blocks + 1) / blocks)


def test_the_flag_sets_the_depths_and_stacks_without_them_refuse():
    base = ("evaluate", "--model", "deepseek-v3", "--cluster", "dgx-h100-ndr", "--gpus", "256",
            "--tp", "1", "--pp", "16", "--ep", "8", "--etp", "1", "--mbs", "1",
            "--global-batch", "512", "--seq-len", "4096", "--zero", "1", "--json")
    import json

    code, out, err = cli(*base)
    code0, out0, err0 = cli(*base, "--mtp-layers", "0")
    assert code == 0 and code0 == 0, err + err0
    assert json.loads(out)["step_time_s"] > json.loads(out0)["step_time_s"]
    # the text names the depth where it runs: with the head, on the last stage
    text = cli(*base[:-1])[1].splitlines()
    assert [line.split()[0] for line in text if "+1 MTP depth" in line] == ["15"]
    assert "MTP" not in " ".join(line for line in cli(*base[:-1], "--mtp-layers", "0")[1].splitlines()
                                 if "blocks" in line)
    assert "of its own" not in cli(*base, "--mtp-layers", "2")[2]  # DeepSeek-V3 has one
    dense = ("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", "8",
             "--tp", "1", "--pp", "1", "--mbs", "1", "--global-batch", "8", "--seq-len", "2048")
    code, out, err = cli(*dense, "--mtp-layers", "2")
    assert code == 0 and "--mtp-layers 2: llama3-8b has no multi-token-prediction depth of its " \
        "own; 2 added after its last block" in err, err
    assert "of its own" not in cli(*dense, "--mtp-layers", "0")[2]
    for bad in ("-1", "99"):
        code, out, err = cli(*base, "--mtp-layers", bad)
        assert one_line_error(code, out, err, "mtp-layers"), err
    code, out, err = cli(*base, "--stack", "deepspeed")  # its model code has no MTP
    assert one_line_error(code, out, err, "--mtp-layers 0"), err


def test_a_runs_csv_column_sets_the_depths(tmp_path):
    from nestplan.validation import load_cases

    path = _one_row(tmp_path, "mtp_layers", "0")
    (case,) = load_cases(path)
    assert case.scenario.model.mtp_layers == 0 and V3.mtp_layers == 1


def test_only_decoders_predict_further_tokens():
    from nestplan.errors import SpecError

    with pytest.raises(SpecError, match="causal"):
        replace(get_model("bert-large"), mtp_layers=1)


def _one_row(tmp_path, column, value):
    """The B200 DeepSeek-V3 development row with one column changed, in a CSV of its own."""
    with open(DATA / "moe_runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    row = next(r for r in rows if r["id"] == "nemo2602-b200-deepseek-v3-256g")
    row[column] = value
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    for stack in (DATA / "moe_stacks").glob("*.toml"):
        (tmp_path / "moe_stacks").mkdir(exist_ok=True)
        (tmp_path / "moe_stacks" / stack.name).write_text(stack.read_text())
    return path


@pytest.mark.parametrize("column, value, needle", [
    ("mtp_layers", "-1", "mtp_layers"), ("mtp_layers", "one", "mtp_layers"),
    ("stage_layers", "4 4 x", "stage_layers"), ("stage_layers", "4 4", "stage_layers")])
def test_bad_depth_or_layout_columns_are_one_line(tmp_path, column, value, needle):
    code, out, err = cli("validate", "--csv", _one_row(tmp_path, column, value))
    assert one_line_error(code, out, err, needle), err


def test_mtp_layers_0_lets_a_stack_without_mtp_run_the_model():
    """``--mtp-layers 0`` drops DeepSeek-V3's own depth before the stack is checked against it
    (a stack without multi-token prediction had refused the model, naming the depth it had)."""
    from console import cli

    args = ("evaluate", "--model", "deepseek-v3", "--cluster", "dgx-h100-ndr", "--gpus", 256,
            "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 256, "--seq-len", 1024,
            "--stack", "composer")
    code, _, err = cli(*args, "--mtp-layers", 0)
    assert code == 0, err
    code, _, err = cli(*args)
    assert code == 2 and "model.mtp_layers: got 1" in err, err


def test_torchtitan_runs_no_depth_with_a_pipeline_or_context_parallelism(tmp_path):
    """torchtitan 0.3 refuses multi-token prediction under PP and CP (mtp.py raises
    NotImplementedError): its stack searches no such plan, evaluate refuses one, and the export
    of another stack's pipelined plan says torchtitan will not start it (a torchtitan MoE user's
    trial: the search had pipelined DeepSeek-V3's depth and the export's advice led to a crash)."""
    import json

    base = ("--model", "deepseek-v3", "--cluster", "dgx-h200-ndr", "--gpus", 256, "--seq-len",
            4096, "--global-batch", 1024)
    code, out, err = cli("plan", *base, "--stack", "torchtitan", "--json")
    assert code == 0, err
    top = json.loads(out)["top"]
    assert top and all(p["pp"] == 1 and p["cp"] == 1 for p in top), top
    # and says so (a torchtitan MoE trial's plan was 58 % slower than with --mtp-layers 0, the
    # depth torchtitan's own deepseek_v3_671b trains, without a word); of the axes left open
    said = ("deepseek-v3's 1 multi-token-prediction depth kept pipeline and context parallelism "
            "out of the search: stack torchtitan runs none with them (mtp_without); "
            "--mtp-layers 0 searches them")
    assert said in err, err
    small = ("plan", "--model", "qwen3-30b-a3b", "--mtp-layers", 1, "--stack", "torchtitan",
             "--cluster", "dgx-h100-ndr", "--gpus", 8, "--seq-len", 4096, "--global-batch", 64)
    code, _, err = cli(*small, "--pp", 1)
    assert code == 0 and "depth kept context parallelism out of the search" in err, err
    code, _, err = cli(*small, "--pp", 1, "--cp", 1)
    assert code == 0 and "out of the search" not in err, err
    for axis in ("pp", "cp"):
        code, out, err = cli("evaluate", *base, "--stack", "torchtitan", "--tp", 1, "--pp",
                             4 if axis == "pp" else 1, "--cp", 2 if axis == "cp" else 1,
                             "--ep", 8, "--mbs", 1)
        assert one_line_error(code, out, err, (
            f"{axis}: got {4 if axis == 'pp' else 2}; stack torchtitan runs no "
            f"multi-token-prediction depth with {'pipeline' if axis == 'pp' else 'context'} "
            "parallelism (deepseek-v3 has 1); use " + f"{axis} = 1, or --mtp-layers 0")), err
    saved = tmp_path / "p.json"
    code, _, err = cli("evaluate", *base, "--tp", 1, "--pp", 8, "--ep", 8, "--mbs", 1,
                       "--save", saved)
    assert code == 0, err
    code, _, err = cli("export", saved, "--format", "torchtitan", "-o", tmp_path / "t.toml")
    assert code == 0 and "torchtitan will not start this plan with the model's depths built in: " \
        "stack torchtitan runs no multi-token-prediction depth with pipeline parallelism" in err, err
    assert "its loss as MTPLoss.Config" in err
    # a pipeline asked for by its schedule alone is refused alike (a review's)
    code, out, err = cli("plan", *base, "--stack", "torchtitan", "--schedule", "1f1b")
    assert one_line_error(code, out, err, "schedule: got '1f1b'; stack torchtitan runs no "
                          "multi-token-prediction depth with pipeline parallelism"), err


def test_a_model_with_depths_computes_its_loss_whole_on_torchtitan():
    """torchtitan's MTPLoss has no chunks and its MTP decoder refuses the chunked wrapper's
    skipped head (mtp.py, 0.3.0 wheel): with depths, the loss is costed whole, as a stack with
    no chunks costs it (a review found the head's device 8 GiB under)."""
    sc = scenario_from_names("deepseek-v3", "dgx-h200-ndr", 256, seq_len=4096, global_batch=512,
                             stack="torchtitan")
    par = Parallelism(dp=256, ep=64, zero=3, mbs=2, recompute=("full",))
    whole = replace(sc, stack=replace(sc.stack, name="whole", loss_chunks=1))
    assert evaluate(sc, par).peak_memory == evaluate(whole, par).peak_memory
    without = replace(sc, model=replace(sc.model, mtp_layers=0))
    assert evaluate(without, par).peak_memory != evaluate(
        replace(without, stack=whole.stack), par).peak_memory  # (chunked without depths)
