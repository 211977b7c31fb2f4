"""Launch configurations from a plan: Megatron-LM, torchtitan, DeepSpeed.

Each exporter returns an :class:`Export`: the main text (command-line arguments, a TOML or a JSON
file), extra files to write beside it (a rank map, the device mesh) and notes on what the
framework cannot express. A plan a framework cannot express exactly is exported as the closest
plan it can run, never silently: the notes say what changed and what nestplan predicts for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from ..axes import order_text
from ..caching import cached
from ..errors import SpecError
from ..evaluate import evaluate as _evaluate, logged_flops_said
from ..recompute import Policy
from ..placement import rank_grid
from ..notes.plan import unchecked_peak_text
from ..notes.scenario import trained_context_text
from ..planfile import PlanFile
from ..specs import Parallelism, blocks_per_chunk
from ..stack import FORMAT_STACKS
from ..textfmt import memory_verdict, plan_short, simulated_schedule_text
from ..units import GiB

FORMATS = tuple(FORMAT_STACKS)

evaluate = cached(maxsize=32)(_evaluate)
"""The exporters evaluate the plan and the plan they export, often the same one, once."""


@dataclass
class Export:
    text: str
    extras: dict[str, str] = field(default_factory=dict)
    """File-name suffix (appended to the output path) -> contents."""
    notes: list[str] = field(default_factory=list)
    plan: Parallelism | None = None
    """The plan actually exported (the saved plan, or the closest one the framework runs)."""


def mesh_json(par: Parallelism) -> str:
    """The device mesh of the plan: device id (= global rank when rank r runs on device r) of
    every (pp, dp, cp, tp) coordinate."""
    grid = rank_grid(par)
    return json.dumps({"dims": ["pp", "dp", "cp", "tp"], "shape": list(grid.shape),
                       "rank_order": order_text(par.rank_order),
                       "ranks": grid.tolist()}) + "\n"


def rank_map(par: Parallelism, devices_per_host: int) -> str:
    """CSV ``rank,device,node,local_device``: the device that runs each framework rank, on
    which host (``node``, of ``devices_per_host`` devices: ``ClusterSpec.host_size``) as which
    local device (a launcher's LOCAL_RANK).

    Megatron-LM (order tp-cp-ep-dp-pp, ep = 1 for the dense layers), torchtitan (pp,
    dp_replicate, dp_shard, cp, tp) and DeepSpeed (pipe, data, model) all number ranks tp
    fastest, then cp, dp, pp; the plan's
    rank order puts rank ``r`` of its own numbering on device ``r``.
    """
    grid = rank_grid(par)  # [pp, dp, cp, tp] -> device
    lines = ["rank,device,node,local_device"]
    for rank, dev in enumerate(grid.ravel().tolist()):  # C order: tp fastest, then cp, dp, pp
        lines.append(f"{rank},{dev},{dev // devices_per_host},{dev % devices_per_host}")
    return "\n".join(lines) + "\n"


def rank_script(framework: str) -> str:
    """A bash wrapper for a launcher that starts one process per device and numbers them by host
    (torchrun's GROUP_RANK, DeepSpeed's launcher's CROSS_RANK, NODE_RANK where only it is set; and
    LOCAL_RANK): it sets RANK to the framework rank the rank map (``rank_map``, the
    ``.ranks.csv`` beside it) puts on this host's device, then runs its arguments. The map's
    hosts are the cluster's in device order (host h holds devices h·n to h·n + n - 1): the
    launcher must number them so (torchrun: a static rendezvous with --node-rank in that order;
    c10d's picks its own), which the script's comments and the export's note say."""
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# nestplan: the {framework} rank of each device, from the rank map beside this file",
        "# run: torchrun --no-python ... bash THIS_FILE COMMAND ARGUMENTS",
        "# hosts must be numbered in the cluster's device order (host h holds the map's devices",
        "# h*n .. h*n+n-1): torchrun --rdzv-backend static --node-rank h, or DeepSpeed's hostfile",
        "# in that order",
        "set -euo pipefail",
        'here="$(readlink -f "${BASH_SOURCE[0]}")"',
        'map="${here%.sh}.csv"',
        'host="${GROUP_RANK:-${CROSS_RANK:-${NODE_RANK:-}}}"',
        'if [ -z "$host" ] || [ -z "${LOCAL_RANK:-}" ]; then',
        '  echo "GROUP_RANK (CROSS_RANK, NODE_RANK) and LOCAL_RANK are not set (run under a '
        'launcher)" >&2',
        "  exit 2",
        "fi",
        'if [ "$#" -eq 0 ]; then echo "give the command to run" >&2; exit 2; fi',
        'RANK=$(awk -F, -v h="$host" -v l="$LOCAL_RANK" \'NR > 1 && $3 == h && $4 == l '
        '{ print $1; exit }\' "$map")',
        'if [ -z "$RANK" ]; then echo "no rank for host $host, local rank $LOCAL_RANK in $map" >&2; '
        "exit 2; fi",
        "export RANK",
        'exec "$@"']) + "\n"


def rank_files(par: Parallelism, order: tuple, devices_per_host: int,
               framework: str) -> dict[str, str]:
    """The rank map and its launcher wrapper: extras of an export whose plan does not number its
    ranks in the framework's ``order`` (none when it does)."""
    if par.ranks_ordered_as(order):
        return {}
    return {".ranks.csv": rank_map(par, devices_per_host), ".ranks.sh": rank_script(framework)}


def rank_note(par: Parallelism, order: tuple, framework: str, theirs: str,
              command: str) -> list[str]:
    """The note of an export whose plan does not number its ranks in ``framework``'s ``order``
    (worded ``theirs``), which then writes ``rank_files``; none when it does."""
    if par.ranks_ordered_as(order):
        return []
    return [f"the plan's rank order ({order_text(par.rank_order)}) differs from "
            f"{framework}'s ({theirs}): launch through the rank wrapper, which sets RANK from the "
            f"rank map (PATH.ranks.csv) so that {framework} rank r runs on the device the plan "
            f"chose: torchrun --no-python ... bash PATH.ranks.sh {command}, its hosts numbered "
            "in the cluster's device order (--rdzv-backend static --node-rank h for the host of "
            "devices h·n to h·n+n-1)"]


def uniform_policy(pf: PlanFile) -> tuple[Policy, list[str]]:
    """One recompute policy of the plan's stack for every stage (frameworks take one), and a
    note if the plan had several: the one that keeps the fewest bytes per block of the plan's
    own layer graph, so that the plan still fits."""
    from ..evaluate import layer_graph
    from ..recompute import effect

    sc, par = pf.scenario, pf.plan
    stack = sc.stack
    policies = [stack.policy(par.recompute_of(s)) for s in range(par.pp)]
    graph = layer_graph(sc.model, par, sc.training, stack)
    block = graph.moe if graph.moe is not None else graph.dense
    chosen = min(policies, key=lambda p: effect(p, block).saved)
    notes = []
    if len(set(policies)) > 1:
        notes.append(f"per-stage recomputation ({par.recompute_text}) cannot be expressed; "
                     f"every stage uses '{chosen.name}', the one that keeps the least")
    return chosen, notes


def closest_schedule(pf: PlanFile, par: Parallelism, offered: tuple[str, ...],
                     framework: str, stack=None) -> tuple[Parallelism, list[str]]:
    """``par`` (the plan of ``pf`` as exported so far) with a pipeline schedule the framework runs
    (``offered``, nestplan's names; an interleaved one only with micro-batches in rounds the
    framework's StackSpec ``stack`` runs, when given), and a note when that changed it:
    interleaved 1F1B with the same chunks per device where it can run (every device keeps its
    chunks' blocks), else 1F1B with each device's blocks in one chunk."""
    from ..schedule import SCHEDULES

    micro = pf.scenario.training.micro_batches(par.mbs, par.dp)

    def refusal(n: str, vp: int):
        if stack is not None and SCHEDULES[n].looped_rounds:
            return stack.schedule_refusal(n, par.pp, vp, micro)
        return SCHEDULES[n].check(par.pp, vp, micro)

    name = par.pipeline.name
    if par.pp == 1 or (name in offered and refusal(name, par.vp) is None):
        return par, []
    why = (f"{framework} has no {name} schedule ({par.pipeline.title})" if name not in offered
           else f"{framework} cannot run {micro} micro-batches per replica under {name} "
                f"({refusal(name, par.vp)[2]})")
    # the same chunks per device, interleaved, where the format runs that
    interleaves = "interleaved-1f1b" in offered and refusal("interleaved-1f1b", par.vp) is None
    if par.pipeline.mirrored:  # its fold's schedule on the same ranks: one copy of the weights
        target = par.pipeline.folds_to if par.pipeline.folds_to in offered else "1f1b"
        vp = 1 if SCHEDULES[target].chunks == "one" else par.vp
        if target == "1f1b" and interleaves:
            # as many chunks per rank, each device's weights one copy of a pp-th of the model, and
            # what needs interleaving still runs (a DeepSeek-V3 trial's DualPipe plan went out as
            # 1F1B with the expert exchange overlapped, which Megatron-Core refuses without it)
            target, vp = "interleaved-1f1b", par.vp
        return par.with_(schedule=target, vp=vp, stage_layers=None), [
            f"{why}; exported with {target}"
            + (f" over {vp} chunks per device" if vp > 1 else "")
            + f" on the same {par.pp} ranks, the blocks split evenly"]
    sizes = list(blocks_per_chunk(pf.scenario.model, par))
    local = par.pipeline.per_device(sizes, par.pp, par.vp)
    if par.vp > 1 and interleaves:
        target, vp = SCHEDULES["interleaved-1f1b"], par.vp
        layers = target.model_order(local, par.pp, vp)
        how = ""
    else:
        target, vp = SCHEDULES["1f1b"], 1
        layers = tuple(sum(row) for row in local)
        how = ", each device's blocks in one chunk" if par.vp > 1 else ""
    return par.with_(schedule=target.name, vp=vp, stage_layers=layers), [
        f"{why}; exported with {target.name}{how}"]


def launched_as(pf: PlanFile, plan: Parallelism, rules: dict[str, str], **behaviour):
    """The plan file and ``plan`` as the format launches them: the recompute policies ``rules``
    names running the rule it gives them, as a format launches a policy it cannot express
    (Megatron-LM runs per-op checkpointing as its selective recomputation): the stack gains a
    policy ``NAME-as-launched`` of that rule; and the stack's fields ``behaviour`` sets as the
    arguments run them (Megatron-LM's gathers not overlapped where its flag is left out). So the
    export's predictions are of the run it launches (a user trial's Megatron export said "fits"
    of a policy it did not launch, whose stand-in needs 93 GiB of 80; its header had quoted
    overlapped gathers the arguments left out). Without either, both as they are."""
    if not rules and not behaviour:
        return pf, plan
    st = pf.scenario.stack
    named = {name: f"{name}-as-launched" for name in rules}
    stack = replace(st, **behaviour, recompute=st.recompute + tuple(
        Policy(named[name], rule) for name, rule in rules.items()))
    return (replace(pf, scenario=replace(pf.scenario, stack=stack)),
            plan.with_(recompute=tuple(named.get(r, r) for r in plan.recompute)))


def fit_notes(pf: PlanFile) -> list[str]:
    """A warning when the plan itself does not fit its devices' memory."""
    ev = evaluate(pf.scenario, pf.plan)
    return [] if ev.fits else [f"the plan does NOT fit: {ev.why_not}"]


def prediction(pf: PlanFile, changed: Parallelism):
    """nestplan's evaluation of the plan actually exported, with the plan's stack's behaviour,
    and a remark when that stack itself would not run it (a plan searched for another framework,
    exported as what the format's framework runs)."""
    sc = pf.scenario
    why = sc.stack.unsupported(changed, biased=sc.model.biased_experts)
    under = "" if why is None else f" (with {sc.stack.name}'s behaviour, although {why[2]})"
    return evaluate(sc, changed, stack_offers=False), under


def _predicted_line(ev, how: str = "") -> str:
    """A header line (bare: a format adds its comment mark) with a prediction (an Evaluation),
    ``how`` it was made."""
    return (f"predicted{' ' + how if how else ''}: step {ev.step_time:.3f} s, "
            f"{ev.tokens_per_s:,.0f} tokens/s, MFU {ev.mfu:.1%}, peak memory "
            f"{ev.peak_memory / GiB:.1f} GiB ({memory_verdict(ev)})")


def headline(pf: PlanFile, exported: Parallelism, fmt: str) -> tuple[list[str], list[str]]:
    """An export's header lines with nestplan's prediction of the plan it exports (bare), and
    its notes on the stack it was searched for and on a schedule that simulates longer than that
    prediction (``textfmt.simulated_schedule_text``). With the plan's stack; for a plan searched for
    another format's stack, first as the format's own stack runs it (``own_prediction``, which
    ``predicted_note`` works out too where the plan changed), and a note that says so."""
    def later(run) -> list[str]:
        """What plan and evaluate say of ``run``'s unequal chunks, in the file too (a user
        trial's export quoted a step its own schedule simulation puts 15 % later, without a
        word), and what a document span needs of the launch."""
        text = simulated_schedule_text(run)
        sc = run.scenario
        said = logged_flops_said(run, fmt)
        logged = [] if said is None else [
            f"{said.log.name} logs about {said.tflops_per_gpu:.0f} TFLOP/s per GPU for this "
            f"prediction, not the {run.model_tflops_per_gpu:.0f} behind its MFU: its count takes "
            f"{said.differences} ({said.log.source})"]
        # a RoPE model past the context it was built for, as plan said it (the Megatron export
        # sets the length and the RoPE flags from the model; a long-context trial's Qwen3 at 128K
        # had been exported without the note)
        context = trained_context_text(sc) if fmt == "megatron" else None
        # the held-out memory shortfall, in the file that is launched too (a torchtitan trial's
        # export said "fits, leaves the headroom" where plan had warned of it)
        peak = unchecked_peak_text(run)
        return ([text] if text else []) + logged + _span_notes(pf, exported, fmt) + (
            [context] if context else []) + ([peak] if peak else [])

    ev, _ = prediction(pf, exported)
    stack = pf.scenario.stack
    if stack.export_format == fmt:  # (the stack named: a calibrating user's export had not)
        return [_predicted_line(ev, f"with stack {stack.name}")], later(ev)
    said, own = own_prediction(pf, exported, fmt)
    # (of the plan as exported, which may not be the saved one: a user trial read a ZeRO-2 plan's
    # 12.0 s as the saved ZeRO-1 plan's 9.6 s)
    changed = "" if exported.same_plan(pf.plan) else \
        f" for the plan as exported ({plan_short(exported, pf.scenario.model.moe is not None)})"
    mine = _predicted_line(ev, f"with stack {stack.name}'s behaviour{changed}"
                           + ("" if own is None else f" (for comparison: {fmt} does not run it "
                              "so)"))
    runs = f"exports as {stack.export_format}" if stack.export_format else "has no launcher export"
    note = (f"the plan was searched for stack {stack.name} ({runs}), not for {fmt}; its "
            f"prediction assumes {stack.name}'s behaviour; {said} (plan again with --stack "
            f"{FORMAT_STACKS[fmt]} for a {fmt} plan)")
    lines = [mine] if own is None else [
        _predicted_line(own, f"as stack {FORMAT_STACKS[fmt]} runs it"), mine]
    return lines, [note] + later(ev if own is None else own)  # (the exported run's schedule)


# (the dense mask's 64 GiB: float32, 4 bytes x 131,072^2 = 2^36 bytes)
MASKS_PER_DOCUMENT = {
    "megatron": "the export asks Megatron-LM to mask attention per document "
                "(--dataloader-inter-document-masking: cu_seqlens from the dataset's document "
                "lengths, megatron/core/datasets/gpt_dataset.py @ d98e8a64dd; not "
                "--reset-attention-mask, "
                "whose dense sequence-by-sequence mask, torch.tril in "
                "megatron/core/datasets/gpt_dataset.py, is 64 GiB at 131,072 tokens), so the step "
                "holds where your documents are about that long",
    "deepspeed": "DeepSpeed runs the model's own attention: your model code must mask it per "
                 "document",
}
"""How each format's launch attends within packed documents (torchtitan 0.3 always does: its
export says so instead)."""


def _span_notes(pf: PlanFile, exported: Parallelism, fmt: str) -> list[str]:
    """What a plan costed with attention within packed documents (``--attention-span``) needs of
    a launch that may attend over the whole sequence, and its step there (a review's finding: the
    Megatron export quoted the per-document step without a word)."""
    tr = pf.scenario.training
    if fmt not in MASKS_PER_DOCUMENT or tr.document_span is None:
        return []
    sc = replace(pf.scenario, training=replace(tr, attention_span=None))
    whole = evaluate(sc, exported, stack_offers=False).step_time
    return [f"the plan is costed with attention within documents of {tr.document_span:,} tokens "
            f"(--attention-span); {MASKS_PER_DOCUMENT[fmt]}; over the whole {tr.seq_len:,}-token "
            f"sequence the step is predicted at {whole:.3f} s (stack {sc.stack.name}'s "
            "behaviour)"]


def predicted_note(pf: PlanFile, changed: Parallelism, fmt: str,
                   saved: PlanFile | None = None) -> str:
    """What nestplan predicts for the plan actually exported: where the plan was searched for
    another format's stack, as the format's own stack runs it (``own_prediction``; the changed
    plan costed with the first stack's behaviour is a run no framework makes: a user trial read
    11.7 s there for a torchtitan run predicted at 7.9 s), else with the plan's stack
    (``prediction``); against the ``saved`` plan file's own prediction where ``pf`` is it as
    launched (default: ``pf``'s)."""
    saved = saved or pf
    before = evaluate(saved.scenario, saved.plan)
    stack = pf.scenario.stack
    moe = pf.scenario.model.moe is not None
    if stack.export_format != fmt:
        _, own = own_prediction(pf, changed, fmt)
        if own is not None:  # (its figures are the headline's and the searched-for note's:
            # a new user's trial read them twice, beside a second peak, and asked which held)
            return (f"exported plan: {plan_short(changed, moe)} in place of the saved "
                    f"{plan_short(saved.plan, moe)}, whose {before.step_time:.3f} s a step "
                    f"assumes {stack.name}'s behaviour; the run as exported is predicted as stack "
                    f"{FORMAT_STACKS[fmt]} runs it (the file's first prediction line)")
    after, under = prediction(pf, changed)
    if not under and pf.scenario.stack.export_format != fmt:
        under = f" (with {pf.scenario.stack.name}'s behaviour)"
    now, was = f"{after.step_time:.3f}", f"{before.step_time:.3f}"
    step = f"unchanged at {now} s{under}" if now == was else f"{now} s{under} instead of {was} s"
    return (f"exported plan: predicted step {step}, peak memory "
            f"{after.peak_memory / GiB:.1f} GiB ({memory_verdict(after)})")


def mtp_note(pf: PlanFile) -> str:
    """The saved plan's predicted step with and without the model's multi-token prediction."""
    sc = pf.scenario
    without = replace(sc, model=replace(sc.model, mtp_layers=0))
    return (f"the saved plan is predicted at {evaluate(without, pf.plan).step_time:.3f} s a step "
            f"without them, {evaluate(sc, pf.plan).step_time:.3f} s with them")


def capacity_notes(pf: PlanFile, framework: str) -> list[str]:
    """For a format with no capacity-factor option: a note that the plan's is not exported."""
    capacity = pf.scenario.training.moe_capacity
    if capacity is None or pf.scenario.model.moe is None:
        return []
    return [f"the expert capacity factor {capacity:g} (tokens over it dropped) is not exported: "
            f"{framework}'s configuration has no such option here; set it in the model code, or "
            "the run routes every token (dropless)"]


def export(pf: PlanFile, fmt: str) -> Export:
    """The launch configuration of ``pf`` for framework ``fmt``."""
    if fmt == "megatron":
        from .megatron import export as run
    elif fmt == "torchtitan":
        from .torchtitan import export as run
    elif fmt == "deepspeed":
        from .deepspeed import export as run
    else:
        raise SpecError("--format", fmt, f"allowed: {', '.join(FORMATS)}")
    return run(pf)


def launching_stack(stack, fmt: str):
    """The stack whose behaviour a ``fmt`` launch of a plan of ``stack`` is costed with (as
    ``headline`` predicts it): ``stack`` where it exports as ``fmt``, else the format's catalog
    stack (``FORMAT_STACKS``)."""
    from ..catalog import get_stack

    return stack if stack.export_format == fmt else get_stack(FORMAT_STACKS[fmt])


def own_prediction(pf: PlanFile, exported: Parallelism, fmt: str) -> tuple[str, object]:
    """What nestplan predicts for the exported plan as the format's own stack runs it (each
    recompute policy as that stack's closest one), or why that stack cannot run it; with the
    Evaluation (None when it cannot)."""
    from ..catalog import get_stack
    from ..recompute import closest

    sc = pf.scenario
    target = get_stack(FORMAT_STACKS[fmt])
    axis = target.missing_axis(exported)
    if axis is not None:
        return f"nestplan's stack {target.name} would not run it ({axis[0]}: {axis[2]})", None
    mapped = [closest(sc.stack.policy(r), target.recompute) for r in exported.recompute]
    if None in mapped:
        return (f"stack {target.name} offers no policy like '{exported.recompute_text}' (it "
                "offers " + ", ".join(p.name for p in target.recompute) + ")"), None
    plan = replace(exported, recompute=tuple(p.name for p in mapped))
    why = target.unsupported(plan, biased=sc.model.biased_experts)
    if why is not None:
        return f"nestplan's stack {target.name} would not run it ({why[0]}: {why[2]})", None
    try:
        ev = evaluate(replace(sc, stack=target), plan)
    except SpecError as e:  # what the scenario asks of a stack (MTP depths on one without them
        # had refused the export with a --mtp-layers that export does not take)
        return f"nestplan's stack {target.name} would not run it ({e.field}: {e.rule})", None
    taken = sorted({r for r, p in zip(exported.recompute, mapped)
                    if sc.stack.policy(r).rule != p.rule})  # (its nearest policy, not the same)
    return (f"as stack {target.name} runs it (recompute {plan.recompute_text}"
            + (f", the nearest to {sc.stack.name}'s {', '.join(taken)}" if taken else "")
            + "): step "
            f"{ev.step_time:.3f} s, peak memory {ev.peak_memory / GiB:.1f} GiB "
            f"({memory_verdict(ev)})" + _better_zero(ev, target)), ev


BETTER_ZERO = 0.9
"""Another ZeRO stage of the format's stack is named when it steps in at most this share of the
exported plan's time and keeps the headroom."""


def _better_zero(ev, target) -> str:
    """The ZeRO stage ``target`` runs ``ev``'s plan fastest at, where it is much faster than the
    plan's own and keeps the headroom (a user trial: a torchtitan ZeRO-2 plan with PP 8 exported
    to Megatron at 25 s, where its distributed optimizer runs it in 7.9 s)."""
    best = ev
    for zero in target.zeros_for(ev.plan):
        if zero == ev.plan.zero:
            continue
        try:
            other = evaluate(ev.scenario, ev.plan.with_(zero=zero))
        except SpecError:
            continue
        if other.within_headroom and other.step_time < best.step_time:
            best = other
    if best is ev or best.step_time > BETTER_ZERO * ev.step_time:
        return ""
    return (f"; at ZeRO-{best.plan.zero} it runs in {best.step_time:.3f} s "
            f"({best.peak_memory / GiB:.1f} GiB): evaluate the plan with --zero "
            f"{best.plan.zero} --stack {target.name} --save and export that")
