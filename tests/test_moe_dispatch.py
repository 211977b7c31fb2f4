"""Expert-parallel token dispatch: the traffic each level carries, the dispatchers a stack runs,
and the overlap that hides them (issue 9)."""

import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from conftest import BENCHMARKS, exported
from nestplan import planfile
from nestplan.catalog import get_cluster, get_stack
from nestplan.cost.network import crossing_share
from nestplan.evaluate import evaluate, scenario_from_names
from nestplan.exports import export
from nestplan.placement import _block_sizes, expert_grid, layouts, rank_grid
from nestplan.specs import Parallelism

"""benchmarks/, whose moe_accuracy.py reads the MoE rows as the README's figures do."""


@pytest.mark.parametrize("par", [
    Parallelism(tp=4, pp=2, dp=2, ep=8, etp=1, sp=True),   # EP folded over TP ranks
    Parallelism(tp=2, pp=1, dp=8, ep=16, etp=1, sp=True),  # EP across two nodes
    Parallelism(tp=8, pp=1, dp=2, ep=4, etp=2, sp=True)])  # expert TP inside EP
def test_all_to_all_share_per_level_matches_a_count_over_ranks(par):
    """For every EP group of the folded expert grid and every member, the share of its routed
    copies that leave its block at each level (uniform routing: one copy per peer) equals what
    the cost model uses, (n - members inside) / n."""
    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", par.devices, seq_len=4096,
                             global_batch=64)
    lay = layouts(par, sc.cluster, sc.gpus).ep
    egrid = expert_grid(rank_grid(par), par)
    groups = np.moveaxis(egrid, 2, -1).reshape(-1, par.ep)
    blocks = (1, *_block_sizes(sc.cluster, sc.gpus)[:-1])
    prev = 1
    for level, inside in enumerate(lay.k):
        if inside > prev:
            size = blocks[level]  # a level-(l-1) block: what traffic crossing level l leaves
            for group in groups:
                for d in group:
                    leaving = sum(1 for e in group if e // size != d // size) / len(group)
                    assert leaving == pytest.approx(crossing_share(len(group), prev))
        prev = inside


@pytest.mark.parametrize("experts, k, n, inside", [(8, 2, 4, 2), (16, 4, 8, 2), (12, 3, 6, 3)])
def test_deduplicated_crossings_match_an_enumeration(experts, k, n, inside):
    """DeepEP sends a token once per remote block holding any of its k (distinct) experts:
    the closed form against every choice of k experts, for a token on rank 0."""
    per_rank = experts // n
    block_of = [e // per_rank // inside for e in range(experts)]
    total = count = 0
    for picks in itertools.combinations(range(experts), k):
        total += len({block_of[e] for e in picks} - {0})
        count += 1
    assert crossing_share(n, inside, (k, experts)) == pytest.approx(total / count / k)


@pytest.mark.frameworks
@pytest.mark.parametrize("ranks, close", [(16, 0.01), (32, 0.01), (64, 0.01), (128, 0.07),
                                          (256, 0.05)])
def test_group_limited_crossings_match_megatrons_routing(ranks, close):
    """DeepSeek-V3's node-limited routing (8 groups of 32 experts, 4 chosen per token) through
    Megatron-Core's own ``group_limited_topk`` on the random scores of a force-balanced run:
    the share of a token's copies that DeepEP sends to other 8-rank nodes, against
    ``crossing_share`` (exact where nodes hold whole groups; over, by the stated bound, where
    they hold part of one)."""
    torch = pytest.importorskip("torch")
    moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils")
    experts, k, groups, chosen, tokens, node = 256, 8, 8, 4, 20000, 8
    gen = torch.Generator().manual_seed(0)
    scores = torch.sigmoid(torch.randn(tokens, experts, generator=gen))
    _, picked = moe_utils.group_limited_topk(scores, k, tokens, experts, groups, chosen)
    block = picked // (experts // ranks) // node  # node of each copy; the token sits on node 0
    crossings = sum(len(set(row) - {0}) for row in block.tolist())
    theirs = crossings / tokens / k
    ours = crossing_share(ranks, node, (k, experts, groups, chosen))
    assert theirs <= ours * 1.002 and ours == pytest.approx(theirs, rel=close)
    assert ours < crossing_share(ranks, node, (k, experts))  # fewer than unlimited routing


def test_group_limited_routing_counts_only_where_nodes_hold_runs_of_ep_ranks():
    """With dp inside cp (order tp-dp-cp-pp) a node's eight EP ranks are every other one of
    sixteen, so they hold parts of two router groups and node-limited routing spares no
    crossing: such a layout is costed as uniform routing, Megatron's own order as limited."""
    from nestplan.axes import parse_order
    from nestplan.cost.network import collective_coeffs
    from nestplan.graph import CollKind

    sc = scenario_from_names("deepseek-v3", "dgx-h100-ndr", 1024, seq_len=4096,
                             global_batch=8192)
    m = sc.model.moe
    limited, uniform = (8, 256, m.router_groups, m.router_group_top_k), (8, 256)
    per_byte = {}
    for order in ("tp-cp-dp-pp", "tp-dp-cp-pp"):
        par = Parallelism(tp=1, pp=16, dp=32, cp=2, ep=64, etp=1, zero=1, mbs=1,
                          rank_order=parse_order(order))
        ep = layouts(par, sc.cluster, sc.gpus).ep
        per_byte[order] = [collective_coeffs(CollKind.ALL_TO_ALL, ep, sc.cluster, dedup=d)[0][1]
                           for d in (limited, uniform)]
    assert m.router_groups == 8 and m.router_group_top_k == 4
    assert per_byte["tp-cp-dp-pp"][0] < per_byte["tp-cp-dp-pp"][1]
    assert per_byte["tp-dp-cp-pp"][0] == per_byte["tp-dp-cp-pp"][1]


def megatron_text(ev) -> str:
    """The Megatron export of an evaluation, through its plan file."""
    return export(planfile.from_dict(planfile.to_dict(ev)), "megatron").text


def _deepseek(stack, gpus=1024, ep=64, pp=16, recompute="full"):
    cfg = Path(__file__).parent / "data" / "deepseek-v3.json"
    sc = scenario_from_names(str(cfg), "dgx-h100-ndr", gpus, seq_len=4096, global_batch=1024)
    sc = replace(sc, stack=stack)
    par = Parallelism(tp=1, pp=pp, dp=gpus // pp, ep=ep, etp=1, mbs=1, recompute=(recompute,))
    return evaluate(sc, par)


def _batch_overlap(stack):
    """``stack`` overlapping the expert exchange with another micro-batch, as Megatron-Core
    runs it: without full recomputation (DeepSeek-V3's 61 blocks, a prime, cannot interleave, so
    its plans with it do not pipeline)."""
    return replace(stack, moe_overlap="batch", recompute=stack.recompute[:3])


def test_dispatchers_and_overlap_change_what_they_should():
    base = get_stack("megatron-core")
    plan = dict(pp=1, recompute="fine-grained")  # what batch overlap runs with (_batch_overlap)
    a2a = _deepseek(base, **plan)
    flex = _deepseek(replace(base, moe_dispatcher="flex"), **plan)
    gather = _deepseek(replace(base, moe_dispatcher="allgather"), **plan)
    batch = _deepseek(_batch_overlap(base), **plan)
    # top-8 over 8 nodes: DeepEP sends each token to fewer nodes than it has copies
    assert flex.link_time["ep"] < a2a.link_time["ep"]
    # all-gather moves every rank's tokens to all 64 ranks: far more than 8 copies
    assert gather.link_time["ep"] > a2a.link_time["ep"]
    # batch-level overlap hides exposed EP time and holds one more block (below; here no more
    # than the loss's gradient of the logits, which it never meets)
    assert batch.time.ep < a2a.time.ep and batch.link_time["ep"] == pytest.approx(
        a2a.link_time["ep"])
    # (equal here: the block stays under the loss's bytes; test_merged_micro_batches_hold_one_
    # more_block checks the block itself)
    assert batch.peak_memory == pytest.approx(a2a.peak_memory)


@pytest.mark.parametrize("pp, vp", [(1, 1), (4, 2)])
def test_merged_micro_batches_hold_one_more_block(pp, vp):
    """Megatron-Core's combined 1F1B runs one micro-batch's forward layer i beside another's
    backward layer L - 1 - i, each backward layer freeing its state: beside what the schedule
    holds, one more block (the interleaved schedule's extra warm-up forward starts the steady
    state where the interleaved schedule without the overlap has its peak). It had been a whole
    micro-batch more: Qwen3-30B-A3B on 8 GB300 at 8 sequences of 4,096 tokens, which ran, at
    1.5x HBM. The loss runs apart from the paired layers, so on the head's device the block only
    adds what exceeds the loss's own working bytes."""
    from nestplan import graph as G
    from nestplan.evaluate import layer_graph
    from nestplan.recompute import effect

    base = get_stack("megatron-core")
    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256)
    par = Parallelism(tp=2, pp=pp, vp=vp, dp=32 // pp, ep=8, etp=1, sp=True, zero=1, mbs=1,
                      recompute=("selective",))
    plain = evaluate(replace(sc, stack=replace(base, recompute=base.recompute[:3])), par)
    merged = evaluate(replace(sc, stack=_batch_overlap(base)), par)
    g = layer_graph(sc.model, par, sc.training, merged.scenario.stack)
    block = effect(merged.scenario.stack.policy("selective"), g.moe).saved
    loss = (base.loss_transient_bytes * sc.training.seq_len * par.mbs
            * G.padded_vocab(sc.model.vocab, par.tp) / par.tp)
    assert 0 < loss < block
    for i, (p, m) in enumerate(zip(plain.stages, merged.stages)):
        assert m.memory.activations == pytest.approx(p.memory.activations)
        extra = block - loss if i == pp - 1 else block  # (the head's device: the last)
        assert m.memory.transient - p.memory.transient == pytest.approx(extra)
    # as few micro-batches as the pipeline needs: a device that runs them all in its warm-up
    # (one alone without a pipeline; stage 0 of 4 with 2 chunks, 11 > 4·2 warm-up forwards)
    # merges none, and holds no block beyond the count; the last stage (5 < 8) still does
    few = replace(sc, training=replace(sc.training, global_batch=par.dp * pp))
    plain_few = evaluate(replace(few, stack=plain.scenario.stack), par)
    merged_few = evaluate(replace(few, stack=_batch_overlap(base)), par)
    assert merged_few.stages[0].memory.transient == pytest.approx(
        plain_few.stages[0].memory.transient)
    if pp > 1:
        assert merged_few.stages[-1].memory.transient > plain_few.stages[-1].memory.transient


def test_every_batch_overlap_run_fits_its_gpus():
    """The measured MoE runs that overlap the expert exchange with another micro-batch ran, so
    none of their plans may need more than HBM. With a whole micro-batch more held, 14 of the
    38 had been put above it, up to 1.53x (benchmarks/runs_fit.py)."""
    from nestplan.validation import hbm_ratios, load_cases

    data = Path(__file__).parent / "data"
    cases = [c for f in ("moe_runs.csv", "moe_held_out.csv", "moe_runs_gb200_gb300_b300.csv",
                         "held_out_runs.csv")
             for c in load_cases(data / f) if c.scenario.stack.moe_overlap == "batch"]
    # (38 until NeMo 25.11's B200 Qwen3-235B row took its base config; 39 until the two
    # Megatron-Bridge rows of 2026 with the overlap were added)
    assert len(cases) == 41
    over = [(c.id, round(r, 3)) for r, c in hbm_ratios(cases) if r > 1]
    assert not over, over


def test_the_search_tables_hold_the_merged_block_per_device():
    """The search's memory tables share one cost class among devices alike but for the
    embedding and the head; which of them merge forward-backward steps depends on each one's
    warm-up, so the block is decided per device: with four micro-batches over four stages of
    two chunks, stage 0 runs them all in its warm-up and the last stage merges. The tables
    give every stage the peak ``evaluate`` gives it."""
    from nestplan.cost import device as D
    from nestplan.search import tables as T

    stack = _batch_overlap(get_stack("megatron-core"))
    sc = replace(scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096,
                                     global_batch=32), stack=stack)
    par = Parallelism(tp=2, pp=4, vp=2, dp=8, ep=8, etp=1, sp=True, zero=1, mbs=1,
                      recompute=("selective",))
    ev = evaluate(sc, par)
    tb = T.build(D.config_costs(sc, par))
    policy = [p.name for p in stack.recompute].index("selective")
    blocks = sc.model.layers // par.pp
    peaks = [float(m[blocks, policy]) for m in tb.mem]
    assert peaks == pytest.approx([s.memory.total for s in ev.stages])
    held = [sum(D.held_in_flight(D.config_costs(sc, par), i)[0]) for i in range(par.pp)]
    assert held[0] == 8 and held[-1] < 8  # stage 0 merges nothing, the last stage does


def test_a_batch_overlap_stack_pipelines_experts_only_interleaved():
    """Megatron-Core overlaps the expert exchange with another micro-batch under pipelining only
    with virtual stages: a batch-overlap stack refuses the plan without them, and the search
    does not offer it."""
    from nestplan.errors import SpecError

    stack = _batch_overlap(get_stack("megatron-core"))
    sc = replace(scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096,
                                     global_batch=256), stack=stack)
    par = Parallelism(tp=2, pp=4, dp=8, ep=8, etp=1, sp=True, zero=1, mbs=1)
    with pytest.raises(SpecError, match="vp: got 1; stack .* interleaved schedule"):
        evaluate(sc, par)
    assert evaluate(sc, par.with_(vp=2)).step_time > 0
    assert evaluate(sc, par.with_(pp=1, dp=32)).step_time > 0  # no pipeline: no rule
    from nestplan.search.methods import run_method
    from nestplan.search.constraints import Constraints

    from nestplan.search import space

    con = Constraints(tp=2, ep=8)
    plain = {(p.pp, p.vp) for p in space.configurations(replace(sc, stack=get_stack(
        "megatron-core")), con)}
    overlap = {(p.pp, p.vp) for p in space.configurations(sc, con)}
    # the same space less the single-chunk pipelines (which the plain stack offers)
    assert any(pp > 1 and vp == 1 for pp, vp in plain)
    assert overlap == {(pp, vp) for pp, vp in plain if pp == 1 or vp > 1}
    res = run_method("nest", sc, con, top=20)
    assert all(p.plan.pp == 1 or p.plan.vp > 1 for p in res.plans)


def test_stack_dispatcher_values_are_checked():
    from nestplan.errors import SpecError

    with pytest.raises(SpecError, match="moe_dispatcher: got 'deepep'; allowed: alltoall"):
        replace(get_stack("megatron-core"), moe_dispatcher="deepep")
    with pytest.raises(SpecError, match="moe_overlap: got 'yes'; allowed: none, shared, batch"):
        replace(get_stack("megatron-core"), moe_overlap="yes")


def test_the_megatron_export_names_the_dispatcher_and_overlap():

    stack = _batch_overlap(replace(get_stack("megatron-core"), moe_dispatcher="flex"))
    ev = _deepseek(stack, pp=1, recompute="fine-grained")
    text = megatron_text(ev)
    for flag in ("--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep",
                 "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"):
        assert flag in text
    # a stack that overlaps without delaying the weight gradients (delay_wgrad = false, as a
    # Megatron-Bridge recipe runs it: the flag had been exported whatever the stack said)
    args = megatron_text(_deepseek(replace(stack, delay_wgrad=False), pp=1,
                                   recompute="fine-grained")).split()
    assert "--overlap-moe-expert-parallel-comm" in args and "--delay-wgrad-compute" not in args


def test_delayed_weight_gradients_are_left_out_where_megatron_refuses_them():
    """Megatron-LM's validate_args refuses --delay-wgrad-compute under --overlap-grad-reduce where
    weight gradients sit in a CUDA graph (the attention graphed) and either the attention carries
    biases ("CUDA graph with delay_wgrad_compute doesn't support attn bias for now") or
    gradient-accumulation fusion is off, as Megatron-FSDP has it (megatron/training/arguments.py
    @ NVIDIA/Megatron-LM d98e8a64dd): such exports leave it out, said; without the graphs,
    without biases, or without the reduction's overlap (one data-parallel rank), they keep it."""
    def args_of(model, graphs, zero=1, tp=1, qkv_bias=False):
        stack = replace(_batch_overlap(get_stack("megatron-core")), cuda_graphs=graphs)
        sc = replace(scenario_from_names(model, "dgx-h100-ndr", 8, seq_len=4096,
                                         global_batch=256), stack=stack)
        if qkv_bias:
            sc = replace(sc, model=replace(sc.model, qkv_bias=True))
        out = exported(sc, Parallelism(tp=tp, pp=1, dp=8 // tp, ep=8, etp=1, sp=tp > 1,
                                       zero=zero, mbs=1, recompute=("none",)), "megatron")
        return " ".join(line for line in out.text.splitlines()
                        if not line.startswith("#")).split(), " ".join(out.notes)

    for case in (("gpt-oss-120b", "layers"), ("qwen3-30b-a3b", "layers", 1, 1, True),
                 ("qwen3-30b-a3b", "layers", 2)):
        args, notes = args_of(*case)
        assert args[args.index("--cuda-graph-modules") + 1] == "attn", case
        assert "--overlap-grad-reduce" in args and "--overlap-moe-expert-parallel-comm" in args
        assert "--delay-wgrad-compute" not in args, case
        assert "--delay-wgrad-compute left out: Megatron-LM refuses it" in notes, case
    assert "no gradient-accumulation fusion" in notes and "--use-megatron-fsdp" in args
    for case in (("gpt-oss-120b", "none"), ("qwen3-30b-a3b", "layers"),
                 ("gpt-oss-120b", "layers", 1, 8)):
        args, notes = args_of(*case)
        assert "--delay-wgrad-compute" in args and "left out" not in notes, case
    assert "--overlap-grad-reduce" not in args  # (one data-parallel rank: nothing to overlap)


def test_load_imbalance_slows_the_busiest_rank_and_capacity_caps_it(tmp_path):
    """A stated imbalance (trained routers) makes the busiest expert rank compute and receive
    more; a capacity factor drops tokens beyond it; both are bad input outside [1, 64]."""
    from console import cli, one_line_error

    base = ["evaluate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ndr", "--gpus", 64,
            "--tp", 2, "--pp", 2, "--sp", "--ep", 8, "--etp", 1, "--mbs", 1, "--global-batch", 128,
            "--seq-len", 4096, "--recompute", "full", "--json"]

    def step(*extra):
        code, out, err = cli(*base, *extra)
        assert code == 0, err
        return json.loads(out)

    balanced, skewed = step(), step("--moe-imbalance", 1.5)
    capped = step("--moe-imbalance", 1.5, "--moe-capacity-factor", 1.2)
    assert balanced["step_time_s"] < capped["step_time_s"] < skewed["step_time_s"]
    # bytes grow 1.5 times; the collectives' latencies do not
    assert 1.4 < skewed["link_time_s"]["ep"] / balanced["link_time_s"]["ep"] < 1.5
    code, out, err = cli(*base, "--moe-imbalance", 1.5, "--save", tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["training"]["moe_imbalance"] == 1.5
    code, out, err = cli("evaluate", "--plan", tmp_path / "p.json", "--json")
    assert json.loads(out)["step_time_s"] == pytest.approx(skewed["step_time_s"])
    # a saved plan at another routing balance: evaluate --plan takes --moe-imbalance (a MoE
    # trial's what-if had been refused), checked as without --plan
    code, out, err = cli(*base, "--save", tmp_path / "even.json")
    code, out, err = cli("evaluate", "--plan", tmp_path / "even.json", "--moe-imbalance", 1.5,
                         "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_s"] == pytest.approx(skewed["step_time_s"])
    assert one_line_error(*cli("evaluate", "--plan", tmp_path / "even.json", "--moe-imbalance",
                               0.5), "moe-imbalance: got 0.5; must be in [1, 64]")
    assert one_line_error(*cli(*base, "--moe-imbalance", 0.5),
                          "moe-imbalance: got 0.5; must be in [1, 64]: the busiest expert rank's")
    assert one_line_error(*cli(*base, "--moe-capacity-factor", 0.5),
                          "moe-capacity-factor: got 0.5; must be in [1, 64]: the tokens an expert")


# mean |error| of the MoE runs as README's "MoE runs" reports them (percent); not targets
MOE_FILES = {"moe_runs.csv": 17.4, "moe_held_out.csv": 23.4,
             "moe_runs_gb200_gb300_b300.csv": 13.2}


@pytest.mark.parametrize("name", sorted(MOE_FILES))
def test_every_moe_run_is_expressed_and_predicted_as_reported(name):
    """Every loadable MoE run (folded expert grids, DeepEP, A2A overlap, recompute modules as the
    rows state them) evaluates without a refusal; the mean error is what the README says."""
    from nestplan.validation import run

    outcomes = run(Path(__file__).parent / "data" / name)
    assert outcomes and all(o.predicted > 0 for o in outcomes)
    mean = sum(abs(o.error) for o in outcomes) / len(outcomes) * 100
    assert mean == pytest.approx(MOE_FILES[name], abs=0.5)


@pytest.mark.parametrize("experts, top_k, ep", [(4, 2, 2), (4, 1, 2), (6, 2, 3), (4, 3, 4),
                                                (8, 2, 4)])
def test_the_most_load_one_expert_rank_can_have_is_a_count_over_routings(experts, top_k, ep):
    """``most_moe_load`` is the busiest rank's share over the mean at the worst routing: counted
    over every choice of top-k distinct experts (one token: every token alike is the worst)."""
    from nestplan.specs import MoESpec, most_moe_load

    per_rank = experts // ep
    worst = max(max(sum(1 for e in pick if e // per_rank == r) for r in range(ep))
                for pick in itertools.combinations(range(experts), top_k))
    moe = MoESpec(experts=experts, top_k=top_k, ffn_hidden=256)
    assert most_moe_load(moe, ep) == pytest.approx(worst / (top_k / ep))


def test_a_load_beyond_what_the_expert_ranks_can_have_is_costed_at_the_most_with_a_note():
    """--moe-imbalance 9 over two expert ranks of Mixtral (8 experts, top-2) was costed as given
    (34.5 s and 276 GiB against 5.4 s and 83 GiB balanced): the busiest of two ranks receives at
    most every token's two copies, twice the mean; it is costed so, and says so."""
    from console import cli

    base = ("evaluate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ndr", "--gpus", 32,
            "--tp", 1, "--pp", 4, "--ep", 2, "--mbs", 1, "--seq-len", 4096, "--global-batch",
            256, "--json")
    runs = {load: cli(*base, "--moe-imbalance", load) for load in (2, 9)}
    assert all(code == 0 for code, _, _ in runs.values())
    at = {load: json.loads(out)["step_time_s"] for load, (_, out, _) in runs.items()}
    assert at[9] == pytest.approx(at[2])
    assert ("--moe-imbalance 9: the busiest of 2 expert ranks receives at most 2x the mean"
            in runs[9][2]) and "receives at most" not in runs[2][2]
    # a capacity factor that sets the load is the flag named; the report shows the load costed
    code, out, err = cli(*base, "--moe-imbalance", 9, "--moe-capacity-factor", 4)
    assert code == 0 and "--moe-capacity-factor 4: the busiest of 2 expert ranks" in err
    from nestplan.report import _load_text
    from nestplan.specs import Parallelism

    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 32, seq_len=4096, global_batch=256,
                             moe_imbalance=9.0)
    ev = evaluate(sc, Parallelism(tp=1, pp=4, dp=8, ep=2, mbs=1))
    assert _load_text(ev) == "2x the mean (stated 9: the most 2 expert ranks can have)"


def test_imbalance_needs_more_than_one_expert_rank_and_leaves_hardware_flops_alone():
    """With one EP rank every rank holds every expert: no busiest rank. Imbalance slows the
    busiest rank but does not add hardware FLOP (HFU falls with it)."""
    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 32, seq_len=4096, global_batch=128)

    def run(ep, load):
        s = replace(sc, training=replace(sc.training, moe_imbalance=load))
        return evaluate(s, Parallelism(tp=4, pp=4, dp=2, ep=ep, etp=1, sp=True, mbs=1,
                                       recompute=("full",)))
    assert run(1, 2.0).step_time == pytest.approx(run(1, 1.0).step_time)
    even, skewed = run(2, 1.0), run(2, 2.0)
    assert skewed.step_time > even.step_time
    assert skewed.hardware_flops == pytest.approx(even.hardware_flops)


def test_moe_layer_host_time_bounds_the_forward_and_shows_as_host():
    """An MoE layer's forward takes at least the stack's host time; dense layers are untouched;
    the wait is the breakdown's ``host`` and the parts still add up to the step."""
    from nestplan.cost.device import config_costs

    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    par = Parallelism(tp=1, pp=1, dp=16, ep=8, etp=1, mbs=1)
    free = replace(sc, stack=replace(sc.stack, moe_layer_host=0.0))
    bound = replace(sc, stack=replace(sc.stack, moe_layer_host=0.05))  # far above any forward
    c0, c1 = config_costs(free, par), config_costs(bound, par)
    assert c0.moe.fwd < 0.05 and c1.moe.fwd == pytest.approx(0.05)
    assert c1.moe.host == pytest.approx(0.05 - c0.moe.fwd) and c0.moe.host == 0.0
    assert c1.moe.bwd == c0.moe.bwd and c1.dense.fwd == c0.dense.fwd and c1.dense.host == 0.0
    e0, e1 = evaluate(free, par), evaluate(bound, par)
    assert e0.time.host == 0.0
    layers = sc.model.num_moe_layers * e1.micro_batches
    assert e1.time.host == pytest.approx(layers * c1.moe.host)
    assert e1.time.total == pytest.approx(e1.step_time)
    assert e1.step_time == pytest.approx(e0.step_time + e1.time.host)
    # a forward that full recomputation runs again waits again, and that wait is host time
    # too, not recomputation (a user trial read "recompute 13.9 s" beside "compute 4.6 s")
    full = par.with_(recompute=("full",))
    r0, r1 = evaluate(free, full), evaluate(bound, full)
    assert r1.time.host == pytest.approx(2 * layers * c1.moe.host)
    assert r1.time.recompute == pytest.approx(r0.time.recompute)
    assert r1.time.compute == pytest.approx(r0.time.compute)
    assert r1.time.total == pytest.approx(r1.step_time)
    # (the longer backward hides more of the last gradient reduction)
    assert r1.step_time - r0.step_time == pytest.approx(r1.time.host - (r0.time.dp - r1.time.dp))


def test_a_layer_in_a_cuda_graph_waits_on_no_host(tmp_path):
    """A full-iteration graph holds every MoE layer, so none waits on the host; per-layer graphs
    hold an MoE layer only when its input is padded to a capacity (static shapes), and otherwise
    spare it the attention's launches only. Exported as Megatron's --cuda-graph-impl with the
    capacity flags."""

    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    par = Parallelism(tp=1, pp=1, dp=16, ep=8, etp=1, mbs=1)
    eager = replace(sc, stack=replace(sc.stack, moe_layer_host=0.05))
    capped = replace(eager, training=replace(eager.training, moe_capacity=1.0))

    def run(scenario, **stack):
        return evaluate(replace(scenario, stack=replace(scenario.stack, **stack)), par)

    e1 = evaluate(eager, par)
    full = run(eager, cuda_graphs="full_iteration")
    layers_dropless = run(eager, cuda_graphs="layers", recompute=eager.stack.recompute[:2])
    layers_unpadded = run(capped, cuda_graphs="layers", recompute=eager.stack.recompute[:2])
    layers_padded = run(capped, cuda_graphs="layers", recompute=eager.stack.recompute[:2],
                        moe_pad_to_capacity=True)
    assert e1.time.host > 0 and full.time.host == 0.0 and full.step_time < e1.step_time
    assert layers_dropless.time.host == layers_unpadded.time.host < e1.time.host
    assert run(eager, cuda_graphs="layers", recompute=eager.stack.recompute[:2],
               attention_host_share=0.0).time.host == e1.time.host
    assert layers_padded.time.host == 0.0
    assert layers_padded.step_time == pytest.approx(full.step_time)  # capacity 1: same work

    # Megatron-LM's validate_args asserts the NaN check off with a full-iteration graph
    # (megatron/training/arguments.py @ d98e8a64dd)
    assert "--cuda-graph-impl full_iteration" in megatron_text(full)
    assert "--no-check-for-nan-in-loss-and-grad" in megatron_text(full)
    assert "--cuda-graph-impl" not in megatron_text(e1)
    padded = megatron_text(layers_padded)
    assert "--cuda-graph-impl local" in padded and "--cuda-graph-modules" not in padded
    assert "--moe-expert-capacity-factor 1 " in padded + " "
    assert "--moe-pad-expert-input-to-capacity" in padded
    assert "--moe-pad-expert-input-to-capacity" not in megatron_text(layers_unpadded)
    # unpadded MoE layers stay eager: only the attention is graphed (Qwen3 has no dense layer)
    for ev in (layers_unpadded, layers_dropless):
        assert "--cuda-graph-modules attn \\\n" in megatron_text(ev)  # one module: no mlp after it
    # DeepSeek-V3's first three layers are dense: their MLPs are graphed too
    ds = scenario_from_names("deepseek-v3", "dgx-h100-ndr", 256, seq_len=4096, global_batch=256)
    ds = replace(ds, stack=replace(ds.stack, cuda_graphs="layers",
                                   recompute=ds.stack.recompute[:2]))
    ev = evaluate(ds, Parallelism(tp=1, pp=8, dp=32, ep=32, etp=1, mbs=1))
    assert "--cuda-graph-modules attn mlp \\\n" in megatron_text(ev)


def test_padding_to_capacity_computes_the_capacity_on_every_expert_rank():
    """Dropping caps the busiest rank at the capacity and leaves the mean device's work alone;
    padding makes every rank compute its capacity, on one expert rank too: the padded work is
    hardware FLOP in proportion to the capacity beyond 1, and with the routing above capacity the
    busiest rank's time is the same either way."""
    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)

    def run(par, capacity, imbalance, pad):
        tr = replace(sc.training, moe_capacity=capacity, moe_imbalance=imbalance)
        return evaluate(replace(sc, training=tr, stack=replace(
            sc.stack, moe_pad_to_capacity=pad)), par)

    for ep in (1, 8):
        par = Parallelism(tp=1, pp=1, dp=16, ep=ep, etp=1, mbs=1)
        base = run(par, 1.0, 1.0, False).hardware_flops
        assert run(par, 1.5, 1.2, False).hardware_flops == pytest.approx(base)
        assert run(par, 1.0, 1.0, True).hardware_flops == pytest.approx(base)
        half, whole = (run(par, c, 1.2, True).hardware_flops - base for c in (1.5, 2.0))
        assert half > 0 and half / whole == pytest.approx(0.5)
        assert run(par, 1.5, 1.2, True).time.compute > run(par, 1.5, 1.2, False).time.compute
    par = Parallelism(tp=1, pp=1, dp=16, ep=8, etp=1, mbs=1)
    assert run(par, 1.5, 2.0, True).time.compute == pytest.approx(
        run(par, 1.5, 2.0, False).time.compute)


MEGATRON_SCOPE_DEFAULT = "ignore:full scope is deprecated"
"""megatron-core 0.16 warns about its own default cuda_graph_scope on every TransformerConfig."""


def test_graphed_attention_spares_its_share_of_the_host_wait():
    """An eager MoE layer waits on the host for its launches; per-layer graphs of the attention
    spare the attention's share (``attention_host_share``), graphs of the router alone nothing,
    and a graphed MoE layer waits for none."""
    from nestplan.specs import TrainingSpec

    tr = TrainingSpec(seq_len=4096, global_batch=64)
    eager = get_stack("nemo")
    assert eager.moe_layer_host > 0 and 0 < eager.attention_host_share < 1

    def graphed(*modules, **more):
        return replace(eager, cuda_graphs="layers", cuda_graph_modules=modules,
                       recompute=eager.recompute[:2], **more)

    attn = graphed("attn", "moe_router", "moe_preprocess")
    assert attn.moe_host_wait(tr, 8) == pytest.approx(
        eager.moe_layer_host * (1 - eager.attention_host_share))
    assert graphed("moe_router", "moe_preprocess").moe_host_wait(tr, 8) == eager.moe_layer_host
    padded = graphed(moe_pad_to_capacity=True)  # whole layers, experts padded: all graphed
    assert padded.moe_host_wait(replace(tr, moe_capacity=1.0), 8) == 0.0
    assert padded.moe_host_wait(tr, 8) == attn.moe_host_wait(tr, 8)  # dropless: the MoE stays eager
    # and a step of a host-bound MoE plan is shorter by that much
    sc = scenario_from_names("qwen3-30b-a3b", "dgx-b200-ndr", 8, seq_len=4096, global_batch=64)
    par = Parallelism(dp=8, ep=8, etp=1, zero=1, mbs=1)
    waits = [evaluate(replace(sc, stack=s), par).time.host for s in (eager, attn)]
    assert waits[1] < waits[0]


def test_cuda_graph_stack_files_are_checked(tmp_path):
    """Stack-file keys go through the console script; a per-layer-graph stack may not offer full
    recomputation (as Megatron-Core refuses it: the next test)."""
    from console import one_line_error

    good = tmp_path / "graph.toml"
    good.write_text('base = "nemo"\nname = "g"\ncuda_graphs = "layers"\n'
                    'moe_pad_to_capacity = true\nrecompute = ["none", "selective"]\n')
    stack = get_stack(str(good))
    assert stack.cuda_graphs == "layers" and stack.moe_pad_to_capacity
    legacy = tmp_path / "legacy.toml"  # the key cuda_graphs replaced, as older plan files hold it
    legacy.write_text('base = "nemo"\nname = "g"\nfull_iteration_cuda_graph = true\n')
    assert get_stack(str(legacy)).cuda_graphs == "full_iteration"
    for body, field in (('cuda_graphs = "yes"', "cuda_graphs"),
                        ('cuda_graphs = "layers"', "stack.recompute"),
                        ('moe_pad_to_capacity = "yes"', "moe_pad_to_capacity"),
                        ('moe_dispatcher = "flex"\nmoe_pad_to_capacity = true',
                         "moe_pad_to_capacity"),
                        ('full_iteration_cuda_graph = true\ncuda_graphs = "none"',
                         "full_iteration_cuda_graph")):
        bad = tmp_path / "bad.toml"
        bad.write_text(f'base = "nemo"\nname = "g"\n{body}\n')
        code, out, err = _evaluate_moe_with(bad)
        assert one_line_error(code, out, err, field), err
    # module graphs: Megatron-Core's own rules (checked against it in the next tests)
    layers = 'cuda_graphs = "layers"\nrecompute = ["none", "selective"]\n'
    for body, needle in (('cuda_graph_modules = ["attn"]', "only with cuda_graphs = layers"),
                         (layers + 'cuda_graph_modules = ["attention"]', "allowed: attn"),
                         (layers + 'cuda_graph_modules = ["attn", "attn"]', "must differ"),
                         (layers + 'cuda_graph_modules = ["moe_preprocess"]', "needs moe_router"),
                         (layers + 'moe_pad_to_capacity = true\n'
                          'cuda_graph_modules = ["moe", "moe_router"]', "exclude each other"),
                         (layers + 'cuda_graph_modules = ["moe"]', "moe_pad_to_capacity"),
                         ('cuda_graphs = "layers"\ncuda_graph_modules = ["moe_router"]\n'
                          'recompute = {none = "none", m = "modules:moe"}', "graphed moe_router"),
                         # not graph rules, but Megatron-Core's as well
                         ('moe_overlap = "shared"\n'
                          'recompute = {none = "none", s = "modules:shared_experts"}',
                          "moe_overlap = shared"),
                         ('moe_overlap = "batch"', "recomputes neither whole blocks"),
                         ('moe_overlap = "batch"\nmoe_dispatcher = "allgather"\n'
                          'recompute = ["none", "selective"]', "alltoall or flex")):
        bad = tmp_path / "bad.toml"
        bad.write_text(f'base = "nemo"\nname = "g"\n{body}\n')
        code, out, err = _evaluate_moe_with(bad)
        assert one_line_error(code, out, err, needle), err


def _module_graphs(modules, padded=False, **training):
    stack = replace(get_stack("nemo"), name="te-graphs", cuda_graphs="layers",
                    cuda_graph_modules=modules, moe_pad_to_capacity=padded,
                    recompute=get_stack("nemo").recompute[:2])
    return replace(scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096,
                                       global_batch=256, **training), stack=stack)


MODULE_GRAPH_CASES = [
    # NeMo's MoE recipes: the router and its preprocessing in Transformer Engine graphs
    ("qwen3-30b-a3b", ("attn", "moe_router", "moe_preprocess"), {},
     "attn moe_router moe_preprocess"),
    # a capacity factor without padding: the all-to-all copies token counts to the host in its
    # preprocessing, which Megatron-Core will not graph
    ("qwen3-30b-a3b", ("attn", "moe_router", "moe_preprocess"), {"moe_capacity": 1.0},
     "attn moe_router"),
    # a dense model has no router and no MoE layer to graph
    ("llama3-8b", ("attn", "mlp", "moe_router"), {}, "attn mlp"),
    # with padding the MoE layer itself
    ("qwen3-30b-a3b", ("attn", "moe"), {"moe_capacity": 1.0, "padded": True}, "attn moe"),
]
"""(model, the stack's graph modules, workload, what the Megatron export graphs)."""


def _module_graph_export(model, modules, training):

    training = dict(training)
    padded = training.pop("padded", False)
    sc = replace(_module_graphs(modules, padded, **training),
                 model=scenario_from_names(model, "dgx-h100-ndr", 16, seq_len=4096,
                                           global_batch=256).model)
    moe = sc.model.moe is not None
    par = Parallelism(tp=1, pp=1, dp=16, ep=8 if moe else 1, etp=1 if moe else None, zero=1,
                      mbs=1)
    return sc, exported(sc, par, "megatron")


@pytest.mark.parametrize("model, modules, training, kept", MODULE_GRAPH_CASES)
def test_module_graphs_export_what_the_model_and_workload_have(model, modules, training,
                                                               kept):
    """A stack's CUDA graph modules export as Transformer Engine graphs of the modules the
    model and workload have (a note names the rest), and the cost model runs the MoE layers
    as the export graphs them."""
    from test_exports import _flags

    sc, exp = _module_graph_export(model, modules, training)
    flags = _flags(exp.text)
    assert flags["cuda-graph-impl"] == ["transformer_engine"]
    assert " ".join(flags["cuda-graph-modules"]) == kept
    assert any("left out" in n for n in exp.notes) == (kept != " ".join(modules))
    assert sc.stack.graphs_moe_layers(sc.training) == ("moe" in kept.split())


@pytest.mark.frameworks
@pytest.mark.filterwarnings(MEGATRON_SCOPE_DEFAULT)
def test_megatron_accepts_the_module_graphs_exported_and_refuses_them_unfiltered():
    pytest.importorskip("megatron.core")
    from test_exports import megatron_transformer_config

    for model, modules, training, kept in MODULE_GRAPH_CASES:
        _, exp = _module_graph_export(model, modules, training)
        megatron_transformer_config(exp.text)
        if kept != " ".join(modules):
            unfiltered = exp.text.replace(f"--cuda-graph-modules {kept}",
                                          "--cuda-graph-modules " + " ".join(modules))
            with pytest.raises(AssertionError):
                megatron_transformer_config(unfiltered)


def test_only_the_moe_layers_own_graph_spares_it_the_host():
    """A graphed router leaves the experts eager: the MoE layer still waits on the host (less
    the attention's share where the attention is graphed too); the padded layer's own graph (or
    whole-layer graphs) does not."""
    router = _module_graphs(("moe_router", "moe_preprocess"))
    assert router.stack.moe_host_wait(router.training, 8) == router.stack.moe_layer_host > 0
    with_attn = _module_graphs(("attn", "moe_router", "moe_preprocess"))
    assert 0 < with_attn.stack.moe_host_wait(with_attn.training, 8) < router.stack.moe_layer_host
    own = _module_graphs(("attn", "moe"), padded=True, moe_capacity=1.0)
    assert own.stack.moe_host_wait(own.training, 8) == 0.0
    par = Parallelism(tp=1, pp=1, dp=16, ep=8, etp=1, zero=1, mbs=1)
    assert evaluate(own, par).step_time < evaluate(
        replace(own, stack=replace(own.stack, cuda_graph_modules=("attn",))), par).step_time


@pytest.mark.frameworks
@pytest.mark.filterwarnings(MEGATRON_SCOPE_DEFAULT)
def test_megatron_graphs_a_padded_moe_layer_and_refuses_full_recompute_with_it():
    """The rules of ``cuda_graphs = "layers"`` as the installed megatron-core's own
    TransformerConfig checks them on CPU: whole-layer graphs of a padded MoE layer are accepted,
    full recomputation with them is refused."""
    TransformerConfig = pytest.importorskip(
        "megatron.core.transformer.transformer_config").TransformerConfig
    moe = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=8,
               moe_router_topk=2, moe_ffn_hidden_size=32, add_bias_linear=False,
               cuda_graph_impl="local", moe_expert_capacity_factor=1.0,
               moe_pad_expert_input_to_capacity=True)
    TransformerConfig(**moe)
    with pytest.raises(AssertionError, match="full recompute"):
        TransformerConfig(**moe, recompute_granularity="full", recompute_method="uniform",
                          recompute_num_layers=1)
    # without padding the export graphs the attention only (megatron-core 0.16 names the
    # modules cuda_graph_scope, later releases cuda_graph_modules): accepted; MoE graphs refused
    dropless = {k: v for k, v in moe.items()
                if k not in ("moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity")}
    TransformerConfig(**dropless, cuda_graph_scope=["attn"])
    with pytest.raises(AssertionError, match="drop-padding"):
        TransformerConfig(**dropless, cuda_graph_scope=["moe"])
    # `mlp` only where dense layers exist (the export adds it for them)
    TransformerConfig(**dropless, cuda_graph_scope=["attn", "mlp"], moe_layer_freq=[0, 1])
    with pytest.raises(AssertionError, match="dense layers"):
        TransformerConfig(**dropless, cuda_graph_scope=["attn", "mlp"])


def test_moe_layer_host_time_in_stack_files(tmp_path):
    from console import one_line_error

    good = tmp_path / "host.toml"
    good.write_text('base = "megatron-core"\nname = "mine"\nmoe_layer_host_ms = 2.5\n')
    assert get_stack(str(good)).moe_layer_host == pytest.approx(2.5e-3)
    bad = tmp_path / "bad.toml"
    bad.write_text('base = "megatron-core"\nname = "mine"\nmoe_layer_host_ms = -1\n')
    code, out, err = _evaluate_moe_with(bad)
    assert one_line_error(code, out, err, "moe_layer_host_ms"), err


def _evaluate_moe_with(stack):
    """``nestplan evaluate`` of Qwen3-30B-A3B with expert parallelism under a stack file:
    (exit code, stdout, stderr)."""
    from console import cli

    return cli("evaluate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-ndr", "--gpus",
               "16", "--tp", "1", "--pp", "1", "--mbs", "1", "--ep", "8", "--global-batch", "64",
               "--seq-len", "4096", "--stack", stack)


@pytest.mark.frameworks
@pytest.mark.filterwarnings(MEGATRON_SCOPE_DEFAULT)
def test_model_zoo_rows_split_their_pipeline_as_megatron_does():
    """The model zoo's Qwen3-235B runs count the embedding and the loss as pipeline layers
    (--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split): the
    rows' stage_layers are what Megatron-Core's own get_num_layers_to_build gives each model chunk
    (installed megatron-core, on CPU; chunks in model order)."""
    import csv
    torch = pytest.importorskip("torch")
    block = pytest.importorskip("megatron.core.transformer.transformer_block")
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_config import TransformerConfig

    path = Path(__file__).parent / "data" / "moe_held_out.csv"
    rows = [r for r in csv.DictReader(open(path)) if r["id"].startswith("mcore-moezoo")]
    assert len(rows) == 3
    for r in rows:
        pp, vp = int(r["pp"]), int(r["vp"])
        cfg = TransformerConfig(num_layers=94, hidden_size=64, num_attention_heads=4,
                                pipeline_model_parallel_size=pp,
                                virtual_pipeline_model_parallel_size=vp,
                                pipeline_dtype=torch.bfloat16,
                                account_for_embedding_in_pipeline_split=True,
                                account_for_loss_in_pipeline_split=True)
        ps.set_pipeline_model_parallel_world_size(pp)
        theirs = []
        try:
            for v in range(vp):
                for rank in range(pp):
                    ps.set_pipeline_model_parallel_rank(rank)
                    theirs.append(block.get_num_layers_to_build(cfg, vp_stage=v, pp_rank=rank))
        finally:
            ps.set_pipeline_model_parallel_world_size(None)
            ps.set_pipeline_model_parallel_rank(None)
        assert [int(n) for n in r["stage_layers"].split()] == theirs, r["id"]


@pytest.mark.frameworks
@pytest.mark.parametrize("capacity, ep", [(1.0, 8), (1.25, 8), (1.5, 4), (2.0, 1)])
def test_padded_expert_tokens_are_megatrons_capacity(capacity, ep):
    """Padded to capacity, a device's experts compute what Megatron-Core's all-to-all dispatcher
    gives them: every local expert the capacity of every source rank, get_capacity(tokens·top-k,
    experts, factor) each (installed megatron-core's own function;
    MoEAlltoAllTokenDispatcher.preprocess)."""
    get_capacity = pytest.importorskip("megatron.core.transformer.moe.moe_utils").get_capacity
    from nestplan.evaluate import layer_graph

    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    sc = replace(sc, training=replace(sc.training, moe_capacity=capacity, moe_imbalance=1.3),
                 stack=replace(sc.stack, moe_pad_to_capacity=True))
    par = Parallelism(tp=1, pp=1, dp=16, ep=ep, etp=1, mbs=1)
    block = layer_graph(sc.model, par, sc.training, sc.stack).block(0)
    fc1 = next(o for o in block.ops if o.name == "expert_fc1")
    moe = sc.model.moe
    per_expert = get_capacity(num_tokens=4096 * moe.top_k, num_experts=moe.experts,
                              capacity_factor=capacity)
    assert fc1.shape[0] == pytest.approx(moe.experts // ep * per_expert * ep)


@pytest.mark.parametrize("name", sorted(MOE_FILES) + ["held_out_runs.csv"])
def test_every_row_runs_what_its_notes_state(name):
    """A row's stack runs the dispatcher, expert all-to-all overlap, CUDA graphs and recompute
    modules its notes state (each row's notes quote its recipe; a stack file that drifted from
    them would score a plan the run did not use)."""
    import csv
    import re
    from nestplan.validation import load_cases

    path = Path(__file__).parent / "data" / name
    with open(path, newline="") as f:
        notes = {r["id"]: r["notes"] for r in csv.DictReader(f)}
    checked = 0
    for case in load_cases(path):
        text, stack = notes[case.id], case.scenario.stack
        said = re.search(r"dispatcher: (flex|alltoall)", text)
        if said:
            assert stack.moe_dispatcher == said.group(1), case.id
        if "EP A2A overlap on" in text:
            assert stack.moe_overlap == "batch", case.id
        if "EP A2A overlap off" in text:
            assert stack.moe_overlap != "batch", case.id
        if "CUDA graphs full_iteration" in text:
            assert stack.cuda_graphs == "full_iteration", case.id
        scope = re.search(r"CUDA graphs transformer_engine scope ([a-z_,]+)", text)
        if scope:  # per-layer graphs of these modules
            assert stack.cuda_graphs == "layers", case.id
            assert set(stack.cuda_graph_modules) == set(scope.group(1).split(",")), case.id
        # Transformer Engine's op fuser fuses the GLU clamp and the experts' bias (eager_ops):
        # a Megatron-Core stack's choice (torchtitan's rows, in held_out_runs.csv, run no TE)
        if stack.export_format == "megatron":
            fuser = "use_transformer_engine_op_fuser = True" in text
            assert ("glu_clamp" not in stack.eager_ops) == fuser, case.id
        modules = re.search(r"recompute_modules=([a-z_,]+)", text)
        if modules:
            rules = {stack.policy(p).rule for p in case.plan.recompute}
            assert rules == {"modules:" + modules.group(1)}, case.id
        checked += bool(said or modules or scope or "EP A2A overlap" in text)
    assert checked >= 1


def test_plan_files_written_before_cuda_graphs_still_load():
    """Plan files store their stack whole; those written while the field was the boolean
    full_iteration_cuda_graph load with the graphs they meant."""
    from nestplan import planfile

    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    for graphs, old in (("full_iteration", True), ("none", False)):
        ev = evaluate(replace(sc, stack=replace(sc.stack, cuda_graphs=graphs)),
                      Parallelism(tp=1, pp=1, dp=16, ep=8, etp=1, mbs=1))
        d = planfile.to_dict(ev)
        del d["stack"]["cuda_graphs"]
        d["stack"]["full_iteration_cuda_graph"] = old
        assert planfile.from_dict(d).scenario.stack.cuda_graphs == graphs


@pytest.mark.frameworks
@pytest.mark.filterwarnings(MEGATRON_SCOPE_DEFAULT)
def test_megatron_accepts_the_dispatchers_overlaps_and_graphs_exported():
    """Megatron-Core's own TransformerConfig on the Megatron exports of this file's stacks: the
    dispatchers, the batch and shared-expert overlaps, and the CUDA graphs (full iteration,
    whole layers with and without padding)."""
    pytest.importorskip("megatron.core")
    from test_exports import megatron_transformer_config


    base = get_stack("megatron-core")
    batch = _deepseek(_batch_overlap(replace(base, moe_dispatcher="flex")), pp=1,
                      recompute="fine-grained")
    # the installed megatron-core 0.16 still refuses the overlap with an MTP depth on a single
    # stage, which Megatron-LM's main branch, the export's target, allows since 286445c28a
    batch = evaluate(replace(batch.scenario, model=replace(batch.scenario.model, mtp_layers=0)),
                     batch.plan)
    exports = [megatron_text(_deepseek(base)), megatron_text(_deepseek(replace(base, moe_overlap="shared"))),
               megatron_text(_deepseek(replace(base, moe_dispatcher="allgather"))), megatron_text(batch)]
    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    par = Parallelism(tp=1, pp=1, dp=16, ep=8, etp=1, mbs=1)
    capped = replace(sc, training=replace(sc.training, moe_capacity=1.0))
    layers = dict(cuda_graphs="layers", recompute=sc.stack.recompute[:2])
    for scenario, stack in ((sc, dict(cuda_graphs="full_iteration")), (sc, layers),
                            (capped, layers), (capped, dict(layers, moe_pad_to_capacity=True))):
        exports.append(megatron_text(evaluate(replace(scenario, stack=replace(scenario.stack, **stack)),
                                     par)))
    for t in exports:
        megatron_transformer_config(t)


def test_scores_on_the_input_keep_the_unscaled_tokens_and_weight_no_output():
    """Llama 4's router score scales each expert's input: the product keeps the permuted tokens,
    unscaled, for the scores' gradient, and the combine weights nothing (a review found it
    costed as the fused output weighting, which keeps nothing)."""
    from nestplan import graph as G
    from nestplan.options import AttentionImpl, Precision

    sc = scenario_from_names("llama4-maverick", "dgx-h100-ndr", 64, seq_len=4096, global_batch=64)
    local = G.Local(1, False, 1, 16, 1, 1, 4096, Precision.BF16, AttentionImpl.FLASH)
    ops = {o.name: o for o in G.build(sc.model, local).moe.ops}
    assert ops["scale_input"].saved == 2 * 4096 * sc.model.hidden  # top-1: one copy a token
    assert ops["unpermute"].saved == 0
    plain = replace(sc.model, moe=replace(sc.model.moe, scores_on_input=False))
    ops = {o.name: o for o in G.build(plain, local).moe.ops}
    assert "scale_input" not in ops


def test_an_moe_plan_says_it_was_costed_with_balanced_routing():
    """A user trial's recommended MoE plans sat at the memory limit with balanced routing and
    stopped fitting at 1.2: where no imbalance is stated, evaluate says what the plan takes and
    needs with the busiest expert rank at 1.2 times the mean; a stated one, or a capacity factor
    that caps it, gets no note, nor does a dense model or a plan without expert parallelism."""
    from console import cli

    from nestplan.units import fmt_gib, fmt_time

    args = ["evaluate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ndr", "--gpus", 64,
            "--tp", 2, "--pp", 1, "--ep", 8, "--etp", 1, "--sp", "--mbs", 1, "--global-batch",
            256, "--seq-len", 4096, "--recompute", "full"]
    code, out, err = cli(*args)
    assert code == 0, err
    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256,
                             moe_imbalance=1.2)
    par = Parallelism(tp=2, pp=1, dp=32, ep=8, etp=1, sp=True, zero=1, mbs=1,
                      recompute=("full",))
    uneven = evaluate(sc, par)
    assert "costed with perfectly balanced routing" in err
    assert (f"this plan takes {fmt_time(uneven.step_time)}" in err
            and f"needs {fmt_gib(uneven.peak_memory)} GiB" in err), err
    # its verdict in evaluate's words (a trial: "fits, inside the headroom" had been said of a
    # load that evaluate calls "not recommended")
    free = 1 - uneven.peak_memory / uneven.capacity
    assert free > 0.02
    assert "GiB (fits, leaves the headroom)" in err and "ranks only the plans" not in err
    code, out, err = cli(*args, "--memory-headroom", round(free * 100) + 1)
    assert "GiB (fits, less than the headroom: not recommended)" in err, err
    # and says how to search for plans that leave it at that load (a MoE user's trial)
    assert "a search given --moe-imbalance 1.2 ranks only the plans that leave the headroom" in err
    for extra in (["--moe-imbalance", 1.0], ["--moe-capacity-factor", 1.25]):
        code, out, err = cli(*args, *extra)  # (a capacity factor's own note says balanced
        # routing leaves it nothing to cap: test_a_capacity_factor_under_balanced_routing...)
        assert code == 0 and "costed with perfectly balanced routing" not in err, err
    code, out, err = cli("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus",
                         8, "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8,
                         "--seq-len", 2048)
    assert code == 0 and "balanced routing" not in err, err
    # one expert rank holds every expert: no busiest rank, no note (a user trial's read +0 %)
    code, out, err = cli(*[("1" if a == 8 and args[i - 1] == "--ep" else a)
                           for i, a in enumerate(args)])
    assert code == 0 and "balanced routing" not in err, err


def test_a_batch_overlap_stack_refuses_what_megatron_core_refuses_with_it(tmp_path):
    """Megatron-Core overlaps the expert exchange with another micro-batch with at most one MTP
    depth, and graphs neither moe nor mlp beside it (TransformerConfig.__post_init__ @
    d98e8a64dd): a user trial's export of two depths had been refused at start-up. One line
    each, exit 2; one depth runs."""
    from console import cli, one_line_error

    stack = tmp_path / "batch.toml"
    head = ('base = "megatron-core"\nname = "batchy"\nmoe_dispatcher = "flex"\n'
            'moe_overlap = "batch"\n')
    tail = '[recompute]\nnone = "none"\nfine = "modules:layernorm,moe_act"\n'
    run = ["evaluate", "--model", "deepseek-v3", "--cluster", "dgx-h100-ndr", "--gpus", 256,
           "--tp", 4, "--pp", 1, "--ep", 64, "--etp", 1, "--mbs", 1, "--global-batch", 1024,
           "--seq-len", 4096, "--stack", stack]
    stack.write_text(head + tail)
    assert one_line_error(*cli(*run, "--mtp-layers", 2), "mtp-layers: got 2; stack batchy "
                          "overlaps the expert exchange")
    saved = tmp_path / "p.json"
    code, out, err = cli(*run, "--mtp-layers", 1, "--save", saved)
    assert code == 0 and "1 MTP depth" in out, err
    # which Megatron-LM runs with no pipeline, and megatron-core 0.16 does not: said
    code, _, err = cli("export", saved, "--format", "megatron", "-o", tmp_path / "m.sh")
    assert code == 0 and "megatron-core 0.16 refuses it" in err, err
    stack.write_text(head + 'cuda_graphs = "layers"\ncuda_graph_modules = ["attn", "mlp"]\n' + tail)
    assert one_line_error(*cli(*run), "stack.cuda_graph_modules: got ['attn', 'mlp']; with "
                          "moe_overlap = batch")


def test_the_blackwell_moe_recipe_stack_is_the_one_its_rows_validate():
    """The catalog's nemo-moe-blackwell holds what NeMo 26.08's GB200/GB300 rows state (the test
    stack they run on), and an MoE plan's text names the stack's dispatcher, what hides the expert
    exchange, its CUDA graphs and its host wait (a MoE trial: the catalog nemo, without any of
    NeMo's MoE recipes' settings, had predicted NeMo's Qwen3-235B on 256 GB200 at twice its
    measured step, and the output named the stack only)."""
    from dataclasses import fields
    from console import cli

    mine = get_stack("nemo-moe-blackwell")
    rows = get_stack(str(Path(__file__).parent / "data" / "moe_stacks"
                         / "nemo-flex-a2a-overlap-full-graph-op-fuser.toml"))
    assert [f.name for f in fields(mine) if getattr(mine, f.name) != getattr(rows, f.name)] \
        == ["name", "description"]
    base = ("evaluate", "--model", "qwen3-235b-a22b", "--cluster", "gb200-nvl72-ndr", "--gpus", 256,
            "--global-batch", 8192, "--precision", "fp8", "--tp", 1, "--pp", 8, "--vp", 3,
            "--ep", 32, "--mbs", 1, "--seq-len", 4096)
    said = {}
    for stack in ("nemo", "nemo-moe-blackwell"):
        code, out, err = cli(*base, "--stack", stack)
        assert code == 0, err
        said[stack] = next(line for line in out.splitlines() if line.startswith("experts:"))
    assert said["nemo"].startswith("experts: dispatcher alltoall, their exchange not overlapped, "
                                   "no CUDA graphs, host wait 6.8 ms per MoE layer (stack nemo;")
    assert said["nemo-moe-blackwell"].startswith(
        "experts: dispatcher flex, their exchange overlapped with another micro-batch's compute, "
        "one CUDA graph for the whole step, no host wait (stack nemo-moe-blackwell;")


def test_a_blackwell_export_asks_for_the_dispatcher_backend_and_fp8_recipe_its_recipes_run():
    """DeepEP's flex dispatcher goes to HybridEP where the NVLink domain spans more than one
    8-GPU board (Megatron-Core: "only hybridep supports the MNNVL case"), and fp8 to MXFP8 on
    Blackwell, per-tensor scaling on Hopper (a MoE trial's GB200 export had asked for DeepEP and
    the Hopper recipe, neither of which NeMo's GB200 rows ran)."""
    from nestplan.options import Precision

    def export_of(cluster, gpus):
        sc = scenario_from_names("qwen3-30b-a3b", cluster, gpus, seq_len=4096, global_batch=512,
                                 precision=Precision.FP8, stack="nemo-moe-blackwell")
        return megatron_text(evaluate(sc, Parallelism(tp=1, pp=1, dp=gpus, ep=8, etp=1, mbs=1,
                                                      zero=1)))

    for cluster, backend, recipe, fmt in (("gb200-nvl72-ndr", "hybridep", "mxfp8", "e4m3"),
                                          ("dgx-b200-ndr", "deepep", "mxfp8", "e4m3"),
                                          ("dgx-h100-ndr", "deepep", "tensorwise", "hybrid")):
        text = export_of(cluster, 16)
        assert f"--moe-flex-dispatcher-backend {backend} \\" in text, cluster
        assert ("needs DeepEP built with HybridEP" in text) == (backend == "hybridep"), cluster
        assert f"--fp8-recipe {recipe} \\" in text and f"--fp8-format {fmt} \\" in text, cluster
        # MXFP8's parameter gather reuses the gradient buffer, as NeMo's recipe has it
        assert ("--reuse-grad-buf-for-mxfp8-param-ag" in text) == (
            recipe == "mxfp8" and "--fp8-param-gather" in text), cluster
    assert "--reuse-grad-buf-for-mxfp8-param-ag" in export_of("dgx-b200-ndr", 16)


def test_nvlink_spans_hosts_in_a_domain_over_several_hosts():
    """HybridEP is asked for where the NVLink domain joins GPUs of several hosts: by the hosts a
    cluster file gives (devices_per_host), else by an HGX board's 8 GPUs."""
    hgx = get_cluster("dgx-b200-ndr")  # 8 GPUs on one host's NVSwitch
    nvl72 = get_cluster("gb200-nvl72-ndr")  # 64 used of a rack, 4 per tray
    assert not hgx.nvlink_spans_hosts and nvl72.nvlink_spans_hosts
    assert replace(hgx, devices_per_host=4).nvlink_spans_hosts  # two 4-GPU hosts on NVLink
    assert not replace(nvl72, devices_per_host=64).nvlink_spans_hosts  # one host, one domain
    assert replace(nvl72, devices_per_host=None).nvlink_spans_hosts  # no host size: > 8


def test_a_model_with_attention_sinks_on_a_megatron_stack_says_its_runs_were_predicted_fast():
    """GPT-OSS's development rows are all predicted too fast (README "MoE runs"): a plan of a
    model with its sinks says how much, the figures those rows give."""
    from console import cli
    from nestplan.notes.plan import SINKS_FAST, SINKS_FAST_HELD_OUT

    sys.path.insert(0, str(BENCHMARKS))
    from moe_accuracy import DATA, GB, held_out_release, moe_outcomes

    rows = moe_outcomes(DATA / "moe_runs.csv") + moe_outcomes(
        GB, lambda c: not held_out_release(c))
    fast = [-o.error for o in rows if "gpt-oss" in o.case.id]
    assert len(fast) == 24 and min(fast) > 0  # every one too fast
    assert (round(min(fast), 3), round(max(fast), 3)) == SINKS_FAST
    held = [-o.error for o in moe_outcomes(DATA / "moe_held_out.csv") + moe_outcomes(
        GB, held_out_release) if "gpt-oss" in o.case.id and o.case.id.startswith("nemo")]
    assert len(held) == 7 and min(held) > 0
    assert (round(min(held), 3), round(max(held), 3)) == SINKS_FAST_HELD_OUT
    base = ("evaluate", "--model", "gpt-oss-120b", "--cluster", "dgx-b200-ndr", "--gpus", 64,
            "--tp", 1, "--pp", 1, "--ep", 8, "--mbs", 4, "--global-batch", 1280, "--seq-len", 4096)
    for stack, said in (("nemo", True), ("torchtitan", False)):
        code, out, err = cli(*base, "--stack", stack)
        assert code == 0, err
        assert ("its development runs by 10% to 47%, its held-out ones by 2% to 46%" in err) \
            == said, (stack, err)


def test_a_capacity_factor_under_balanced_routing_is_said_to_change_nothing():
    """Balanced routing (the default) fills no expert rank beyond its share: a capacity factor
    then drops nothing and, unpadded, changes nothing, which a note says (a MoE trial's 1.0 and
    1.5 gave one plan without a word)."""
    from console import cli

    base = ("evaluate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-b200-ndr", "--gpus", 8,
            "--tp", 1, "--pp", 1, "--ep", 8, "--mbs", 1, "--global-batch", 64, "--seq-len", 4096,
            "--json")
    steps = {}
    for extra in ((), ("--moe-capacity-factor", 1.5), ("--moe-capacity-factor", 1.1,
                                                       "--moe-imbalance", 1.3)):
        code, out, err = cli(*base, *extra)
        assert code == 0, err
        steps[extra] = json.loads(out)["step_time_s"]
        said = "drops nothing and changes nothing here" in err
        assert said == (extra[:1] == ("--moe-capacity-factor",) and len(extra) == 2), (extra, err)
    assert steps[()] == steps[("--moe-capacity-factor", 1.5)]


def test_a_searched_plan_saved_at_another_routing_balance_is_not_saved_as_found(tmp_path):
    """A plan found at balanced routing, evaluated and saved at another balance, is saved as
    evaluated, not as found by its method (its search was at the file's balance)."""
    from console import cli

    code, out, err = cli("plan", "--model", "qwen3-30b-a3b", "--cluster", "dgx-b200-ndr", "--gpus", 8,
                         "--global-batch", 64, "--seq-len", 4096, "--save", tmp_path / "q.json")
    assert code == 0, err
    assert json.loads((tmp_path / "q.json").read_text())["method"] == "nest"
    code, out, err = cli("evaluate", "--plan", tmp_path / "q.json", "--moe-imbalance", 1.3,
                         "--save", tmp_path / "q2.json")
    assert code == 0, err
    assert "not saved as found by nest" in err and "evaluated at 1.3" in err
    saved = json.loads((tmp_path / "q2.json").read_text())
    assert saved.get("method") is None and saved["training"]["moe_imbalance"] == 1.3


def test_eager_torchtitans_per_op_checkpoint_exchanges_the_experts_tokens_again():
    """Eager torchtitan 0.3 exchanges tokens with spmd.all_to_all, which SelectiveAC's save list
    (the functional all_to_all_single) does not hold: its selective policy runs the forward's
    two all-to-alls again, 6 a layer a micro-batch instead of 4 (a torchtitan MoE user's trial,
    with torchtitan's own SelectiveAC on one gloo rank); compiled, the functional op is kept."""
    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64,
                             stack="torchtitan")
    par = Parallelism(dp=16, ep=8, etp=1, zero=2, mbs=1, recompute=("selective",))
    eager = evaluate(sc, par)
    kept = evaluate(replace(sc, stack=replace(sc.stack, name="kept",
                                              per_op_saves_all_to_all=True)), par)
    assert eager.link_time["ep"] == pytest.approx(1.5 * kept.link_time["ep"])
    assert eager.peak_memory == kept.peak_memory  # (time only: what is saved is not measured)
    # kept, the exchange is what it is without recomputation; compiled, it is kept
    plain = par.with_(recompute=("none",))
    assert evaluate(sc, plain).link_time["ep"] == pytest.approx(kept.link_time["ep"])
    compiled = replace(sc, stack=get_stack("torchtitan-compile"))
    assert evaluate(compiled, par).link_time["ep"] == pytest.approx(
        evaluate(compiled, plain).link_time["ep"])
    # DeepEP's ops are on the save list: a torchtitan stack dispatching with it re-runs nothing
    flex = replace(sc, stack=replace(sc.stack, name="flex", moe_dispatcher="flex"))
    assert evaluate(flex, par).link_time["ep"] == pytest.approx(
        evaluate(flex, plain).link_time["ep"])


def test_a_plan_whose_step_is_much_host_wait_says_how_far_such_runs_were_off():
    """The MoE layers' host wait is the least certain term of an MoE step: the measured runs
    predicted with a fifth or more of their step waiting are off either way, by the figures the
    note gives (read here from the rows); a plan that heavy says so (an MoE user's trial ranked a
    recipe 1.5x behind a plan that differed from it mostly in that wait), a lighter one does not."""
    from console import cli
    from nestplan.notes.plan import MOE_HOST_HEAVY, MOE_HOST_HEAVY_ERRORS
    from nestplan.validation import load_cases, predict

    sys.path.insert(0, str(BENCHMARKS))
    from moe_accuracy import DATA, GB

    errors = []
    for path in (DATA / "moe_runs.csv", DATA / "moe_held_out.csv", GB):
        for case in load_cases(path):
            if case.metric == "step_time" and case.scenario.model.moe is not None:
                step, ev = predict(case)
                if ev.time.host >= MOE_HOST_HEAVY * ev.step_time:
                    errors.append(step / case.measured - 1)
    assert len(errors) >= 20 and min(errors) < 0 < max(errors)
    assert (round(min(errors), 3), round(max(errors), 3)) == MOE_HOST_HEAVY_ERRORS
    base = ("evaluate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-ndr", "--tp", 1,
            "--pp", 1, "--ep", 16, "--etp", 1, "--mbs", 1, "--seq-len", 4096, "--recompute", "none")
    heavy = Path(__file__).parent / "data" / "moe_stacks" / "nemo-flex-a2a-overlap-router-graphs.toml"
    code, out, err = cli(*base, "--gpus", 64, "--global-batch", 4096, "--stack", heavy)
    assert code == 0 and "45% of this step is the MoE layers' host wait" in err, err
    assert "host wait 6.8 ms per MoE layer" in out and "6.8 ms per MoE layer)" in err, err
    assert "off by -35% to +82%" in err, err
    code, out, err = cli(*base, "--gpus", 16, "--global-batch", 1024, "--stack", "nemo")
    assert code == 0 and "host wait (" not in err, err


def test_deepeps_dispatcher_needs_more_than_one_expert_rank():
    """Megatron-Core builds DeepEP's dispatcher over the expert-TP x EP group only when it holds
    more than one rank ("DeepEP dispatcher requires TPxEP > 1", token_dispatcher.py @
    d98e8a64dd): a flex stack's search offers no such plan (an MoE user's trial had been
    recommended ep = 1 with it), evaluate and a fixed plan refuse it in one line, and the
    all-to-all stack keeps it, as does HybridEP's backend on NVLink over several hosts."""
    from console import cli, flags, one_line_error
    from nestplan.search import space
    from nestplan.search.constraints import Constraints

    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    for stack, single in (("megatron-core-deepep", False), ("megatron-core", True)):
        shapes = list(space.shapes(replace(sc, stack=get_stack(stack)), Constraints()))
        assert shapes and any((s.etp or s.tp) * s.ep == 1 for s in shapes) == single, stack
    base = ("--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-ndr", "--gpus", 16, "--seq-len",
            4096, "--global-batch", 64, "--stack", "megatron-core-deepep", "--tp", 1, "--ep", 1)
    for command in ("evaluate", "plan"):
        code, out, err = cli(command, *base, *(("--pp", 1, "--mbs", 1) if command == "evaluate"
                                               else ()))
        assert one_line_error(code, out, err, "ep: got 1; stack megatron-core-deepep dispatches "
                              "tokens with DeepEP (moe_dispatcher = flex), which Megatron-Core "
                              "runs over more than one expert-TP x EP rank only")
    # HybridEP, which the export asks for where NVLink spans hosts, has no such rule (a review's)
    code, out, err = cli("evaluate", *flags(*base, "--cluster", "gb200-nvl72-ndr"), "--pp", 1,
                         "--mbs", 1)
    assert code == 0, err
