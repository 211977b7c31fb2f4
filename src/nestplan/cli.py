"""The ``nestplan`` command line. Heavy modules are imported inside the handlers.

Exit codes: 0 success, 2 bad input (one line on stderr naming field, value and what is allowed),
3 a search that finds no feasible plan.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from .errors import note, say
from .notes import plan as plan_notes
from .notes import runs as runs_notes
from .notes import scenario as scenario_notes

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
                   "(default) on all, full on all but nemo-moe-blackwell; selective on "
                   "megatron-2022, megatron-core, nemo and the torchtitan ones; fine-grained on "
                   "megatron-core and nemo; nestplan list stacks NAME lists them), or one per stage, "
                   "comma-separated, name*k for k stages in a row (none*3,full)")
    k.add_argument("--mbs", type=whole_arg, help="micro-batch size (sequences)")
    k.add_argument("--rank-order", help="axes innermost first, e.g. tp-cp-dp-pp (default)")
    if for_evaluate:
        k.add_argument("--stage-layers", metavar="N,N,...",
                       help="blocks of each model chunk, in pipeline order (pp·vp of them, "
                       "pp·vp/2 under DualPipe, whose ranks hold each chunk twice; default: "
                       "even), as a searched plan's stages give them")
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
    scenario_notes.added_depths(sc, args.model)
    scenario_notes.fused_pieces(sc)
    scenario_notes.straddling_domains(sc)
    scenario_notes.cluster_bandwidths(sc.cluster)
    scenario_notes.sequence(sc)
    scenario_notes.huge_batch(sc, args.global_batch is not None)
    scenario_notes.default_workload(sc, args.seq_len is None, args.global_batch is None)
    return _with_headroom(sc, args)


def _on_cluster(sc, cluster: str):
    """``sc`` on another cluster (``evaluate --plan P --cluster C``; the scenario's checks, its
    capacity among them, run again)."""
    import dataclasses

    from .catalog import get_cluster

    return dataclasses.replace(sc, cluster=get_cluster(cluster))


def _load_plan(path: str):
    """A plan file, with the notes its scenario calls for."""
    from . import planfile

    pf = planfile.load(path)
    scenario_notes.fused_pieces(pf.scenario)
    return pf


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
                 examined: int | None = None, bounded: int | None = None):
        if seconds < 2.0 or (not self.tty and self.shown and seconds - self.last < 5.0):
            return
        self.shown, self.last = True, seconds
        checked = ("" if not bounded else f"{bounded:,} plan shapes bounded, ") + (
            "" if examined is None else f"{examined:,} examined, ")
        count = (f"{done:,} of {total:,} {of}" if of else
                 f"{checked}{done:,} solved of {total:,} configurations")
        text = f"nestplan: {self.method} {self.doing}, {count}, {seconds:.0f} s"
        say("\r" + text if self.tty else text, end="" if self.tty else "\n")

    def close(self):
        if self.shown and self.tty:
            say("")


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
    vp = args.vp
    if vp is None:  # one a schedule fixes by itself (dualpipev's 2), else 1
        from .schedule import SCHEDULES

        given = SCHEDULES.get(args.schedule)  # (None for none given)
        vp = (given.implied_vp if given is not None else None) or 1
    kw = dict(tp=args.tp, pp=args.pp, dp=dp, cp=cp, ep=ep, etp=etp, vp=vp, sp=sp,
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
        par = par.with_(zero=st.zero_unsaid(par))
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
        # what evaluate of the plan's flags says of its sequence (a long-context trial's plan
        # file, at 16 times its model's context, had lost the RoPE note)
        scenario_notes.sequence(pf.scenario)
        sc, plan = _with_headroom(pf.scenario, args), pf.plan
        if args.cluster is not None:  # the same plan, ranks on devices in order, elsewhere
            sc = _on_cluster(sc, args.cluster)
            scenario_notes.straddling_domains(sc)
            scenario_notes.cluster_bandwidths(sc.cluster)  # (a user trial's Gb/s slip went unsaid here)
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
    plan_notes.evaluated(ev, args.moe_imbalance is not None)
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
        print(_json(_with_measured_error(ev.to_json(), ev.scenario)))
    else:
        from .textfmt import evaluation

        print(evaluation(ev))
    return 0


def _searchable(args):
    """The scenario and constraints of ``plan``/``compare``, checked before the search (and its
    numerical libraries) is loaded: a bad flag is refused at once."""
    from .search.constraints import check_constraints, refuse_unsearchable

    _check_top(args.top)
    sc, con = _scenario(args), _constraints(args)
    check_constraints(sc, con)
    if getattr(args, "method", None) not in (None, "manual"):  # plan, with a search; compare
        refuse_unsearchable(con)  # (no --method) shows each method's reason instead
    scenario_notes.no_cp_split(sc, con)
    return sc, con


def cmd_plan(args) -> int:
    sc, con = _searchable(args)
    from .search.methods import run_method

    progress = _Progress(args.method)
    try:
        res = run_method(args.method, sc, con, top=args.top, progress=progress)
    finally:
        progress.close()
    plan_notes.searched(res.best, con, args.moe_imbalance is not None)
    if args.save is not None:
        from . import planfile

        planfile.save(res.best, args.save, method=res.method)
    if args.json:
        js = _with_measured_error(res.best.to_json(), res.best.scenario)
        js.update(method=res.method, search_seconds=res.seconds,
                  configurations=res.configurations, solved=res.solved,
                  # (with their margins: a pipeline engineer's script could not gate on them)
                  top=[_top_entry(ev, ("margin_gib", "within_headroom")) for ev in res.plans])
        print(_json(js))
    else:
        from .textfmt import search_result

        print(search_result(res, args.top))
    return 0


def _with_measured_error(js: dict, sc) -> dict:
    """``js`` with ``measured_error``: the model's error on the measured runs of the plan's stack
    calibration, accelerator and kind of model (``nestplan.accuracy``); null where there are
    none, or the calibration is the user's own."""
    from . import accuracy

    record = accuracy.measured(sc)[1]
    return {**js, "measured_error": record.to_json() if record else None}


def _top_entry(ev, extra: tuple = ()) -> dict:
    """One of ``plan --json``'s ``top`` plans: its summary, expert TP and blocks per model chunk
    (null: the default split), all evaluate needs to reproduce it (also ``compare``'s rows),
    and the ``extra`` keys of its ``to_json``."""
    from .result import SUMMARY_KEYS

    js = ev.to_json()
    return {k: js[k] for k in (*SUMMARY_KEYS, "etp", "stage_layers", *extra)}


def _check_top(top: int) -> None:
    from .errors import SpecError

    if not 1 <= top <= MAX_TOP:
        raise SpecError("top", top, f"must be an integer in [1, {MAX_TOP}]")


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
    plan_notes.manual_without_cp(results)
    plan_notes.manual_far_behind(results, con)
    best = max(results.values(), key=lambda r: (r.best.fits, r.best.tokens_per_s))
    # (of the fastest: a review found compare silent where plan, given the same scenario, noted
    # the workload and the stack)
    plan_notes.searched(best.best, con, args.moe_imbalance is not None)
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
    from .loaders import writable, writable_beside, write_text_atomic

    if args.output == "-":  # standard output, as without -o (a pipeline engineer's trial)
        args.output = None
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
                write_text_atomic(name, text)
            except OSError as e:  # the file that failed, and what was written before it
                done = list(files)[:list(files).index(name)]
                raise SpecError("-o", name, f"cannot write ({e.strerror})" + (
                    f"; {', '.join(done)} written" if done else "")) from None
        written = [str(path)] + [str(path) + s for s in out.extras]
        say("nestplan: wrote " + ", ".join(written))
    else:
        print(out.text, end="")
        if out.extras:
            say("nestplan: give -o PATH to also write " + ", ".join(
                f"PATH{s}" for s in out.extras))
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
    from .loaders import writable, write_text_atomic
    from .report import render

    writable(args.output, "-o", "report HTML", reads=(args.plan,), what=THE_PLAN)
    suffix = Path(args.output).suffix.lower()
    if suffix not in (".html", ".htm", ""):  # (a user trial's report.pdf held HTML)
        raise SpecError("-o", args.output, f"the report is HTML; name it .html, not {suffix} "
                        "(a browser prints it to PDF)")
    from .errors import PENDING_NOTES

    said = len(PENDING_NOTES)
    pf = _load_plan(args.plan)
    ev = evaluate(pf.scenario, pf.plan)
    plan_notes.evaluated(ev, False)  # (the page says what evaluate --plan says on stderr)
    notes = [n.removeprefix("nestplan: note: ") for n in dict.fromkeys(PENDING_NOTES[said:])]
    html = render(pf, ev, notes)
    try:
        write_text_atomic(args.output, html)
    except OSError as e:
        raise SpecError("-o", args.output, f"cannot write ({e.strerror})") from None
    say(f"nestplan: wrote {args.output} ({len(html) / 1e3:,.0f} kB)")
    return 0


def cmd_list(args) -> int:
    from .catalog import get_accelerator, get_cluster, get_model, get_stack, list_names
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
        print(f"# {args.kind[:-1]} {args.name}, every field (nestplan list {args.kind} NAME)"
              + ("; what the model lacks (sliding windows, YaRN, MLA, experts, ...) left out"
                 if args.kind == "models" else ""))
        from .catalog import catalog_files

        files = catalog_files(args.kind, args.name)
        if files:  # (where the sources are: a buyer's trial found none in this listing)
            print(f"# sources: the comments of {files[0]}" + (
                f" and of its bases' {', '.join(map(str, files[1:]))}" if files[1:] else ""))
        if args.kind == "models":  # its size, as the catalog's listing gives it (a new user's
            # own config had none shown anywhere)
            print(f"# {_model_size(spec)}")
        if args.kind == "clusters":  # what its levels' sizes add up to
            blocks = [*spec.block_sizes(), spec.max_devices]
            print("# devices under one block of each level: " + ", ".join(
                f"{lv.name} {'any number' if n is None else f'{n:,}'}"
                for lv, n in zip(spec.levels, blocks)))
            # (a DeepSpeed trial checked its file here, where its figures' notes had not come)
            scenario_notes.cluster_bandwidths(spec)
        print(text, end="")
        return 0
    for name in list_names(args.kind):
        if args.kind == "stacks":
            print(f"{name:22s} {get_stack(name).description}")
        elif args.kind == "models":
            m = get_model(name)
            print(f"{name:22s} {m.layers:4d} layers  {_model_size(m, 8)}")
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
                  f"{a.hbm_bytes / GiB:6.1f} GiB at {a.hbm_bandwidth / (1000 * GB):.2f} TB/s"
                  + ("" if a.fitted_on else "  (no measured run behind its efficiencies)"))
    return 0


def _model_size(m, width: int = 0) -> str:
    """A model's parameters (and, with experts, those active per token)."""
    from .graph import active_params, total_params

    size = f"{total_params(m) / 1e9:{width}.1f}B parameters"
    if m.moe is not None:  # (the embedding counted, as transformers counts it; model cards
        # differ, GPT-OSS's leaves it out: an HF trial's 4.2B against the card's 3.61B)
        size += (f", {active_params(m) / 1e9:.1f}B active with the embedding "
                 f"({m.moe.experts} experts, top-{m.moe.top_k})")
    if m.mtp_layers:
        size += f", with {m.mtp_layers} multi-token-prediction depth(s)"
    return size


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
    from .validation import SetAside, note_set_aside, report, run, stacks_named, table

    runs = _runs_csv(args.csv)
    refused: list[SetAside] = []
    if args.stack:
        note_set_aside(stacks_named(runs, missing_ok=True, stated_only=True), args.stack,
                       "predicted")
    outcomes = run(runs, get_stack(args.stack) if args.stack else None, refused)
    runs_notes.filled_in(runs, args.stack, "--csv", precision=False)
    if refused:
        runs_notes.cannot_run(args.stack, refused, len(outcomes))
    if not outcomes:
        from .errors import SpecError

        raise SpecError("--stack", args.stack, f"runs none of the rows' plans (first: "
                        f"{refused[0].id}: {refused[0].why}); give a stack that offers them")
    summary = report(outcomes)
    summary["set_aside"] = [{"id": r.id, "why": r.why} for r in refused]
    runs_notes.over_hbm([o.case for o in outcomes], [o.predicted_memory for o in outcomes])
    runs_notes.far_rows(outcomes)
    runs_notes.beyond_calibration([o.case for o in outcomes])
    if args.json:
        print(_json(summary))
    else:
        print(table(outcomes))
        print(_tolerance_line(summary))
    return 0 if summary["ok"] else 1


def _tolerance_line(summary: dict) -> str:
    """``validate``'s last line (and ``calibrate``'s, after its fit): the tolerance and whether
    the rows keep it (``validation.tolerance_summary``'s figures)."""
    from .units import counted

    over, mean, peaks = (summary[k] for k in ("rows_over", "mean_abs_error", "memory_rows"))
    missed = [f"{counted(over, 'row')} over"] if over else []
    if mean > summary["mean_tolerance"]:
        missed.append(f"mean {mean:.1%}")
    if summary["memory_rows_over"]:
        n = summary["memory_rows_over"]
        missed.append(f"{n} peak memor{'ies' if n > 1 else 'y'} over")
    memory = (f", every measured peak memory within {summary['memory_tolerance']:.0%} (of "
              f"{peaks}: mean {summary['memory_mean_abs_error']:.1%})" if peaks else "")
    return (f"tolerance: every row within {summary['row_tolerance']:.0%}, mean within "
            f"{summary['mean_tolerance']:.0%}{memory}: "
            + ("ok" if summary["ok"] else f"FAILED ({', '.join(missed)})"))


def _shown(text: str) -> str:
    """``text`` for a comment line: characters that are not printable escaped (a path may hold a
    line break, which would start a line of the file)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def cmd_calibrate(args) -> int:
    from .calibrate import FITTED_VALUES, base_of, distinct_rows, fit_choosing, waits_per_moe_layer
    from .catalog import files_read, get_stack, list_names, looks_like_path
    from .errors import SpecError
    from .loaders import checked_name, stack_to_table, writable
    from .stack import FITTED_FROM
    from .textfmt import seconds
    from .tomlfmt import dumps
    from .units import MS, counted
    from .validation import files_named, load_cases

    runs = _runs_csv(args.csv, "RUNS.csv")
    given = base_of(runs, args.stack)
    base = get_stack(given)
    writable(args.output, "-o", "stack TOML", results=True,
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
    runs_notes.filled_in(runs, args.stack)
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
                                   or k in FITTED_FROM}}
    # written beside it first and loaded as --stack takes it (a chain of bases not too long),
    # so that a file that would not load replaces nothing
    from .loaders import replacing

    try:  # (the draft has a name of its own: no file the command reads can be it)
        with replacing(target) as draft:
            draft.write_text(f"# nestplan calibrate {_shown(args.csv)}"
                             + (f" --stack {_shown(args.stack)}" if args.stack
                                else f" (base: the rows' stack, {_shown(ref)})")
                             + f" -o {_shown(args.output)}\n" + _provenance(runs)
                             + _measured_comment(cases, result)
                             + dumps(table))
            try:
                get_stack(str(draft))
            except SpecError as e:  # (the draft is removed, the target left as it was)
                raise SpecError("-o", args.output, f"the fitted stack file would not load ({e}); "
                                "nothing written") from None
    except OSError as e:
        raise SpecError("-o", str(out), f"cannot write ({e.strerror})") from None
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
    wait = waits_per_moe_layer(cases, base)

    def fitted_text(k: str, v: float) -> str:
        """One fitted value as the summary line gives it."""
        if k in FITTED_VALUES:
            return f"{k} {v:.3g}" + (" of the activation and working bytes"
                                     if k == "allocator_overhead" else "")
        if k == "compute_scale" and wait:
            return f"{k} {v:.3g}x the base's (the MoE layers' host wait divided by it)"
        if k == "moe_host_scale":
            return (f"{k} {v:.3g}x the base's ({result.stack.moe_layer_host / MS:.3g} ms per "
                    "MoE layer)")
        return f"{k} {v:.3g}x the base's"

    fitted = ", ".join(fitted_text(k, v) for k, v in result.params.items())
    n, plans = len(cases), distinct_rows(cases)
    distinct = f" ({plans} distinct: a plan measured again counts once)" if plans < n else ""
    lines.append(f"fitted on {counted(n, 'row')}{distinct} over {base.name}: {fitted}")
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
    runs_notes.far_when_left_out(cases, result.loo)
    runs_notes.fit_limits(cases, result, base)
    runs_notes.over_hbm(cases, result.peaks)
    say(f"nestplan: wrote {out} (use it with --stack {shlex.quote(str(out))})")
    # after the fit, validate's tolerance, and its exit code (a fuzzing trial's fit left two rows
    # 495 % off and exited 0, where the README promised 1)
    from .validation import tolerance_summary

    summary = tolerance_summary(result.after, result.memory_after)
    print("after the fit, " + _tolerance_line(summary))
    return 0 if summary["ok"] else 1


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
    from .validation import mean_abs as mean

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


class _Version(argparse.Action):
    """``--version``: the version and the build (``build.fingerprint``, as a sweep's rows record
    it), the build's digest taken only when asked, not at every start."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and build, and exit", **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        from . import __version__
        from .build import fingerprint

        print(f"nestplan {__version__} (build {fingerprint()})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nestplan", description="Network- and memory-aware planner for distributed "
                "training of large models.")
    p.add_argument("--version", action=_Version)
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
                    "instead of printing; - prints")
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
            say("nestplan: error: cannot write the output: standard output is closed")
        return 1
    if sys.stderr is None:  # started with it closed (``2>&-``): notes and errors go nowhere (a
        # review: Python's print sends a file=None line to stdout, after the --json object)
        sys.stderr = open(os.devnull, "w")
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
            writable(args.save, "--save", "plan JSON", what=INPUT_FILE, results=True,
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
        say(f"nestplan: no feasible plan: {e}")
        return 3
    except NestplanError as e:
        PENDING_NOTES.clear()  # the mistake is the one line
        say(f"nestplan: error: {e}")
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (sweep reports its own, keeping its rows)
        flush_notes()  # (what the command had noted, then how it ended: the last line)
        say(("\n" if sys.stderr.isatty() else "") + "nestplan: interrupted")
        return exit_code(e)
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except OSError as e:  # writing the output (files read are checked where they are read)
        _quiet_stdout()
        PENDING_NOTES.clear()  # (the one line: notes had followed it, a pipeline engineer's)
        say(f"nestplan: error: cannot write the output: {e.strerror or e}")
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
