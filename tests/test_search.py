"""The stage DP and the search: exact against brute force, equal to evaluate, baselines."""

import dataclasses
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nestplan.catalog import get_cluster
from nestplan.cli import main
from nestplan.errors import InfeasibleError, SpecError
from nestplan.evaluate import evaluate, scenario_from_names
from nestplan.options import MLPKind, Norm, Position
from nestplan.search import methods, space
from nestplan.search.constraints import Constraints
from nestplan.catalog import get_stack
from nestplan.recompute import Policy
from nestplan.schedule import SCHEDULES
from nestplan.specs import ClusterSpec, Level, ModelSpec, MoESpec, Parallelism, Scenario, TrainingSpec

H100 = get_cluster("dgx-h100-ndr").accelerator


def tiny_scenario(layers, gpus, node, heads, kv, moe, extra_mib, batch, bw_ratio, over,
                  first_dense=0, vocab=512):
    """A small model on a small cluster; HBM leaves ``extra_mib`` above the fixed reserve
    (the tiny plans need 12-85 MiB of it, so memory decides some and not others), with no
    headroom (the default 6 % of 1.5 GiB is more than all of it)."""
    acc = dataclasses.replace(H100, hbm_bytes=1.5 * 2**30 + extra_mib * 2**20)
    cluster = ClusterSpec(name="tiny", accelerator=acc, levels=(
        Level(name="node", size=node, bandwidth=200e9, latency=2e-6),
        Level(name="net", size=None, bandwidth=200e9 / bw_ratio, latency=10e-6,
              oversubscription=over)))
    model = ModelSpec(name="tiny", layers=layers, hidden=256, heads=heads, kv_heads=kv,
                      head_dim=256 // heads, ffn_hidden=512, vocab=vocab, mlp=MLPKind.SWIGLU,
                      norm=Norm.RMSNORM, bias=False, position=Position.ROPE,
                      moe=MoESpec(experts=2, top_k=1, ffn_hidden=256,
                                  first_dense_layers=first_dense) if moe else None)
    return Scenario(model=model, cluster=cluster, gpus=gpus, memory_headroom=0.0,
                    training=TrainingSpec(seq_len=512, global_batch=batch))


def test_the_network_bound_holds_for_a_plan_without_interleaving():
    """A hypothesis example (2026-12-05): the network bound took the pipeline's send times from
    the interleaved layout, whose wrap-around send shares the links, so a four-stage plan's bound
    (one block a stage, rank order tp-pp-cp-dp) exceeded its step by 1.7 µs and the search
    returned a slower plan than the brute-force optimum. (On a stack that overlaps sends without
    interleaving, as megatron-core was costed then: the four-stage plan is the optimum there.)"""
    sc = tiny_scenario(4, 4, 2, 2, 2, False, 35, 4, 1.0, 4.0, 0)
    sc = dataclasses.replace(sc, stack=dataclasses.replace(
        sc.stack, p2p_overlap_needs_interleaving=False))
    con = Constraints(zero=0, mbs=2)
    oracle = methods.run_method("exhaustive", sc, con, top=1)
    found = methods.run_method("nest", sc, con, top=1)
    assert oracle.best.plan.pp == 4
    assert found.best.step_time == pytest.approx(oracle.best.step_time, rel=1e-9)
    assert space.network_bound(sc, oracle.best.plan.with_(stage_layers=None)) \
        <= oracle.best.step_time


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(layers=st.integers(2, 4), gpus=st.sampled_from([2, 4]), node=st.sampled_from([1, 2, 4]),
       heads=st.sampled_from([2, 4]), moe=st.booleans(), hbm=st.sampled_from([20, 35, 60, 1000]),
       batch=st.sampled_from([4, 8]), bw_ratio=st.sampled_from([1.0, 10.0]),
       over=st.sampled_from([1.0, 4.0]), zero=st.sampled_from([0, 1, 3]),
       mbs=st.sampled_from([1, 2]), first_dense=st.sampled_from([0, 1]),
       more_policies=st.booleans(), every_schedule=st.booleans())
def test_dp_equals_brute_force(layers, gpus, node, heads, moe, hbm, batch, bw_ratio, over, zero,
                               mbs, first_dense, more_policies, every_schedule):
    """Random small models (dense, MoE, MoE after a dense layer) and two-level clusters with
    tight memory, with the standard three recompute policies or a stack offering four, and
    Megatron's two pipeline schedules or every schedule nestplan models (zero bubble's deferred
    weight gradients change both the objective and the memory): NEST finds exactly the
    brute-force optimum of the same space."""
    sc = tiny_scenario(layers, gpus, node, heads, heads // 2 if heads > 2 else heads, moe, hbm,
                       batch, bw_ratio, over, first_dense)
    if more_policies:
        base = get_stack("megatron-core")
        sc = dataclasses.replace(sc, stack=dataclasses.replace(
            base, recompute=base.recompute + (Policy("half", "every:2"),)))
    if every_schedule:
        sc = dataclasses.replace(sc, stack=dataclasses.replace(sc.stack,
                                                               schedules=tuple(SCHEDULES)))
    con = Constraints(zero=zero, mbs=mbs)
    try:
        oracle = methods.run_method("exhaustive", sc, con, top=1)
    except InfeasibleError:
        _nest_names_the_closest_plan(sc, con)
        return
    found = methods.run_method("nest", sc, con, top=1)
    assert found.best.step_time == pytest.approx(oracle.best.step_time, rel=1e-9)
    # the DP's own objective is exactly what evaluate reports for its plan
    assert found.objective == pytest.approx(found.best.step_time, rel=1e-9)
    assert found.best.fits


def _nest_names_the_closest_plan(sc, con):
    """Where nothing fits, NEST names the plan the least over the limit of every plan exhaustive
    evaluates, measuring every configuration whose floor is below it; measuring at most one,
    it names one no closer, and a bound no further, than exhaustive's (returned: what it says
    measuring one, None if exhaustive evaluated no plan)."""
    from nestplan.search import driver

    said = {}

    def keep(sc_, con_, shortfall, n, method="nest"):
        said.setdefault("short", []).append(shortfall)
        return "nothing fits"

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(driver, "why_nothing_fits", keep)
        for method in ("exhaustive", "nest"):
            with pytest.raises(InfeasibleError):
                methods.run_method(method, sc, con, top=1)
        mp.setattr(driver, "SHORTFALL_MEASURED", 1)
        with pytest.raises(InfeasibleError):
            methods.run_method("nest", sc, con, top=1)
    if sc.stack.reserved_bytes >= sc.memory_limit:  # nest says so before it searches
        return None
    oracle, nest, once = said["short"]
    if oracle.plan is None:  # no plan of any split was evaluated
        return None
    assert nest.least is None and not nest.floor
    assert nest.gap == pytest.approx(oracle.gap, rel=1e-9)
    assert evaluate(sc, nest.plan).peak_memory == pytest.approx(nest.gap + nest.limit, rel=1e-9)
    assert once.gap >= oracle.gap * (1 - 1e-9)
    if once.least is not None:
        assert once.least <= oracle.gap + oracle.limit
    return once


@pytest.mark.parametrize("node, extra_mib, moe, zero, mbs, bound", [
    (2, 5, False, 0, 1, True), (2, 10, True, 3, 2, True), (1, 15, True, 3, 1, False),
    (1, 15, False, 3, 2, True)])
def test_nest_names_the_closest_plan_when_nothing_fits(node, extra_mib, moe, zero, mbs, bound):
    """Four GPUs with a few MiB above the reserve: NEST names the plan exhaustive finds the least
    over the limit (it had measured the 8 configurations of least memory floor, a lower bound,
    and could name one 0.4 GiB further than another: qwen3-30b-a3b on 8 H100 at 20 % headroom);
    made to measure one, it names a bound no greater than that plan's peak."""
    sc = tiny_scenario(4, 4, node, 2, 2, moe, extra_mib, 8, 1.0, 1.0)
    once = _nest_names_the_closest_plan(sc, Constraints(zero=zero, mbs=mbs))
    assert (once.least is not None) == bound


@pytest.mark.parametrize("layers,batch,vocab", [(8, 2, 512), (8, 3, 65536), (12, 2, 65536)])
def test_dp_equals_brute_force_with_fewer_micro_batches_than_stages(layers, batch, vocab):
    """torchtitan runs interleaved 1F1B with fewer micro-batches than stages (one round, whose
    span weighs ``sum X`` by 1): over four GPUs, NEST finds the brute-force optimum, and its
    objective is what evaluate reports."""
    sc = tiny_scenario(layers, 4, 4, 2, 2, False, 4000, batch, 1.0, 1.0, 0, vocab)
    sc = dataclasses.replace(sc, stack=get_stack("torchtitan"))
    oracle = methods.run_method("exhaustive", sc, Constraints(), top=1)
    found = methods.run_method("nest", sc, Constraints(), top=1)
    assert found.best.step_time == pytest.approx(oracle.best.step_time, rel=1e-9)
    assert found.objective == pytest.approx(found.best.step_time, rel=1e-9)
    short = methods.run_method("nest", sc, Constraints(pp=4, vp=2), top=1).best
    assert short.micro_batches < 4 and short.plan.pipeline.name == "interleaved-1f1b"


def test_objective_equals_evaluate_on_a_real_scenario():
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 256, seq_len=8192, global_batch=256)
    res = methods.run_method("nest", sc, Constraints(tp=8), top=3)
    assert res.objective == pytest.approx(res.best.step_time, rel=1e-9)
    for ev in res.plans:
        again = evaluate(sc, ev.plan)
        assert again.step_time == ev.step_time and again.fits
        assert ev.plan.tp == 8
    assert [e.step_time for e in res.plans] == sorted(e.step_time for e in res.plans)


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-8x7b"])
def test_nest_beats_or_ties_every_baseline(name):
    sc = scenario_from_names(name, "meta-h100-roce-7to1", 32, seq_len=4096, global_batch=128)
    nest = methods.run_method("nest", sc, Constraints(), top=1).best
    for method in ("manual", "phaze", "alpa", "mist", "mcmc"):
        other = methods.run_method(method, sc, Constraints(), top=1).best
        assert other.fits
        assert nest.step_time <= other.step_time * (1 + 1e-9), method


def test_every_search_that_finds_nothing_says_how_close_it_came():
    """exhaustive and mcmc name the closest plan and its shortfall, as nest does (they had said
    only that nothing fits), and all three the least a plan misses by (nest had given the memory
    floor of a configuration no split fits, a lower bound: 96.6 GiB here)."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=64)
    con = Constraints(tp=8, pp=1, zero=1, recompute=("none",), mbs=2)
    from nestplan.specs import Parallelism

    plan = Parallelism(tp=8, pp=1, dp=1, sp=True, zero=1, recompute=("none",), mbs=2)
    gap = (evaluate(sc, plan).peak_memory - sc.memory_limit) / 2**30  # the one shape there is
    for method in ("nest", "mcmc", "exhaustive"):
        with pytest.raises(InfeasibleError) as e:
            methods.run_method(method, sc, con, top=1)
        said = str(e.value)
        assert "the closest plan (tp=8 pp=1 dp=1" in said and "try more GPUs" in said, said
        for hint in ("a longer pipeline (drop --pp)", "ZeRO-3 (drop --zero)",
                     "full recomputation (drop --recompute)", "a smaller micro-batch (drop --mbs)",
                     "more tensor parallelism (drop --tp)"):  # each names the flag that fixed it
            assert hint in said, (hint, said)
        short = float(said.split("short by ")[1].split(" GiB")[0])
        assert short == pytest.approx(gap, abs=0.05), method
        # the peak it states is evaluate's for those flags
        needs = float(said.split(") needs ")[1].split(" GiB")[0])
        assert needs == pytest.approx(evaluate(sc, plan).peak_memory / 2**30, abs=0.05), method


def test_a_search_where_nothing_fits_times_nothing(monkeypatch):
    """When no configuration's memory floor is within the limit, the search computes no time
    bound (it had computed the network bounds of every configuration, 18 s of DeepSeek-V3 on 64
    H100s), and names the plan exhaustive finds the closest."""
    sc = tiny_scenario(4, 4, 2, 2, 2, True, 2, 8, 1.0, 1.0)
    con = Constraints()
    _nest_names_the_closest_plan(sc, con)

    def timed(*args, **kw):
        raise AssertionError("a time bound was computed")

    for name in ("compute_bound", "network_bound", "config_bounds", "policy_bounds"):
        monkeypatch.setattr(space, name, timed)
    with pytest.raises(InfeasibleError, match="the closest plan"):
        methods.run_method("nest", sc, con, top=1)


@pytest.mark.parametrize("name, gpus", [("qwen3-30b-a3b", 64), ("llama3-70b", 128)])
def test_memory_does_not_depend_on_the_rank_order(name, gpus):
    """Where nothing fits, the search floors and measures one rank order of each configuration
    (``driver._one_order``): a plan's peak, and the least peak of its configuration's memory
    table, are the same at every order the space offers (shapes of a dense and an MoE model
    spread over the space, each at its least and most virtual stages and two ZeRO stages)."""
    from nestplan.cost import device as D
    from nestplan.search import tables as T
    from nestplan.search.driver import _least_peaks

    sc = scenario_from_names(name, "dgx-h100-ndr", gpus, seq_len=4096, global_batch=1024)
    con = Constraints()
    shapes = [s for s in space.shapes(sc, con) if len(space.rank_orders(con, s)) > 1]
    checked = 0
    for shape in shapes[::len(shapes) // 6][:6]:
        orders = space.rank_orders(con, shape)
        vps = space.virtual_stages(sc, con, shape)
        for vp in {vps[0], vps[-1]}:
            for zero in space.zero_stages(sc, con, shape.parallelism(orders[0], vp=vp))[-2:]:
                plans = [shape.parallelism(o, vp=vp, zero=zero) for o in orders]
                peaks = {round(evaluate(sc, p).peak_memory) for p in plans}
                least = set()
                for p in plans:
                    tb = T.build(D.config_costs(sc, p))
                    if tb is not None:
                        least.add(tuple(round(m) for m, _ in _least_peaks(sc, tb, p, [(0,), (2,)],
                                                                           None)))
                assert len(peaks) == 1 and len(least) <= 1, (plans[0], peaks, least)
                checked += 1
    assert checked >= 12


def test_a_floor_names_the_configuration_without_what_a_split_settles():
    """When the shortfall is only a memory floor (no table to measure a split), the message names
    the configuration, as evaluate's flags, without a recomputation or split, and says "at
    least"."""
    from nestplan.search.driver import Shortfall, why_nothing_fits
    from nestplan.specs import Parallelism

    sc = scenario_from_names("llama3-405b", "dgx-h100-ndr", 32, seq_len=4096, global_batch=1024)
    short = Shortfall(sc.memory_limit)
    par = Parallelism(tp=8, pp=4, dp=1, sp=True, zero=1, recompute=("full",), mbs=1,
                      stage_layers=(30, 30, 30, 36))
    short.add(sc.memory_limit + 5 * 2**30, par, floor=True)
    said = why_nothing_fits(sc, Constraints(), short, 10)
    named = said.split("the closest configuration (")[1].split(")")[0].split()
    assert named == ["tp=8", "pp=4", "dp=1", "cp=1", "ep=1", "vp=1", "schedule=1f1b", "sp=on",
                     "zero=1", "mbs=1", "rank-order=tp-cp-dp-pp"], said
    assert "short by at least 5.0 GiB" in said


def _named_plan(said: str):
    """The plan a "nothing fits" message names, as evaluate's flags would give it."""
    import re

    from nestplan.axes import parse_order
    from nestplan.recompute import parse_names
    from nestplan.specs import Parallelism

    named = dict(re.findall(r"([\w-]+)=([\w,*-]+)", said.split("closest plan (")[1].split(")")[0]))
    kw = {k: int(named[k]) for k in ("tp", "pp", "dp", "cp", "vp", "zero", "mbs")}
    kw.update(sp=named["sp"] == "on", rank_order=parse_order(named["rank-order"]),
              recompute=parse_names("recompute", named["recompute"]))
    if "schedule" in named:
        kw["schedule"] = named["schedule"]
    if "stage-layers" in named:
        kw["stage_layers"] = tuple(int(n) for n in named["stage-layers"].split(","))
    return Parallelism(**kw)


@pytest.mark.parametrize("con, says", [
    (Constraints(), "recompute=full mbs=1 rank-order="),
    (Constraints(pp=4, recompute=("full", "none", "none", "full")), "stage-layers="),
    (Constraints(pp=4, vp=2), "vp=2 schedule=interleaved-1f1b")])
def test_the_closest_plan_named_is_the_one_whose_shortfall_is_quoted(con, says):
    """Llama 3 405B on 32 H100 fits no way: the plan nest names (its split and per-stage policies
    where they are not the defaults, its chunks and schedule), evaluated as named, misses the
    limit by what the message says. It had named the configuration with its own policy
    (recompute=none) beside full recomputation's shortfall, and no split: 142 GiB quoted for plans
    short by far more."""
    sc = scenario_from_names("llama3-405b", "dgx-h100-ndr", 32, seq_len=4096, global_batch=1024)
    with pytest.raises(InfeasibleError) as e:
        methods.run_method("nest", sc, con, top=1)
    said = str(e.value)
    assert says in said, said
    short = float(said.split("short by ")[1].split(" GiB")[0])
    assert short == pytest.approx(
        (evaluate(sc, _named_plan(said)).peak_memory - sc.memory_limit) / 2**30, abs=0.05)


def test_exhaustive_counts_the_plans_it_evaluates(monkeypatch):
    """The space's size, which the limit and the progress line use, is the number of plans
    evaluated, also with one policy fixed per stage (it had counted every mix of policies)."""
    sc = tiny_scenario(4, 4, 2, 4, 2, False, 1000, 8, 1.0, 1.0)
    con = Constraints(pp=2, mbs=1, recompute=("full", "none"))
    evaluated = []
    real = methods.evaluate
    monkeypatch.setattr(methods, "evaluate", lambda *a: evaluated.append(a) or real(*a))
    methods.exhaustive(sc, con, 1)
    size = len(evaluated)
    assert size
    methods.exhaustive(sc, con, 1, limit=size)  # within its own size
    with pytest.raises(SpecError, match=f"the space holds {size:,} plans"):
        methods.exhaustive(sc, con, 1, limit=size - 1)


def test_exhaustive_stops_listing_past_its_limit(monkeypatch):
    """A space larger than the limit is refused after listing only as many configurations as
    it takes to pass it (compare of Qwen3-235B on 512 GPUs had listed all 513,680, 15 s)."""
    sc = scenario_from_names("qwen3-235b-a22b", "dgx-h100-ndr", 512, seq_len=4096, global_batch=1024)
    listed = []
    real = methods.space.configurations

    def counting(*a):
        for par in real(*a):
            listed.append(par)
            yield par

    monkeypatch.setattr(methods.space, "configurations", counting)
    with pytest.raises(SpecError, match="the space holds more than 50,000 plans; fix some of"):
        methods.exhaustive(sc, Constraints(), 1)
    assert 0 < len(listed) < 1000, len(listed)


def test_a_space_too_large_names_only_the_knobs_the_stack_varies():
    """The advice to fix knobs names those the stack offers (a DeepSpeed user's trial was told to
    fix --tp, --cp and --vp on a stack with none of them)."""
    sc = scenario_from_names("llama3-8b", "selene-a100-hdr", 64, seq_len=4096, global_batch=256,
                             stack="deepspeed")
    with pytest.raises(SpecError) as e:
        methods.exhaustive(sc, Constraints(), 1)
    assert ("fix some of --pp --recompute --dp --mbs --zero (pipeline depth multiplies it most)"
            in str(e.value)), e.value
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256)
    with pytest.raises(SpecError) as e:
        methods.exhaustive(sc, Constraints(), 1)
    assert ("fix some of --pp --recompute --vp --tp --dp --cp --mbs --zero (pipeline depth and "
            "per-stage recomputation multiply it most)") in str(e.value), e.value


def test_manual_keeps_a_fixed_vp_by_pipelining():
    """--vp 2 is an interleaved pipeline: manual takes the shortest pipeline that can have it
    (it had taken no pipeline and dropped the vp)."""
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    assert methods.manual_plan(sc, Constraints()).pp == 1
    p = methods.manual_plan(sc, Constraints(vp=2))
    assert (p.pp, p.vp, p.schedule) == (2, 2, None) and evaluate(sc, p).fits
    # on one node, TP leaves room for the pipeline the vp needs
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=64)
    p = methods.manual_plan(sc, Constraints(vp=2))
    assert (p.tp, p.pp, p.vp) == (4, 2, 2)
    p = methods.manual_plan(sc, Constraints(schedule="1f1b"))  # a fixed schedule likewise
    assert (p.tp, p.pp, p.pipeline.name) == (4, 2, "1f1b")


def test_manual_follows_megatron_rules():
    sc = scenario_from_names("gpt3-175b", "selene-a100-hdr", 512, seq_len=2048,
                             global_batch=512)
    p = methods.manual_plan(sc, Constraints())
    assert (p.tp, p.sp, p.zero, p.mbs, p.vp) == (8, True, 1, 1, 1)
    assert p.recompute == ("full",)
    assert evaluate(sc, p).fits
    assert not evaluate(sc, p.with_(pp=p.pp // 2, dp=p.dp * 2)).fits  # the smallest PP that fits


def test_search_space_respects_constraints_and_limits():
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 128, seq_len=8192, global_batch=128)
    con = Constraints(tp_within_node=True, zero=1)
    for par in space.configurations(sc, con):
        assert par.tp <= 8 and par.zero == 1 and par.rank_order[0].value == "tp"
        assert par.tp * par.pp * par.dp * par.cp == 128
    # within a node of 72 only degrees that divide it: a group of 16 would straddle two nodes
    # (a hardware trial's NVL72 search had returned tp 16 under --tp-within-node)
    rack = dataclasses.replace(sc.cluster, levels=(
        dataclasses.replace(sc.cluster.levels[0], size=72), *sc.cluster.levels[1:]))
    wide = dataclasses.replace(sc, cluster=rack, gpus=144)
    tps = {par.tp for par in space.configurations(wide, con)}
    assert tps and all(72 % t == 0 for t in tps) and 16 not in tps


def run_cli(args, capsys):
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    return (code, *capsys.readouterr())


def test_plan_json_contract(capsys):
    code, out, err = run_cli(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                              "--gpus", "16", "--seq-len", "4096", "--global-batch", "64",
                              "--top", "3", "--json"], capsys)
    assert code == 0, err
    js = json.loads(out)
    for key in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
                "mfu", "peak_memory_gib", "fits", "tp", "pp", "dp", "cp", "ep", "vp", "sp",
                "zero", "recompute", "mbs", "stages", "rank_order"):
        assert key in js
    devices = sorted(d for s in js["stages"] for d in s["devices"])
    assert devices == list(range(16))
    assert all("blocks" in s for s in js["stages"]) and len(js["top"]) == 3
    # each listed plan with its margin (a pipeline engineer's script gates alternatives on it)
    best = js["top"][0]
    assert (best["margin_gib"], best["within_headroom"]) == (js["margin_gib"],
                                                           js["within_headroom"])
    assert all(isinstance(p["margin_gib"], float) and isinstance(p["within_headroom"], bool)
               for p in js["top"])


def test_plan_text_lists_top_plans_and_devices(capsys):
    code, out, _ = run_cli(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                            "--gpus", "16", "--global-batch", "64", "--pp", "2"], capsys)
    assert code == 0
    assert "best plan" in out and "devices per stage" in out and " pp=2 " in out


def test_plan_nothing_fits_exits_3(capsys):
    code, out, err = run_cli(["plan", "--model", "llama3-405b", "--cluster", "dgx-h100-ndr",
                              "--gpus", "8", "--seq-len", "8192", "--global-batch", "8"], capsys)
    assert code == 3 and out == ""
    assert "short by" in err and "more GPUs" in err and "Traceback" not in err


def test_plan_names_a_stack_reserve_that_fills_the_device(tmp_path, capsys):
    """A stack that reserves more than a device holds leaves no plan of any size: the search
    says so at once, instead of 'short by ...; try more GPUs' after searching (a fuzzer's)."""
    stack = tmp_path / "res.toml"
    stack.write_text('base = "megatron-core"\nname = "res"\nreserved_GiB = 100\n')
    code, out, err = run_cli(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                              "--gpus", "1024", "--stack", str(stack)], capsys)
    assert code == 3 and out == ""
    assert "stack res reserves 100.0 GiB on every device (reserved_GiB)" in err
    assert "more GPUs" not in err


def test_plan_bad_method_exits_2(capsys):
    """An unknown method exits 2, with the one it is likely a slip for (a NEST-paper trial's
    "nets" and "Nest" had got none)."""
    code, _, err = run_cli(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                            "--gpus", "8", "--method", "genetic"], capsys)
    assert code == 2 and "method: got 'genetic'; allowed: nest, manual" in err
    from console import cli, one_line_error

    for slip in ("nets", "Nest"):
        assert one_line_error(*cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                                   "--gpus", 8, "--method", slip),
                              f"method: got '{slip}'; did you mean 'nest'? allowed: nest,")


def test_phaze_that_finds_nothing_is_not_told_to_drop_a_zero_it_chose():
    """phaze never shards (ZeRO-0 of its own): where nothing fits it is not told "ZeRO-3 (drop
    --zero)" (a DeepSpeed trial's compare said so of a --zero never given); a search given
    --zero 1 is."""
    from console import cli

    base = ("plan", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr", "--gpus", 8)
    code, _, err = cli(*base, "--method", "phaze")
    assert code == 3 and "phaze (no ZeRO" in err and "--zero" not in err, err
    code, _, err = cli(*base, "--zero", 1, "--pp", 1)
    assert code == 3 and "ZeRO-3 (drop --zero)" in err, err


def test_compare_json(capsys):
    code, out, _ = run_cli(["compare", "--model", "llama2-7b", "--cluster", "dgx-h100-ndr",
                            "--gpus", "16", "--global-batch", "64", "--seq-len", "4096", "--json"],
                           capsys)
    assert code == 0
    js = json.loads(out)
    assert js["scenario"] == {"model": "llama2-7b", "cluster": "dgx-h100-ndr", "gpus": 16,
                              "seq_len": 4096, "global_batch": 64, "precision": "bf16",
                              "stack": "megatron-core", "attention_span": None, "moe_imbalance": None,
                              "moe_capacity_factor": None, "mtp_layers": 0}
    methods_run = {m["method"]: m for m in js["methods"]}
    assert methods_run["manual"]["tokens_per_s_ratio_to_manual"] == pytest.approx(1.0)
    assert methods_run["nest"]["tokens_per_s_ratio_to_manual"] >= 1.0
    # each method's plan as evaluate reproduces it: its expert TP and its split with the rest
    for name, row in methods_run.items():
        flags = ["--tp", row["tp"], "--pp", row["pp"], "--dp", row["dp"], "--cp", row["cp"],
                 "--vp", row["vp"], "--zero", row["zero"],
                 "--recompute", row["recompute"], "--mbs", row["mbs"],
                 "--rank-order", row["rank_order"], "--sp" if row["sp"] else "--no-sp"]
        assert (row["schedule"] is None) == (row["pp"] == 1)  # (no pipeline, no schedule)
        if row["schedule"] is not None:
            flags += ["--schedule", row["schedule"]]
        if row["stage_layers"] is not None:
            flags += ["--stage-layers", ",".join(map(str, row["stage_layers"]))]
        assert row["etp"] is None  # a dense model
        code, again, _ = run_cli(["evaluate", "--model", "llama2-7b", "--cluster", "dgx-h100-ndr",
                                  "--gpus", "16", "--global-batch", "64", "--seq-len", "4096",
                                  "--json", *map(str, flags)], capsys)
        again = json.loads(again)
        assert code == 0 and again["step_time_s"] == pytest.approx(row["step_time_s"]), name
        assert again["stage_layers"] == row["stage_layers"]


def test_compare_runs_the_methods_at_once_with_the_same_answers(capsys, monkeypatch):
    """On one core compare runs the methods in turn; on more, side by side in processes: the
    plans, predictions and reasons for finding none are the same (only search times differ)."""
    import nestplan.processes as processes

    args = ["compare", "--model", "llama2-7b", "--cluster", "dgx-h100-ndr", "--gpus", "16",
            "--global-batch", "64", "--json"]
    answers = []
    for cores in (1, 2):
        monkeypatch.setattr(processes, "cores", lambda cores=cores: cores)
        code, out, _ = run_cli(args, capsys)
        assert code == 0
        js = json.loads(out)
        for row in js["methods"]:
            row.pop("search_seconds")
        answers.append(js)
    assert answers[0] == answers[1]
    assert len(answers[0]["methods"]) + len(answers[0]["errors"]) == len(methods.METHODS)
    assert "exhaustive" in answers[0]["errors"]  # a reason, carried back from its process


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(layers=st.integers(2, 4), gpus=st.sampled_from([2, 4]), node=st.sampled_from([1, 2, 4]),
       moe=st.booleans(), batch=st.sampled_from([4, 8]), bw_ratio=st.sampled_from([1.0, 10.0]),
       first_dense=st.sampled_from([0, 1]), vocab=st.sampled_from([512, 16384]),
       stack=st.sampled_from(["megatron-core", "torchtitan", "deepspeed"]),
       hbm=st.sampled_from([20, 35, 60, 1000]))
def test_pruning_bounds_never_exceed_the_dp_objective(layers, gpus, node, moe, batch, bw_ratio,
                                                      first_dense, vocab, stack, hbm):
    """Every bound the branch and bound prunes with (compute, network, ZeRO) is at most the
    stage DP's objective of each configuration it stands for, under every schedule (memory
    ignored: the DP's best over all splits and policies); with one policy in every block, the
    bound plus that policy's least recompute is at most the DP's objective under it, the
    memory floor at most the least peak any split reaches, and with that peak as the capacity
    the per-device floor (``_positions_fit``) still lets some split fit; with the memory as it
    is (tight for some plans), the bound with the recomputation it forces
    (``driver._set_bounds``) is at most the DP's objective over the splits that fit, for
    every policy set the search tries."""
    sc = tiny_scenario(layers, gpus, node, 2, 2, moe, hbm, batch, bw_ratio, 1.0, first_dense,
                       vocab)
    from nestplan.catalog import get_stack

    # megatron-core gathers operator by operator and mixes policies per stage; torchtitan
    # gathers whole blocks (FSDP) and runs one policy everywhere
    sc = dataclasses.replace(sc, stack=dataclasses.replace(get_stack(stack),
                                                           schedules=tuple(SCHEDULES)))
    _bounds_hold(sc)


def test_pruning_bounds_hold_where_the_optimizer_shards_without_zero_and_gathers_once():
    """Two cost rules the ZeRO bound had not followed, where a reviewer found the search missing
    its best plan: DeepSpeed's BF16_Optimizer shards the optimizer at ZeRO-0 under a pipeline
    (a smaller step, a gather after it), and torchtitan's pipelined ZeRO-3 gathers m + 1 times a
    step, not twice a micro-batch."""
    import numpy as np

    from nestplan.catalog import get_stack
    from nestplan.cost import device as D
    from nestplan.search import dp as DP
    from nestplan.search import space
    from nestplan.search import tables as T
    from nestplan.specs import Parallelism

    sc = tiny_scenario(4, 8, 4, 2, 2, False, 1000, 8, 1.0, 1.0, 0, 16384)
    _bounds_hold(dataclasses.replace(sc, stack=get_stack("deepspeed")))
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=1024, global_batch=64,
                             stack="torchtitan")
    par = Parallelism(tp=1, pp=4, dp=16, zero=3, recompute=("full",), mbs=1)
    cc = D.config_costs(sc, par)
    tb = T.build(cc)
    best = DP.solve(tb.x, tb.e, [np.ones_like(o) for o in tb.ok], cc.micro, par.vp, tb.const,
                    y=tb.y).objective
    assert space.config_bound(sc, par) <= best * (1 + 1e-9)


def _bounds_hold(sc, con=None):
    """The property of ``test_pruning_bounds_never_exceed_the_dp_objective`` on scenario ``sc``
    (configurations under ``con``)."""
    import numpy as np

    from nestplan.cost import device as D
    from nestplan.search import dp as DP
    from nestplan.search import tables as T
    from nestplan.search.driver import _floor_parts, _positions_fit, _set_bounds, _states_floor

    layers = sc.model.layers
    con = con or Constraints()
    for shape in space.shapes(sc, con):
        vps = space.virtual_stages(sc, con, shape)
        if not vps:
            continue
        shape_bound = space.compute_bound(sc, shape, max(vps))
        for par in space.configurations(sc, Constraints(
                tp=shape.tp, pp=shape.pp, dp=shape.dp, cp=shape.cp, mbs=shape.mbs, sp=shape.sp,
                ep=shape.ep, etp=shape.etp)):
            tb = T.build(D.config_costs(sc, par))
            if tb is None:
                continue
            sol = DP.solve(tb.x, tb.e, [np.ones_like(o) for o in tb.ok], D.config_costs(
                sc, par).micro, par.vp, tb.const, y=tb.y)
            assert sol is not None
            order_bound = space.network_bound(sc, par.with_(vp=1, schedule=None), max(vps))
            for bound in (shape_bound, order_bound, space.network_bound(sc, par),
                          space.config_bound(sc, par)):
                assert bound <= sol.objective * (1 + 1e-9), (par, bound, sol.objective)
            # one policy in every block: its recompute joins the bound, its memory the floor
            cc = D.config_costs(sc, par)
            policies = np.arange(len(sc.stack.recompute))
            parts = _floor_parts(sc, par)
            bounds = _set_bounds(sc, par, [(p,) for p in policies], True, None, 0.0)
            for p in policies:
                only = [np.broadcast_to(policies == p, o.shape) for o in tb.ok]
                sol_p = DP.solve(tb.x, tb.e, only, cc.micro, par.vp, tb.const, y=tb.y)
                bound = bounds[p]
                assert bound <= sol_p.objective * (1 + 1e-9), (par, p, bound, sol_p.objective)
                peak = DP.least_peak([m[..., p:p + 1] for m in tb.mem], [tb.valid] * len(tb.mem))[0]
                floor = _states_floor(parts, (p,))
                assert floor <= peak * (1 + 1e-9), (par, p, floor, peak)
                # with the least peak as the capacity, the per-device floor lets a split fit
                assert _positions_fit(parts, (p,), peak * (1 + 1e-9), layers, par.vp), (par, p)
            # plans mixing every policy stage by stage
            peak = DP.least_peak(tb.mem, [tb.valid] * len(tb.mem))[0]
            floor = _states_floor(parts, tuple(policies))
            assert floor <= peak * (1 + 1e-9), (par, floor, peak)
            assert _positions_fit(parts, tuple(policies), peak * (1 + 1e-9), layers, par.vp)
            # what memory forces, for the policy sets the search tries and each one alone
            for s in {*space.policy_sets(sc, con), *((p,) for p in policies)}:
                allow = np.isin(policies, s)
                sol_m = DP.solve(tb.x, tb.e, [o & allow for o in tb.ok], cc.micro, par.vp,
                                 tb.const, y=tb.y)
                if sol_m is not None:
                    bound = _set_bounds(sc, par, [s], len(s) == 1, parts, sc.memory_limit)[0]
                    assert bound <= sol_m.objective * (1 + 1e-9), (par, s, bound,
                                                                   sol_m.objective)


@pytest.mark.parametrize("case", ["float8-zero-bubble", "moe-dense-first", "short-round"])
def test_pruning_bounds_hold_where_a_review_found_them_exceeded(case):
    """Cases a review of the search found (each bound once exceeded the DP's objective by up to
    0.1 %): a wide model with a large vocabulary under interleaved zero bubble, whose busiest
    device's ``m·X`` form had the average device's end of step added; and an MoE model with a
    dense first block, where a device holding no experts has no expert reduction at its end.
    And one found on re-reading: two micro-batches over four stages under torchtitan (one round
    shorter than the pipeline), whose span weighs ``sum X`` by 1, not ``1/v``, with the head's
    large vocabulary on one device (the bound had kept ``(m - 1/v)·max X + sum X / v``). Each
    fails on the code before its fix."""
    from nestplan.catalog import get_stack

    if case == "float8-zero-bubble":
        sc = tiny_scenario(6, 2, 8, 4, 4, False, 1000, 4, 1.0, 1.0, 0, 256000)
        sc = dataclasses.replace(sc, model=dataclasses.replace(
            sc.model, hidden=2048, head_dim=512, ffn_hidden=4096),
            stack=get_stack("torchtitan-float8"))
        _bounds_hold(sc, Constraints(pp=2))
    elif case == "short-round":
        sc = tiny_scenario(8, 4, 4, 2, 2, False, 1000, 2, 1.0, 1.0, 0, 256000)
        _bounds_hold(dataclasses.replace(sc, stack=get_stack("torchtitan")), Constraints(pp=4))
    else:  # nothing hidden by overlap: the end of step counts every reduction
        sc = tiny_scenario(2, 8, 1, 4, 4, True, 1000, 4, 1.0, 1.0, 1, 16384)
        moe = dataclasses.replace(sc.model.moe, experts=2)
        stack = dataclasses.replace(get_stack("torchtitan"), overlap_efficiency=0.0,
                                    zero_stages=(0, 1, 2, 3), max_zero_with_pp=3)
        sc = dataclasses.replace(sc, model=dataclasses.replace(sc.model, moe=moe), stack=stack)
        _bounds_hold(sc, Constraints(pp=2))


def test_least_top_equals_the_best_split_found_by_brute_force():
    """``space._least_top`` (the busiest device's least work when the embedding's and the
    head's devices carry extra work) equals the least maximum over every split of the blocks
    with at least ``least`` per device."""
    import random

    from nestplan.search.space import _least_top

    rng = random.Random(1)
    for _ in range(300):
        p, a = rng.randint(2, 4), rng.uniform(0.1, 2.0)
        blocks = rng.randint(p, 10)
        least = rng.randint(1, blocks // p)
        extra = tuple(rng.uniform(0.0, 3.0) for _ in range(rng.choice([1, 2])))
        loads = list(extra) + [0.0] * (p - len(extra))
        best = min(max(a * n + e for n, e in zip(split, loads))
                   for split in itertools.product(range(least, blocks + 1), repeat=p)
                   if sum(split) == blocks)
        assert _least_top(a, extra, p, blocks, least) == pytest.approx(best, rel=1e-9)


def test_memory_forced_recompute_is_that_of_the_cheapest_policy_that_fits():
    """``driver._least_recompute``: a device's blocks, spread over its chunks as the plan space
    spreads them (extras first), keep each policy's bytes times their chunk's micro-batches; the
    least recompute is that of the cheapest single policy whose total fits (one policy per
    device), against a count block by block, for random chunk holdings and policies."""
    import random

    import numpy as np

    from nestplan.search.driver import _least_recompute
    from nestplan.specs import spread

    rng = random.Random(3)
    for _ in range(300):
        chunks = rng.randint(1, 5)
        held = tuple(rng.randint(0, 40) for _ in range(chunks))
        points = tuple((rng.choice([0.0, 1.0, rng.uniform(0, 10)]), rng.uniform(0, 5))
                       for _ in range(rng.randint(1, 5)))
        n = np.arange(0, 25)
        allowed = np.array([rng.uniform(0, 400) for _ in n])
        got = _least_recompute(points, held, 24, allowed)
        for count, cap, value in zip(n, allowed, got):
            per_chunk = spread(int(count), chunks)
            blocks = [k for k in range(chunks) for _ in range(per_chunk[k])]  # each block's chunk
            fitting = [count * rc for kept, rc in points
                       if sum(kept * held[k] for k in blocks) <= cap]
            assert value == pytest.approx(min(fitting, default=np.inf), abs=1e-12)


def test_a_devices_extra_blocks_go_where_the_fewest_micro_batches_are_held():
    """The spread rule puts a device's extra blocks in its last chunks because no schedule holds
    more micro-batches of a later chunk than of an earlier one at the peak (a plan-quality audit
    found even splits that the first-chunk rule had refused, up to 2.6 % faster: Qwen3-235B-A22B
    on 256 GB200, interleaved 1F1B, 3.458 -> 3.371 s)."""
    from nestplan.schedule import SCHEDULES
    from nestplan.specs import spread

    assert spread(7, 3) == [2, 2, 3]
    for sched in SCHEDULES.values():
        for pp in (2, 4, 8):
            for vp in ((1,) if sched.chunks == "one" else (2,) if sched.chunks == "two"
                       else (2, 3, 4)):
                for micro in (pp, 2 * pp, 4 * pp + 2):
                    if sched.check(pp, vp, micro) is not None:
                        continue
                    for stage in range(pp):
                        held = sched.held(stage, pp, vp, micro)
                        assert all(a >= b for a, b in zip(held, held[1:])), (
                            sched.name, pp, vp, micro, stage, held)


def test_the_spread_rule_has_one_meaning_in_both_forms():
    """``space.chunk_counts`` (arrays, for the cost tables and the memory floors) spreads a
    device's blocks over its chunks exactly as ``specs.spread`` does (plans, default splits)."""
    import numpy as np

    from nestplan.search.space import chunk_counts
    from nestplan.specs import chunks_from_totals, spread

    counts = np.arange(40)
    for chunks in range(1, 7):
        table = chunk_counts(counts, chunks)
        assert [list(row) for row in table] == [spread(int(n), chunks) for n in counts]
    assert chunks_from_totals((5, 4), 2) == (2, 2, 3, 2)  # (a device's extra block last)


def test_the_manual_plan_keeps_tp_at_8_on_a_rack_sized_nvlink_domain():
    """An NVL72 rack is one 64-GPU NVLink level in the catalog; Megatron's rule of thumb still
    stops at TP 8 (a TP of 64 made compare's 'vs manual' ratio 64x)."""
    from nestplan.search.methods import manual_plan
    from nestplan.search.constraints import Constraints

    sc = scenario_from_names("llama3-70b", "gb200-nvl72-ndr", 512, seq_len=4096,
                             global_batch=1024)
    assert manual_plan(sc, Constraints()).tp == 8


def test_a_fixed_vp_follows_the_split_rule_the_search_uses():
    """vp need not divide the layers of a model whose blocks are all alike (each device spreads
    its blocks over its chunks), as the search itself picks: fixing it is not refused; for a
    model of dense and MoE blocks it must divide them."""
    from nestplan.errors import SpecError
    from nestplan.search.constraints import check_constraints

    llama = scenario_from_names("llama3-70b", "dgx-h100-ndr", 512, seq_len=4096,
                                global_batch=1024)
    check_constraints(llama, Constraints(pp=4, vp=7))  # 80 blocks: not a multiple of 7
    dsv3 = scenario_from_names("deepseek-v3", "dgx-h100-ndr", 512, seq_len=4096,
                               global_batch=1024)
    with pytest.raises(SpecError, match="vp: got 2; must be 1 or a divisor of layers = 61"):
        check_constraints(dsv3, Constraints(pp=4, vp=2))


def test_a_fixed_vp_above_the_free_search_is_searched():
    """The free search tries up to ``MAX_VP`` chunks per device; one the user fixes above it is
    searched (it had been refused "must be at most 8"): GPT-3 175B, 96 blocks, on 64 GPUs in
    four stages of twelve chunks, each chunk two blocks; the plan is what evaluate reports."""
    from nestplan.search.constraints import MAX_VP

    sc = scenario_from_names("gpt3-175b", "dgx-h100-ndr", 64, seq_len=2048, global_batch=64)
    res = methods.run_method("nest", sc, Constraints(pp=4, vp=12, tp=8, mbs=1), top=1)
    assert 12 > MAX_VP and res.best.plan.vp == 12 and len(res.best.plan.stage_layers) == 48
    assert res.objective == pytest.approx(evaluate(sc, res.best.plan).step_time, rel=1e-9)


def test_the_manual_method_keeps_what_the_user_fixed():
    """With --pp 4 on 16 GPUs Megatron's node-wide TP 8 leaves no room: the manual plan takes
    the largest TP that does (it asked for dp = 0 before); a mirrored schedule the stack runs is
    the manual method's to use (only the search refuses it)."""
    from nestplan.search.methods import manual_plan

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    par = manual_plan(sc, Constraints(pp=4))
    assert (par.tp, par.pp, par.dp) == (4, 4, 1)
    dual = dataclasses.replace(sc, stack=dataclasses.replace(sc.stack,
                                                             schedules=("1f1b", "dualpipe")))
    assert manual_plan(dual, Constraints(pp=4, schedule="dualpipe")).schedule == "dualpipe"
    from nestplan.errors import SpecError
    from nestplan.search.driver import run

    with pytest.raises(SpecError, match="the search does not run it"):
        run(dual, Constraints(pp=4, schedule="dualpipe"))


def test_the_manual_plan_folds_a_fixed_ep_over_the_tp_ranks():
    """--ep 8 on Mixtral over 32 GPUs: Megatron's node-wide TP 8 leaves dp 4, which EP 8 cannot
    divide while experts follow TP (tp·ep = 64 ranks); the hand-made plan folds EP over the TP
    ranks with ETP 1 as Megatron-Core's MoE recipes do (it had answered "no feasible plan");
    where the experts can follow TP, they still do."""
    from console import cli

    base = ("plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ndr", "--method", "manual",
            "--json")
    code, out, err = cli(*base, "--gpus", 32, "--ep", 8)
    assert code == 0, err
    js = json.loads(out)
    assert (js["tp"], js["dp"], js["ep"], js["etp"]) == (8, 4, 8, 1), js
    code, out, err = cli(*base, "--gpus", 64, "--ep", 8)
    assert code == 0, err
    js = json.loads(out)
    assert (js["tp"], js["ep"], js["etp"]) == (8, 8, 8), js


def test_a_batch_overlap_stack_refuses_a_fixed_single_chunk_pipeline_up_front(tmp_path):
    from console import cli, one_line_error

    stack = tmp_path / "b.toml"
    stack.write_text('base = "nemo"\nname = "b"\nmoe_overlap = "batch"\n'
                     'recompute = ["none", "selective"]\n')
    code, out, err = cli("plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ndr",
                         "--gpus", 64, "--stack", stack, "--pp", 4, "--vp", 1, "--ep", 8,
                         "--global-batch", 256)
    assert one_line_error(code, out, err, "vp: got 1; stack b overlaps the expert exchange"), err


def test_a_found_plan_is_never_slower_than_itself_with_the_default_split(tmp_path):
    """The DP splits a configuration's blocks by the closed form, which unequal chunks' schedule
    can exceed: where the same plan with the default split runs faster (and fits), that is the
    plan found. A new user's trial, on the README's sweep example (Meta's RoCE cluster with
    200 Gb/s NICs and a 16:1 pod), had been handed a 3,4,4,3,4,5,5,4 split at 2.575 s, with a
    note that the default split takes 2.445 s."""
    from console import cli

    code, out, _ = cli("list", "clusters", "meta-h100-roce-7to1")
    assert code == 0
    text = out.replace('name = "meta-h100-roce-7to1"', 'name = "roce200x16"')
    text = text.replace("bandwidth_GBps = 50.0", "bandwidth_GBps = 25.0")
    pod = text.index('name = "pod"')
    text = text[:pod] + text[pod:].replace("oversubscription = 1.0", "oversubscription = 16.0", 1)
    cluster = tmp_path / "roce16.toml"
    cluster.write_text(text)
    run = ("--model", "llama3-8b", "--cluster", cluster, "--gpus", 256, "--seq-len", 4096,
           "--global-batch", 1024)
    code, out, err = cli("plan", *run, "--top", 1, "--json")
    assert code == 0, err
    best = json.loads(out)
    assert "faster): that plan, the same flags without --stage-layers" not in err, err
    flags = ["--tp", best["tp"], "--pp", best["pp"], "--cp", best["cp"], "--vp", best["vp"],
             "--mbs", best["mbs"], "--zero", best["zero"], "--recompute", best["recompute"],
             "--rank-order", best["rank_order"]] + (["--sp"] if best["sp"] else [])
    code, out, err = cli("evaluate", *run, *flags, "--json")  # (the default split)
    assert code == 0, err
    assert best["step_time_s"] <= json.loads(out)["step_time_s"] * (1 + 1e-9)


def test_alpas_view_keeps_the_clusters_hosts():
    """Alpa's two-level view of a cluster has its hosts: a node spans hosts in the view as on the
    cluster (which picks DeepEP's backend and what it runs), and the launcher numbers the same
    local ranks. The view had dropped the host size: a 16-GPU NVSwitch host was searched as an
    NVLink domain over hosts, GB200's 4-GPU trays as whole racks."""
    base = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 64, seq_len=4096,
                               global_batch=64)

    def view_of(cluster):
        return cluster, methods.two_level_view(dataclasses.replace(base, cluster=cluster)).cluster

    nvl = Level(name="nvlink", size=16, bandwidth=450e9, latency=3.4e-6, efficiency=0.82)
    leaf = Level(name="leaf", size=8, bandwidth=50e9, latency=14e-6, efficiency=0.96)
    net = Level(name="net", size=None, bandwidth=50e9, latency=15e-6, efficiency=0.96)
    pcie = dataclasses.replace(nvl, size=2)
    clusters = (ClusterSpec(name="hgx16", accelerator=get_cluster("dgx-h100-ndr").accelerator,
                            levels=(nvl, leaf, net), devices_per_host=16),
                ClusterSpec(name="pairs", accelerator=get_cluster("dgx-h100-ndr").accelerator,
                            levels=(pcie, dataclasses.replace(leaf, size=4), net),
                            devices_per_host=8),
                get_cluster("gb200-nvl72-ndr"), get_cluster("dgx-h100-ndr"))
    spans = []
    for cluster in clusters:
        real, view = view_of(cluster)
        assert len(view.levels) == 2 and view.levels[0] == real.levels[0]
        assert view.nvlink_spans_hosts == real.nvlink_spans_hosts, cluster.name
        spans.append(view.nvlink_spans_hosts)
        if real.devices_per_node % real.host_size == 0:  # (hosts within a node: the same ones)
            assert view.host_size == real.host_size, cluster.name
    assert spans == [False, False, True, False]


def test_fixed_knobs_hold_in_every_search():
    """A knob the user fixes stays fixed: alpa's fallback for plans that do not fit shards only
    what is free (it had set ZeRO-3 over --zero 1, and ZeRO-3 on stacks without it), and a fixed
    cp or mbs below the search's own floors (chunks of 1,024 tokens, micro-batches of 16) is
    searched instead of answering that no configuration satisfies the constraints."""
    from console import cli

    base = ("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8, "--json")
    code, out, err = cli(*base, "--method", "alpa", "--zero", 1)
    assert code == 0, err
    js = json.loads(out)
    assert js["zero"] == 1 and {p["zero"] for p in js["top"]} == {1}
    code, out, err = cli(*base, "--method", "alpa", "--stack", "megatron-2022")
    assert code in (0, 3) and "zero" not in err.split("\n")[-1], err
    code, out, err = cli(*base, "--cp", 4, "--seq-len", 2048, "--global-batch", 16)
    assert code == 0 and json.loads(out)["cp"] == 4, err
    code, out, err = cli(*base, "--mbs", 32, "--global-batch", 256, "--seq-len", 1024)
    assert code == 0 and json.loads(out)["mbs"] == 32, err
    # a policy per stage: mcmc's moves between shapes had put one policy on every stage
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    res = methods.run_method("mcmc", sc, Constraints(pp=2, recompute=("full", "none")), top=5)
    assert {ev.plan.recompute for ev in res.plans} == {("full", "none")}
    assert res.solved <= res.configurations  # shapes visited of those in the space


def test_the_slow_methods_report_what_they_count(capsys, monkeypatch):
    """exhaustive reports plans evaluated of the space's, mcmc its steps of the budget; the CLI's
    progress line says which (a search under two seconds prints nothing)."""
    from nestplan.cli import _Progress

    sc = tiny_scenario(4, 4, 2, 4, 2, False, 1000, 8, 1.0, 1.0)  # 952 plans with mbs 1
    calls = []
    res = methods.run_method("exhaustive", sc, Constraints(mbs=1), top=1,
                             progress=lambda *a, **k: calls.append((a, k)))
    assert calls and all(k == {"of": "plans evaluated"} for _, k in calls)
    dones = [a[0] for a, _ in calls]
    assert dones == sorted(dones) and all(d % 500 == 0 for d in dones)
    assert all(a[1] >= dones[-1] for a, _ in calls) and res.best.fits
    calls.clear()
    methods.run_method("mcmc", sc, Constraints(), top=1,
                       progress=lambda *a, **k: calls.append((a, k)))
    assert [a[:2] for a, _ in calls][:2] == [(0, methods.MCMC_BUDGET), (200, methods.MCMC_BUDGET)]
    assert all(k == {"of": "steps"} for _, k in calls)
    line = _Progress("exhaustive")
    line(500, 2000, 1.0, of="plans evaluated")
    assert capsys.readouterr().err == ""
    # off a terminal: a line once past two seconds, then one every 5 s at most
    line(1000, 2000, 2.5, of="plans evaluated")
    line(2000, 2000, 6.0, of="plans evaluated")
    line(3, 40, 7.5)
    line(3, 40, 12.5, examined=25)  # nest's: what its bounds looked at, most never solved
    # and the plan shapes it bounded before examining any (a pipeline engineer's MoE search had
    # read "0 examined" for 14 s)
    line(0, 40, 17.5, examined=0, bounded=1234)
    assert capsys.readouterr().err.splitlines() == [
        "nestplan: exhaustive searching, 1,000 of 2,000 plans evaluated, 2 s",
        "nestplan: exhaustive searching, 3 solved of 40 configurations, 8 s",
        "nestplan: exhaustive searching, 25 examined, 3 solved of 40 configurations, 12 s",
        "nestplan: exhaustive searching, 1,234 plan shapes bounded, 0 examined, 0 solved of 40 "
        "configurations, 18 s"]
    # the search reports them all, examined never fewer than solved, bounds counted up (every
    # report, not one a second: the tiny search is over within one, a review's)
    from nestplan.search import driver

    monkeypatch.setattr(driver, "PROGRESS_EVERY_S", 0.0)
    calls.clear()
    methods.run_method("nest", sc, Constraints(), top=1,
                       progress=lambda *a, **k: calls.append((a, k)))
    assert len(calls) > 2 and all(set(k) <= {"examined", "bounded"} and k["examined"] >= a[0]
                                  for a, k in calls)
    bounds = [k["bounded"] for _, k in calls if "bounded" in k]
    assert bounds == sorted(bounds) and bounds[-1] > 0


@pytest.mark.parametrize("micro, vp", [(1, 1), (1, 2), (3, 1), (4, 2)])
def test_dp_solver_equals_brute_force_on_random_tables(micro, vp):
    """``dp.solve`` against every split and policy choice of random cost tables, one micro-batch
    per replica among them (its X term vanishes, and the solver then looks at no X bound)."""
    import itertools

    import numpy as np

    from nestplan.search import dp as DP

    rng = np.random.default_rng(micro * 10 + vp)
    units, devices, policies = 6, 3, 2
    for trial in range(20):
        shape = (units + 1, units + 1, policies)
        x = [rng.uniform(1, 10, shape) for _ in range(devices)]
        y = [rng.uniform(1, 10, shape) for _ in range(devices)]
        e = [rng.uniform(0, 5, shape) for _ in range(devices)]
        forward = (np.arange(units + 1)[:, None] >= np.arange(units + 1)[None, :])[:, :, None]
        ok = [(rng.random(shape) > 0.3) & forward for _ in range(devices)]  # [end, start]
        best = np.inf
        # every split, a device holding no unit included (as the solver's tables allow)
        for cuts in itertools.combinations_with_replacement(range(units + 1), devices - 1):
            bounds = (0, *cuts, units)
            for pols in itertools.product(range(policies), repeat=devices):
                cells = [(bounds[i + 1], bounds[i], pols[i]) for i in range(devices)]
                if not all(ok[i][c] for i, c in enumerate(cells)):
                    continue
                best = min(best, DP.objective([x[i][c] for i, c in enumerate(cells)],
                                              [y[i][c] for i, c in enumerate(cells)],
                                              [e[i][c] for i, c in enumerate(cells)],
                                              micro, vp, 0.5))
        sol = DP.solve(x, e, ok, micro, vp, 0.5, y=y)
        if not np.isfinite(best):
            assert sol is None, trial
        else:
            assert sol is not None and sol.objective == pytest.approx(best, rel=1e-12), trial


def test_a_tie_goes_to_the_plan_found_first_whatever_the_top():
    """Llama 3 70B on 256 H100 at CP 2 has two best plans of one step time (rank orders
    tp-cp-dp-pp and tp-cp-pp-dp): the best is the same one with --top 1, 2 or 5 (with 5 it had
    been the other, which Megatron runs only through a rank map)."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 256, seq_len=8192, global_batch=512)
    runs = {top: methods.run_method("nest", sc, Constraints(cp=2), top=top) for top in (1, 2, 5)}
    assert runs[5].plans[0].step_time == runs[5].plans[1].step_time  # the tie
    assert runs[5].plans[0].plan.rank_order != runs[5].plans[1].plan.rank_order
    assert {r.best.plan for r in runs.values()} == {runs[1].best.plan}


def test_the_search_ranks_plans_by_their_simulated_steps():
    """Llama 3 70B on 256 H100 at CP 2: the plans of least closed form interleave chunks of
    unequal size, which simulate later (``Evaluation.uneven_chunks``); the search ranks found
    plans by their steps, so --top 1 and 5 agree (ranking the kept plans again afterwards had
    not: at --top 1 every kept plan was such a one, 14.075 s against 13.941 s), and the plan
    --top 1 had given, less by closed form, is more by step."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 256, seq_len=8192, global_batch=512)
    one = methods.run_method("nest", sc, Constraints(cp=2), top=1).best
    five = methods.run_method("nest", sc, Constraints(cp=2), top=5).plans
    assert one.plan == five[0].plan
    assert [e.step_time for e in five] == sorted(e.step_time for e in five)
    # the plan --top 1 had given: less than the best by closed form, more simulated
    seven = evaluate(sc, one.plan.with_(vp=7, stage_layers=(2, 2, 3, 2, 2) + (3,) * 23))
    assert seven.step_time - seven.uneven_chunks < one.step_time < seven.step_time


def test_experts_with_biases_are_searched_at_expert_tp_1_where_megatron_core_runs_them_so():
    """GPT-OSS's experts carry biases: Megatron-Core splits them by no expert TP, so its stack's
    search space holds none, and a plan that does not name etp takes 1; a stack without that
    rule (torchtitan, whose experts follow TP without EP) keeps its own degrees."""
    sc = scenario_from_names("gpt-oss-120b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    etps = {par.expert_tp for par in space.configurations(sc, Constraints(tp=2))}
    assert etps == {1}
    assert sc.stack.default_etp(2, 4, biased=sc.model.biased_experts) == 1
    plain = dataclasses.replace(sc, model=dataclasses.replace(
        sc.model, bias=False, moe=dataclasses.replace(sc.model.moe, expert_bias=False)))
    assert {par.expert_tp for par in space.configurations(plain, Constraints(tp=2))} == {1, 2}
    titan = dataclasses.replace(sc, stack=get_stack("torchtitan"))
    assert 2 in {par.expert_tp for par in space.configurations(titan, Constraints(tp=2, ep=1))}


def test_where_nothing_is_sharded_the_space_keeps_the_lowest_zero_stage():
    """With one data-parallel rank ZeRO-1 and -2 run the same plan as ZeRO-0 and ZeRO-3 keeps its
    gathered weights on top: the space lists the lowest stage alone, in whatever order a stack
    file gives them; with more ranks, or with experts sharded over expert-data-parallel ranks,
    every stage stays."""
    from nestplan.catalog import get_stack
    from nestplan.search.space import zero_stages
    from nestplan.specs import Parallelism

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 4, seq_len=8192, global_batch=16)
    sc = dataclasses.replace(sc, stack=dataclasses.replace(get_stack("megatron-core"),
                                                           zero_stages=(3, 0, 1)))
    alone = Parallelism(tp=4, pp=1, dp=1, sp=True, mbs=1)
    plain = evaluate(sc, alone.with_(zero=0))
    gathered = evaluate(sc, alone.with_(zero=3))
    assert gathered.step_time == pytest.approx(plain.step_time)
    assert gathered.peak_memory > plain.peak_memory
    assert zero_stages(sc, Constraints(), alone) == [0]
    assert zero_stages(sc, Constraints(zero=3), alone) == [3]  # a fixed stage is kept
    assert zero_stages(sc, Constraints(), alone.with_(tp=2, dp=2)) == [3, 0, 1]
    moe = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=16)
    folded = Parallelism(tp=8, pp=1, dp=1, sp=True, ep=2, etp=1, mbs=1)  # 4 expert replicas
    assert zero_stages(moe, Constraints(), folded) == [0, 1, 2, 3]


def test_the_per_device_floor_counts_the_few_dense_blocks_once():
    """Kimi-K2 has one dense block among 60 MoE ones: 32 pipeline devices of two blocks each
    cannot all hold the dense one. The floor had let every device pair it with one MoE block
    (about 38 of the 75 GiB a device may use) and the search solved this configuration, and
    thousands like it, only to find no split fits (least peak 83.5 GiB); it still lets the
    least peak fit."""
    import numpy as np

    from nestplan.cost import device as D
    from nestplan.search import dp as DP
    from nestplan.search import tables as T
    from nestplan.search.driver import _floor_parts, _positions_fit
    from nestplan.specs import Parallelism

    sc = scenario_from_names("kimi-k2", "dgx-h100-ndr", 256, seq_len=4096, global_batch=1024)
    par = Parallelism(tp=2, pp=32, dp=4, ep=8, etp=1, sp=True, zero=1, mbs=4)
    tb = T.build(D.config_costs(sc, par))
    peak = DP.least_peak(tb.mem, [tb.valid] * len(tb.mem))[0]
    parts = _floor_parts(sc, par)
    every = tuple(range(len(sc.stack.recompute)))
    assert parts.lighter == 1 and peak > sc.memory_limit
    assert not _positions_fit(parts, every, sc.memory_limit, sc.model.layers, par.vp)
    assert _positions_fit(parts, every, peak * (1 + 1e-9), sc.model.layers, par.vp)
    assert np.all(np.diff(parts.block) > 0)


def test_the_memory_floor_counts_gradients_a_pipelined_fsdp_keeps_whole():
    """torchtitan under pipelining reduces gradients once a step (``pipeline_defers_grad_sync``):
    every device keeps its stage's gradients unsharded until then. The search's memory floor
    counts them so (it had sharded them, a looser bound), and stays at most the least peak."""
    from nestplan.catalog import get_stack
    from nestplan.cost import device as D
    from nestplan.search import dp as DP
    from nestplan.search import tables as T
    from nestplan.search.driver import _floor_parts, _floor_shared, _states_floor
    from nestplan.specs import Parallelism

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    tt = dataclasses.replace(sc, stack=get_stack("torchtitan"))
    par = Parallelism(tp=1, pp=2, dp=8, zero=2, mbs=1)
    assert tt.stack.defers_grad_sync(par.pp, par.zero)
    kept = dataclasses.replace(tt, stack=dataclasses.replace(tt.stack,
                                                             pipeline_defers_grad_sync=False))
    every = tuple(range(len(tt.stack.recompute)))
    whole, sharded = _floor_parts(tt, par), _floor_parts(kept, par)
    params = _floor_shared(tt, par)[0]  # the average device's (dense) parameters
    assert whole.states - sharded.states == pytest.approx(
        tt.stack.grad_bytes * params * (1 - 1 / par.dp))
    tb = T.build(D.config_costs(tt, par))
    peak = DP.least_peak(tb.mem, [tb.valid] * len(tb.mem))[0]
    assert _states_floor(sharded, every) < _states_floor(whole, every) <= peak * (1 + 1e-9)


def test_evaluate_says_when_a_devices_chunks_are_uneven(tmp_path):
    """A device's chunks of unequal blocks are simulated with each chunk's own time, which
    evaluate says where it ends the step later than the closed form's even spread: --stage-layers
    16,16,0,0 at vp 2 (no interleaving in fact) runs as vp 1 does; an even split and the search's
    rule (within a block) say nothing. (A note that the closed form alone costed such splits
    outlived the simulation, and told a MoE trial that NeMo's DeepSeek-V3 layout, which the
    simulation does not delay, ran slower than shown.) On a stack that overlaps sends without
    interleaving too, so that vp 2 and vp 1 differ in their chunks alone."""
    from console import cli, flags

    stack = tmp_path / "overlapping.toml"
    stack.write_text('base = "megatron-core"\nname = "overlapping"\n'
                     'p2p_overlap_needs_interleaving = false\n')
    base = ("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 16,
            "--tp", 1, "--pp", 2, "--vp", 2, "--mbs", 1, "--seq-len", 4096, "--global-batch", 16,
            "--stack", stack, "--json", "--stage-layers")
    said = {split: cli(*base, split) for split in ("8,8,8,8", "8,8,9,7", "16,16,0,0")}
    assert all(code == 0 for code, _, _ in said.values())
    assert "the model chunks hold 0 or 16 blocks: simulated with each chunk's own time" \
        in said["16,16,0,0"][2]
    vp1 = cli(*flags(*base[:-1], "--vp", 1))
    assert json.loads(said["16,16,0,0"][1])["step_time_s"] == pytest.approx(
        json.loads(vp1[1])["step_time_s"], rel=1e-3)
    assert "chunks hold" not in said["8,8,8,8"][2] + said["8,8,9,7"][2]
    assert "costed as if each device's blocks" not in "".join(e for _, _, e in said.values())


def test_a_split_hardly_faster_than_the_default_one_points_to_it():
    """A plan's own split within 1 % of the default one says that the default, which exports
    without a layout, runs about as fast (a Megatron user's trial was handed a 20-chunk layout
    for 0.07 %); one the default beats says so; one more than 1 % faster than it, and the
    default split itself, say nothing."""
    from console import cli

    from nestplan.units import fmt_time

    base = ("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 16,
            "--tp", 1, "--pp", 2, "--vp", 2, "--mbs", 1, "--seq-len", 4096, "--global-batch", 16,
            "--json", "--stage-layers")
    said = {split: cli(*base, split) for split in ("8,8,8,8", "9,8,8,7", "7,9,8,8", "8,8,9,7")}
    default = json.loads(said["8,8,8,8"][1])["step_time_s"]
    steps = {split: json.loads(out)["step_time_s"] for split, (_, out, _) in said.items()}
    assert steps["9,8,8,7"] < default < steps["7,9,8,8"] and steps["8,8,9,7"] < default * 0.99
    for split, wording in (("9,8,8,7", ", well within this model's error)"), ("7,9,8,8",
                                                                                ": faster)")):
        assert (f"the default split of the layers over the pipeline's 4 chunks takes "
                f"{fmt_time(default)} ({default / steps[split] - 1:+.2%}{wording}: that plan, "
                "the same flags without --stage-layers, exports with no layout") \
            in said[split][2], split
    assert "default split" not in said["8,8,8,8"][2] + said["8,8,9,7"][2]


@pytest.mark.parametrize("schedule", ["zbv", "interleaved-1f1b"])
def test_the_split_a_search_writes_holds_the_blocks_where_its_tables_counted_them(schedule):
    """The plan the DP returns names each chunk's blocks (``space.chunk_sizes``); the tables it
    chose from had counted a device's extra blocks in its last chunks (``space.chunk_counts``).
    A V had written them first: a user trial's ZB-V plan of Qwen3-30B-A3B whose tables said
    72.3 GiB was 79.6 GiB evaluated, recommended beyond its headroom. Each device's peak and time
    in the tables at the written split are evaluate's."""
    from nestplan.cost import device as D
    from nestplan.search import tables as T

    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 64, seq_len=4096,
                             global_batch=1024, stack="torchtitan")
    totals = [11, 13, 12, 12]  # blocks per device: two devices of uneven chunks
    base = Parallelism(tp=1, pp=4, dp=16, ep=8, vp=2, schedule=schedule, zero=2,
                       recompute=("none",), mbs=1)
    par = base.with_(stage_layers=space.chunk_sizes(sc.model, 4, 2, totals, base.pipeline))
    ev = evaluate(sc, par)
    tb = T.build(D.config_costs(sc, par))
    none = sc.stack.policy_index("none")
    for i, stage in enumerate(ev.stages):
        assert tb.mem[i][totals[i], none] == pytest.approx(stage.memory.total, rel=1e-9), i
        assert tb.x[i][totals[i], none] == pytest.approx(stage.time_per_microbatch, rel=1e-9), i


def test_a_search_where_nothing_fits_gives_the_closest_plan_as_data():
    """plan --json gives the closest plan's summary beside the reason (a user scripting the JSON
    found it only in prose): flags evaluate reproduces, and how far it misses the limit."""
    import json

    from console import cli

    code, out, err = cli("plan", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                         "--json")
    js = json.loads(out)
    assert code == 3 and js["feasible"] is False and "closest plan" in js["reason"], err
    near = js["closest"]
    code, out, err = cli("evaluate", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr",
                         "--gpus", 8, "--tp", near["tp"], "--pp", near["pp"], "--mbs", near["mbs"],
                         "--zero", near["zero"], "--recompute", near["recompute"],
                         "--global-batch", 1024, "--seq-len", 4096, "--json")
    ev = json.loads(out)
    assert code == 0 and ev["peak_memory_gib"] == pytest.approx(near["peak_memory_gib"]), err
    assert near["short_gib"] == pytest.approx(ev["peak_memory_gib"] - 0.94 * ev["capacity_gib"])


def test_manual_says_which_policy_and_headroom_it_missed():
    """The manual rules' failure names the recompute policy they tried and the memory headroom
    (a DeepSeek-V3 trial's fine-grained plan, on a stack without full recomputation, was said
    to fail "with full recomputation", where the 6 % headroom alone was short)."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 8, seq_len=8192, global_batch=64)
    with pytest.raises(InfeasibleError) as e:
        methods.manual_plan(sc, Constraints(recompute=("none",), pp=1))
    assert "with tp=8 and recompute none within the memory headroom (6% of HBM;" in str(e.value)
    with pytest.raises(InfeasibleError) as e:
        methods.manual_plan(sc, Constraints(pp=1))
    assert "and recompute full within the memory headroom" in str(e.value)


def test_of_equal_steps_the_plan_holding_less_memory_comes_first():
    """DeepSpeed's pipeline at ZeRO-0 and ZeRO-1 takes the same step (its ZeRO-1 waits for the
    same all-reduce); the one holding less memory is listed first (a DeepSpeed trial had the
    ZeRO-0 plan, 18 GiB heavier, above it)."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 128, seq_len=4096, global_batch=1024,
                             stack="deepspeed")
    res = methods.run_method("nest", sc, Constraints(pp=8), top=2)
    first, second = res.plans
    assert first.step_time == pytest.approx(second.step_time, rel=1e-9)
    assert first.peak_memory < second.peak_memory
    assert (first.plan.zero, second.plan.zero) == (1, 0)


def test_an_empty_space_names_the_context_parallel_rule_too():
    """--tp 1 --pp 1 --mbs 64 on 8 GPUs at global batch 64 leaves dp 1 and cp 8: 512 tokens a
    rank, below what the search offers; the refusal names that rule (a fuzzing trial had been
    told only rules its flags could meet)."""
    from console import cli

    code, out, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                         "--seq-len", 4096, "--global-batch", 64, "--mbs", 64, "--tp", 1,
                         "--pp", 1)
    assert code == 3
    assert "and cp leave each rank at least 1,024 of the sequence's tokens unless --cp fixes it" \
        in err, err
    code, out, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 8,
                         "--seq-len", 4096, "--global-batch", 64, "--mbs", 64, "--tp", 1,
                         "--pp", 1, "--cp", 8)
    assert code == 0, err


def test_the_infeasible_hint_offers_more_gpus_only_where_they_can_help():
    """On deepspeed (no TP, no ZeRO-2 pipeline) ZeRO-2 keeps every weight on every device: no GPU
    count fits Llama 3 70B, and the hint says so (a DeepSpeed trial had been told to try more);
    one GPU gets no context-parallel hint (a fuzzing trial's)."""
    from console import cli

    code, out, err = cli("plan", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr", "--gpus",
                         1024, "--global-batch", 1024, "--seq-len", 4096, "--zero", 2,
                         "--stack", "deepspeed")
    assert code == 3
    assert err.rstrip().endswith("; try ZeRO-3 (drop --zero) (no GPU count does: the weights "
                                 "each device holds under them do not fit)"), err
    # a fixed EP splits the experts: Qwen3-235B-A22B at TP 1, PP 1 holds 44 GB of weights a
    # device at EP 16, which more GPUs (a longer expert-data-parallel ZeRO-1) leave room beside;
    # 243 GB at EP 2, which no count does (both had been told every device holds all of them)
    moe = ("plan", "--model", "qwen3-235b-a22b", "--cluster", "dgx-h100-ndr", "--gpus", 16,
           "--tp", 1, "--pp", 1, "--zero", 1, "--seq-len", 4096, "--global-batch", 64)
    code, out, err = cli(*moe, "--ep", 16)
    assert code == 3 and "; try more GPUs, a longer pipeline" in err, err
    assert "no GPU count does" not in err
    code, out, err = cli(*moe, "--ep", 2)
    assert code == 3 and "no GPU count does" in err and "try more GPUs" not in err, err
    # so on a stack without TP, whose plans leave --tp out (a review's)
    code, out, err = cli("plan", "--model", "qwen3-235b-a22b", "--cluster", "dgx-h100-ndr",
                         "--gpus", 16, "--pp", 1, "--zero", 1, "--seq-len", 4096,
                         "--global-batch", 64, "--ep", 16, "--stack", "deepspeed")
    assert code == 3 and "try more GPUs" in err and "no GPU count does" not in err, err
    code, out, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 1,
                         "--global-batch", 1, "--seq-len", 4096)
    assert code == 3 and err.rstrip().endswith("; try more GPUs"), err
