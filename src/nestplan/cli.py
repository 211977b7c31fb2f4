"""The ``nestplan`` command line. Heavy modules are imported inside the handlers.

Exit codes: 0 success, 2 bad input (one line on stderr naming field, value and what is allowed),
3 a search that finds no feasible plan.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from pathlib import Path

from .errors import note

DEFAULT_SEQ_LEN = 4096
DEFAULT_GLOBAL_BATCH = 1024


def _refuse_repeated_flags(sub: argparse.ArgumentParser, given: list[str]) -> None:
    """A flag given twice, or two flags that set the same thing (``--sp`` and ``--no-sp``, ``-o``
    and ``--output``), which argparse would take the last of without a word (a user trial's
    ``--tp 2 ... --tp 4`` ran tp 4): exit 2 naming them. ``given`` holds the subcommand's
    arguments, after its name."""
    flags = {o: a for a in sub._actions for o in a.option_strings}  # (-h exits before this)
    seen: dict[str, tuple[str, str]] = {}  # dest -> (the flag, as it was given)
    for i, token in enumerate(given):
        if token == "--":
            break
        flag = token.split("=", 1)[0] if token.startswith("--") else token
        action = flags.get(flag)
        if action is None:
            continue
        alone = "=" in token or i + 1 == len(given) or action.nargs == 0
        said = token if alone else f"{token} {given[i + 1]}"
        if action.dest in seen:
            before, first = seen[action.dest]
            sub.error(f"{flag} given twice ({first}, then {said}); give it once" if before == flag
                      else f"{before} and {flag} both given ({first}, then {said}); give one")
        seen[action.dest] = flag, said


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit code 2, and whole flag names only (a user trial's
    ``--glob 512`` had been taken for ``--global-batch`` without a word)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        words = self.prog.split()
        where = " ".join(["nestplan", *words[1:]])  # the subcommand's help, or the top-level one
        self.exit(2, f"nestplan: error: {message} (see {where} --help)\n")


def whole_arg(text: str) -> int:
    """argparse's type for whole-number flags: ASCII digits only (``int`` also takes ``1_6``,
    ``+1`` and other scripts' digits)."""
    from .units import whole

    value = whole(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"got {text!r}; must be a whole number (ASCII digits)")
    return value


def decimal_arg(text: str) -> float:
    """argparse's type for decimal flags (``float`` also takes ``1_0``, ``nan`` and ``inf``)."""
    from .units import decimal

    value = decimal(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"got {text!r}; must be a decimal number (ASCII)")
    return value


def _json(obj) -> str:
    """One JSON object for ``--json``: strict JSON (a NaN or an infinity is a bug here, never
    printed as the non-JSON tokens NaN/Infinity)."""
    return json.dumps(obj, allow_nan=False)


def _add_scenario(p: argparse.ArgumentParser, *, for_evaluate: bool):
    g = p.add_argument_group("scenario")
    g.add_argument("--model", required=not for_evaluate,
                   help="catalog name, model TOML, or HuggingFace config.json (or the model "
                   "folder holding it)")
    g.add_argument("--cluster", required=not for_evaluate,
                   help="catalog name or path to a cluster TOML file")
    g.add_argument("--gpus", type=whole_arg, required=not for_evaluate,
                   help="devices used by the run")
    g.add_argument("--seq-len", type=whole_arg,
                   help="tokens per sequence" + ("" if for_evaluate else
                                                 f" (default {DEFAULT_SEQ_LEN})"))
    g.add_argument("--global-batch", type=whole_arg,
                   help="sequences per step" + ("" if for_evaluate else
                                                f" (default {DEFAULT_GLOBAL_BATCH})"))
    g.add_argument("--precision", help="matmul precision: bf16 (default) or fp8")
    g.add_argument("--attention-span", type=whole_arg, metavar="N",
                   help="tokens a query attends to when each sequence packs documents of about N "
                   "tokens under per-document masks (torchtitan 0.3 masks every document; packed "
                   "fine-tuning); default: the whole sequence")
    g.add_argument("--stack", help="training stack: catalog name (nestplan list stacks) or stack "
                   "TOML path (default megatron-core)")
    g.add_argument("--moe-imbalance", type=decimal_arg, metavar="R",
                   help="MoE: routed tokens of the busiest expert rank over the mean (default 1, "
                   "balanced)")
    g.add_argument("--moe-capacity-factor", type=decimal_arg, metavar="C",
                   help="MoE: expert capacity factor; tokens beyond it are dropped (default: "
                   "dropless)")
    g.add_argument("--mtp-layers", type=whole_arg, metavar="N",
                   help="multi-token-prediction depths trained (default: the model's, e.g. 1 for "
                   "DeepSeek-V3; 0 trains without)")
    g.add_argument("--memory-headroom", type=decimal_arg, metavar="PCT",
                   help="percent of HBM a recommended plan leaves free beyond its predicted peak "
                   "(default 6: the memory model's largest under-prediction on the development "
                   "memory rows; held-out torchtitan runs with PP and CP were under by up to 22 "
                   "percent: give more there)")
    k = p.add_argument_group("plan (Megatron convention: tp·pp·dp·cp = gpus)" if for_evaluate
                             else "constraints: any plan flag fixes that knob")
    k.add_argument("--tp", type=whole_arg, help="tensor-parallel degree")
    k.add_argument("--pp", type=whole_arg, help="pipeline stages")
    k.add_argument("--dp", type=whole_arg, help="data-parallel degree (default: derived)")
    free = "" if for_evaluate else "; plan: searched unless given"
    k.add_argument("--cp", type=whole_arg,
                   help=f"context-parallel degree (evaluate's default 1{free})")
    k.add_argument("--ep", type=whole_arg,
                   help="expert-parallel degree; etp·ep must divide tp·cp·dp (evaluate's "
                   f"default 1{free})")
    k.add_argument("--etp", type=whole_arg, help="expert tensor-parallel degree (default: tp where "
                   "the stack lets experts follow TP; torchtitan with EP: 1)")
    k.add_argument("--vp", type=whole_arg,
                   help=f"virtual stages per pipeline rank (evaluate's default 1{free})")
    from .schedule import SCHEDULES

    k.add_argument("--schedule", metavar="NAME",
                   help="pipeline schedule: " + ", ".join(SCHEDULES) + " (default 1f1b, "
                   "interleaved-1f1b when vp > 1; a stack runs those its file lists in schedules)")
    k.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                   help="sequence parallelism (evaluate's default: on with tp > 1 where the "
                   "stack's launchers turn it on, as megatron-core's and torchtitan's do)")
    k.add_argument("--zero", type=whole_arg, help="ZeRO stage 0-3 (1 = distributed optimizer; "
                   "evaluate's default: the stack's default_zero, 1 on megatron-core; under pp > 1 its "
                   "default_zero_with_pp where set, 2 on torchtitan)")
    k.add_argument("--recompute", help="a recompute policy of the stack (catalog stacks: none "
                   "(default) and full on all; selective on megatron-2022, megatron-core, nemo "
                   "and torchtitan; fine-grained on megatron-core and nemo), or one per stage, "
                   "comma-separated, name*k for k stages in a row (none*3,full)")
    k.add_argument("--mbs", type=whole_arg, help="micro-batch size (sequences)")
    k.add_argument("--rank-order", help="axes innermost first, e.g. tp-cp-dp-pp (default)")
    if for_evaluate:
        k.add_argument("--stage-layers", metavar="N,N,...",
                       help="blocks of each model chunk, in pipeline order (pp·vp of them; "
                       "default: even), as a searched plan's stages give them")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--save", metavar="PLAN.json", help="write the (best) plan to a plan file"
                   + ("" if for_evaluate else "; from compare, with every method's result"))


def _add_search(p: argparse.ArgumentParser):
    p.add_argument("--tp-within-node", action="store_true",
                   help="keep tensor parallelism inside a node")


FLAG_OF = {"seq_len": "seq-len", "global_batch": "global-batch", "rank_order": "rank-order",
           "attention_span": "attention-span",
           "stage_layers": "stage-layers",
           "moe_imbalance": "moe-imbalance", "moe_capacity": "moe-capacity-factor",
           "model.mtp_layers": "mtp-layers"}
"""The flag that sets a scenario or plan field, for errors about a value given as a flag."""


def _as_flags(fn):
    """Run ``fn`` naming the flag (``seq-len``) instead of the field (``seq_len``) in a
    SpecError about a value the user gave as a flag."""
    import functools

    from .errors import SpecError

    @functools.wraps(fn)
    def wrapped(args, *a, **kw):
        try:
            return fn(args, *a, **kw)
        except SpecError as e:
            from .specs import list_text  # (not at start-up: the decorator runs on import)

            flag = FLAG_OF.get(e.field)
            given = getattr(args, flag.replace("-", "_"), None) if flag else None
            # the flag only when it gave the value (a model file's mtp_layers is the file's)
            # (a list flag's value as it was typed, 4,4,3, as specs echo a list)
            typed = list_text(given) if isinstance(given, tuple) else given
            if given is not None and typed == e.value:  # (flags hold no NaN: decimal_arg)
                raise SpecError(flag, e.value, e.allowed) from None
            raise
    return wrapped


@_as_flags
def _scenario(args):
    from .catalog import scenario_from_names
    from .options import Precision

    seq = args.seq_len if args.seq_len is not None else DEFAULT_SEQ_LEN
    batch = args.global_batch if args.global_batch is not None else DEFAULT_GLOBAL_BATCH
    workload = {}
    if args.moe_imbalance is not None:
        workload["moe_imbalance"] = args.moe_imbalance
    if args.moe_capacity_factor is not None:
        workload["moe_capacity"] = args.moe_capacity_factor
    if args.attention_span is not None:
        workload["attention_span"] = args.attention_span
    sc = scenario_from_names(args.model, args.cluster, args.gpus, seq_len=seq,
                             global_batch=batch,
                             precision=Precision.parse(
                                 "precision", "bf16" if args.precision is None else args.precision),
                             stack=args.stack, mtp_layers=args.mtp_layers, **workload)
    if args.attention_span is not None and sc.training.document_span is None:
        # (a user trial's span above the sequence had been taken without a word)
        note(f"--attention-span {args.attention_span} is not below the sequence "
             f"({seq}): attention over the whole sequence, as without it")
    if (args.moe_imbalance, args.moe_capacity_factor) != (None, None) and sc.model.moe is None:
        from .errors import note_no_experts

        note_no_experts(" and ".join(f"--{k.replace('_', '-')}" for k in (
            "moe_imbalance", "moe_capacity_factor") if getattr(args, k) is not None), sc.model.name)
    _note_added_depths(sc, args.model)
    _note_fused_pieces(sc)
    _note_straddling_domains(sc)
    _note_position_table(sc)
    _note_trained_context(sc, args.model)
    return _with_headroom(sc, args)


def _note_trained_context(sc, model: str) -> None:
    """Say when a HuggingFace config's RoPE model, its RoPE unscaled, is given a sequence longer
    than its ``max_position_embeddings`` (a long-context trial's 1M tokens on Llama 3 8B's 8,192
    went without a word, and the Megatron export set the longer length with no scaling)."""
    from .catalog import hf_config_in, looks_like_path
    from .options import Position

    m, seq = sc.model, sc.training.seq_len
    if not looks_like_path(model) or m.position is not Position.ROPE or m.rope_scaling or m.yarn:
        return
    path = hf_config_in(Path(model))
    try:
        trained = json.loads(path.read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):  # (a TOML, or a file read before)
        return
    if type(trained) is int and 0 < trained < seq:
        note(f"{m.name} sets max_position_embeddings {trained:,} and no RoPE scaling: at "
             f"--seq-len {seq:,} it is costed and exported with its RoPE base "
             f"({m.rope_theta:g}) unscaled; longer-context training usually raises the "
             "base or scales RoPE (rope_theta or rope_scaling in the config)")


def _note_added_depths(sc, model: str) -> None:
    """Say when --mtp-layers gives a model depths it does not have of its own (a user trial:
    a dense model's header then named them without a word of where they came from)."""
    from .catalog import get_model

    added = sc.model.mtp_layers
    if added and not get_model(model).mtp_layers:
        note(f"--mtp-layers {added}: {sc.model.name} has no multi-token-prediction "
             f"depth of its own; {added} added after its last block (DeepSeek-V3's "
             "kind: a projection, one more block and a loss each, costed as such)")


def _note_position_table(sc) -> None:
    """Say when a learned position table must grow to the sequence length."""
    m, seq = sc.model, sc.training.seq_len
    if m.position_rows(seq) > m.max_positions > 0:
        note(f"{m.name} learns {m.max_positions:,} positions; at --seq-len {seq:,} its "
             f"table has {seq:,} rows (costed so, and exported as "
             "--max-position-embeddings): a model of its own, not a checkpoint of "
             f"{m.name}")


def _on_cluster(sc, cluster: str):
    """``sc`` on another cluster (``evaluate --plan P --cluster C``; the scenario's checks, its
    capacity among them, run again)."""
    import dataclasses

    from .catalog import get_cluster

    return dataclasses.replace(sc, cluster=get_cluster(cluster))


def _note_straddling_domains(sc) -> None:
    """Say when the scale-up domains (an NVL72 rack, say) do not divide the job
    (``textfmt.partial_domain_text``; ``sweep`` says it of its grid)."""
    from .textfmt import partial_domain_text

    text = partial_domain_text(sc.cluster, sc.gpus)
    if text:
        note(text)


def _load_plan(path: str):
    """A plan file, with the notes its scenario calls for."""
    from . import planfile

    pf = planfile.load(path)
    _note_fused_pieces(pf.scenario)
    return pf


def _note_fused_pieces(sc) -> None:
    """Say which of the model's pieces that frameworks may run as eager kernels (``StackSpec.
    eager_ops``) the stack costs as fused ones."""
    from .catalog import DEFAULT_STACK
    from .graph import eager_split

    fused = eager_split(sc.model, sc.stack.eager_ops)[1]
    if fused:
        note(f"stack '{sc.stack.name}' costs {sc.model.name}'s {', '.join(fused)} as "
             "fused kernels (not in its eager_ops): a framework that runs them as "
             f"separate kernels takes longer (stack '{DEFAULT_STACK}' costs them so)")


def _with_headroom(sc, args):
    """``sc`` with ``--memory-headroom`` when given (a percent of HBM)."""
    import dataclasses

    from .errors import SpecError

    pct = args.memory_headroom
    if pct is None:
        return sc
    from .specs import MAX_HEADROOM, valid_headroom

    if not valid_headroom(pct / 100):
        raise SpecError("memory-headroom", pct,
                        f"must be a percent of HBM in [0, {MAX_HEADROOM * 100:g})")
    if 0 < pct < MAX_HEADROOM:  # a plan file's share given as the flag's percent (a user
        # trial's; a share of 0.5 or more, 50 %, is refused in a file as in the flag)
        note(f"--memory-headroom {pct:g} is {pct:g} % of HBM; for {pct * 100:g} %, as a "
             f"plan file's memory_headroom of {pct:g} means, give {pct * 100:g}")
    return dataclasses.replace(sc, memory_headroom=pct / 100)


def _constraints(args):
    from .search.constraints import KNOBS, SWITCHES, constraints_from

    names = (*KNOBS, *(k for k in SWITCHES if k != "tp_within_node"))
    values = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    return constraints_from({**values, "tp_within_node": args.tp_within_node},
                            lambda key: FLAG_OF.get(key, key))


class _Progress:
    """Progress on stderr once a search or a fit has run for more than two seconds: one
    updating line on a terminal; otherwise a line then, and one every five seconds after."""

    def __init__(self, method: str = "nest", doing: str = "searching"):
        self.tty = sys.stderr.isatty()
        self.shown, self.last = False, 0.0
        self.method, self.doing = method, doing

    def __call__(self, done: int, total: int, seconds: float, of: str | None = None,
                 examined: int | None = None):
        if seconds < 2.0 or (not self.tty and self.shown and seconds - self.last < 5.0):
            return
        self.shown, self.last = True, seconds
        checked = "" if examined is None else f"{examined:,} examined, "
        count = (f"{done:,} of {total:,} {of}" if of else
                 f"{checked}{done:,} solved of {total:,} configurations")
        text = f"nestplan: {self.method} {self.doing}, {count}, {seconds:.0f} s"
        print("\r" + text if self.tty else text, end="" if self.tty else "\n",
              file=sys.stderr, flush=True)

    def close(self):
        if self.shown and self.tty:
            print(file=sys.stderr)


@_as_flags
def _plan(args, sc):
    from .axes import parse_order
    from .errors import SpecError
    from .recompute import parse_names
    from .specs import Parallelism, check_plan

    cp = args.cp if args.cp is not None else 1
    for name, value in (("tp", args.tp), ("pp", args.pp), ("cp", cp)):
        if value <= 0:
            raise SpecError(name, value, "must be an integer > 0")
    denom = args.tp * args.pp * cp
    dp = args.dp
    if dp is None:
        if sc.gpus % denom:
            # named: the first degree whose product with those before it stops dividing gpus
            product, name, value = 1, "tp", args.tp
            for name, value in (("tp", args.tp), ("pp", args.pp), ("cp", cp)):
                product *= value
                if sc.gpus % product:
                    break
            raise SpecError(name, value, f"tp·pp·cp = {args.tp}·{args.pp}·{cp} = {denom} must "
                            f"divide gpus = {sc.gpus}")
        dp = sc.gpus // denom
    ep = 1 if args.ep is None else args.ep
    etp = args.etp
    if etp is None and sc.model.moe is not None:
        etp = sc.stack.default_etp(args.tp, ep, biased=sc.model.biased_experts)
    st = sc.stack
    sp = args.sp
    if sp is None:
        sp = st.sp_for(args.tp, sc.model.moe is not None)
    kw = dict(tp=args.tp, pp=args.pp, dp=dp, cp=cp, ep=ep,
              etp=etp, vp=1 if args.vp is None else args.vp, sp=sp,
              zero=0 if args.zero is None else args.zero, mbs=args.mbs)
    if args.recompute is not None:
        kw["recompute"] = parse_names("recompute", args.recompute)
    if args.rank_order is not None:
        kw["rank_order"] = parse_order(args.rank_order)
    if args.schedule is not None:
        from .schedule import SCHEDULES
        from .specs import no_pipeline_schedule

        if args.pp == 1 and args.schedule in SCHEDULES:  # (even the default's: as plan says)
            raise no_pipeline_schedule(args.schedule, "--pp")
        kw["schedule"] = args.schedule
    if args.stage_layers is not None:
        from .units import counts

        sizes = counts(args.stage_layers.replace(" ", "").split(","))
        if sizes is None:
            raise SpecError("stage-layers", args.stage_layers, "must be whole numbers of blocks "
                            "per model chunk, comma-separated (4,4,3)")
        # as the field holds it, so that an error about it names the flag (``_as_flags``)
        args.stage_layers = kw["stage_layers"] = sizes
    par = Parallelism(**kw)
    if args.zero is None:  # the stack's own, or the most it runs with this plan
        runs = st.zeros_for(par) or [0]
        zero = st.default_zero_for(par.pp)
        par = par.with_(zero=zero if zero in runs else max(runs))
    check_plan(sc, par)  # before the cost model (and numpy) is loaded: mistakes answer fast
    return par


MAX_TOP = 100
"""Most plans ``plan --top`` lists (each is evaluated in full, and the search cannot stop until
that many are found: Llama 3 70B on 1,024 H100 took 5 s for 100, 24 s for 1,000)."""

EVALUATE_NEEDS = ("model", "cluster", "gpus", "tp", "pp", "mbs", "global_batch", "seq_len")
PLAN_FILE_HOLDS = EVALUATE_NEEDS + ("precision", "stack", "dp", "cp", "ep", "etp", "vp", "schedule",
                                    "sp", "zero", "recompute", "rank_order", "moe_imbalance",
                                    "moe_capacity_factor", "mtp_layers", "stage_layers",
                                    "attention_span")
"""Flags that ``evaluate --plan`` takes from the plan file instead."""
PLAN_WHAT_IFS = ("cluster", "moe_imbalance")
"""Of those, what ``evaluate --plan`` may change (a MoE trial could not see a saved plan at a
trained router's balance, which the balanced-routing note asks about)."""


@_as_flags
def _at_imbalance(args, sc):
    """``sc`` with the busiest expert rank at ``--moe-imbalance`` times the mean (checked as the
    flag is without --plan; a note for a model without experts, as there)."""
    from dataclasses import replace

    if sc.model.moe is None:
        from .errors import note_no_experts

        note_no_experts("--moe-imbalance", sc.model.name)
        return sc
    return replace(sc, training=replace(sc.training, moe_imbalance=args.moe_imbalance))


def cmd_evaluate(args) -> int:
    from .errors import UsageError
    from .specs import check_plan

    pf = None
    if args.plan is not None:
        given = [f"--{'no-' if getattr(args, n) is False else ''}{n.replace('_', '-')}"
                 for n in PLAN_FILE_HOLDS if getattr(args, n) is not None
                 and n not in PLAN_WHAT_IFS]
        if given:
            raise UsageError(f"--plan takes the whole plan from the file; drop {' '.join(given)} "
                             "(or leave out --plan; --cluster may move it to another cluster, "
                             "--moe-imbalance load its experts otherwise)")
        pf = _load_plan(args.plan)
        sc, plan = _with_headroom(pf.scenario, args), pf.plan
        if args.cluster is not None:  # the same plan, ranks on devices in order, elsewhere
            sc = _on_cluster(sc, args.cluster)
            _note_straddling_domains(sc)
        if args.moe_imbalance is not None:  # the same plan at another routing balance
            sc = _at_imbalance(args, sc)
        check_plan(sc, plan)
    else:
        missing = [f"--{n.replace('_', '-')}" for n in EVALUATE_NEEDS if getattr(args, n) is None]
        if missing:
            raise UsageError(f"missing {' '.join(missing)} (or give --plan PLAN.json)")
        sc = _scenario(args)
        plan = _plan(args, sc)  # checked against the scenario, errors naming the flags
    from .evaluate import evaluate

    ev = evaluate(sc, plan)
    _note_idle_policies(ev)
    _note_recompute_costs_memory(ev)
    _note_host_bound(ev)
    _notes_on_workload_and_stack(ev, args)
    _note_simulated_schedule(ev)
    _note_split_groups(ev)
    if args.save is not None:
        from . import planfile

        # the methods' figures (and whether their plans fit) were for the saved cluster and margin
        moved = [what for what, changed in (
            ("cluster", pf is not None and sc.cluster != pf.scenario.cluster),
            ("memory headroom", pf is not None
             and sc.memory_headroom != pf.scenario.memory_headroom),
            ("routing balance", pf is not None
             and sc.training.moe_imbalance != pf.scenario.training.moe_imbalance)) if changed]
        if moved and pf.comparison:  # (dropped without a word, even for the file's own cluster)
            note(f"--save: the methods compared in {args.plan} are not saved: their "
                 f"results are for its {' and '.join(moved)}")
        method = pf.method if pf else None
        if method and "cluster" in moved:  # (the report had said "found by nest" of a plan
            # only evaluated on this cluster: a datacenter trial's)
            note(f"--save: not saved as found by {method}: {args.plan}'s plan was "
                 f"searched on {pf.scenario.cluster.name} and is only evaluated on "
                 f"{sc.cluster.name}")
            method = None
        elif method and "routing balance" in moved:  # (found for the file's balance)
            note(f"--save: not saved as found by {method}: {args.plan}'s plan was searched "
                 f"at routing balance {pf.scenario.training.moe_imbalance:g} and is only "
                 f"evaluated at {sc.training.moe_imbalance:g}")
            method = None
        planfile.save(ev, args.save, method=method,
                      comparison=pf.comparison if pf and not moved else None)
    if args.json:
        print(_json(ev.to_json()))
    else:
        from .textfmt import evaluation

        print(evaluation(ev))
    return 0


HOST_BOUND_SHARE = 0.5
"""Share of a step in per-step host time beyond which the plan's GPUs are said to be idle."""


def _note_host_bound(ev) -> None:
    """Say when most of the step is per-step host time (a user trial's BERT-large on 4,096 GPUs:
    MFU 0.5 %, the host 87 % of the step): the global batch leaves each device little work."""
    host, step = ev.time.step_host, ev.step_time
    if host > HOST_BOUND_SHARE * step:
        from .units import fmt_time

        note(f"{host / step:.0%} of the step is per-step host time ({fmt_time(host)} of "
             f"{fmt_time(step)}, stack {ev.scenario.stack.name}'s step overhead): the "
             f"global batch gives each of the {ev.scenario.gpus:,} GPUs little work; "
             "fewer GPUs or a larger global batch would use them better")


UNEVEN_ROUTING = 1.2
"""The busiest expert rank's load over the mean that the balanced-routing note shows a plan at: an
example of a trained router's, not a measured figure (state a run's own with --moe-imbalance)."""


def _notes_on_workload_and_stack(ev, args) -> None:
    """The notes evaluate and plan both give of a plan's routing load and of its stack."""
    _note_balanced_routing(ev, args)
    _note_capacity_under_balance(ev)
    _note_load_capped(ev)
    _note_fp8_stack_at_bf16(ev)
    _note_uncalibrated_stack(ev)
    _note_unchecked_peak(ev)
    _note_long_context_on_hopper(ev)
    _note_short_cp_chunks(ev)
    _note_beyond_calibration(ev)
    _note_sinks_predicted_fast(ev)


SINKS_FAST = (0.104, 0.472)
"""How much too fast NeMo's GPT-OSS-120B development runs are predicted (least and most; README
"MoE runs"; a test reads them from tests/data's development rows)."""
SINKS_FAST_HELD_OUT = (0.011, 0.462)
"""The same of its held-out NeMo runs (NeMo AutoModel's two, on PyTorch FSDP2, are within ±5 %)."""


def _note_sinks_predicted_fast(ev) -> None:
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


CALIBRATION_REACH = 2
"""How far beyond the sequence lengths a calibration was fitted on (a factor either way) a plan
may go without a note."""


def _note_beyond_calibration(ev) -> None:
    """Say when a stack ``calibrate`` fitted is used on another accelerator than its runs', or
    at a sequence length far from theirs (a trial's fit on 2K-8K runs took the attention to 0.58x
    and predicted its 64K-1M runs 45 % slow, without a word)."""
    sc = ev.scenario
    st, seq, acc = sc.stack, sc.training.seq_len, sc.cluster.accelerator.name
    if st.fitted_seq_len:
        lo, hi = st.fitted_seq_len
        if not lo / CALIBRATION_REACH <= seq <= hi * CALIBRATION_REACH:
            span = f"{lo:,}" if lo == hi else f"{lo:,} to {hi:,}"
            note(f"stack {st.name} was calibrated on runs of {span} tokens; at {seq:,} the "
                 "attention's share of the step differs, and what the fit gave it may not carry "
                 "(calibrate on runs nearer this length)")
    if st.fitted_accelerators and acc not in st.fitted_accelerators:
        note(f"stack {st.name} was calibrated on runs on {', '.join(st.fitted_accelerators)}, "
             f"not on {acc}: its multipliers were fitted to those accelerators' kernels")


LONG_CONTEXT_HOPPER_SLOW = (0.098, 0.320)
"""How much slower than measured the step of NeMo's H100 long-context runs is predicted from 32K
tokens on (least and most; README "Long-context runs", the rows of
tests/data/long_context_runs.csv, which a test reads them from)."""
LONG_CONTEXT_FROM = 32768
"""The sequence length from which those rows are predicted more than the published tolerance's
10 % slow, or nearly."""


def _note_long_context_on_hopper(ev) -> None:
    """Say when a Megatron-Core-family plan on a Hopper GPU trains sequences long enough for the
    attention to take most of the step: NeMo's H100 long-context runs ran faster than predicted
    there (a long-context trial: plan and evaluate had said nothing, only the README did). A stack
    whose attention scale was fitted (torchtitan's, or a user's calibration) is left alone."""
    from .options import AttentionImpl

    sc = ev.scenario
    acc, st = sc.cluster.accelerator, sc.stack
    tr = sc.training
    attended = min(tr.seq_len, tr.attention_span or tr.seq_len)  # (documents: a review's)
    if (acc.compute_capability != 9.0 or st.export_format != "megatron"
            or st.attention is not AttentionImpl.FLASH or st.attention_scale != 1.0
            or attended < LONG_CONTEXT_FROM):  # (materialised: GEMMs, not the kernel)
        return
    low, high = LONG_CONTEXT_HOPPER_SLOW
    note(f"seq_len {tr.seq_len:,}: NeMo's long-context runs on H100 (Llama 2 7B, 32K to "
         f"1M tokens) were predicted {low:.0%} to {high:.0%} slower than they ran, the more the "
         f"longer: H100's attention efficiency is not fitted at this length (README "
         f"\"Long-context runs\"), so take this step time as an upper bound")


def _note_short_cp_chunks(ev) -> None:
    """Say when context parallelism leaves each rank fewer tokens than the search's floor (a
    trial's CP 32 at 2,048 tokens, 64 per rank, evaluated without a word)."""
    from .specs import MIN_CP_CHUNK

    par, seq = ev.plan, ev.scenario.training.seq_len
    if par.cp > 1 and seq // par.cp < MIN_CP_CHUNK:
        note(f"cp {par.cp}: {seq // par.cp:,} tokens per rank, under the {MIN_CP_CHUNK:,} the "
             "search gives each when it chooses the degree itself: the K/V exchange then costs "
             "mostly its latency")


HELD_OUT_PEAK_SHORTFALL = 0.223
"""The most the memory model fell short of a measured peak on held-out runs: torchtitan's Llama
3.1 405B with TP 8, PP 8 and CP 8 (README, "Held-out runs"; the development rows' most is 5.5 %,
which the default headroom covers)."""


def _note_unchecked_peak(ev) -> None:
    """Say when a torchtitan plan with a pipeline or context parallelism leaves less free than the
    memory model's shortfall on such held-out runs (a long-context trial's CP 64 plans at 8-11
    GiB free, where the model had missed measured peaks by 19 GiB at CP 8)."""
    sc, par = ev.scenario, ev.plan
    if sc.stack.export_format != "torchtitan" or (par.pp == 1 and par.cp == 1):
        return
    short = ev.peak_memory * HELD_OUT_PEAK_SHORTFALL / (1 - HELD_OUT_PEAK_SHORTFALL)
    if not ev.fits or ev.margin >= short:  # (one that does not fit says so already)
        return
    from .units import fmt_gib

    note(f"the memory model fell short of torchtitan's measured peaks by up to "
         f"{HELD_OUT_PEAK_SHORTFALL:.0%} on held-out runs with pipeline and context "
         f"parallelism (Llama 3.1 405B, README \"Held-out runs\"); this plan leaves "
         f"{fmt_gib(ev.margin)} GiB free where that shortfall would take "
         f"{fmt_gib(short)} GiB: give --memory-headroom "
         f"{math.ceil(100 * HELD_OUT_PEAK_SHORTFALL)} to plan with it")


def _note_simulated_schedule(ev) -> None:
    """Say when an interleaved plan's simulated schedule runs longer than its closed form
    (``textfmt.simulated_schedule_text``; the exports say it too)."""
    from .textfmt import simulated_schedule_text

    text = simulated_schedule_text(ev)
    if text:
        note(text)


def _note_split_groups(ev) -> None:
    """Say when TP or CP groups whose devices a scale-up domain could hold (``placement.reach``:
    ``tp`` devices for TP, ``tp·cp`` for CP in Megatron's order) cross out of it because the
    domain's size is not a multiple of that span: ranks fill devices in order, so some groups
    straddle two domains (a user trial's TP 16 on 72-GPU NVLink domains ran over InfiniBand
    without a word)."""
    from .axes import Axis
    from .placement import reach

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


def _note_fp8_stack_at_bf16(ev) -> None:
    """Say when the stack's fp8 behaviour (fp8 all-gathers: the torchtitan-float8 stacks) has
    nothing to act on because the run is bf16 (a user trial's Float8 stack had been costed as
    bf16 without a word)."""
    from .options import Precision

    st = ev.scenario.stack
    if ev.scenario.training.precision is Precision.FP8 or not (st.fp8_param_gather
                                                              or st.fp8_tp_gather):
        return
    note(f"stack {st.name} moves fp8 in its all-gathers in fp8 training; this run is "
         "bf16 (--precision fp8 for fp8), costed as in bf16")


def _note_uncalibrated_stack(ev) -> None:
    """Say when the stack was fitted on no measured run (``StackSpec.fitted_on`` empty: its
    efficiencies are another stack's or the defaults; a user trial found deepspeed's MFU
    presented as plainly as megatron-core's, which dozens of runs back)."""
    st = ev.scenario.stack
    if st.fitted_on:
        return
    note(f"stack {st.name} was fitted on no measured run of its own (README, \"Training "
         "stacks\", says whose values it holds): nestplan calibrate, given runs of yours "
         "and this stack as --stack, fits it to them")


def _note_load_capped(ev) -> None:
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


def _note_balanced_routing(ev, args) -> None:
    """Say that an MoE plan was costed with perfectly balanced routing when the user stated no
    imbalance and no capacity caps it, and what the plan takes and needs at an uneven load (a
    user trial: plans at the memory limit stopped fitting at 1.2, without a word)."""
    sc = ev.scenario
    tr = sc.training
    if (sc.model.moe is None or getattr(args, "moe_imbalance", None) is not None
            or tr.moe_imbalance != 1.0 or tr.moe_capacity is not None
            or ev.plan.ep == 1):  # one rank holds every expert: no busiest one (a user trial's
        return  # note had quoted +0 %)
    from dataclasses import replace

    from .evaluate import evaluate
    from .textfmt import memory_verdict
    from .units import fmt_gib, fmt_time

    uneven = evaluate(replace(sc, training=replace(tr, moe_imbalance=UNEVEN_ROUTING)), ev.plan)
    note(f"costed with perfectly balanced routing (--moe-imbalance 1, as benchmarks "
         f"that force it run); with a trained router's busiest expert rank at e.g. "
         f"{UNEVEN_ROUTING:g}x the mean this plan takes {fmt_time(uneven.step_time)} "
         f"({uneven.step_time / ev.step_time - 1:+.0%}) and needs "
         f"{fmt_gib(uneven.peak_memory)} GiB ("
         + memory_verdict(uneven)
         + "); state your run's with --moe-imbalance")


def _note_capacity_under_balance(ev) -> None:
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


def _note_no_interleaving(ev) -> None:
    """Say why a pipelined plan does not interleave when its stack could but its looped schedules
    cannot run the micro-batches per replica (rounds of pp, or a count that is no whole number
    of rounds: a user trial's Llama-3 405B on 12,288 GPUs had 64 micro-batches over pp 12, 12 %
    slower per GPU than at 16,384 GPUs, without a word)."""
    par, st = ev.plan, ev.scenario.stack
    from .schedule import SCHEDULES

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


def _note_recompute_costs_memory(ev) -> None:
    """Say so when the plan's per-module recomputation keeps more memory than none would (as
    Megatron's selective, core_attn, does under flash attention: its checkpoint pins the fused
    QKV output, and the fused kernel keeps no score matrix to drop; README, "Memory")."""
    from .evaluate import evaluate
    from .options import AttentionImpl
    from .units import fmt_gib, fmt_time

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


def _note_idle_policies(ev) -> None:
    """Say when a per-module recompute policy of the plan has none of its modules among the
    model's operators on this stack, so it recomputes nothing (a user trial's fine-grained
    Llama plan gave none's figures without a word)."""
    from .evaluate import layer_graph

    sc, stack = ev.scenario, ev.scenario.stack
    present = layer_graph(sc.model, ev.plan, sc.training, stack).modules
    for p in sorted({stack.policy(n) for n in ev.plan.recompute}, key=lambda p: p.name):
        if p.modules and not set(p.modules) & present:
            note(f"recompute {p.name} recomputes nothing here: none of its modules "
                 f"({', '.join(p.modules)}) is an operator of {sc.model.name} on stack "
                 f"{stack.name} (a norm fused into the next linear layer is not one); "
                 "costed as none")


def _searchable(args):
    """The scenario and constraints of ``plan``/``compare``, checked before the search (and its
    numerical libraries) is loaded: a bad flag is refused at once."""
    from .search.constraints import check_constraints, refuse_unsearchable

    _check_top(args.top)
    sc, con = _scenario(args), _constraints(args)
    check_constraints(sc, con)
    if getattr(args, "method", None) not in (None, "manual"):  # plan, with a search; compare
        refuse_unsearchable(con)  # (no --method) shows each method's reason instead
    _note_no_cp_split(sc, con)
    return sc, con


CP_SPLIT_NOTED_FROM = 16384
"""The sequence length from which a length no CP degree splits is noted."""


def _note_no_cp_split(sc, con) -> None:
    """Say when the sequence is long enough for context parallelism but no CP degree the GPUs
    allow splits it into an even number of tokens per rank (load-balanced causal chunks), so the
    search runs without CP (a long-context trial's 131,071 tokens: a plan 14 % slower than at
    131,072, without a word)."""
    from .specs import MIN_CP_CHUNK, cp_splits, divisors

    seq, gpus = sc.training.seq_len, sc.gpus
    # (a stack without CP says so itself; at a few thousand tokens CP hardly matters: a review
    # found 4,097 tokens told to take 4,096)
    if con.cp is not None or not sc.stack.offers("cp") or seq < CP_SPLIT_NOTED_FROM:
        return
    possible = [c for c in divisors(gpus)[1:] if seq // c >= MIN_CP_CHUNK]
    if not possible or any(cp_splits(seq, c) for c in possible):
        return
    step = 2 * possible[0]
    nearest = max(step, round(seq / step) * step)
    note(f"seq_len {seq:,}: no context-parallel degree splits it (seq_len / cp must be an even "
         f"number of tokens, each rank's at least {MIN_CP_CHUNK:,}), so the search ran without "
         f"CP; {nearest:,} tokens would offer cp {possible[0]}")


def cmd_plan(args) -> int:
    sc, con = _searchable(args)
    from .search.methods import run_method

    progress = _Progress(args.method)
    try:
        res = run_method(args.method, sc, con, top=args.top, progress=progress)
    finally:
        progress.close()
    _note_host_bound(res.best)
    _note_no_interleaving(res.best)
    _notes_on_workload_and_stack(res.best, args)
    _note_simulated_schedule(res.best)
    _note_split_groups(res.best)
    if args.save is not None:
        from . import planfile

        planfile.save(res.best, args.save, method=res.method)
    if args.json:
        js = res.best.to_json()
        js.update(method=res.method, search_seconds=res.seconds,
                  configurations=res.configurations, solved=res.solved,
                  top=[_top_entry(ev) for ev in res.plans])
        print(_json(js))
    else:
        from .textfmt import search_result

        print(search_result(res))
    return 0


def _top_entry(ev) -> dict:
    """One of ``plan --json``'s ``top`` plans: its summary, expert TP and blocks per model chunk
    (null: the default split), all evaluate needs to reproduce it."""
    from .result import SUMMARY_KEYS

    js = ev.to_json()
    return {**{k: js[k] for k in SUMMARY_KEYS}, "etp": js["etp"], "stage_layers": js["stage_layers"]}


def _check_top(top: int) -> None:
    from .errors import SpecError

    if not 1 <= top <= MAX_TOP:
        raise SpecError("top", top, f"must be an integer in [1, {MAX_TOP}]")


def _note_manual_without_cp(results) -> None:
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


def cmd_compare(args) -> int:
    sc, con = _searchable(args)
    from .errors import InfeasibleError
    from .processes import cores
    from .result import scenario_json
    from .search.methods import METHODS, attempt, side_by_side

    workers = min(cores(), len(METHODS))
    if workers > 1:  # the methods at once; the progress line counts those finished
        line = _Progress("compare", "running")
        outcomes = side_by_side(sc, con, args.top, workers,
                                lambda done, total, s: line(done, total, s, of="methods finished"))
        line.close()
    else:  # in turn, each with its own progress line
        outcomes = {}
        for name in METHODS:
            line = _Progress(name)
            try:
                outcomes[name] = attempt(name, sc, con, args.top, line)
            finally:
                line.close()
    results = {name: res for name, (res, _) in outcomes.items() if res is not None}
    errors = {name: why for name, (res, why) in outcomes.items() if res is None}
    if not results:
        # nest searches the whole space: its reason stands for all (each method's is in --json)
        why = errors.get("nest") or next(iter(errors.values()))
        raise InfeasibleError(f"no method found a plan ({', '.join(errors)}); nest: {why}",
                              {"scenario": scenario_json(sc), "methods": [], "errors": errors})
    rows = [{"method": name, **_top_entry(res.best), "search_seconds": res.seconds}
            for name, res in results.items()]
    _note_manual_without_cp(results)
    best = max(results.values(), key=lambda r: (r.best.fits, r.best.tokens_per_s))
    _notes_on_workload_and_stack(best.best, args)  # (of the fastest: a review found compare
    # silent where plan, given the same scenario, noted the workload and the stack)
    if args.save is not None:
        from . import planfile

        planfile.save(best.best, args.save, method=best.method,
                      comparison={"methods": rows, "errors": errors})
    if args.json:
        ref = results["manual"].best.tokens_per_s if "manual" in results else None
        for row, res in zip(rows, results.values()):
            row["tokens_per_s_ratio_to_manual"] = res.best.tokens_per_s / ref if ref else None
        print(_json({"scenario": scenario_json(sc), "methods": rows, "errors": errors}))
    else:
        from .textfmt import comparison

        print(comparison(results, errors))
    return 0


def cmd_export(args) -> int:
    from .errors import SpecError
    from .exports import export
    from .loaders import writable, writable_beside

    if args.output is not None:
        writable(args.output, "-o", "launch-script", reads=(args.plan,), what=THE_PLAN)
    pf = _load_plan(args.plan)
    out = export(pf, args.format)
    if args.output is not None:
        path = Path(args.output)
        writable_beside(path, tuple(out.extras), "-o", reads=(args.plan,), what=THE_PLAN)
        files = {str(path): out.text, **{str(path) + s: t for s, t in out.extras.items()}}
        for name, text in files.items():
            try:
                Path(name).write_text(text)
            except OSError as e:  # the file that failed, and what was written before it
                done = list(files)[:list(files).index(name)]
                raise SpecError("-o", name, f"cannot write ({e.strerror})" + (
                    f"; {', '.join(done)} written" if done else "")) from None
        written = [str(path)] + [str(path) + s for s in out.extras]
        print("wrote " + ", ".join(written), file=sys.stderr)
    else:
        print(out.text, end="")
        if out.extras:
            print("nestplan: give -o PATH to also write " + ", ".join(
                f"PATH{s}" for s in out.extras), file=sys.stderr)
    for text in out.notes:  # after the output, with the plan file's own notes (main)
        note(text)
    return 0


THE_PLAN = "the plan file being read"
"""What ``writable`` calls the plan that ``export`` and ``report`` read, refusing it as output."""
INPUT_FILE = "a file the scenario is read from (model, cluster, accelerator, stack or a base)"
"""What ``writable`` calls a scenario's input file, refusing it as ``--save``'s output."""


def cmd_report(args) -> int:
    from .errors import SpecError
    from .evaluate import evaluate
    from .loaders import writable
    from .report import render

    writable(args.output, "-o", "report HTML", reads=(args.plan,), what=THE_PLAN)
    suffix = Path(args.output).suffix.lower()
    if suffix not in (".html", ".htm", ""):  # (a user trial's report.pdf held HTML)
        raise SpecError("-o", args.output, f"the report is HTML; name it .html, not {suffix} "
                        "(a browser prints it to PDF)")
    pf = _load_plan(args.plan)
    html = render(pf, evaluate(pf.scenario, pf.plan))
    try:
        Path(args.output).write_text(html)
    except OSError as e:
        raise SpecError("-o", args.output, f"cannot write ({e.strerror})") from None
    print(f"wrote {args.output} ({len(html) / 1e3:,.0f} kB)", file=sys.stderr)
    return 0


def cmd_list(args) -> int:
    from .catalog import get_accelerator, get_cluster, get_model, get_stack, list_names
    from .graph import active_params, total_params
    from .units import GB, TFLOPS, GiB

    if args.name is not None:
        from .catalog import as_table, get
        from .tomlfmt import document

        spec = get(args.kind, args.name)
        table = as_table(args.kind, spec)
        if args.kind == "stacks":  # a catalog stack's runs: the rows validate puts on it
            from .catalog import stack_sources

            runs = [text for text, name in stack_sources() if name == args.name]
            if runs:
                table["runs_source"] = runs
        text = document(table)
        print(f"# {args.kind[:-1]} {args.name}, every field (nestplan list {args.kind} NAME)")
        if args.kind == "clusters":  # what its levels' sizes add up to
            blocks = [*spec.block_sizes(), spec.max_devices]
            print("# devices under one block of each level: " + ", ".join(
                f"{lv.name} {'any number' if n is None else f'{n:,}'}"
                for lv, n in zip(spec.levels, blocks)))
        print(text, end="")
        return 0
    for name in list_names(args.kind):
        if args.kind == "stacks":
            print(f"{name:22s} {get_stack(name).description}")
        elif args.kind == "models":
            m = get_model(name)
            size = f"{total_params(m) / 1e9:8.1f}B parameters"
            if m.moe is not None:
                size += (f", {active_params(m) / 1e9:.1f}B active ({m.moe.experts} experts, "
                         f"top-{m.moe.top_k})")
            if m.mtp_layers:
                size += f", with {m.mtp_layers} multi-token-prediction depth(s)"
            print(f"{name:22s} {m.layers:4d} layers  {size}")
        elif args.kind == "clusters":
            c = get_cluster(name)
            # per level: its fan-out (children per group; the top has none) and each device's
            # bandwidth into it
            levels = ", ".join(
                f"{lv.name}{' x' + str(lv.size) if lv.size else ''} {lv.bandwidth / GB:.4g} GB/s"
                + (f" {lv.oversubscription:g}:1" if lv.oversubscription != 1 else "")
                for lv in c.levels)
            print(f"{name:22s} {c.accelerator.name:20s} {levels}")
        else:  # accelerators
            a = get_accelerator(name)
            print(f"{name:22s} {a.peak_flops_bf16 / TFLOPS:7.1f} bf16 TFLOP/s, "
                  f"{a.hbm_bytes / GiB:6.1f} GiB at {a.hbm_bandwidth / (1000 * GB):.2f} TB/s")
    return 0


def _runs_csv(text: str | None, field: str = "--csv") -> Path:
    """The runs CSV a command reads (given as ``field``): the given file, or (``None``) the
    published runs shipped with nestplan (a copy of the shared ``published_runs.csv``)."""
    from importlib import resources

    from .loaders import regular_file

    if text is None:
        return Path(str(resources.files("nestplan").joinpath("data", "published_runs.csv")))
    regular_file(text, field, "runs CSV")  # (as typed: a blank path is refused)
    return Path(text)


def cmd_validate(args) -> int:
    from .catalog import get_stack
    from .validation import (MEAN_TOLERANCE, MEMORY_TOLERANCE, ROW_TOLERANCE, SetAside,
                             note_set_aside, report, run, stacks_named, table)

    runs = _runs_csv(args.csv)
    refused: list[SetAside] = []
    if args.stack:
        note_set_aside(stacks_named(runs, missing_ok=True, stated_only=True), args.stack,
                       "predicted")
    outcomes = run(runs, get_stack(args.stack) if args.stack else None, refused)
    _note_filled_in(runs, args.stack, "--csv", precision=False)
    if refused:
        _note_cannot_run(args.stack, refused, len(outcomes))
    if not outcomes:
        from .errors import SpecError

        raise SpecError("--stack", args.stack, f"runs none of the rows' plans (first: "
                        f"{refused[0].id}: {refused[0].why}); give a stack that offers them")
    summary = report(outcomes)
    summary["set_aside"] = [{"id": r.id, "why": r.why} for r in refused]
    _note_over_hbm([o.case for o in outcomes], [o.predicted_memory for o in outcomes])
    _note_far_rows(outcomes)
    if args.json:
        print(_json(summary))
    else:
        print(table(outcomes))
        missed = [f"{summary['rows_over']} rows over"] if summary["rows_over"] else []
        if summary["mean_abs_error"] > MEAN_TOLERANCE:
            missed.append(f"mean {summary['mean_abs_error']:.1%}")
        if summary["memory_rows_over"]:
            missed.append(f"{summary['memory_rows_over']} peak memories over")
        memory = (f", every measured peak memory within {MEMORY_TOLERANCE:.0%} (of "
                  f"{summary['memory_rows']}: mean {summary['memory_mean_abs_error']:.1%})"
                  if summary["memory_rows"] else "")
        print(f"tolerance: every row within {ROW_TOLERANCE:.0%}, mean within {MEAN_TOLERANCE:.0%}"
              f"{memory}: " + ("ok" if summary["ok"] else f"FAILED ({', '.join(missed)})"))
    return 0 if summary["ok"] else 1


def _note_far_rows(outcomes) -> None:
    """Say which rows are predicted 10 or more times from their measurement (``calibrate`` refuses
    them): a step time in milliseconds, or a plan the row misstates, is likelier than a model that
    far off (a user trial's runs in ms had shown -99.9 % with no word)."""
    from .calibrate import FARTHEST
    from .textfmt import first_of

    far = [o for o in outcomes if not 1 / FARTHEST < 1 + o.error < FARTHEST]
    if not far:
        return
    o = max(far, key=lambda o: max(1 + o.error, 1 / (1 + o.error)))
    note(f"{len(far)} of {len(outcomes)} rows are predicted {FARTHEST:g} or more times "
         f"from their measurement ({first_of([f.case.id for f in far])}; the farthest "
         f"{o.case.id}: {o.case.measured:g} s measured, {o.predicted:.3g} s predicted): "
         "step_time_s is seconds per step; check the units, and the plans the rows "
         "state")


def _note_over_hbm(cases, peaks) -> None:
    """Say which measured runs the memory model puts above their device's memory (``peaks``:
    predicted bytes, None for a layer row): they ran, so it over-counts what they kept or their
    rows misstate a plan (a user trial: such a row was fitted and listed without a word)."""
    from .textfmt import first_of
    from .units import GiB

    def hbm(case):
        return case.scenario.cluster.accelerator.hbm_bytes

    over = [(c, p / hbm(c)) for c, p in zip(cases, peaks) if p is not None and p > hbm(c)]
    if not over:
        return
    c, ratio = max(over, key=lambda o: o[1])
    most = f"{ratio:.2f}x its {hbm(c) / GiB:.1f} GiB"
    which = (f"row {c.id}'s plan is predicted at {most}" if len(over) == 1 else
             f"{len(over)} of {len(cases)} rows' plans are predicted above their device's memory "
             f"({first_of([o[0].id for o in over])}; the most {c.id}, {most})")
    it, row = ("it", "the row misstates its") if len(over) == 1 else (
        "they", "the rows misstate their")
    note(f"{which}: {it} ran, so the memory model counts more than {it} kept, or {row} "
         "plan (recompute, zero_stage, micro_batch)")


def _note_cannot_run(stack: str, refused: list, kept: int) -> None:
    """Say which rows (``validation.SetAside``) ``validate --stack`` left out because that stack
    cannot run their plans, grouped by reason (with the value where a group shares one; the
    first ``textfmt.LISTED`` reasons, ``--json`` lists all)."""
    from .textfmt import LISTED, first_of

    by_kind: dict[str, list] = {}
    for r in refused:
        by_kind.setdefault(r.kind, []).append(r)

    def group(rows: list) -> str:
        why = rows[0].why if len({repr(r.value) for r in rows}) == 1 else rows[0].kind
        return f"{first_of([r.id for r in rows])} ({why})"

    shown = "; ".join(group(rows) for rows in list(by_kind.values())[:LISTED])
    rest = len(by_kind) - LISTED
    more = f"; and {rest} more reason{'s' if rest > 1 else ''}" if rest > 0 else ""
    note(f"--stack {stack} cannot run the plans of {len(refused)} of the "
         f"{len(refused) + kept} rows, left out of the figures (--json lists them): "
         f"{shown}{more}")


LEFT_OUT_SUSPECT = 0.5
"""A row the fit on the other rows predicts 1 + this times too slow or too fast is named: a step
time in the wrong unit or a misstated plan pulls the fit of every row."""


def _note_far_when_left_out(cases, loo) -> None:
    """Name the rows the leave-one-out fits predict far off (``LEFT_OUT_SUSPECT``)."""
    far = [(c, e) for c, e in zip(cases, loo or ()) if abs(math.log1p(e)) > math.log1p(
        LEFT_OUT_SUSPECT)]  # (as far either way: 1.5 times too slow or too fast)
    if far:
        note("fitted without it, each of these rows is predicted far off: "
             + ", ".join(f"{c.id} {e:+.0%}" for c, e in far)
             + "; check their step times (seconds) and plans: such rows pull every "
             "row's fit")


def _shown(text: str) -> str:
    """``text`` for a comment line: characters that are not printable escaped (a path may hold a
    line break, which would start a line of the file)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def cmd_calibrate(args) -> int:
    from .calibrate import FITTED_VALUES, base_of, distinct_rows, fit_choosing
    from .catalog import files_read, get_stack, list_names, looks_like_path
    from .errors import SpecError
    from .loaders import checked_name, stack_to_table, writable
    from .textfmt import seconds
    from .tomlfmt import dumps
    from .validation import files_named, load_cases

    runs = _runs_csv(args.csv, "RUNS.csv")
    given = base_of(runs, args.stack)
    base = get_stack(given)
    writable(args.output, "-o", "stack TOML",
             reads=(*files_read("stacks", given), runs, *files_named(runs, "RUNS.csv")),
             what="the runs CSV, a file its rows name, the base stack file or one of its bases")
    out = Path(args.output)
    target = out.resolve()  # (replaced at the end: the file a link names, never a device)
    if target.exists() and not target.is_file():
        raise SpecError("-o", args.output, "not a regular file; calibrate replaces the file it "
                        "writes: give a file path")
    if out.stem in list_names("stacks"):  # (the stack is named for the file, and then refused)
        raise SpecError("-o", args.output, f"names the fitted stack for the file, and "
                        f"'{out.stem}' is a catalog stack's name: choose another file name")
    if out.stem != out.stem.strip() or out.name == ".toml":  # (" a.toml", or a suffix alone)
        raise SpecError("-o", args.output, "names the fitted stack for the file (its name without "
                        ".toml): give one with no space at either end and more than the suffix "
                        "(mine.toml)")
    try:  # (a name --stack would refuse)
        checked_name(out.stem, "-o")
    except SpecError as e:
        raise SpecError("-o", args.output, "names the fitted stack for the file, whose name "
                        + e.allowed) from None
    first = load_cases(runs, stack=base, field="RUNS.csv")
    _note_filled_in(runs, args.stack)
    progress = _Progress("calibrate", "fitting")
    try:
        result, cases, moved = fit_choosing(
            lambda stack: first if stack is base else _reloaded(runs, stack),
            base, name=out.stem, progress=progress)
    finally:
        progress.close()
    # the file first, so that one that cannot be written leaves nothing on stdout: the base
    # plus what the fit changed (and the new name and provenance)
    before = stack_to_table(base)
    # a base given as a file is named by its path from the new file's folder, where bases
    # resolve: the two files move together
    ref = os.path.relpath(Path(given).resolve(), out.resolve().parent) \
        if looks_like_path(given) else base.name
    if looks_like_path(given) and os.sep not in ref:  # (a bare name would read as the catalog's)
        ref = f".{os.sep}{ref}"
    table = {"base": ref, **{k: v for k, v in stack_to_table(result.stack).items()
                                   if v != before.get(k) or k == "name"
                                   or k.startswith("fitted_")}}
    # written beside it first and loaded as --stack takes it (a chain of bases not too long),
    # so that a file that would not load replaces nothing
    import tempfile

    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=".toml")
    os.close(fd)  # (a name of its own: no file the command reads can be it)
    draft = Path(name)
    try:
        draft.write_text(f"# nestplan calibrate {_shown(args.csv)}"
                         + (f" --stack {_shown(args.stack)}" if args.stack
                            else f" (base: the rows' stack, {_shown(ref)})")
                         + f" -o {_shown(args.output)}\n" + _provenance(runs)
                         + _measured_comment(cases, result)
                         + dumps(table))
        try:
            get_stack(str(draft))
        except SpecError as e:
            raise SpecError("-o", args.output, f"the fitted stack file would not load ({e}); "
                            "nothing written") from None
        # the mode a file written in place would have (mkstemp's draft is the owner's alone)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(draft, target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~umask)
        os.replace(draft, target)
    except OSError as e:
        raise SpecError("-o", str(out), f"cannot write ({e.strerror})") from None
    finally:
        draft.unlink(missing_ok=True)
    lines = [f"{'id':40s} {'measured s':>10s} {'before':>8s} {'after':>8s}"
             + (f" {'left out':>9s}" if result.loo else "")]
    for i, c in enumerate(cases):
        line = (f"{c.id:40s} {seconds(c.measured):>10s} {result.before[i] * 100:+7.1f}% "
                f"{result.after[i] * 100:+7.1f}%")
        if result.loo:
            line += f" {result.loo[i] * 100:+8.1f}%"
        if result.memory_after[i] is not None:
            line += (f"  memory {result.memory_before[i] * 100:+.1f}% -> "
                     f"{result.memory_after[i] * 100:+.1f}%")
        lines.append(line)
    fitted = ", ".join(f"{k} {v:.3g}" + (" of the activation and working bytes"
                                          if k == "allocator_overhead" else "")
                       if k in FITTED_VALUES else f"{k} {v:.3g}x the base's"
                       for k, v in result.params.items())
    n, plans = len(cases), distinct_rows(cases)
    counted = f" ({plans} distinct: a plan measured again counts once)" if plans < n else ""
    lines.append(f"fitted on {n} row{'s' if n != 1 else ''}{counted} over {base.name}: {fitted}")
    lines.append(_fit_summary(result, plans))
    print("\n".join(lines))
    if moved:
        from .textfmt import plan_short

        chosen = {c.id: c.plan for c in first}
        note("; ".join(
            f"{c.id}: {plan_short(c.plan, c.scenario.model.moe is not None)} (the base chose "
            f"{chosen[c.id].recompute_text} b{chosen[c.id].mbs})" for c in cases if c.id in moved)
            + ": the micro-batch or recomputation these rows leave blank, chosen by the model as "
            "validate chooses them, is the fitted stack's choice, which the fit is on; 'before' "
            "is the base's own")
    _note_far_when_left_out(cases, result.loo)
    _note_fit_limits(cases, result, base)
    _note_over_hbm(cases, result.peaks)
    print(f"wrote {out} (use it with --stack {shlex.quote(str(out))})", file=sys.stderr)
    return 0


def _reloaded(runs: Path, stack):
    """The runs CSV's rows read again with ``stack`` (the plans it chooses for them), its notes
    said already by the first reading."""
    import warnings

    from .validation import load_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_cases(runs, stack=stack, field="RUNS.csv")


def _provenance(runs: Path) -> str:
    """A comment line of a fitted file: when, by which nestplan, from which runs file (a
    calibrating user's file had named its CSV as given, relative to where it was run)."""
    import datetime

    from . import __version__

    return (f"# on {datetime.date.today().isoformat()} by nestplan {__version__}, from "
            f"{_shown(str(Path(runs).resolve()))}\n")


def _fit_summary(result, plans: int) -> str:
    """The mean |error| before and after the fit and, with three rows or more, of each row
    predicted by the fit without it; says when that is worse than before (the fit then does not
    carry to runs it was not given: a calibrating user's 3-row fit, 6.5 % before and 7.4 % left
    out, had shown no word of it) and why no rows were left out."""
    def mean(xs):
        return sum(abs(x) for x in xs) / len(xs)

    text = f"mean |error|: before {mean(result.before):.1%}, after {mean(result.after):.1%}"
    if not result.loo:
        return text + (f"; no row left out: that takes 3 rows or more of 2 plans or more "
                       f"(here {len(result.before)} of {plans})")
    text += f", left out {mean(result.loo):.1%}"
    if mean(result.loo) > mean(result.before):
        text += (" (worse than before the fit: the fit does not carry to runs it was not given; "
                 "more rows, or the base, predict runs you have not measured better)")
    return text


def _measured_comment(cases, result) -> str:
    """Comment lines of the fitted file: each row it was fitted on, its measured figures and the
    errors before and after (``fitted_on`` names the rows only)."""
    from .textfmt import seconds
    from .units import GiB

    lines = ["# fitted on (measured seconds, error before and after the fit; peak memory alike):"]
    for i, c in enumerate(cases):
        line = (f"#   {_shown(c.id)}: {seconds(c.measured)} s, {result.before[i]:+.1%} -> "
                f"{result.after[i]:+.1%}")
        if result.memory_after[i] is not None:
            line += (f"; {c.memory / GiB:.1f} GiB, {result.memory_before[i]:+.1%} -> "
                     f"{result.memory_after[i]:+.1%}")
        lines.append(line)
    return "\n".join(lines) + "\n"


def _note_filled_in(runs: Path, stack: str | None, field: str = "RUNS.csv", *,
                    precision: bool = True) -> None:
    """Say which rows a command reads with a value they do not give: the default stack (no
    ``stack`` column value and no source a catalog stack names) and, with ``precision``
    (calibrate, whose fit they change), bf16 (no precision). validate says only the first: the
    shipped published runs leave the precision blank where their sources do not state it (16-bit
    mixed precision, which bf16 stands for), so that note would come with every validate."""
    from .catalog import DEFAULT_STACK
    from .textfmt import first_of
    from .validation import rows_filled_in

    def rows(ids: list[str], verb: str, rest: str) -> None:  # verb: for more than one row
        if ids:
            one = len(ids) == 1
            note(f"{len(ids)} row{'' if one else 's'} ({first_of(ids)}) "
                 f"{verb}{'s' if one else ''} {rest}")

    no_stack, no_precision = rows_filled_in(runs, field)
    if not stack:  # (--stack sets the rows' own aside)
        rows(no_stack, "name", f"no stack (a stack column) and no source a catalog stack names: "
             f"read as run on {DEFAULT_STACK}, the default")
    if precision:
        rows(no_precision, "give", "no precision: read as bf16")


PLAUSIBLE_SCALE = 2.0
"""A fitted efficiency multiplier beyond this factor of its base's, either way, gets a note: the
rows then run a kind of kernel more than twice as fast or slow as the base stack's own runs did,
which is likelier a miss of the model that the multiplier absorbs than a kernel that different."""


def _note_fit_limits(cases, result, base) -> None:
    """Say when the fit leaves rows beyond validate's tolerance, or raises an efficiency of
    ``base`` to its cap of 1 (a user trial's one row at 1.2 s for 9 s of work: 4x the base's,
    +378 % after the fit, plans then at 99 % MFU, without a word), when the rows span several
    accelerators, or when the peaks are below the memory model's tensors."""
    from .calibrate import PARAMETERS
    from .textfmt import first_of
    from .units import GiB
    from .validation import MEMORY_TOLERANCE, ROW_TOLERANCE

    far = [c.id for c, e in zip(cases, result.after) if abs(e) > ROW_TOLERANCE]
    if far:
        note(f"after the fit {len(far)} of {len(cases)} rows are still beyond "
             f"{ROW_TOLERANCE:.0%} ({first_of(far)}): one calibration does not explain "
             "them; check their step times, precision, plan and stack")
    st = result.stack
    capped = set()
    for acc in {c.scenario.cluster.accelerator for c in cases}:
        curves = [e for _, e in acc.matmul_efficiency_bf16 + (acc.matmul_efficiency_fp8 or ())]
        for what, top, field in (("the GEMM efficiency", max(curves), "matmul_scale"),
                                 ("the attention efficiency", max(acc.attention_efficiency),
                                  "attention_scale"),
                                 ("the memory-bound kernels' share of HBM bandwidth",
                                  acc.memory_efficiency, "memory_scale")):
            scale = getattr(st, field)
            if top * scale >= 1 and scale > getattr(base, field):
                capped.add(what)
    lowered = [f for f in PARAMETERS[:3] if getattr(st, f) < getattr(base, f)]
    if capped and lowered:  # (a user trial: rows 15 % slow read as "ran beyond the peak")
        note(f"the fit takes {' and '.join(sorted(capped))} to the cap of the "
             f"accelerator's peak while it lowers {' and '.join(lowered)}: the rows do "
             "not tell these efficiencies apart, so how the fit shares them out is not "
             "measured; rows of other shapes (sequence lengths, model widths, "
             "micro-batches) separate them")
    elif capped:
        note(f"the fit takes {' and '.join(sorted(capped))} to the cap of the "
             "accelerator's peak: the rows ran at or beyond what it allows, and beyond "
             "the cap a multiplier changes nothing; check their step times and "
             "precision")
    accelerators = sorted({c.scenario.cluster.accelerator.name for c in cases})
    if len(accelerators) > 1:
        note(f"the rows ran on {len(accelerators)} accelerators "
             f"({', '.join(accelerators)}), fitted with one set of multipliers of each "
             "one's own efficiencies; where they disagree, fit each accelerator's rows "
             "apart")
    alloc = result.params.get("allocator_overhead")
    over = [(c, e) for c, e in zip(cases, result.memory_after)
            if e is not None and e > MEMORY_TOLERANCE]
    if alloc == 0 and over:  # (a user trial: a peak below every tensor was fitted silently)
        c, e = over[0]
        note(f"the measured peaks are below what the memory model predicts with no "
             f"allocator overhead ({c.id}: {c.memory / GiB:.1f} GiB measured, "
             f"{c.memory * (1 + e) / GiB:.1f} predicted): allocator_overhead is 0, and "
             "the model's tensors exceed what these runs kept; check their recompute, "
             "zero_stage and micro_batch")
    elif off := [c.id for c, e in zip(cases, result.memory_after)
                 if e is not None and abs(e) > MEMORY_TOLERANCE]:
        note(f"after the fit {len(off)} of "
             f"{sum(e is not None for e in result.memory_after)} measured peaks are "
             f"still beyond {MEMORY_TOLERANCE:.0%} ({first_of(off)}): one allocator "
             "share does not explain them, and one far off moves it for the others; "
             "check their recompute, zero_stage and micro_batch")
    wide = [(f, getattr(st, f) / getattr(base, f)) for f in PARAMETERS[:3]
            if not 1 / PLAUSIBLE_SCALE <= getattr(st, f) / getattr(base, f) <= PLAUSIBLE_SCALE]
    if wide and not capped:  # (a user trial: three MoE rows fitted attention at 0.275x, dense
        # plans then 2.5 times slower; a fit at the peak's cap is said so above)
        note(f"the fit moves {', '.join(f'{f} to {r:.3g}x' for f, r in wide)} the base's "
             f"({base.name}'s): kernels more than twice as fast or slow as its own runs' "
             "are likelier a miss of the model in these rows (an MoE layer's cost, a plan "
             "misstated) that the multiplier absorbs, and carries into every other "
             "workload; check with validate on runs of other shapes before planning "
             "with it")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = _Parser(prog="nestplan", description="Network- and memory-aware planner for distributed "
                "training of large models.")
    p.add_argument("--version", action="version", version=f"nestplan {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p.commands = sub.choices  # each subcommand's parser, for its own errors (main)
    e = sub.add_parser("evaluate", help="predict step time, throughput, MFU and memory of a plan")
    _add_scenario(e, for_evaluate=True)
    e.add_argument("--plan", metavar="PLAN.json",
                   help="evaluate a saved plan file instead (with --cluster: on another cluster)")
    e.set_defaults(func=cmd_evaluate)
    pl = sub.add_parser("plan", help="find the fastest plans that fit (NEST or a baseline)")
    _add_scenario(pl, for_evaluate=False)
    _add_search(pl)
    pl.add_argument("--method", default="nest", help="nest (default), manual, phaze, alpa, "
                    "mist, mcmc or exhaustive")
    pl.add_argument("--top", type=whole_arg, default=5,
                    help=f"plans to list, 1-{MAX_TOP} (default 5)")
    pl.set_defaults(func=cmd_plan)
    cm = sub.add_parser("compare", help="every method on one scenario, side by side")
    _add_scenario(cm, for_evaluate=False)
    _add_search(cm)
    cm.add_argument("--top", type=whole_arg, default=1, help=f"plans each method keeps, "
                    f"1-{MAX_TOP} (default 1; the table shows each method's best)")
    cm.set_defaults(func=cmd_compare)
    ex = sub.add_parser("export", help="launch configuration of a saved plan for a framework")
    ex.add_argument("plan", metavar="PLAN.json", help="a plan file written with --save")
    ex.add_argument("--format", required=True, help="megatron, torchtitan or deepspeed")
    ex.add_argument("-o", "--output", metavar="PATH", help="write here (extra files beside it) "
                    "instead of printing")
    ex.set_defaults(func=cmd_export)
    rp = sub.add_parser("report", help="self-contained HTML report of a saved plan")
    rp.add_argument("plan", metavar="PLAN.json", help="a plan file written with --save")
    rp.add_argument("-o", "--output", required=True, metavar="REPORT.html", help="where to write")
    rp.set_defaults(func=cmd_report)
    from .catalog import KINDS
    from .sweep.command import add_parser as add_sweep

    add_sweep(sub)
    ls = sub.add_parser("list", help="list catalog entries")
    ls.add_argument("kind", choices=KINDS)
    ls.add_argument("name", nargs="?", metavar="NAME|PATH",
                    help="show this one in full, as a file of its kind (a stack with its bases "
                         "resolved): a starting point for your own")
    ls.set_defaults(func=cmd_list)
    v = sub.add_parser("validate", help="compare predictions with measured training runs",
                       description="Compare predictions with measured training runs. Exit code "
                       "0 when every row, the mean and every measured peak memory are within the "
                       "tolerance it prints, 1 when not (a check, like a test run), 2 for bad "
                       "input.")
    v.add_argument("--csv", help="a runs CSV (default: the published runs shipped with nestplan, "
                   "a copy of ../shared/data/published_runs.csv)")
    v.add_argument("--stack", help="stack for every row (default: each row's stack column, or "
                   "the catalog stack that names its source)")
    v.add_argument("--json", action="store_true",
                   help="one JSON object: its rows and, beside them, the summary figures")
    v.set_defaults(func=cmd_validate)
    ca = sub.add_parser("calibrate", help="fit a stack's efficiencies to your measured runs")
    ca.add_argument("csv", metavar="RUNS.csv", help="measured runs (the columns of "
                    "published_runs.csv)")
    ca.add_argument("--stack", help="base stack (default: the one the rows' stack column names, "
                    "else the catalog stack their source names, else megatron-core)")
    ca.add_argument("-o", "--output", required=True, metavar="MINE.toml",
                    help="where to write the calibrated stack file")
    ca.set_defaults(func=cmd_calibrate)
    return p


BLAS_THREADS = "1"
"""BLAS threads of the console script's process (``OPENBLAS_NUM_THREADS`` unless the user set it):
nestplan's arrays go through element-wise kernels and a calibration's few-by-few solves, which one
thread does; OpenBLAS starts a thread per core when numpy loads, which on this project's 2-core
machine cost 0.06 s of CPU per command (``evaluate`` 0.30 -> 0.24 s; ``import numpy`` 0.18 ->
0.09 s). Set only for the command line (``argv`` None): a caller of ``main`` keeps its own."""


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the console script or python -m nestplan, before numpy loads
        os.environ.setdefault("OPENBLAS_NUM_THREADS", BLAS_THREADS)
    from .errors import InfeasibleError, NestplanError

    import warnings

    from .errors import PENDING_NOTES, Note, flush_notes

    if sys.stdout is None:  # started with its standard output closed (``>&-``)
        if sys.stderr is not None:
            print("nestplan: error: cannot write the output: standard output is closed",
                  file=sys.stderr)
        return 1
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    _refuse_repeated_flags(parser.commands[args.command],
                           given[given.index(args.command) + 1:] if args.command in given else given)
    if extra:  # named by the subcommand's parser, whose help lists what it takes (by the
        # top-level one for a flag before the subcommand, which the subcommand never saw)
        before = extra[0] in given and args.command in given \
            and given.index(extra[0]) < given.index(args.command)
        (parser if before else parser.commands[args.command]).error(
            "unrecognized arguments: " + " ".join(extra))

    def gather(message, category, *rest, **kw):
        if issubclass(category, Note):  # printed once the command has run (errors.flush_notes)
            PENDING_NOTES.append(f"nestplan: note: {message}")
        else:
            previous(message, category, *rest, **kw)

    from .processes import exit_code, on_sigterm, restore_sigterm

    previous = warnings.showwarning
    warnings.showwarning = gather
    sigterm = on_sigterm()  # SIGTERM ends a command as Ctrl-C does
    try:
        if getattr(args, "save", None) is not None:  # refused before the work, not after it
            from .catalog import files_read
            from .loaders import not_read, writable

            plan = getattr(args, "plan", None)
            if plan:
                not_read(args.save, "--save", (plan,), THE_PLAN)
            # nor over a file the scenario is read from (a user's config.json had been replaced)
            writable(args.save, "--save", "plan JSON", what=INPUT_FILE,
                     reads=tuple(set().union(*(files_read(kind, getattr(args, key, None))
                                              for kind, key in (("models", "model"),
                                                                ("clusters", "cluster"),
                                                                ("stacks", "stack"))))))
        code = args.func(args)
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not at exit
        return code
    except InfeasibleError as e:
        if getattr(args, "json", False):  # a script reading stdout gets an object here too
            print(_json({"feasible": False, "reason": str(e), **e.details}))
        flush_notes()
        print(f"nestplan: no feasible plan: {e}", file=sys.stderr)
        return 3
    except NestplanError as e:
        PENDING_NOTES.clear()  # the mistake is the one line
        print(f"nestplan: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (sweep reports its own, keeping its rows)
        print(("\n" if sys.stderr.isatty() else "") + "nestplan: interrupted", file=sys.stderr)
        return exit_code(e)
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except OSError as e:  # writing the output (files read are checked where they are read)
        _quiet_stdout()
        print(f"nestplan: error: cannot write the output: {e.strerror or e}", file=sys.stderr)
        return 1
    finally:  # after the output, an interrupt or any other ending: what is pending
        flush_notes()
        warnings.showwarning = previous
        restore_sigterm(sigterm)


def _quiet_stdout() -> None:
    """After a failed write, send stdout to nowhere so that the exit's flush cannot fail again."""
    import os

    try:
        sys.stdout = open(os.devnull, "w")
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
