"""Notes on an evaluated plan (an ``evaluate.Evaluation``) that ``evaluate``, ``plan`` and
``compare`` give beside its figures: where the figures are less certain than the README's
accuracy tables, what the plan costs that its numbers do not show, and what a flag did not do.
The constants are the measured figures the notes quote, each tied to its data by a test."""

from __future__ import annotations

import math

from ..errors import note


HOST_BOUND_SHARE = 0.5
"""Share of a step in per-step host time beyond which the plan's GPUs are said to be idle."""


def host_bound(ev) -> None:
    """Say when most of the step is per-step host time (a user trial's BERT-large on 4,096 GPUs:
    MFU 0.5 %, the host 87 % of the step): the global batch leaves each device little work."""
    host, step = ev.time.step_host, ev.step_time
    if host > HOST_BOUND_SHARE * step:
        from ..units import fmt_time

        note(f"{host / step:.0%} of the step is per-step host time ({fmt_time(host)} of "
             f"{fmt_time(step)}, stack {ev.scenario.stack.name}'s step overhead): the "
             f"global batch gives each of the {ev.scenario.gpus:,} GPUs little work; "
             "fewer GPUs or a larger global batch would use them better")


UNEVEN_ROUTING = 1.2
"""The busiest expert rank's load over the mean that the balanced-routing note shows a plan at: an
example of a trained router's, not a measured figure (state a run's own with --moe-imbalance)."""


def eager_float8_text(sc, par) -> str | None:
    """What to say of fp8 training of plan ``par`` on a torchtitan stack that does not compile it
    (``StackSpec.torch_compiled``: no fused norms or gated MLPs, no async TP for this plan's TP):
    torchao's Float8 scales and casts every linear layer's inputs, weights and gradients in
    kernels of their own there, which the cost model does not charge (a torchtitan trial's eager
    Float8 plan was predicted faster than the compiled one, exported with compile off, without a
    word); None otherwise."""
    from ..options import Precision
    from ..placement import layouts

    st = sc.stack
    if st.export_format != "torchtitan" or sc.training.precision is not Precision.FP8:
        return None
    if st.torch_compiled(st.async_tp(par.tp, layouts(par, sc.cluster, sc.gpus).tp)):
        return None
    return (f"stack {st.name} runs torchtitan without torch.compile, under which torchao's Float8 "
            "scales and casts every linear layer's inputs, weights and gradients in kernels of "
            "their own (torchtitan: \"The quantization modules are intended to be ran under "
            "`torch.compile` for competitive performance\", components/quantization/__init__.py, "
            "0.3.0 wheel); nestplan does not cost those casts, so this fp8 step is likely too "
            "short: a compiled Float8 stack (torchtitan-float8) costs the runs torchtitan "
            "measured so")


def eager_float8(sc, par) -> None:
    """Say ``eager_float8_text``."""
    note(eager_float8_text(sc, par))


def evaluated(ev, imbalance_stated: bool) -> None:
    """Every note ``evaluate`` gives of a plan it evaluated (``report`` writes the same ones into
    the page: a hardware trial's HTML had none of the command's caveats)."""
    idle_policies(ev)
    recompute_costs_memory(ev)
    host_bound(ev)
    _plan_and_schedule(ev, imbalance_stated)


def searched(ev, con, imbalance_stated: bool) -> None:
    """Every note ``plan`` gives of the best plan a search found under the constraints ``con``,
    and ``compare`` of the fastest method's (a review: compare gave only the workload's and the
    stack's, where the README said it gives plan's)."""
    host_bound(ev)
    no_interleaving(ev)
    depths_narrow_search(ev, con)
    _plan_and_schedule(ev, imbalance_stated)


def _plan_and_schedule(ev, imbalance_stated: bool) -> None:
    """The notes ``evaluated`` and ``searched`` end with: the workload's and the stack's, the
    schedule's simulation, groups split over domains."""
    workload_and_stack(ev, imbalance_stated)
    simulated_schedule(ev)
    split_groups(ev)


def workload_and_stack(ev, imbalance_stated: bool) -> None:
    """The notes evaluate, plan and compare give of a plan's routing load and of its stack
    (``imbalance_stated``: the command was given --moe-imbalance)."""
    balanced_routing(ev, imbalance_stated)
    capacity_under_balance(ev)
    load_capped(ev)
    fp8_stack_at_bf16(ev)
    eager_float8(ev.scenario, ev.plan)
    uncalibrated_stack(ev)
    unmeasured_accelerator(ev)
    unchecked_peak(ev)
    long_context_on_hopper(ev)
    short_cp_chunks(ev)
    beyond_calibration(ev)
    sinks_predicted_fast(ev)
    moe_host_heavy(ev)
    fewer_per_domain(ev)
    even_split_close(ev)
    unfelt_oversubscription(ev)


UNFELT = 1e-3
"""A step within this share of the one at 1:1 is taken as not slowed by a level's
oversubscription (``unfelt_oversubscription``)."""


def unfelt_oversubscription(ev) -> None:
    """Say when a level some of the plan's groups cross is oversubscribed and yet the plan takes
    the same step at 1:1 there: what they send across it is hidden, or leaves each block below
    it from few of their members at once (a ring crosses a level once per block each way: 32
    members of a ring in a leaf put a thirty-second of each one's traffic on the spine), within
    the uplinks' share. A datacenter
    trial's 1:1, 2:1 and 4:1 spines had given one step time, its data-parallel group shown
    crossing the spine, and nothing said why."""
    from dataclasses import replace

    from ..evaluate import evaluate

    sc = ev.scenario
    names = [lv.name for lv in sc.cluster.levels]
    crossing = {axis: names.index(level) for axis, (_, level) in ev.group_levels.items() if level}
    for i, lv in enumerate(sc.cluster.levels):
        groups = [axis for axis, top in crossing.items() if top >= i]
        if i == 0 or lv.oversubscription <= 1 or not groups:
            continue
        levels = tuple(replace(x, oversubscription=1.0) if x is lv else x
                       for x in sc.cluster.levels)
        full = evaluate(replace(sc, cluster=replace(sc.cluster, levels=levels)), ev.plan)
        if abs(full.step_time - ev.step_time) <= UNFELT * ev.step_time:
            note(f"level {lv.name}'s {lv.oversubscription:g}:1 oversubscription does not slow "
                 f"this plan (it takes the same step at 1:1): what its groups crossing {lv.name} "
                 f"({', '.join(groups)}) send across it is hidden behind compute or leaves each "
                 f"{names[i - 1]} block from few of their members at once, within the uplinks' "
                 "share (README, \"How the cost model works\")")


NVL72_AS_NEMO = (72, 64)
"""GPUs of an NVL72 rack, and those of each a NeMo job takes: 16 of its 18 four-GPU trays
(segments of 16 trays asked of Slurm; the catalog's gb200-nvl72-ndr, sourced there)."""
FEWER_TRIED = 4
"""How many device counts per domain ``fewer_per_domain`` evaluates the plan at, at most."""
FEWER_PER_DOMAIN_GAIN = 0.03
"""How much faster the plan must run with fewer devices of each scale-up domain used for
``fewer_per_domain`` to say so: this model's error on measured runs is larger than less."""


def fewer_per_domain(ev) -> None:
    """Where the job's GPUs fill no whole number of scale-up domains (72-GPU NVL72 racks under
    2,048 GPUs), say what the plan takes with fewer devices of each used, when that is faster:
    a datacenter trial's 64-rank expert groups straddled racks at 13.5 s a step, 5.6 s at 64 of
    72, and only editing the cluster file showed it. The counts tried divide the job and are
    whole hosts (``ClusterSpec.devices_per_host``), the largest ``FEWER_TRIED`` of them at least
    half a domain (a review: the largest divisor alone, 70 of 72 at 560 GPUs, was slower than 40,
    whose gain it missed); the fastest is said."""
    import dataclasses

    from ..errors import SpecError
    from ..evaluate import evaluate
    from ..units import fmt_time

    sc = ev.scenario
    cl = sc.cluster
    if not cl.straddled_by(sc.gpus):
        return
    inner = cl.levels[0]
    host = cl.devices_per_host or 1
    counts = [d for d in range(inner.size - 1, inner.size // 2 - 1, -1)
              if sc.gpus % d == 0 and d % host == 0][:FEWER_TRIED]
    best = None
    for used in counts:
        try:
            fewer = dataclasses.replace(cl, levels=(dataclasses.replace(inner, size=used),
                                                    *cl.levels[1:]))
            other = evaluate(dataclasses.replace(sc, cluster=fewer), ev.plan)
        except SpecError:  # (a cluster too small with fewer a domain, hosts it cannot hold)
            continue
        if best is None or other.step_time < best[1].step_time:
            best = (used, other)
    if best is None or best[1].step_time >= ev.step_time * (1 - FEWER_PER_DOMAIN_GAIN):
        return
    used, other = best
    launcher = (" as NeMo's launcher places NVL72 racks," if (inner.size, used) == NVL72_AS_NEMO
                else "")
    note(f"with {used} of each {inner.name} domain's {inner.size} devices used (a cluster file "
         f"with {inner.name}'s size {used},{launcher} every domain then filled alike), this plan "
         f"takes {fmt_time(other.step_time)} ({other.step_time / ev.step_time - 1:+.0%}); plan on "
         "such a file for its own best")


EVEN_SPLIT_CLOSE = 0.01
"""How close to a plan's uneven split of the layers the default split must run for
``even_split_close`` to point to it: well within this model's error on measured runs."""


def even_split_close(ev) -> None:
    """Say when the plan's own split of the layers over its pipeline chunks runs hardly faster
    than the default one (``specs.default_split``): a Megatron user's trial was handed a
    20-chunk ``--pipeline-model-parallel-layout`` for 0.07 % over the plain
    ``--num-layers-per-virtual-pipeline-stage``. Said only where the default split fits within
    the headroom too."""
    from ..evaluate import with_default_split
    from ..units import fmt_time

    sc, par = ev.scenario, ev.plan
    other = with_default_split(sc, par)
    if other is None or not other.within_headroom or other.step_time > ev.step_time * (1 + EVEN_SPLIT_CLOSE):
        return
    change = other.step_time / ev.step_time - 1
    # (a pipeline engineer read "exports without a layout" as said of this plan's export)
    note(f"the default split of the layers over the pipeline's {par.pp * par.vp} chunks takes "
         f"{fmt_time(other.step_time)} ({change:+.2%}"
         f"{', well within this model' + chr(39) + 's error' if change >= 0 else ': faster'}): "
         "that plan, the same flags without --stage-layers, exports with no layout, where this "
         "one's export carries its split")


SINKS_FAST = (0.105, 0.473)
"""How much too fast NeMo's GPT-OSS-120B development runs are predicted (least and most; README
"MoE runs"; a test reads them from tests/data's development rows)."""
SINKS_FAST_HELD_OUT = (0.016, 0.465)
"""The same of its held-out NeMo runs (NeMo AutoModel's two, on PyTorch FSDP2, are within ±5 %)."""


def sinks_predicted_fast(ev) -> None:
    """Say when a model with GPT-OSS's layers (learned attention sinks) runs on a
    Megatron-Core-family stack: NeMo's runs of it are all predicted too fast, for reasons not
    found (a MoE trial planned GPT-OSS on B200 and was told nothing; the README was)."""
    sc = ev.scenario
    if not sc.model.attention_sinks or sc.stack.export_format != "megatron":
        return
    (low, high), (held_low, held_high) = SINKS_FAST, SINKS_FAST_HELD_OUT
    note(f"NeMo's GPT-OSS-120B runs (learned attention sinks, clamped GLU) are all predicted "
         f"faster than they ran, for reasons not found: its development runs by {low:.0%} to "
         f"{high:.0%}, its held-out ones by {held_low:.0%} to {held_high:.0%}; NeMo AutoModel's "
         f"within 5 % (README \"MoE runs\"): on a NeMo-like stack this step is likely too short")


MOE_HOST_HEAVY = 0.2
"""The share of an MoE step's prediction waiting on the host from which ``moe_host_heavy`` says
how uncertain that is."""
MOE_HOST_HEAVY_ERRORS = (-0.349, 0.824)
"""Least and most error of the measured MoE runs (development and held out) predicted with at
least ``MOE_HOST_HEAVY`` of their step waiting on the host (README "MoE runs"; a test reads them
from tests/data's rows)."""


def moe_host_heavy(ev) -> None:
    """Say when much of an MoE plan's step is the MoE layers' host wait: the least certain term of
    an MoE step (the measured runs where it weighs this much are predicted from 35 % too fast to
    82 % too slow), which can part plans in a ranking that a run would not (an MoE user's trial:
    a Megatron-Bridge recipe ranked 1.5x behind a plan that differed from it mostly in micro-batch
    count; without the wait the two were within 5 %)."""
    from ..units import MS, fmt_time

    sc, host, step = ev.scenario, ev.time.host, ev.step_time
    if sc.model.moe is None or host < MOE_HOST_HEAVY * step:
        return
    low, high = MOE_HOST_HEAVY_ERRORS
    wait = sc.stack.moe_host_wait(sc.training, ev.plan.ep)  # (the breakdown's per-layer figure)
    note(f"{host / step:.0%} of this step is the MoE layers' host wait ({fmt_time(host)}; stack "
         f"{sc.stack.name}: {wait / MS:.1f} ms per MoE layer), the least certain term of an MoE "
         f"step: the measured runs predicted with {MOE_HOST_HEAVY:.0%} or more of theirs waiting "
         f"are off by {low:+.0%} to {high:+.0%} (README \"MoE runs\"); plans it parts (by their "
         "micro-batches or MoE layers per device) may rank otherwise when run: measure before "
         "choosing between them")


CALIBRATION_REACH = 2
"""How far beyond the sequence lengths a calibration was fitted on (a factor either way) a plan
may go without a note."""


def beyond_calibration(ev) -> None:
    """Say when a stack ``calibrate`` fitted is used beyond the runs it was fitted on
    (``calibration_gaps``)."""
    for _, sentence in calibration_gaps(ev.scenario):
        note(sentence)


GAP_ASPECTS = {"length": "sequence length", "accelerator": "accelerator", "size": "device count",
               "kind": "model kind (dense or MoE)"}
"""How a scenario can lie beyond a calibration's runs (``calibration_gaps``), in the order said,
and the words for each."""


def _span(lo: int, hi: int) -> str:
    """A range of counts as the calibration notes say it: ``4,096`` or ``2,048 to 8,192``."""
    return f"{lo:,}" if lo == hi else f"{lo:,} to {hi:,}"


def calibration_gaps(sc) -> list[tuple[str, str]]:
    """How scenario ``sc`` lies beyond the runs its stack was calibrated on, as (aspect of
    ``GAP_ASPECTS``, sentence): another accelerator than theirs, a sequence length or a device
    count far from theirs (a trial's fit on 2K-8K runs took the attention to 0.58x and predicted
    its 64K-1M runs 45 % slow, without a word), or a model of another kind (dense or MoE);
    empty for a stack no calibration fitted."""
    from ..stack import fitted_kind

    st, seq, acc = sc.stack, sc.training.seq_len, sc.cluster.accelerator.name
    gaps = []
    if st.fitted_seq_len:
        lo, hi = st.fitted_seq_len
        if not lo / CALIBRATION_REACH <= seq <= hi * CALIBRATION_REACH:
            gaps.append(("length", f"stack {st.name} was calibrated on runs of "
                         f"{_span(lo, hi)} tokens; at "
                         f"{seq:,} the attention's share of the step differs, and what the fit "
                         "gave it may not carry (calibrate on runs nearer this length)"))
    if st.fitted_accelerators and acc not in st.fitted_accelerators:
        gaps.append(("accelerator", f"stack {st.name} was calibrated on runs on "
                     f"{', '.join(st.fitted_accelerators)}, not on {acc}: its multipliers were "
                     "fitted to those accelerators' kernels"))
    if st.fitted_gpus:  # (a calibrating user's trial: a one-node fit moved a 512-GPU plan 24 %)
        lo, hi = st.fitted_gpus
        n, levels = sc.gpus, sc.cluster.levels
        span = _span(lo, hi)
        # (a review: 16 GPUs beside runs on one 8-GPU node cross the network, which the runs
        # did not, though within twice their count)
        reach, runs = sc.cluster.top_level(n), sc.cluster.top_level(hi)
        if n > hi * CALIBRATION_REACH or reach > runs:
            beyond = (f"its groups reach the {levels[reach].name} level, beyond the runs' "
                      f"{levels[runs].name} on this cluster" if reach > runs
                      else "its groups span far more devices than the runs'")
            gaps.append(("size", f"stack {st.name} was calibrated on runs of {span} GPUs; on "
                         f"{n:,} {beyond}, and what the fit gave the runs' mix of compute and "
                         "communication may not carry (calibrate on runs nearer this size)"))
        elif n < lo / CALIBRATION_REACH:
            gaps.append(("size", f"stack {st.name} was calibrated on runs of {span} GPUs; on "
                         f"{n:,} communication weighs less than in them, and what the fit gave "
                         "their mix of compute and communication may not carry (calibrate on "
                         "runs nearer this size)"))
    kind = fitted_kind(sc.model)
    if st.fitted_kinds and kind not in st.fitted_kinds:
        gaps.append(("kind", f"stack {st.name} was calibrated on {st.fitted_kinds[0]} models' "
                     "runs only; " + (
                         f"{sc.model.name}'s experts (their exchange, grouped GEMMs and host "
                         "waits) were not in them" if kind == "moe" else
                         f"{sc.model.name} has no experts, whose costs the fit may have "
                         "absorbed") + ": calibrate on runs of its kind"))
    return gaps


LONG_CONTEXT_HOPPER_SLOW = (0.108, 0.220)
"""How much slower than measured the step of NeMo's H100 long-context runs is predicted from 64K
tokens on (least and most; README "Long-context runs", the rows of
tests/data/long_context_runs.csv, which a test reads them from)."""
LONG_CONTEXT_FROM = 65536
"""The sequence length from which those rows are predicted more than the published tolerance's
10 % slow (at 32K, 6.3 %)."""


def long_context_on_hopper(ev) -> None:
    """Say when a Megatron-Core-family plan on a Hopper GPU trains sequences long enough for the
    attention to take most of the step: NeMo's H100 long-context runs ran faster than predicted
    there (a long-context trial: plan and evaluate had said nothing, only the README did). A stack
    whose attention scale was fitted (torchtitan's, or a user's calibration) is left alone."""
    from ..options import AttentionImpl

    sc = ev.scenario
    acc, st = sc.cluster.accelerator, sc.stack
    tr = sc.training
    attended = min(tr.seq_len, tr.attention_span or tr.seq_len)  # (documents: a review's)
    if (acc.compute_capability != 9.0 or st.export_format != "megatron"
            or st.attention is not AttentionImpl.FLASH or st.attention_scale != 1.0
            or attended < LONG_CONTEXT_FROM):  # (materialised: GEMMs, not the kernel)
        return
    low, high = LONG_CONTEXT_HOPPER_SLOW
    note(f"seq_len {tr.seq_len:,}: NeMo's long-context runs on H100 (Llama 2 7B, "
         f"{LONG_CONTEXT_FROM // 1024}K to 1M tokens) were predicted {low:.0%} to {high:.0%} "
         "slower than they ran, the more the "
         f"longer: H100's attention efficiency is not fitted at this length (README "
         f"\"Long-context runs\"), so take this step time as an upper bound")


def short_cp_chunks(ev) -> None:
    """Say when context parallelism leaves each rank fewer tokens than the search's floor (a
    trial's CP 32 at 2,048 tokens, 64 per rank, evaluated without a word)."""
    from ..specs import MIN_CP_CHUNK

    par, seq = ev.plan, ev.scenario.training.seq_len
    if par.cp > 1 and seq // par.cp < MIN_CP_CHUNK:
        note(f"cp {par.cp}: {seq // par.cp:,} tokens per rank, under the {MIN_CP_CHUNK:,} the "
             "search gives each when it chooses the degree itself: the K/V exchange then costs "
             "mostly its latency")


HELD_OUT_PEAK_SHORTFALL = 0.223
"""The most the memory model fell short of a measured peak on held-out runs: torchtitan's Llama
3.1 405B with TP 8, PP 8 and CP 8 (README, "Held-out runs"; the development rows' most is 5.5 %,
which the default headroom covers)."""
HELD_OUT_TP_SHORTFALL = 0.132
"""... and without a pipeline or context parallelism: torchtitan's Llama 3.1 70B with FSDP and
TP 8 on 256 H100, 62.4 GiB predicted of 71.9 measured (README, "Held-out runs")."""


def unchecked_peak_text(ev) -> str | None:
    """What to say of a torchtitan plan with a pipeline, context or tensor parallelism that leaves
    less free than the memory model's shortfall on such held-out runs (a long-context trial's CP
    64 plans at 8-11 GiB free, where the model had missed measured peaks by 19 GiB at CP 8; a
    torchtitan 405B trial's TP 8 FSDP plan, the held-out 70B rows' shape, got no word, and the
    exported file none at all); None otherwise."""
    sc, par = ev.scenario, ev.plan
    if sc.stack.export_format != "torchtitan" or (par.pp == par.cp == par.tp == 1):
        return None
    staged = par.pp > 1 or par.cp > 1
    share = HELD_OUT_PEAK_SHORTFALL if staged else HELD_OUT_TP_SHORTFALL
    short = ev.peak_memory * share / (1 - share)
    if not ev.fits or ev.margin >= short:  # (one that does not fit says so already)
        return None
    from ..units import fmt_gib

    # (said as the peak it would be: a torchtitan trial read "would take 21.3 GiB" against
    # "give 23", 18.3 GiB of HBM, as a contradiction)
    pct = math.ceil(100 * share)
    runs = ("pipeline and context parallelism (Llama 3.1 405B" if staged else
            "tensor parallelism (Llama 3.1 70B with FSDP and TP 8")
    return (f"the memory model fell short of torchtitan's measured peaks by up to {share:.0%} "
            f"on held-out runs with {runs}, README \"Held-out runs\"); at that shortfall this "
            f"plan's predicted peak of {fmt_gib(ev.peak_memory)} GiB would be "
            f"{fmt_gib(ev.peak_memory + short)} GiB, more than its {fmt_gib(ev.capacity)} GiB: "
            f"--memory-headroom {pct} plans only peaks that such a shortfall leaves within HBM "
            f"(at most {100 - pct}% of it)")


def unchecked_peak(ev) -> None:
    """Say ``unchecked_peak_text``."""
    note(unchecked_peak_text(ev))


def simulated_schedule(ev) -> None:
    """Say when an interleaved plan's simulated schedule runs longer than its closed form
    (``textfmt.simulated_schedule_text``; the exports say it too)."""
    from ..textfmt import simulated_schedule_text

    note(simulated_schedule_text(ev))


def split_groups(ev) -> None:
    """Say when TP or CP groups whose devices a scale-up domain could hold (``placement.reach``:
    ``tp`` devices for TP, ``tp·cp`` for CP in Megatron's order) cross out of it because the
    domain's size is not a multiple of that span: ranks fill devices in order, so some groups
    straddle two domains (a user trial's TP 16 on 72-GPU NVLink domains ran over InfiniBand
    without a word)."""
    from ..axes import Axis
    from ..placement import reach

    cluster, par = ev.scenario.cluster, ev.plan
    if len(cluster.levels) < 2:
        return
    domain = cluster.levels[0]
    levels = ev.group_levels
    split = []
    for axis in (Axis.TP, Axis.CP):
        size, crossed = levels.get(axis.value, (1, None))
        span = reach(par, axis)
        if size > 1 and span <= domain.size and domain.size % span \
                and crossed not in (None, domain.name):
            split.append((axis.value, size, span, crossed))
    if split:
        note(f"{domain.name} domains hold {domain.size} devices, which " + " and ".join(
            f"{a} groups of {n}" + (f" (each over {w} devices)" if w != n else "")
            for a, n, w, _ in split) + " do not divide: ranks fill devices in order, so some "
            "of those groups straddle two domains and cross the " + " and the ".join(
                sorted({c for *_, c in split})) + f"; spans that divide {domain.size} keep every "
            "group inside one")


def fp8_stack_at_bf16(ev) -> None:
    """Say when the stack's fp8 behaviour (fp8 all-gathers: the torchtitan-float8 stacks) has
    nothing to act on because the run is bf16 (a user trial's Float8 stack had been costed as
    bf16 without a word)."""
    from ..options import Precision

    st = ev.scenario.stack
    if ev.scenario.training.precision is Precision.FP8 or not (st.fp8_param_gather
                                                              or st.fp8_tp_gather):
        return
    note(f"stack {st.name} moves fp8 in its all-gathers in fp8 training; this run is "
         "bf16 (--precision fp8 for fp8), costed as in bf16")


def uncalibrated_stack(ev) -> None:
    """Say when the stack was fitted on no measured run (``StackSpec.fitted_on`` empty: its
    efficiencies are another stack's or the defaults; a user trial found deepspeed's MFU
    presented as plainly as megatron-core's, which dozens of runs back)."""
    st = ev.scenario.stack
    if st.fitted_on:
        return
    note(f"stack {st.name} was fitted on no measured run of its own (README, \"Training "
         "stacks\", says whose values it holds): nestplan calibrate, given runs of yours "
         "and this stack as --stack, fits it to them")


def unmeasured_accelerator(ev) -> None:
    """Say when no measured run stands behind the accelerator's efficiencies (``AcceleratorSpec.
    fitted_on`` empty: the catalog's MI300X, H200 and TPU v4, or a file of the user's own without
    a base that has them): a new user's trial planned on MI300X, put it ahead of H200 at 48 % MFU,
    and was told nothing of the kind."""
    note(unmeasured_accelerator_text(ev.scenario.cluster.accelerator))


def unmeasured_accelerator_text(acc, what: str = "this step time and MFU rest") -> str | None:
    """``unmeasured_accelerator``'s note of accelerator ``acc``, ``what`` rests on its stated
    figures (the sweep says it of its points), or None where measured runs stand behind it."""
    if acc.fitted_on:
        return None
    return (f"accelerator {acc.name}: no measured training run stands behind its efficiencies "
            f"(README \"Accuracy\" lists the runs behind each catalog accelerator's): {what} on "
            "the file's stated figures; measured runs of yours and nestplan calibrate fit a stack "
            "to them")


def load_capped(ev) -> None:
    """Say when the stated load of the busiest expert rank is more than the plan's expert ranks
    can have (a fuzzing find: --moe-imbalance 9 over 2 ranks was costed as given, 6x slower), and
    the load it was costed at."""
    sc, par = ev.scenario, ev.plan
    tr = sc.training
    most = ev.capped_moe_load
    if most is not None:
        m = sc.model.moe
        flag = ("--moe-imbalance", tr.moe_imbalance) if tr.moe_load == tr.moe_imbalance else (
            "--moe-capacity-factor", tr.moe_capacity)  # the one that sets the stated load
        note(f"{flag[0]} {flag[1]:g}: the busiest of {par.ep} expert ranks "
             f"receives at most {most:g}x the mean (a rank holds {m.experts // par.ep} of "
             f"the {m.experts} experts, and each token sends its {m.top_k} copies to "
             f"distinct experts); costed at {most:g}")


def balanced_routing(ev, imbalance_stated: bool) -> None:
    """Say that an MoE plan was costed with perfectly balanced routing when the user stated no
    imbalance and no capacity caps it, and what the plan takes and needs at an uneven load (a
    user trial: plans at the memory limit stopped fitting at 1.2, without a word)."""
    sc = ev.scenario
    tr = sc.training
    if (sc.model.moe is None or imbalance_stated
            or tr.moe_imbalance != 1.0 or tr.moe_capacity is not None
            or ev.plan.ep == 1):  # one rank holds every expert: no busiest one (a user trial's
        return  # note had quoted +0 %)
    from dataclasses import replace

    from ..evaluate import evaluate
    from ..textfmt import memory_verdict
    from ..units import fmt_gib, fmt_time

    uneven = evaluate(replace(sc, training=replace(tr, moe_imbalance=UNEVEN_ROUTING)), ev.plan)
    note(f"costed with perfectly balanced routing (--moe-imbalance 1, as benchmarks "
         f"that force it run); with a trained router's busiest expert rank at e.g. "
         f"{UNEVEN_ROUTING:g}x the mean this plan takes {fmt_time(uneven.step_time)} "
         f"({uneven.step_time / ev.step_time - 1:+.0%}) and needs "
         f"{fmt_gib(uneven.peak_memory)} GiB ("
         + memory_verdict(uneven)
         + "); state your run's with --moe-imbalance"
         # (a user trial: the first plan of a search stopped leaving the headroom at 1.2)
         + ("" if uneven.within_headroom else
            f" (a search given --moe-imbalance {UNEVEN_ROUTING:g} ranks only the plans that "
            "leave the headroom at that load)"))


def capacity_under_balance(ev) -> None:
    """Say when a capacity factor is given under balanced routing on a stack that does not pad
    to it: no rank exceeds its share, so it drops nothing and changes nothing (a MoE trial's 1.0
    and 1.5 gave the same plan without a word, and the balanced-routing note had gone)."""
    sc = ev.scenario
    tr = sc.training
    if (sc.model.moe is None or tr.moe_capacity is None or tr.moe_imbalance != 1.0
            or sc.stack.pads_experts(tr) or ev.plan.ep == 1):
        return
    note(f"moe-capacity-factor {tr.moe_capacity:g} caps the busiest expert rank's tokens at "
         f"{tr.moe_capacity:g} times its share; with balanced routing (--moe-imbalance 1, the "
         "default) no rank exceeds its share, so it drops nothing and changes nothing here: "
         "state your run's imbalance with --moe-imbalance to see the cap")


def no_interleaving(ev) -> None:
    """Say why a pipelined plan does not interleave when its stack could but its looped schedules
    cannot run the micro-batches per replica (rounds of pp, or a count that is no whole number
    of rounds: a user trial's Llama-3 405B on 12,288 GPUs had 64 micro-batches over pp 12, 12 %
    slower per GPU than at 16,384 GPUs, without a word)."""
    par, st = ev.plan, ev.scenario.stack
    from ..schedule import SCHEDULES

    looped = [n for n in st.schedules if SCHEDULES[n].looped_rounds]
    if par.pp == 1 or par.vp > 1 or not looped:
        return
    micro = ev.micro_batches
    # (two chunks: the rounds a count allows do not depend on how many)
    why = [st.schedule_refusal(n, par.pp, 2, micro) for n in looped]
    if all(why):
        note(f"no interleaving: {looped[0]} cannot run this plan's {micro} "
             f"micro-batches per replica ({why[0][2]}); a global batch or GPU count "
             "that gives a count it runs would allow it")


def depths_narrow_search(ev, con) -> None:
    """Say when the model's multi-token-prediction depths kept axes the stack offers out of the
    search (``StackSpec.mtp_without``: torchtitan 0.3 runs no depth with a pipeline or context
    parallelism) and the constraints ``con`` did not fix them: a torchtitan MoE user's trial's
    DeepSeek-V3 plan was searched without pipelines, 58 % slower than the best pipelined one
    with --mtp-layers 0, which is what torchtitan's own deepseek_v3_671b trains, without a word."""
    from ..specs import MTP_AXIS_WORDS
    from ..units import counted

    sc = ev.scenario
    st, depths = sc.stack, sc.model.mtp_layers
    if not depths:
        return
    left = [axis for axis in st.mtp_without
            if st.offers(axis) and getattr(con, axis) is None and getattr(ev.plan, axis) == 1]
    if left:
        axes = " and ".join(MTP_AXIS_WORDS[a] for a in left)
        note(f"{sc.model.name}'s {counted(depths, 'multi-token-prediction depth')} kept {axes} "
             f"parallelism out of the search: stack {st.name} runs none with them "
             f"(mtp_without); --mtp-layers 0 searches {'it' if len(left) == 1 else 'them'} (a "
             "model without the depths)")


def recompute_costs_memory(ev) -> None:
    """Say so when the plan's per-module recomputation keeps more memory than none would (as
    Megatron's selective, core_attn, does under flash attention: its checkpoint pins the fused
    QKV output, and the fused kernel keeps no score matrix to drop; README, "Memory")."""
    from ..evaluate import evaluate
    from ..options import AttentionImpl
    from ..units import fmt_gib, fmt_time

    stack = ev.scenario.stack
    policies = {stack.policy(n) for n in ev.plan.recompute}
    kinds = {p.kind for p in policies}
    # per-module policies, some stages perhaps none (every stack offers none: StackSpec)
    if "modules" not in kinds or not kinds <= {"modules", "none"}:
        return
    bare = evaluate(ev.scenario, ev.plan.with_(recompute=("none",)))
    if bare.peak_memory < ev.peak_memory:
        why = ("; under flash attention a checkpointed attention core keeps the whole fused QKV "
               "output alive" if stack.attention is AttentionImpl.FLASH
               and any("core_attn" in p.modules for p in policies) else "")
        # the step may still be shorter: a stage with slack whose longer backward hides more of
        # its gradient sync (a hardware trial's 405B plan: 0.02 %), which "costs time" had denied
        time = ("costs time" if bare.step_time <= ev.step_time else
                f"saves only {fmt_time(bare.step_time - ev.step_time)} of the step (its stages "
                "with slack hide more of their gradient sync behind the longer backward)")
        note(f"recompute {ev.plan.recompute_text} keeps more memory than none, and {time} "
             f"({fmt_gib(ev.peak_memory)} GiB against "
             f"{fmt_gib(bare.peak_memory)}){why}")


def idle_policies(ev) -> None:
    """Say when a per-module recompute policy of the plan has none of its modules among the
    model's operators on this stack, so it recomputes nothing (a user trial's fine-grained
    Llama plan gave none's figures without a word)."""
    from ..evaluate import layer_graph

    sc, stack = ev.scenario, ev.scenario.stack
    present = layer_graph(sc.model, ev.plan, sc.training, stack).modules
    for p in sorted({stack.policy(n) for n in ev.plan.recompute}, key=lambda p: p.name):
        if p.modules and not set(p.modules) & present:
            note(f"recompute {p.name} recomputes nothing here: none of its modules "
                 f"({', '.join(p.modules)}) is an operator of {sc.model.name} on stack "
                 f"{stack.name} (a norm fused into the next linear layer is not one); "
                 "costed as none")


FAR_BEHIND = 3.0
"""``compare``'s ``manual`` plan this many times slower than the fastest method's gets a note: its
speed-ups are then over rules of thumb that fit the model badly, not over a plan anyone would
run."""


def manual_far_behind(results, con) -> None:
    """Say when ``manual``'s plan is ``FAR_BEHIND`` times slower than the fastest method's or more:
    the speed-ups over it are over Megatron's rules of thumb (``_manual_rules``: those the
    constraints ``con`` leave open, as the plan took them; the note had named rules a fixed knob
    had overridden, and says nothing where every one was fixed), not over a tuned plan
    (an MoE user's trial read "nest 13.19x" beside a manual plan of TP 8 and expert TP 8 for 4 KV
    heads and 768-wide experts)."""
    from ..textfmt import plan_short

    manual = results.get("manual")
    if manual is None or not manual.best.fits:
        return
    best = max((r.best for r in results.values() if r.best.fits), key=lambda ev: ev.tokens_per_s)
    ratio = manual.best.step_time / best.step_time
    if ratio >= FAR_BEHIND:
        moe = best.scenario.model.moe is not None
        rules = _manual_rules(manual.best, con)
        if not rules:  # (every one fixed: the plan is the user's own)
            return
        note(f"manual's plan ({plan_short(manual.best.plan, moe)}) takes {ratio:.3g} times the "
             f"fastest method's step ({plan_short(best.plan, moe)}): the speed-ups over manual "
             f"are over Megatron's rules of thumb ({', '.join(rules)}; README, \"How the search "
             "works\"), which fit this model badly, not over a tuned plan; evaluate a plan of "
             "yours to compare with it")


def _manual_rules(ev, con) -> list[str]:
    """The rules of thumb behind ``manual``'s plan (``ev``) that the constraints ``con`` left
    open, as the plan took them (``search.methods.manual_plan``)."""
    stack, plan = ev.scenario.stack, ev.plan
    policy = stack.policy(plan.recompute[0])
    return [rule for rule, taken in (
        ("a node's TP", con.tp is None and stack.offers("tp")),
        ("experts following TP", ev.scenario.model.moe is not None and con.etp is None
         and plan.tp > 1 and plan.expert_tp == plan.tp),
        ("full recomputation" if policy.kind == "full" else
         f"its most saving recomputation, {policy.name}", con.recompute is None),
        ("micro-batch 1", con.mbs is None),
        ("the fewest pipeline stages that fit", con.pp is None),
        (f"ZeRO-{plan.zero}", con.zero is None)) if taken]


def manual_without_cp(results) -> None:
    """Say when the speed-ups are over a ``manual`` plan without context parallelism at a length
    where the others use it: its rules of thumb give CP only when --cp fixes it (a long-context
    trial read "nest 9.84x" at 1M tokens as nestplan's gain over a hand plan with CP, which
    evaluates 1 % slower than nest's)."""
    manual = results.get("manual")
    if manual is None or manual.best.plan.cp > 1:
        return
    if any(res.best.plan.cp > 1 for name, res in results.items() if name != "manual"):
        note("manual's rules of thumb use no context parallelism unless --cp fixes it, and the "
             "other methods' plans do: the speed-ups over manual here are over plans without CP "
             "(README, \"How the search works\"; give --cp to compare at a CP degree of yours)")
