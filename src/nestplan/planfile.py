"""Plan files: the complete plan as JSON (``--save``), and loading it back (``--plan``).

A plan file holds the model, the cluster and the training setup (in the catalog's file format,
units in the keys), every degree, the blocks of every stage and the device ids of each of its
data-parallel replicas, the rank order, the predicted metrics and the nestplan version. Loading
is strict: unknown keys, another file format or a plan edited into something impossible are
SpecErrors.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from . import __version__
from .axes import parse_order
from .caching import cached
from .errors import ABSENT, Note, SpecError
from .loaders import (LATER_STACK_KEYS, accelerator_later_keys_filled, accelerator_to_table,
                      check_keys, cluster_from_table, cluster_to_table, key_of, later_keys_filled,
                      model_from_table, model_to_table, renamed_stack_keys, stack_from_table,
                      stack_to_table, training_from_table, training_to_table)
from .recompute import parse_names
from .result import SUMMARY_KEYS, Evaluation
from .specs import Parallelism, Scenario, finite
from .stack import FITTED_FROM

FORMAT = 2
"""Format 2 adds the stack; format 1 files (stack settings in ``training``) still load."""
_TOP = {"format", "nestplan_version", "model", "cluster", "gpus", "training", "stack", "plan",
        "stages", "predicted", "method", "comparison", "memory_headroom"}
_V1_STACK_KEYS = {"attention", "grad_bytes", "overlap_grad_reduce", "overlap_param_gather",
                  "tp_overlap", "overlap_p2p", "step_overhead_s", "flat_dp_collectives"}
"""Keys a format-1 plan file kept in ``training`` that are the stack's now."""
_PLAN = {"tp", "pp", "dp", "cp", "ep", "etp", "vp", "sp", "zero", "recompute", "mbs",
         "rank_order", "stage_layers", "schedule"}
_STAGE = {"stage", "blocks", "replicas", "recompute", "embedding", "head"}


@dataclass(frozen=True)
class PlanFile:
    """A loaded plan: what it runs on, the plan itself, and what was predicted when saved."""

    scenario: Scenario
    plan: Parallelism
    predicted: dict
    method: str | None = None
    comparison: dict | None = None
    """When saved by ``compare``: every method's best plan and the methods that found none."""
    version: str | None = None
    """The nestplan version that wrote the file."""


def _stage_entry(st, replicas) -> dict:
    return {"stage": st.index, "blocks": [list(b) for b in st.blocks],
            "replicas": replicas[st.index], "recompute": st.recompute,
            "embedding": st.has_embedding, "head": st.has_head}


def stage_replicas(par: Parallelism) -> list[list[list[int]]]:
    """Per stage, per data-parallel replica, the device ids of its context- and tensor-parallel
    ranks (rank ``r`` runs on device ``r``)."""
    from .placement import rank_grid  # numpy: not loaded to refuse a bad file

    grid = rank_grid(par)  # [pp, dp, cp, tp]
    return [[sorted(grid[s, d].ravel().tolist()) for d in range(par.dp)] for s in range(par.pp)]


PREDICTED_KEYS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
                  "mfu", "peak_memory_gib", "fits")
"""What a plan file's ``predicted`` holds (``Evaluation.to_json``'s figures)."""
COMPARISON_KEYS = ("method", *SUMMARY_KEYS, "etp", "stage_layers", "search_seconds")
_COMPARISON_TYPES = {"method": ((str,), "a string"), "rank_order": ((str,), "a string"),
                     "schedule": ((str, type(None)), "a string or null (no pipeline)"),
                     "recompute": ((str, list), "a policy or a list of policies"),
                     "fits": ((bool,), "true or false"), "sp": ((bool,), "true or false"),
                     "etp": ((int, type(None)), "a whole number >= 1 or null (no experts)"),
                     "stage_layers": ((list, type(None)), "a list of blocks per model chunk or "
                                      "null (the even split)")}
"""Types of the comparison keys that are not numbers (kinds, description)."""
COMPARISON_REQUIRED = ("method", "step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "fits",
                       "tp", "pp", "dp", "zero", "recompute", "mbs")
"""The comparison keys every row has (the others came later, or may be left out)."""
MOST_MFU = 2
"""The most MFU a comparison row may state: the FLOPs devices run are at most their peak (every
efficiency is capped at 1), and model FLOPs count causal attention's masked half too, at most
doubling them (``Evaluation.mfu``; a row's 1e308 had been shown as inf %)."""
_COMPARISON_DEGREES = ("tp", "pp", "dp", "cp", "ep", "vp", "zero", "mbs")
"""Comparison keys that are whole numbers."""


def _headroom(data: dict) -> float:
    from .specs import MAX_HEADROOM, Scenario, valid_headroom

    value = data.get("memory_headroom", Scenario.memory_headroom)
    if not valid_headroom(value):
        percent = (f" (a fraction: {value:g} % is {value / 100:g}; --memory-headroom takes percent)"
                   if isinstance(value, (int, float)) and not isinstance(value, bool)
                   and 1 <= value < 100 * MAX_HEADROOM else "")
        raise SpecError("memory_headroom", value,
                        f"must be a share of HBM in [0, {MAX_HEADROOM}){percent}")
    return float(value)


def to_dict(ev: Evaluation, method: str | None = None, comparison: dict | None = None) -> dict:
    """The plan file of an evaluated plan (``comparison``: see :class:`PlanFile`)."""
    from .specs import blocks_per_chunk

    sc, par = ev.scenario, ev.plan
    replicas = stage_replicas(par)
    plan = par.to_dict()
    plan["stage_layers"] = list(blocks_per_chunk(sc.model, par))
    js = ev.to_json()
    predicted = {k: js[k] for k in PREDICTED_KEYS}
    return {
        "format": FORMAT, "nestplan_version": __version__,
        **({"method": method} if method else {}),
        "model": model_to_table(sc.model), "cluster": cluster_to_table(sc.cluster),
        "gpus": sc.gpus, "training": training_to_table(sc.training),
        "stack": stack_to_table(sc.stack), "memory_headroom": sc.memory_headroom, "plan": plan,
        "stages": [_stage_entry(s, replicas) for s in ev.stages],
        "predicted": predicted,
        **({"comparison": comparison} if comparison else {}),
    }


def save(ev: Evaluation, path: str | Path, method: str | None = None,
         comparison: dict | None = None) -> None:
    from .loaders import write_text_atomic

    try:
        write_text_atomic(path, json.dumps(to_dict(ev, method, comparison), indent=1) + "\n")
    except OSError as e:
        raise SpecError("--save", str(path), f"cannot write ({e.strerror})") from None


def _int(table: dict, key: str, where: str) -> int:
    v = table.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise SpecError(key_of(where, key), v, "must be an integer")
    return v


def plan_from_dict(table: dict, where: str = "plan") -> Parallelism:
    check_keys(table, where, required={"tp", "pp", "dp", "mbs"}, optional=_PLAN)
    kw = {k: _int(table, k, where) for k in ("tp", "pp", "dp", "cp", "ep", "vp", "zero", "mbs")
          if k in table}
    if table.get("etp") is not None:
        kw["etp"] = _int(table, "etp", where)
    if "sp" in table:
        if not isinstance(table["sp"], bool):
            raise SpecError(f"{where}.sp", table["sp"], "must be true or false")
        kw["sp"] = table["sp"]
    if "recompute" in table:
        rec = table["recompute"]
        if not isinstance(rec, (str, list)):
            raise SpecError(f"{where}.recompute", rec, "must be a policy or a list of policies")
        kw["recompute"] = parse_names(f"{where}.recompute", rec)
    if "rank_order" in table:
        kw["rank_order"] = parse_order(str(table["rank_order"]))
    # null (written without a pipeline) reads as absent: the default schedule, so that a file
    # edited to pp > 1 still loads
    if table.get("schedule") is not None:
        from .schedule import SCHEDULES, is_default

        if not isinstance(table["schedule"], str) or table["schedule"] not in SCHEDULES:
            raise SpecError(f"{where}.schedule", table["schedule"],
                            "allowed: " + ", ".join(SCHEDULES))
        if kw.get("pp", 1) > 1:
            kw["schedule"] = table["schedule"]
        elif not is_default(table["schedule"], kw.get("vp", 1)):
            # files of before 2026-12-03 named a schedule for every plan, one given or not
            warnings.warn(f"{where}.schedule {table['schedule']} is read as none: the plan has "
                          "no pipeline (pp = 1)", Note)
    if table.get("stage_layers") is not None:
        sl = table["stage_layers"]
        if not isinstance(sl, list) or not all(isinstance(n, int) for n in sl):
            raise SpecError(f"{where}.stage_layers", sl, "must be a list of block counts")
        kw["stage_layers"] = tuple(sl)
    return Parallelism(**kw)


def from_dict(data: dict, source: str = "plan file") -> PlanFile:
    """Rebuild a plan file's scenario and plan; reject what this version cannot read (every
    error named after the file: ``p.json: gpus``, ``p.json: levels[leaf].size``)."""
    try:
        return _from_dict(data)
    except SpecError as e:
        raise SpecError(f"{source}: {e.field}" if e.field else source, e.value,
                        e.allowed) from None


def _same(a, b) -> bool:
    """Two stack-table values alike (floats to rounding: they went through a file's units)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


UNCOSTED_STACK_KEYS = ("description", *FITTED_FROM)
"""Stack keys a plan file may differ in from the catalog without a note (they cost nothing)."""


def _note_expert_load_without_experts(training: dict, sc: Scenario) -> None:
    """Say that a dense model's plan file states an expert load, which nothing reads (as
    evaluate says of --moe-imbalance on a dense model; a file writes the imbalance even at 1,
    the capacity only when one is stated)."""
    if sc.model.moe is not None or not isinstance(training, dict):
        return
    stated = [f"training.{k} = {training[k]}" for k in ("moe_imbalance", "moe_capacity")
              if training.get(k) is not None and (k == "moe_capacity" or training[k] != 1)]
    if stated:
        from .errors import note_no_experts

        note_no_experts(", ".join(stated), sc.model.name)


def _table_differs(mine: dict, catalog: dict, skip=(), at: str = "") -> list[str]:
    """The keys (as the file writes them; ``levels[1].bandwidth_GBps`` inside a list of tables
    of the same length) in which table ``mine`` differs from ``catalog`` (floats within
    ``_same``'s tolerance: they went through a file's units), but those in ``skip``."""
    out = []
    for k in sorted(mine.keys() | catalog.keys()):
        a, b = mine.get(k), catalog.get(k)
        if k in skip or _same(a, b):
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += _table_differs(a, b, (), f"{at}{k}.")
        elif (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
              and all(isinstance(x, dict) and isinstance(y, dict) for x, y in zip(a, b))):
            for i, (x, y) in enumerate(zip(a, b)):
                out += _table_differs(x, y, (), f"{at}{k}[{i}].")
        else:
            out.append(at + k)
    return out


def _note_not_the_catalogs(sc: Scenario) -> None:
    """A plan file's model, cluster, accelerator or stack named as a catalog entry but not that
    entry (edited by hand, or saved by a nestplan whose catalog differed): say so, naming the
    keys that differ, since every output labels it with the name (a sixth fuzzing round's: an
    accelerator of 5,000 TFLOP/s labelled h100-sxm-80gb had been costed without a word; a file
    of its own is refused). A model's MTP depths are the command's (``--mtp-layers``), not an
    edit, nor is its trained context, which costs nothing (files saved before it existed lack
    it); a cluster's accelerator is compared by name (its values on their own)."""
    from .catalog import get_accelerator, get_cluster, get_model, get_stack, list_names
    from .textfmt import first_of

    def cluster_table(cluster) -> dict:  # (its accelerator by name: compared on its own)
        return {**cluster_to_table(cluster), "accelerator": cluster.accelerator.name}

    model = sc.model
    for kind, spec, differ in (
            ("model", model, lambda: _table_differs(model_to_table(model), model_to_table(
                replace(get_model(model.name), mtp_layers=model.mtp_layers,
                        trained_context=model.trained_context)))),
            ("cluster", sc.cluster, lambda: _table_differs(
                cluster_table(sc.cluster), cluster_table(get_cluster(sc.cluster.name)))),
            ("accelerator", sc.cluster.accelerator, lambda: _table_differs(
                accelerator_to_table(sc.cluster.accelerator),
                accelerator_to_table(get_accelerator(sc.cluster.accelerator.name)))),
            ("stack", sc.stack, lambda: _table_differs(
                stack_to_table(sc.stack), stack_to_table(get_stack(sc.stack.name)),
                UNCOSTED_STACK_KEYS))):
        if spec.name not in list_names(kind + "s"):
            continue
        keys = differ()
        if keys:
            warnings.warn(f"the plan file's {kind} is named {spec.name} but is not this "
                          f"nestplan's catalog {spec.name} (it differs in {first_of(keys)}): its "
                          f"own values are used, and outputs label them {spec.name}", Note)


def _accelerator_filled(cluster):
    """A plan file's cluster table, its inline accelerator's later keys filled in
    (``loaders.accelerator_later_keys_filled``)."""
    acc = cluster.get("accelerator") if isinstance(cluster, dict) else None
    filled = accelerator_later_keys_filled(acc)
    return cluster if filled is acc else {**cluster, "accelerator": filled}


def saved_stack(table, where: str = "stack"):
    """The stack of a plan file's ``table`` (whole, without a base). A stack named as a catalog
    stack takes that stack's values for the keys it lacks (those added since it was saved, or
    taken out by hand: the values are the catalog's either way). Another must have every key but
    those added since plan files were first saved (``loaders.later_keys_filled``): a default in
    a key's place would change the plan's cost under the file's own name (a fifth fuzzing
    round's: four keys deleted from a stack moved its step by 8 %)."""
    from .catalog import get_stack, list_names

    if isinstance(table, dict):
        table = renamed_stack_keys(table, where)
        if table.get("name") in list_names("stacks"):
            table = {**stack_to_table(get_stack(table["name"])), **table}
        else:
            table = later_keys_filled(table)
            missing = [k for k in _whole_stack_keys() if k not in table]
            if missing:
                from .textfmt import first_of

                raise SpecError(f"{where}.{missing[0]}", ABSENT, "missing; a plan file holds a stack "
                                f"of its own whole (it lacks {first_of(missing)}): save the plan "
                                "again, or evaluate with --stack and the plan's flags")
    return stack_from_table(table, where)


@cached(maxsize=1)
def _whole_stack_keys() -> tuple[str, ...]:
    """The keys every saved stack has: those of a whole stack table but the ones added after
    plan files were first saved (``loaders.LATER_STACK_KEYS``), those that cost nothing, and
    those a stack may leave unset."""
    from .stack import StackSpec

    skip = set(LATER_STACK_KEYS) | set(UNCOSTED_STACK_KEYS)
    return tuple(k for k in stack_to_table(StackSpec(name="x")) if k not in skip)


def _from_dict(data: dict) -> PlanFile:
    """The plan file in ``data``; errors name fields from the top (``from_dict`` adds the file)."""
    from .catalog import get_accelerator, get_stack

    if not isinstance(data, dict):
        raise SpecError("", type(data).__name__, "a plan file holds one JSON object")
    fmt = data.get("format")
    if fmt is None and not {"model", "plan"} & set(data):  # (a model's config.json, say)
        if "model_type" in data or "architectures" in data:
            raise SpecError("format", ABSENT, "no such key: not a plan file but a HuggingFace model "
                            "config; give it to plan as --model, and --save PLAN.json to write a "
                            "plan file")
        raise SpecError("format", ABSENT, "no such key: not a plan file (no format, model or plan "
                        "key); write one with nestplan plan ... --save PLAN.json")
    if fmt not in (1, FORMAT) or type(fmt) is not int:  # (not 2.0, not true)
        raise SpecError("format", fmt, f"this nestplan ({__version__}) reads plan files of "
                        f"format 1 and {FORMAT}")
    if fmt == 1 and "stack" in data:
        raise SpecError("format", fmt, f"a plan file with a stack table is of format {FORMAT} "
                        "(format 1 kept the stack's settings in training)")
    check_keys(data, "", required={"format", "model", "cluster", "gpus", "training", "plan"},
               optional=_TOP - ({"stack"} if fmt == 1 else set()))
    training, stack = data["training"], data.get("stack")
    if fmt == 1:  # its stack settings sat in training, over the default (Megatron-Core) stack
        if not isinstance(training, dict):
            raise SpecError("training", training, "must be a table")
        stack = {k: v for k, v in training.items() if k in _V1_STACK_KEYS}
        training = {k: v for k, v in training.items() if k not in _V1_STACK_KEYS}
        stack_spec = stack_from_table(stack, "training", base=get_stack())
    elif "stack" not in data:
        stack_spec = get_stack()
    elif not isinstance(stack, dict):  # (null had read as the default stack)
        raise SpecError("stack", stack, "must be a table: the plan's stack, whole")
    else:
        if "base" in stack:  # a stack file's key, followed by the catalog
            raise SpecError("stack.base", stack["base"], "a plan file holds its stack whole; "
                            "remove base (or evaluate with --stack and the plan's flags)")
        stack_spec = saved_stack(stack)
    sc = Scenario(model=model_from_table(data["model"], "model"),
                  cluster=cluster_from_table(_accelerator_filled(data["cluster"]),
                                             get_accelerator, "cluster"),
                  gpus=_int(data, "gpus", ""),
                  training=training_from_table(training, "training"),
                  stack=stack_spec, memory_headroom=_headroom(data))
    _note_not_the_catalogs(sc)
    _note_expert_load_without_experts(training, sc)
    par = plan_from_dict(data["plan"], "plan")
    if sc.model.moe is None:  # (written as tp, it would name etp for an edited tp: a user trial's)
        par = par.with_(etp=None)
    from .evaluate import evaluate  # numpy: loaded once the file reads as a plan

    ev = evaluate(sc, par)  # also validates the plan against the scenario
    stages = data.get("stages")
    replicas = stage_replicas(par)
    if stages is not None:
        if not isinstance(stages, list) or len(stages) != len(ev.stages):
            raise SpecError("stages", f"{len(stages) if isinstance(stages, list) else stages}"
                            " entries", f"the plan has {len(ev.stages)} pipeline stages")
        for st, mine in zip(stages, ev.stages):
            where = f"stages[{mine.index}]"
            check_keys(st, where, required=set(), optional=_STAGE)
            want = _stage_entry(mine, replicas)
            for key, value in st.items():
                if json.dumps(value) == json.dumps(want[key]):  # (1.0 or false is not 1 or 0)
                    continue
                show = _short(value) if isinstance(value, list) else value
                if key == "replicas":
                    rule = (f"must be the devices of each of the {len(want[key])} data-parallel "
                            "replicas that the plan's rank order gives this stage: ")
                else:
                    rule = "must be what the plan gives this stage: "
                raise SpecError(f"{where}.{key}", show, rule + (
                    _short(want[key]) if isinstance(want[key], list) else json.dumps(want[key])))
    for key in ("method", "nestplan_version"):
        if key in data and not isinstance(data[key], str):
            raise SpecError(key, data[key], "must be a string")
    if "method" in data:
        from .search.constraints import METHODS

        if data["method"] not in METHODS:
            raise SpecError("method", data["method"],
                            "the search method that found the plan: " + ", ".join(METHODS))
    predicted = data.get("predicted", {})
    if not isinstance(predicted, dict):
        raise SpecError("predicted", predicted, "must map metric names to numbers")
    check_keys(predicted, "predicted", required=set(), optional=set(PREDICTED_KEYS))
    for key, value in predicted.items():  # numbers, and true/false for ``fits``
        if key == "fits":
            if not isinstance(value, bool):
                raise SpecError("predicted.fits", value, "must be true or false")
        elif isinstance(value, bool) or not (finite(value) and value >= 0):
            raise SpecError(f"predicted.{key}", value, "must be a finite number >= 0")
    saved = predicted.get("step_time_s")
    if saved and abs(saved - ev.step_time) > 1e-6 * ev.step_time:  # (shown silently: a trial's)
        # as many digits as tell the two apart (a user trial's edit read "63.54 s when saved,
        # 63.54 s now")
        digits = next(d for d in range(4, 18) if f"{saved:.{d}g}" != f"{ev.step_time:.{d}g}")
        warnings.warn(Note(f"predicted.step_time_s: {saved:.{digits}g} s when saved, "
                           f"{ev.step_time:.{digits}g} s now: the file was edited, or saved by a "
                           "nestplan whose cost model differs; the figures shown are this one's"),
                      stacklevel=2)
    return PlanFile(sc, par, predicted, data.get("method"),
                    _comparison(data.get("comparison"), ev, data.get("method")),
                    data.get("nestplan_version"))


def _consistent_row(row: dict, at: str, sc: Scenario) -> None:
    """A comparison row's figures agree with each other and with the scenario, as compare wrote
    them: tokens/s is the step's tokens over its time, and ``fits`` says whether the peak is
    within HBM (a step of 1 ms beside its method's tokens/s, and a 10^6 GiB peak that fits, had
    been shown in the report: a sixth fuzzing round's). Only the file's own figures are
    compared, not this nestplan's prediction: a file an earlier one saved still loads."""
    from .units import GiB

    tr = sc.training
    step, rate = row["step_time_s"], row["tokens_per_s"]
    tokens = tr.global_batch * tr.seq_len
    if not math.isclose(step * rate, tokens, rel_tol=CONSISTENT):
        raise SpecError(f"{at}.tokens_per_s", rate, f"must be the step's {tokens:,} tokens over "
                        f"its step_time_s {step:g} ({tokens / step if step else math.inf:,.6g})")
    hbm, peak = sc.cluster.accelerator.hbm_bytes / GiB, row["peak_memory_gib"]
    if (peak > hbm * (1 + CONSISTENT)) if row["fits"] else (peak < hbm * (1 - CONSISTENT)):
        raise SpecError(f"{at}.fits", row["fits"], f"must say whether peak_memory_gib "
                        f"{row['peak_memory_gib']:g} is within the {hbm:g} GiB of HBM")


CONSISTENT = 1e-6
"""Relative slack of the checks that a comparison row's figures agree (compare writes them
unrounded; a hand edit is far beyond it)."""


def _comparison(table, ev: Evaluation, method: str | None) -> dict | None:
    """A plan file's ``comparison``, checked: each method's row holds a plan this scenario can
    have (as a method's search evaluates it: what the stack offers is not asked), with figures
    that agree (``_consistent_row``); the file's own ``method`` (the fastest, whose plan ``ev``
    the file holds) has a row with that plan and no row beats it (compare keeps the fastest plan
    of those that fit), and a method has a row or an error, not both (a seventh fuzzing round's:
    a row beside an error for the same method, another plan under the file's method, a faster
    row than the fastest had been reported)."""
    from .specs import check_plan

    sc = ev.scenario
    if table is None:
        return None
    where = "comparison"
    if not isinstance(table, dict):
        raise SpecError(where, type(table).__name__, "must be an object with methods and errors")
    check_keys(table, where, required={"methods"}, optional={"methods", "errors"})
    rows = table["methods"]
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise SpecError(f"{where}.methods", rows, "must be a list of objects")
    seen = set()
    for i, row in enumerate(rows):
        check_keys(row, f"{where}.methods[{i}]", required={"method", "tokens_per_s"},
                   optional=set(COMPARISON_KEYS))
        for key, value in row.items():
            kinds, text = _COMPARISON_TYPES.get(key, ((int, float), "a finite number >= 0"))
            if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)) \
                    or (kinds == (int, float) and not (finite(value) and value >= 0)):
                raise SpecError(f"{where}.methods[{i}].{key}", value, f"must be {text}")
            if key in _COMPARISON_DEGREES and not (isinstance(value, int) and value >= (
                    0 if key == "zero" else 1)):
                raise SpecError(f"{where}.methods[{i}].{key}", value, "must be a whole number "
                                + (">= 0" if key == "zero" else ">= 1"))
            if (rule := _misnamed(key, value)) is not None:
                raise SpecError(f"{where}.methods[{i}].{key}", value, rule)
            if (key == "etp" and value is not None and value < 1) or (
                    key == "stage_layers" and value is not None and not all(
                        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)):
                raise SpecError(f"{where}.methods[{i}].{key}", value, f"must be {text}")
        at = f"{where}.methods[{i}]"
        # what compare writes of every method's best plan, and the report shows (a row without
        # its degrees had been taken and shown without them: a fifth fuzzing round's)
        missing = [k for k in COMPARISON_REQUIRED if k not in row]
        if missing:
            raise SpecError(f"{at}.{missing[0]}", ABSENT, "missing; a comparison row holds "
                            + ", ".join(COMPARISON_REQUIRED))
        if row["method"] in seen:
            raise SpecError(f"{at}.method", row["method"], "given twice; a comparison has one row "
                            "per method")
        seen.add(row["method"])
        if row["mfu"] > MOST_MFU:
            raise SpecError(f"{at}.mfu", row["mfu"], f"must be a share of the peak FLOP/s, at most "
                            f"{MOST_MFU} (model FLOPs count causal attention whole)")
        _consistent_row(row, at, sc)
        try:
            par = plan_from_dict({k: v for k, v in row.items() if k in _PLAN}, at)
            check_plan(sc, par, stack=False)
            for name in par.recompute:
                sc.stack.policy(name)
        except SpecError as e:
            field = e.field if e.field.startswith(at) else f"{at}.{e.field}"
            raise SpecError(field, e.value, e.allowed) from None
        if row["method"] == method:
            _the_files_row(row, par, at, ev)
    # every method's plan runs the same model FLOPs: MFU times step is the reference row's (the
    # file's method's, else the first's; an MFU of 0.9 beside its step had been reported)
    ref = next((r for r in rows if r["method"] == method), rows[0] if rows else None)
    for i, row in enumerate(rows):
        flops, step = ref["mfu"] * ref["step_time_s"], row["step_time_s"]
        if not math.isclose(row["mfu"] * step, flops, rel_tol=CONSISTENT):
            raise SpecError(f"{where}.methods[{i}].mfu", row["mfu"], f"must be the step's model "
                            f"FLOPs over its step_time_s {step:g} and the devices' peak, as "
                            f"{ref['method']}'s row gives them "
                            f"({flops / step if step else math.inf:.6g})")
    if method is not None and method not in seen:
        raise SpecError(f"{where}.methods", sorted(seen), f"has no row of the file's method "
                        f"{method}, whose plan the file holds")
    if method is not None:  # compare keeps the fastest plan of those that fit, if any fits
        own = ref  # (the file's method's row)
        for i, r in enumerate(rows):
            if (r["fits"] and not own["fits"]) or (r["fits"] == own["fits"] and r["step_time_s"]
                                                   < own["step_time_s"] * (1 - CONSISTENT)):
                raise SpecError(f"{where}.methods[{i}]", f"a step of {r['step_time_s']:g} s"
                                + (" that fits" if r["fits"] else ""), f"the file holds the plan "
                                f"compare chose, the fastest of those that fit: {method}'s of "
                                f"{own['step_time_s']:g} s; no row may beat it")
    errors = table.get("errors", {})
    if not isinstance(errors, dict):
        raise SpecError(f"{where}.errors", errors, "must map method names to messages")
    for name, message in errors.items():
        if (rule := _misnamed("method", name)) is not None:
            raise SpecError(f"{where}.errors", name, rule)
        if not isinstance(message, str) or not message.strip():
            raise SpecError(f"{where}.errors.{name}", message, "must be a message (why the "
                            "method found no plan)")
        if name in seen:
            raise SpecError(f"{where}.errors.{name}", message, f"{name} has a row with its plan; "
                            "a method has a row or an error")
    return {"methods": rows, "errors": errors}


def _the_files_row(row: dict, par: Parallelism, at: str, ev: Evaluation) -> None:
    """The comparison row of the file's own method holds the file's plan (its figures may be an
    earlier nestplan's: a file it saved, evaluated and saved again, keeps them)."""
    from .specs import blocks_per_chunk

    mine, model = ev.plan, ev.scenario.model
    as_run = {"stage_layers": lambda p: blocks_per_chunk(model, p),  # (None: the even split)
              "etp": lambda p: p.expert_tp, "schedule": lambda p: p.pipeline.name,
              "recompute": lambda p: tuple(p.recompute_of(i) for i in range(p.pp))}
    for key in sorted(row.keys() & _PLAN, key=lambda k: (k == "stage_layers", k)):  # degrees first
        value = as_run.get(key, lambda p: getattr(p, key))
        if value(par) != value(mine):
            raise SpecError(f"{at}.{key}", row[key], f"must be the file's plan's (its method "
                            f"{row['method']}'s): {value(mine)!r}")


def _misnamed(key: str, value) -> str | None:
    """What a plan file's method, schedule or rank order must be when ``value`` is not one
    nestplan has (None when it is, or ``key`` holds no such name)."""
    if key == "method":
        from .search.constraints import METHODS

        return None if value in METHODS else "allowed: " + ", ".join(METHODS)
    if key == "schedule":
        from .schedule import SCHEDULES

        return None if value is None or value in SCHEDULES else (
            "allowed: " + ", ".join(SCHEDULES) + ", or null")
    if key == "rank_order":
        try:
            parse_order(value)
        except SpecError:
            return "a rank order of tp, cp, dp and pp, e.g. tp-cp-dp-pp"
    return None


def _short(items: list) -> str:
    text = json.dumps(items[:4], separators=(",", ":"))
    return text[:60] + (f"… ({len(items)} entries)" if len(items) > 4 or len(text) > 60 else "")


def load(path: str | Path) -> PlanFile:
    from .loaders import read_document

    return from_dict(read_document(path, "plan file", "JSON"), str(path))  # (as typed)
