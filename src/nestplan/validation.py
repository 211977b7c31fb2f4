"""Validation against measured training runs (``shared/data/published_runs.csv``,
``shared/data/fsdp_runs.csv``, and the held-out runs of ``tests/data/held_out_runs.csv``).

Each row names a model, a cluster, a plan and the **stack** that ran it, sometimes with gaps:

* The stack is the row's ``stack`` column (a catalog name or a stack TOML relative to the CSV),
  or ``validate --stack`` for every row. A file without the column (the shared ones) takes, per
  row, the catalog stack whose ``runs_source`` entry is the longest one found in the row's
  ``source`` and ``other_metrics`` (an entry ``a|b`` needs both): a rule stated in the stack
  files, by the run's documented source, never by its id or its measured time.
* Gaps in the plan are filled by what the stack runs: a ZeRO stage unstated is the stack's
  ``default_zero``, sequence parallelism follows tensor parallelism where its launchers turn it
  on and always for MoE layers (``StackSpec.sp_for``), and a model-parallel size without a t/p
  split uses
  t = 8 (one node), as every large run of Narayanan et al. does.
* Benchmark runs were tuned for speed and fitted in memory: when a row states no micro-batch
  size (or, except on ``nemo``, whose launcher configs set no recomputation, no recomputation
  policy), the fastest setting the stack offers that fits according to this model is assumed
  (``_tuned``). Packed SQuAD fine-tuning attends within each ~256-token example.
* Model shapes not in a row follow its name: Llama (SwiGLU, RMSNorm, RoPE, no biases),
  Nemotron (squared ReLU), MPT (llm-foundry: GELU, LayerNorm, biases, learned positions, tied
  embeddings, no dropout), else GPT (GELU, LayerNorm, biases, learned positions, dropout, tied
  embeddings except on Megatron-Core, whose README runs untie them).
"""

from __future__ import annotations

import csv
import difflib
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from .axes import parse_order
from .catalog import DEFAULT_STACK, hf_config_in
from .errors import Note, SpecError
from .options import MLPKind, Norm, Position, Precision
from .recompute import parse_names
from .specs import (MAX_GPUS, AcceleratorSpec, ModelSpec, MoESpec, Parallelism, Scenario,
                    TrainingSpec, check_plan)
from .stack import StackSpec
from .units import MiB, GiB, counts, decimal, whole

MIN_STEP, MAX_STEP = 1e-6, 1e7
"""Measured step times a runs CSV may give, seconds: a microsecond to about four months (the
shortest in the data, one 22B layer's forward and backward, 19 ms; the longest, MPT-30B's step
at 8K on 8 A100, 300 s)."""
MIN_PEAK = MiB
"""Least measured peak memory a runs CSV may give, bytes (the data's: 61.8 to 84.5 GiB)."""

CLUSTER_OF = {"A100-SXM4-80GB": "selene-a100-hdr", "H100-SXM5-80GB": "dgx-h100-ndr",
              "H200": "dgx-h200-ndr", "B200": "dgx-b200-ndr", "B300": "dgx-b300-xdr",
              "GB200": "gb200-nvl72-ndr", "GB300": "gb300-nvl72-xdr",
              "H100-SXM5-96GB-HBM2E": "meta-h100-hbm2e-rdma"}
"""The cluster of a row that names only its GPU: the published runs' clusters (``clusters.md``),
NVIDIA's DGX designs for the newer GPUs (GB200 and GB300: NVL72 racks), and Meta's Grand Teton
hosts of torchtitan's H100 runs (``fsdp_runs.md``). llm-foundry's A100 rows ran on RoCE at
1,600 Gb/s per 8-GPU node, Selene's 25 GB/s per GPU. A ``cluster`` column (a catalog name, or a
TOML path relative to the CSV) overrides it."""
GPU_ALIASES = {"A100-SXM-80GB": "A100-SXM4-80GB", "A100-80GB": "A100-SXM4-80GB",
               "H100-SXM-80GB": "H100-SXM5-80GB", "H100-80GB": "H100-SXM5-80GB",
               "H100": "H100-SXM5-80GB", "H200-SXM-141GB": "H200", "B200-SXM-180GB": "B200",
               "H100-SXM5-96GB-HBM2E-500W": "H100-SXM5-96GB-HBM2E",
               "H100-SXM5-95GB-HBM2E-LOWTDP": "H100-SXM5-96GB-HBM2E"}
_KNOWN_GPUS = ("known (any case): " + ", ".join(CLUSTER_OF) + "; read as one of them: "
               + ", ".join(GPU_ALIASES))
"""What a row's ``gpu`` may be, as its refusal says (the aliases too: a user trial's list had
left them out, and a bare A100 is either HBM size)."""
PRECISION_ALIASES = {"bf16+fp8_linear": "fp8"}
"""torchao's Float8 linear layers in a bf16 model: the linear layers' GEMMs in fp8, as nestplan's
fp8 precision."""
COLUMNS = ("id", "model", "seq_len", "num_gpus", "metric", "step_time_s")
"""Columns every runs CSV has."""
OPTIONAL_COLUMNS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "gpu", "tp",
                    "pp", "vp", "dp", "cp", "zero_stage", "sequence_parallel", "recompute",
                    "micro_batch", "global_batch", "precision", "regime", "confidence",
                    "experts", "topk", "shared_experts", "moe_ffn_hidden", "ep", "etp",
                    "mtp_layers", "stage_layers", "cluster", "stack", "rank_order",
                    "other_metrics", "gpus_per_node", "source", "step_time_derivation", "notes")
"""Columns a runs CSV may have besides ``COLUMNS`` (those of ``published_runs.csv`` and the
project's own); a row needs some of them as its model and plan do (a model not in the catalog
and not a file is given by its sizes: ``layers``, ``hidden``, ``heads``; every row needs a
``gpu`` or a ``cluster``, and ``tp``), and a row that lacks one is refused, naming the row.
``source`` names the stack of a row without a ``stack``; ``step_time_derivation`` and ``notes``
are for people. Any other column is refused, so that a misspelt ``stak`` does not silently run
every row on the default stack."""
OTHER_METRICS = ("peak_memory_gib", "moe_imbalance", "moe_capacity", "model_parallel_size",
                 "local_batch", "attention_span")
"""The ``other_metrics`` keys a row's prediction reads; any other key=value is for people (a
source's MFU, tokens/s, ...), but one within a typo of these is refused."""
METRICS = ("step_time", "layer_fwd_bwd_time")
REGIMES = ("", "pretrain", "sft", "lora")
# Packed fine-tuning on SQuAD v1.1: attention stays inside each example (block-diagonal).
# SQuAD paragraphs average ~120 words (Rajpurkar et al. 2016); with the question and the prompt
# template an example is ~256 Llama tokens. An assumption, stated here once.
SQUAD_PACKED_SPAN = 256
ROW_TOLERANCE = 0.15
MEAN_TOLERANCE = 0.07
MEMORY_TOLERANCE = 0.10
"""A measured peak memory a row's prediction must be within (issue 8's ±10 %)."""


@dataclass(frozen=True)
class Case:
    """A measured run turned into a scenario and a plan."""

    id: str
    metric: str
    measured: float
    scenario: Scenario
    plan: Parallelism
    confidence: str
    memory: float | None = None
    """Measured peak memory, bytes (when the row has one)."""
    where: str = ""
    """The row, as errors name it: its file, line and id."""


class _Row:
    """One CSV row; malformed fields raise a SpecError naming the row and the column."""

    MAY_BE_ZERO = ("zero_stage", "shared_experts", "mtp_layers")

    def __init__(self, data: dict, where: str):
        self.data, self.where = data, where
        self.others: dict[str, list[str]] = {}
        """``other_metrics`` as key -> the values it is given (key=value; others are for people)."""
        for item in self.text("other_metrics").split(";"):
            item = item.strip()
            if not item:
                continue
            name, eq, value = item.partition("=")
            name, value = name.strip(), value.strip()
            self.others.setdefault(name, []).append(value)
            if not eq or not name:
                raise SpecError(f"{where}.other_metrics", item, "entries are key=value, "
                                "separated by ';'")
            if name in OTHER_METRICS and not (value and value.isascii()):
                raise SpecError(f"{where}.other_metrics", item, f"{name} needs a value (ASCII "
                                "digits)")
            if name in ("local_batch", "model_parallel_size", "attention_span") and not (
                    whole(value) or 0) > 0:
                raise SpecError(f"{where}.other_metrics", item, f"{name} must be a whole "
                                "number > 0")
            near = difflib.get_close_matches(name.lower(), OTHER_METRICS, n=1, cutoff=0.75)
            if near and name not in OTHER_METRICS:  # a misspelt key would be ignored
                raise SpecError(f"{where}.other_metrics", item, f"did you mean {near[0]}? "
                                "(keys read: " + ", ".join(OTHER_METRICS) + ")")

    def text(self, key: str) -> str:
        return (self.data.get(key) or "").strip()

    def other(self, key: str) -> str:
        """The value of ``key=value`` in the ``other_metrics`` column ("" when absent; a key
        given twice is refused, since either value could be the one meant)."""
        found = self.others.get(key, [])
        if len(found) > 1:
            raise SpecError(f"{self.where}.other_metrics", f"{key}=" + f"; {key}=".join(found),
                            f"{key} given {len(found)} times; give it once")
        return found[0] if found else ""

    def number(self, key: str, default: int | None = None) -> int | None:
        v = self.text(key)
        if not v:
            return default
        n = whole(v)
        if n is None:
            raise SpecError(f"{self.where}.{key}", v, "must be a whole number (ASCII digits)")
        if n < 0 or (n == 0 and key not in self.MAY_BE_ZERO):
            raise SpecError(f"{self.where}.{key}", v, "must be >= 0" if key in self.MAY_BE_ZERO
                            else "must be positive")
        return n

    def seconds(self, key: str) -> float:
        v = self.text(key)
        x = decimal(v)
        if x is None or not MIN_STEP <= x <= MAX_STEP:
            raise SpecError(f"{self.where}.{key}", v, f"must be a number of seconds in "
                            f"[{MIN_STEP:g}, {MAX_STEP:g}] (ASCII digits)")
        return x

    def regime(self) -> str:
        """What the row trained: ``pretrain`` (or blank), ``sft`` or ``lora`` (packed
        fine-tuning, which changes the prediction: a misspelling is refused), in any case, as
        ``gpu`` and ``precision`` are read (SFT had been refused: a user trial's)."""
        v = self.text("regime").lower()
        if v not in REGIMES:
            raise SpecError(f"{self.where}.regime", self.text("regime"), "allowed: " + ", ".join(REGIMES[1:])
                            + ", or blank (pretrain)")
        return v

    def yes_no(self, key: str) -> bool | None:
        v = self.text(key).lower()
        if v not in ("", "yes", "no", "true", "false"):
            raise SpecError(f"{self.where}.{key}", v, "allowed: yes, no (or true, false), or blank")
        return None if not v else v in ("yes", "true")

    def required(self, key: str) -> int:
        n = self.number(key)
        if n is None:
            raise SpecError(f"{self.where}.{key}", "", self.must_give(key))
        return n

    def must_give(self, key: str) -> str:
        """What a refusal of a blank ``key`` says: a file without the column is told so (a
        torchtitan trial's file without ``tp`` had read as a blank cell)."""
        return ("must be given" if key in self.data
                else f"must be given: the file has no {key} column")

    def path(self, key: str, base: Path) -> str:
        """The column as a catalog name, or as a file path relative to the CSV."""
        name = self.text(key)
        if "/" not in name and not name.endswith((".toml", ".json")):
            return name
        path = base / name
        if not (path.is_file() or (key == "model" and hf_config_in(path).is_file())):
            raise SpecError(f"{self.where}.{key}", name, f"no such file ({path})")
        return str(path)  # a model may be a HuggingFace model folder (``catalog.get_model``)

    def stack(self, base: Path, override: StackSpec | None) -> StackSpec:
        """The stack that ran this row (see the module docstring)."""
        from .catalog import get_stack

        return override if override is not None else get_stack(self.stack_ref(base))

    def stack_ref(self, base: Path) -> str:
        """The row's stack as ``--stack`` would name it: its ``stack`` column (a file relative
        to the CSV, or a catalog name), else the catalog stack its source names."""
        if self.text("stack"):
            return self.path("stack", base)
        return self.source_stack() or DEFAULT_STACK

    def source_stack(self) -> str | None:
        """The catalog stack whose ``runs_source`` the row's source names (the longest such
        entry), if any."""
        from .catalog import stack_sources

        text = self.text("source") + " " + self.text("other_metrics")
        best = max(((entry, name) for entry, name in stack_sources()
                    if all(part in text for part in entry.split("|"))),
                   key=lambda t: len(t[0]), default=None)
        return best[1] if best else None


def _model(row: _Row, base: Path, stack: StackSpec) -> ModelSpec:
    model = _architecture(row, base, stack)
    depths = row.number("mtp_layers")  # blank: the model's own (its config's)
    if depths is None or depths == model.mtp_layers:
        return model
    try:
        return replace(model, mtp_layers=depths)
    except SpecError as e:
        raise SpecError(f"{row.where}.mtp_layers", e.value, e.allowed) from None


SIZE_COLUMNS = {"hidden": "hidden", "heads": "heads", "kv_heads": "kv_heads",
                "ffn_hidden": "ffn_hidden", "vocab": "vocab", "experts": "moe.experts",
                "topk": "moe.top_k", "moe_ffn_hidden": "moe.ffn_hidden",
                "shared_experts": "moe.shared_experts"}
"""The size columns of a row's model, and the ``ModelSpec`` field each gives."""


def _named_model(row: _Row, base: Path) -> ModelSpec:
    """The catalog model, TOML or config.json the model column names (``layers`` blank); a size
    column given beside it must say what that model has (it would be ignored)."""
    from .catalog import get_model

    model = get_model(row.path("model", base))
    for column, field in SIZE_COLUMNS.items():
        given = row.number(column)
        if given is None:
            continue
        part, _, name = field.rpartition(".")
        holder = model.moe if part else model
        has = getattr(holder, name) if holder is not None else None
        if given != has and not (has is None and given == 0):  # (no experts: none of each)
            what = f"whose {column} is {has}" if has is not None else "which has no experts"
            raise SpecError(f"{row.where}.{column}", given, f"the model column names "
                            f"{row.text('model')}, {what}: leave it blank, or give the model by "
                            "its sizes (with layers)")
    return model


def _architecture(row: _Row, base: Path, stack: StackSpec) -> ModelSpec:
    name = row.text("model")
    if not name:  # (it names the model in every output, and its family's layers below)
        raise SpecError(f"{row.where}.model", "", "must be given: a catalog model, a model file, "
                        "or with layers and the size columns the model's name (e.g. Llama-2 7B)")
    if not row.text("layers"):  # a catalog model, TOML or config.json named in the model column
        return _named_model(row, base)
    h, heads = row.required("hidden"), row.required("heads")
    lower = name.lower()
    llama, nemotron, mpt = "llama" in lower, "nemotron" in lower, lower.startswith("mpt")
    if llama:
        mlp, norm, bias, pos = MLPKind.SWIGLU, Norm.RMSNORM, False, Position.ROPE
    elif nemotron:
        mlp, norm, bias, pos = MLPKind.SQUARED_RELU, Norm.LAYERNORM, False, Position.ROPE
    else:
        mlp, norm, bias, pos = MLPKind.GELU, Norm.LAYERNORM, True, Position.LEARNED
    gpt = not (llama or nemotron or mpt)
    blank = [c for c in ("vocab", "ffn_hidden") if not row.text(c)]
    if blank and (llama or nemotron):  # (GPT's sizes are no Llama's: a user trial's)
        taken = {"vocab": "50,257 (GPT-2's)", "ffn_hidden": f"4·hidden = {4 * h:,}"}
        warnings.warn(Note(f"{row.where}: {name} is given by its sizes with "
                           + " and ".join(f"{c} blank, read as {taken[c]}" for c in blank)
                           + "; give its own"), stacklevel=2)
    if h % heads:
        raise SpecError(f"{row.where}.heads", heads, f"must divide hidden = {h}")
    experts = row.number("experts")
    for column in ("topk", "moe_ffn_hidden", "shared_experts"):
        given = row.number(column)
        if experts is None and given:  # (it would be ignored: no experts, none of each)
            raise SpecError(f"{row.where}.{column}", given, "describes experts, and the experts "
                            "column is blank: give experts too, or leave it blank")
    moe = None if experts is None else MoESpec(
        experts=experts, top_k=row.required("topk"), ffn_hidden=row.required("moe_ffn_hidden"),
        shared_experts=row.number("shared_experts", 0))
    return ModelSpec(
        name=name, layers=row.required("layers"), hidden=h, heads=heads,
        kv_heads=row.number("kv_heads", heads), head_dim=h // heads,
        ffn_hidden=row.number("ffn_hidden", 4 * h),
        vocab=row.number("vocab", 50257),  # NeMo GPT-3: GPT-2 BPE, padded by the framework
        mlp=mlp, norm=norm, bias=bias, dropout=gpt, position=pos,
        max_positions=row.required("seq_len") if pos is Position.LEARNED else 0,
        # a GPT row that ran a pipeline on a stack that pipelines no tied embeddings was untied
        # (a review's: torchtitan GPT rows at pp 2 had been refused as tied)
        tied_embeddings=mpt or (gpt and stack.gpt_tied_embeddings and (
            stack.pipeline_tied_embeddings or (row.number("pp") or 1) == 1)), moe=moe,
    )


def _training(row: _Row, dp: int) -> TrainingSpec:
    """The row's workload; without a global batch, one micro-batch per replica of the ``dp``."""
    seq = row.required("seq_len")
    given = row.number("global_batch")
    micro = row.number("micro_batch")
    local = row.other("local_batch")  # (a whole number > 0 where given: _Row)
    # without a global batch: a step of the device's local batch where it is given (a micro-batch
    # beside it had made the step one micro-batch: a seventh fuzzing round's), else one
    # micro-batch per replica
    gb = given or (int(local) * dp if local else None if micro is None else micro * dp)
    if gb is None:
        raise SpecError(f"{row.where}.global_batch", "", "must be given (sequences per step; or "
                        "micro_batch alone, for a step of one micro-batch per replica)")
    text = row.text("precision") or "bf16"
    precision = Precision.parse(f"{row.where}.precision", PRECISION_ALIASES.get(text, text))
    span = row.other("attention_span")  # (a whole number > 0 where given: _Row)
    if span:
        span = int(span)
    elif row.regime() in ("sft", "lora"):
        span = SQUAD_PACKED_SPAN
        warnings.warn(Note(f"{row.where.rpartition(' line ')[0]}: sft and lora rows without "
                           f"attention_span=N in other_metrics are predicted with attention "
                           f"within packed examples of {SQUAD_PACKED_SPAN} tokens (NeMo's SQuAD "
                           "fine-tuning benchmark); give your examples' length"), stacklevel=2)
    moe = {}
    for key in ("moe_imbalance", "moe_capacity"):  # stated in other_metrics, where known
        value = row.other(key)
        if value:
            moe[key] = decimal(value)
            if moe[key] is None:
                raise SpecError(f"{row.where}.other_metrics", f"{key}={value}",
                                f"{key} must be a number >= 1")
    try:
        return TrainingSpec(seq_len=seq, global_batch=gb, precision=precision,
                            attention_span=span or None, **moe)
    except SpecError as e:  # name the row's column (or its other_metrics entry, as written)
        if e.field == "attention_span" and row.other("attention_span"):
            raise SpecError(f"{row.where}.other_metrics",
                            f"attention_span={row.other('attention_span')}", e.allowed) from None
        if e.field in moe:
            raise SpecError(f"{row.where}.other_metrics", f"{e.field}={row.other(e.field)}",
                            e.allowed) from None
        column = "micro_batch" if e.field == "global_batch" and given is None else e.field
        raise SpecError(f"{row.where}.{column}", e.value, e.allowed) from None


def _plan(row: _Row, gpus: int, stack: StackSpec, model: ModelSpec) -> Parallelism:
    """The row's plan for ``model`` (whose experts set sequence parallelism's default)."""
    moe = model.moe is not None
    tp, pp = row.number("tp"), row.number("pp")
    if tp is None:  # Narayanan Table 2 gives only the model-parallel size t·p
        mp = row.other("model_parallel_size")
        if not mp or int(mp) % 8:  # (a whole number > 0 where given: _Row)
            raise SpecError(f"{row.where}.tp", "", f"{row.must_give('tp')} (or "
                            "model_parallel_size=N, a multiple of 8, in other_metrics)")
        mp = int(mp)
        tp, pp = 8, mp // 8
    elif row.other("model_parallel_size") and int(row.other("model_parallel_size")) != tp * (pp or 1):
        raise SpecError(f"{row.where}.other_metrics",
                        f"model_parallel_size={row.other('model_parallel_size')}",
                        f"the model-parallel size is tp·pp = {tp}·{pp or 1} = {tp * (pp or 1)} "
                        "by the row's columns; make them agree")
    pp = pp or 1
    cp = row.number("cp", 1)
    dp = row.number("dp")
    if dp is None:  # (num_gpus / (tp·pp·cp): the degrees must divide it)
        if gpus % (tp * pp * cp):
            raise SpecError(f"{row.where}.num_gpus", gpus, f"must be a multiple of tp·pp·cp = "
                            f"{tp}·{pp}·{cp} = {tp * pp * cp} (dp is blank: it is num_gpus over "
                            "their product)")
        dp = gpus // (tp * pp * cp)
    zero = row.number("zero_stage")
    if zero is None:
        zero = stack.default_zero_for(pp)
    # one policy, or one per pipeline stage as --recompute takes them (unstated: see _case)
    rec = parse_names(f"{row.where}.recompute", row.text("recompute") or "none")
    sp = row.yes_no("sequence_parallel")
    if sp is None:
        sp = stack.sp_for(tp, moe)
    order = row.text("rank_order")
    extra = {"rank_order": parse_order(order)} if order else {}
    layout = row.text("stage_layers")
    if layout:  # blocks per model chunk, space-separated (the head runs after the last)
        sizes = counts(layout.split())
        if sizes is None:
            raise SpecError(f"{row.where}.stage_layers", layout, "must be whole numbers of "
                            "blocks per model chunk (ASCII digits), space-separated")
        extra["stage_layers"] = sizes
    ep, etp = row.number("ep", 1), row.number("etp")
    if etp is None:  # as the stack runs experts (torchtitan's with EP: no expert TP)
        etp = stack.default_etp(tp, ep, biased=model.biased_experts)
    return Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp,
                       vp=row.number("vp", 1), sp=sp,
                       zero=zero, recompute=tuple(_policy_name(stack, name) for name in rec),
                       mbs=row.number("micro_batch", _local_batch(row, dp, pp) or 1),  # else _tuned
                       **extra)


def _policy_name(stack, name: str) -> str:
    """The stack's policy a row's recompute column names, in any case as its gpu and precision
    columns are read (``Full``); the stack names its policies when none matches."""
    same = [p.name for p in stack.recompute if p.name.lower() == name.lower()]
    return stack.policy(same[0] if len(same) == 1 else name).name


def _tuned(sc: Scenario, plan: Parallelism, *, free_mbs: bool, free_recompute: bool,
           local: int | None = None) -> Parallelism:
    """Fill unstated knobs of a benchmark run: the run fitted in memory and was tuned for speed,
    so take the fastest micro-batch size and/or recomputation that fits (by this model). A
    ``local`` batch (torchtitan's sequences of one forward, accumulated to the global batch) is
    the micro-batch without pipelining, and a whole number of micro-batches with it (a user
    trial's row of local batch 2 had been predicted at micro-batches of 4)."""
    from .evaluate import evaluate

    per_replica = sc.training.global_batch // plan.dp
    most = local or per_replica
    sizes = ([most] if local and plan.pp == 1 else
             [d for d in range(1, most + 1) if most % d == 0]) if free_mbs else [plan.mbs]
    policies = [(p.name,) for p in sc.stack.recompute] if free_recompute else [plan.recompute]
    best, best_time = None, float("inf")
    for mbs in sizes:
        for policy in policies:
            candidate = plan.with_(mbs=mbs, recompute=policy)
            try:
                ev = evaluate(sc, candidate)
            except SpecError:
                continue
            if ev.fits and ev.step_time < best_time:
                best, best_time = candidate, ev.step_time
    return best or plan.with_(mbs=local if local and plan.pp == 1 else plan.mbs,
                              recompute=(sc.stack.most_saving,) if free_recompute
                              else plan.recompute)


def _cluster(row: _Row, base: Path):
    from .catalog import get_cluster

    gpu = row.text("gpu").upper()
    gpu = GPU_ALIASES.get(gpu, gpu)
    if row.text("cluster"):
        if row.text("gpu") and gpu not in CLUSTER_OF:  # (a misspelt part would be ignored)
            raise SpecError(f"{row.where}.gpu", row.text("gpu"), _KNOWN_GPUS
                            + "; or leave it blank, since the cluster column names the devices")
        cluster = get_cluster(row.path("cluster", base))
        named = get_cluster(CLUSTER_OF[gpu]).accelerator if gpu in CLUSTER_OF else None
        acc = cluster.accelerator
        # another part, not a variant of it (a file may tune a catalog accelerator's
        # efficiencies or clocks under a name of its own)
        def sizes(a):
            return f"{a.hbm_bytes / GiB:g} GiB, {a.peak_flops_bf16 / 1e12:g} TFLOP/s bf16"

        if named is not None and (named.hbm_bytes, named.peak_flops_bf16) != (
                acc.hbm_bytes, acc.peak_flops_bf16):
            raise SpecError(f"{row.where}.cluster", row.text("cluster"), f"its devices are "
                            f"{acc.name} ({sizes(acc)}), the row's gpu column says "
                            f"{row.text('gpu')} ({named.name}: {sizes(named)}); make them agree")
        return cluster
    if gpu not in CLUSTER_OF:  # (as written: it had been shown upper-cased)
        raise SpecError(f"{row.where}.gpu", row.text("gpu"), _KNOWN_GPUS
                        + "; or name a catalog cluster (or cluster TOML) in a cluster column")
    return get_cluster(CLUSTER_OF[gpu])


def _case(row: _Row, base: Path, override: StackSpec | None,
          calibration: StackSpec | None = None) -> Case:
    metric = row.text("metric")
    if metric not in METRICS:
        raise SpecError(f"{row.where}.metric", metric, "allowed: " + ", ".join(METRICS))
    stack = row.stack(base, override)
    if calibration is not None:
        stack = stack.calibrated_as(calibration)
    gpus = row.required("num_gpus")
    if (row.number("gpus_per_node") or 0) > MAX_GPUS:  # (for people; the cluster gives nodes)
        raise SpecError(f"{row.where}.gpus_per_node", row.text("gpus_per_node"),
                        f"must be at most {MAX_GPUS:,}")
    model = _model(row, base, stack)
    if model.moe is None:
        _note_no_experts(row, model)
    plan = _plan(row, gpus, stack, model)
    if metric == "layer_fwd_bwd_time":
        if gpus != plan.tp:  # (its dp had been derived from the count, then refused as made up)
            raise SpecError(f"{row.where}.num_gpus", row.text("num_gpus"), "a layer_fwd_bwd_time "
                            f"row times one layer on its tp GPUs (tp = {plan.tp}): num_gpus "
                            "must equal tp")
        gpus = plan.tp
        if row.other("peak_memory_gib"):  # (it had been dropped without a word: a user trial's)
            raise SpecError(f"{row.where}.other_metrics",
                            f"peak_memory_gib={row.other('peak_memory_gib')}", "a "
                            "layer_fwd_bwd_time row times one layer, whose peak memory nestplan "
                            "does not predict: give it on a step_time row of the whole run")
    cluster = _cluster(row, base)
    per_node = row.number("gpus_per_node")
    if per_node is not None and per_node != cluster.host_size:  # (had been ignored: a user trial's)
        raise SpecError(f"{row.where}.gpus_per_node", row.text("gpus_per_node"),
                        f"the row's cluster {cluster.name} has {cluster.host_size} per node: give "
                        "a cluster (column: a catalog name or TOML) whose nodes hold them, or "
                        "leave it blank")
    sc = Scenario(model=model, cluster=cluster, gpus=gpus, training=_training(row, plan.dp),
                  stack=stack)
    free_mbs = (not row.text("micro_batch") and plan.mbs == 1
                and _local_batch(row, plan.dp, plan.pp) is None)
    if not row.text("recompute") and stack.default_recompute is not None:
        plan = plan.with_(recompute=(stack.default_recompute,))
    free_recompute = not row.text("recompute") and stack.default_recompute is None
    if metric == "step_time" and (free_mbs or free_recompute):
        local = row.other("local_batch")
        plan = _tuned(sc, plan, free_mbs=free_mbs, free_recompute=free_recompute,
                      local=int(local) if local else None)
    _note_flushes(row, sc, plan)
    check_plan(sc, plan)  # here, so that a plan's mistakes name the row
    return Case(row.text("id"), metric, row.seconds("step_time_s"), sc, plan,
                row.text("confidence"), _memory(row, sc.cluster.accelerator), row.where)


def _note_flushes(row: _Row, sc: Scenario, plan: Parallelism) -> None:
    """Say where a pipelined row's global batch is several local batches: torchtitan runs each
    accumulation step as a pipeline flush of its own (``train_step`` calls the schedule once
    per step, trainer.py, torchtitan 0.3.0 wheel), which nestplan's one flush of every
    micro-batch does not model (a reviewer's: such a row is predicted with fewer bubbles)."""
    local = row.other("local_batch")
    steps = sc.training.global_batch // (int(local) * plan.dp) if local else 1
    if plan.pp > 1 and steps > 1:
        warnings.warn(Note(f"{row.where}: local_batch={local} is {steps} accumulation steps of a "
                           f"pipeline of {plan.pp} stages, each its own flush in torchtitan; "
                           "predicted as one flush of all the micro-batches, with fewer bubbles "
                           "than the run has"), stacklevel=2)


def _note_no_experts(row: _Row, model: ModelSpec) -> None:
    """Say that a dense model's row states an expert load, which nothing reads (as ``evaluate``
    says of ``--moe-imbalance``; it had been ignored without a word: a fuzzing helper's)."""
    stated = [f"{k}={row.other(k)}" for k in ("moe_imbalance", "moe_capacity") if row.other(k)]
    if stated:
        from .errors import note_no_experts

        note_no_experts(f"{row.where}.other_metrics: {', '.join(stated)}", model.name)


def _by_row(row: _Row, e: SpecError) -> SpecError:
    """``e`` named by ``row`` (as it is where it already names the row)."""
    if e.field.startswith(row.where):
        return e
    return SpecError(f"{row.where}: {e.field}", e.value, e.rule, e.advice)


def _row_case(row: _Row, base: Path, stack: StackSpec | None,
              calibration: StackSpec | None = None) -> Case:
    """``_case``, its errors named by the row."""
    try:
        return _case(row, base, stack, calibration)
    except SpecError as e:
        raise _by_row(row, e) from None


def _own_error(row: _Row, base: Path, *, ran: bool) -> None:
    """Raise the error a row that ``--stack`` refuses has on its own stack, where that stack exists
    (under ``--stack`` it is set aside and need not): its plan refused there or, with ``ran``,
    needing far more than its devices hold (``check_ran``). A row right there returns."""
    try:
        row.stack(base, None)
    except SpecError:
        return
    case = _row_case(row, base, None)
    if ran:
        outcome(case)


def _local_batch(row: _Row, dp: int, pp: int) -> int | None:
    """``local_batch=N`` in ``other_metrics``: torchtitan's per-device batch of one forward, which
    its 2024 code ran as the step's one micro-batch: the micro-batch where ``micro_batch`` is
    blank and the global batch is N per data-parallel rank (``dp``: the column's, or derived from
    the GPU count) without pipelining (``pp``, however the row gives it); with gradient
    accumulation (the global batch a multiple of that, as torchtitan runs it since) or with
    pipelining, ``_tuned`` chooses it within the local batch. A global batch that is no whole
    number of local batches, or a local batch a given micro-batch does not divide, is refused (a
    sixth fuzzing round's: it had been ignored without a word where dp was derived or it
    disagreed)."""
    value = row.other("local_batch")  # a whole number > 0 where given (_Row)
    if not value:
        return None
    n = int(value)
    gb, micro = row.number("global_batch"), row.number("micro_batch")
    where, shown = f"{row.where}.other_metrics", f"local_batch={value}"
    if gb is not None and gb % (n * dp):
        raise SpecError(where, shown, f"global_batch {gb} must be a whole number of local batches "
                        f"over dp {dp} (a multiple of {n}·{dp} = {n * dp}); make them agree")
    if micro is not None:
        if n % micro:
            raise SpecError(where, shown, f"must be a multiple of micro_batch {micro} (the "
                            "micro-batches of one rank's forward)")
        return None
    # (under PP the local batch is the micro-batches of a flush, whose size _tuned chooses)
    return n if (gb is None or gb == n * dp) and pp == 1 else None


def _memory(row: _Row, acc: AcceleratorSpec) -> float | None:
    """The row's measured peak memory (``peak_memory_gib=X`` in ``other_metrics``), bytes: at
    most the HBM of its accelerator ``acc``."""
    value = row.other("peak_memory_gib")
    if not value:
        return None
    x = decimal(value)
    if x is None or x * GiB < MIN_PEAK:
        raise SpecError(f"{row.where}.other_metrics", f"peak_memory_gib={value}",
                        f"peak_memory_gib must be a number of GiB, at least "
                        f"{MIN_PEAK / GiB:g} (1 MiB)")
    if x * GiB > acc.hbm_bytes:
        raise SpecError(f"{row.where}.other_metrics", f"peak_memory_gib={value}",
                        f"more than the {acc.hbm_bytes / GiB:g} GiB of HBM of {acc.name}")
    return x * GiB


def load_cases(path: Path, *, include_lora: bool = False, stack: StackSpec | None = None,
               field: str = "--csv", set_aside: list[SetAside] | None = None,
               calibration: StackSpec | None = None) -> list[Case]:
    """Rows of a runs CSV (the columns of ``published_runs.csv``, see ``COLUMNS``) as cases
    (LoRA rows skipped unless asked). Optional columns: ``cluster`` (catalog name or TOML path
    relative to the CSV), ``stack`` (likewise; ``stack`` given here overrides it for every row),
    ``rank_order``, ``ep``, ``etp``, ``mtp_layers`` (blank: the model's own), ``stage_layers``
    (blocks per model chunk, space-separated: a stated pipeline layout); a blank ``layers`` makes
    ``model`` a catalog name or a model file (relative to the CSV); ``peak_memory_gib=X`` in
    ``other_metrics`` is a measured peak. Errors about the file name it as ``field``. With
    ``calibration``, each row runs on its stack with that stack's calibration
    (``StackSpec.calibrated_as``), its unstated micro-batch or recomputation chosen under it.

    With ``stack``, a row whose plan that stack refuses is checked on its own stack: a row wrong
    there is refused with its own error; else, with a ``set_aside`` list, the row joins the list
    and is left out, and without one the refusal names ``stack`` (calibrate)."""
    path = Path(path)
    cases, lora, unbatched = [], [], []
    for row in _rows(path, field):
        if row.regime() == "lora" and not include_lora:
            lora.append(row.text("id"))
            continue
        if row.number("global_batch") is None and not row.other("local_batch"):
            unbatched.append(row.text("id"))
        try:
            cases.append(_row_case(row, path.parent, stack, calibration))
        except SpecError as e:
            if stack is None:
                raise
            _own_error(row, path.parent, ran=False)
            left = SetAside.of(row.text("id"), e, row.where)
            if set_aside is None:
                raise SpecError(f"{row.where}: --stack", stack.name, f"cannot run this row's plan "
                                f"({left.why}); give a stack that runs every row, or leave the "
                                "row out") from None
            set_aside.append(left)
    if not cases and not set_aside:  # (rows set aside: the caller says which stack ran none)
        raise SpecError(field, str(path), "holds no run to check" + (
            f" (its {len(lora)} LoRA row{'s are' if len(lora) > 1 else ' is'} skipped)" if lora
            else ": it has a header and no rows"))  # (a pipeline engineer's header-only file)
    if lora:  # (they had been left out without a word: a user trial's)
        warnings.warn(Note(f"{path.name}: {len(lora)} lora row{'s' if len(lora) > 1 else ''} "
                           f"left out (frozen weights are not modelled): {', '.join(lora)}"),
                      stacklevel=2)
    if unbatched:  # (a torchtitan trial's file without the column was fitted without a word)
        warnings.warn(Note(f"{path.name}: {_rows_text(unbatched)} no global_batch: each step "
                           "read as one micro-batch per data-parallel replica (micro_batch x dp, "
                           "no gradient accumulation); give global_batch where the runs "
                           "accumulated"), stacklevel=2)
    return cases


def _rows_text(ids: list[str], shown: int = 5) -> str:
    """``ids`` as a note names them, e.g. "rows a, b give" or "7 rows (a, b, ...) give"."""
    if len(ids) == 1:
        return f"row {ids[0]} gives"
    if len(ids) <= shown:
        return f"rows {', '.join(ids)} give"
    return f"{len(ids)} rows ({', '.join(ids[:shown])}, ...) give"


def _rows(path: Path, field: str = "--csv") -> list[_Row]:
    """The rows of a runs CSV, its columns checked; each named by its line and id."""
    from .loaders import checked_name, regular_file

    regular_file(path, field, "CSV")
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f, strict=True)  # (strict: a quote never closed is an error)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                # a column of the file that is none of ours may be the missing one misnamed (a
                # user's step_time_ms had been met with "missing step_time_s" alone)
                unknown = [n for n in reader.fieldnames or [] if n not in COLUMNS + OPTIONAL_COLUMNS]
                meant = [(m, close[0]) for m in missing
                         if (close := difflib.get_close_matches(m, unknown, n=1))]
                hint = "".join(f" (the file's {u} is not one: the column is {m}"
                               + (", in seconds)" if m == "step_time_s" else ")")
                               for m, u in meant[:1])
                raise SpecError(f"{path}: columns", ", ".join(reader.fieldnames or []),
                                f"missing {', '.join(missing)}{hint}; every runs CSV has "
                                + ", ".join(COLUMNS))
            twice = sorted({n for n in reader.fieldnames if reader.fieldnames.count(n) > 1})
            if twice:  # the last would win without a word
                raise SpecError(f"{path}: column", twice[0], "given twice; name each column once")
            for name in reader.fieldnames:
                if name not in COLUMNS + OPTIONAL_COLUMNS:
                    close = difflib.get_close_matches(name, COLUMNS + OPTIONAL_COLUMNS, n=1)
                    hint = f"did you mean {close[0]}? " if close else ""
                    if name in OTHER_METRICS:  # (a pipeline engineer's peak_memory_gib column)
                        hint = (f"{name} goes in the other_metrics column, as {name}=X "
                                "(';' between entries); ")
                    raise SpecError(f"{path}: column", name, f"unknown; {hint}optional columns: "
                                    + ", ".join(OPTIONAL_COLUMNS))
            rows = []
            for data in reader:
                line = _first_line(reader.line_num, data)
                if None in data:  # fields beyond the header's columns
                    raise SpecError(f"{path.name} line {line}", data[None],
                                    f"more fields than the header's {len(reader.fieldnames)} "
                                    "columns")
                # a short row's last columns are blank (DictReader leaves them None), but one
                # every row needs had been refused as blank, not as missing from the row
                lost = [k for k in COLUMNS if k in data and data[k] is None]
                if lost:
                    given = sum(v is not None for v in data.values())
                    raise SpecError(f"{path.name} line {line}", f"{given} fields",
                                    f"fewer than the header's {len(reader.fieldnames)} columns, "
                                    f"without its {lost[0]}; a row gives every column, blank "
                                    "where not known")
                rows.append((line, data))
    except UnicodeDecodeError as e:
        raise SpecError(field, str(path), f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at "
                        f"offset {e.start}); give a runs CSV file") from None
    except (OSError, csv.Error) as e:
        why = ("a quoted field is never closed" if "unexpected end of data" in str(e) else str(e))
        raise SpecError(field, str(path), f"cannot read it as CSV ({why})") from None
    first: dict[str, int] = {}
    for i, data in rows:  # ids name rows in every report: one row each
        ident = (data.get("id") or "").strip()
        if not ident:
            raise SpecError(f"{path.name} line {i}: id", "", "every row needs an id of its own")
        checked_name(ident, f"{path.name} line {i}: id")  # (ids head report lines: one line each)
        if ident in first:
            raise SpecError(f"{path.name} line {i}: id", ident, f"also the id of line "
                            f"{first[ident]}; give every row an id of its own")
        first[ident] = i
    return [_Row(data, f"{path.name} line {i} ({data['id'].strip()})")
            for i, data in rows]


def _first_line(last: int, data: dict) -> int:
    """The line a CSV row starts on, given the line it ends on (``csv.reader.line_num``): a
    quoted field may hold line breaks (a multi-line note, or id, had been reported at its row's
    last line)."""
    fields = [v for v in data.values() if isinstance(v, str)]
    fields += [v for v in data.get(None) or () if isinstance(v, str)]
    return last - sum(len(re.findall(r"\r\n|\r|\n", v)) for v in fields)


def stacks_named(path: Path, field: str = "--csv", *, missing_ok: bool = False,
                 stated_only: bool = False) -> list[str]:
    """The distinct stacks a runs CSV's rows ran on, as ``load_cases`` reads them (the ``stack``
    column, a file relative to the CSV; else the stack a row's source names; else the default),
    in order of first appearance. ``missing_ok`` (under ``--stack``, which sets the rows' own
    aside, for its note): a file that does not exist is named as the column gives it, not
    refused; ``stated_only``: only the stacks rows name (the default is none of theirs)."""
    path = Path(path)
    named = []
    for row in _rows(path, field):
        if stated_only and not row.text("stack") and row.source_stack() is None:
            continue
        try:
            ref = row.stack_ref(path.parent)
            row.stack(path.parent, None)  # one that does not load is named by its row
        except SpecError as e:
            from .catalog import close_name, looks_like_path

            if not missing_ok:
                raise _by_row(row, e) from None
            # (set aside under --stack, which overrides the column: another framework's name,
            # "megatron-lm", or someone else's file; a likely slip is named so: a calibrating
            # user's "torchtitn" had read as a stack that merely does not load)
            close = None if looks_like_path(row.text("stack")) \
                else close_name("stacks", row.text("stack"))
            ref = f"{row.text('stack')} (does not load" + (
                f"; did you mean '{close}'?)" if close else ")")
        named.append(ref)
    return list(dict.fromkeys(named))


def rows_filled_in(path: Path, field: str = "--csv") -> tuple[list[str], list[str]]:
    """Ids of the (non-LoRA) rows read with the default stack, as no stack column value nor
    source names one, and of those read as bf16, as they give no precision."""
    path = Path(path)
    rows = [r for r in _rows(path, field) if r.regime() != "lora"]
    return ([r.text("id") for r in rows if not r.text("stack") and r.source_stack() is None],
            [r.text("id") for r in rows if not r.text("precision")])


def note_set_aside(named: list[str], given: str, how: str) -> None:
    """A note that ``--stack given`` sets aside the stacks the rows name (``named``, as
    ``stacks_named`` gives them; a file may be spelt two ways): the rows are then ``how``
    (fitted, predicted) as the given stack."""
    from .catalog import looks_like_path
    from .paths import real_path

    def same(name: str) -> bool:
        if looks_like_path(name) and looks_like_path(given):
            return real_path(name) == real_path(given)
        return name == given

    if not all(same(n) for n in named):
        import warnings

        from .errors import Note

        warnings.warn(f"the rows' own stacks ({', '.join(named)}) are set aside: the rows are "
                      f"{how} as --stack {given}", Note)


def files_named(path: Path, field: str = "--csv") -> set[Path]:
    """The files a runs CSV's rows name (model, cluster and stack columns given as paths, with
    the files these read: ``catalog.files_read``), resolved: what a command that writes must not
    replace."""
    from .catalog import files_read

    path = Path(path)
    out: set[Path] = set()
    for row in _rows(path, field):
        for key in ("model", "cluster", "stack"):
            if not row.text(key):
                continue
            try:
                out |= files_read(f"{key}s", row.path(key, path.parent))
            except SpecError:
                if key != "stack":
                    raise
                # a stack file that is missing or does not load (set aside under --stack; refused
                # where the rows' own stack is read)
    return out


def predict(case: Case, stack: StackSpec | None = None):
    """The model's prediction for the case's metric, seconds, and the plan's evaluation (None
    for a single-layer row); ``stack`` replaces the case's own."""
    from dataclasses import replace

    from .evaluate import evaluate, layer_time

    sc = case.scenario if stack is None else replace(case.scenario, stack=stack)
    if case.metric == "layer_fwd_bwd_time":
        return float(layer_time(sc, case.plan)), None
    ev = evaluate(sc, case.plan)
    return float(ev.step_time), ev


@dataclass(frozen=True)
class Outcome:
    case: Case
    predicted: float
    predicted_memory: float | None = None
    """Predicted peak bytes (step-time rows)."""

    @property
    def error(self) -> float:
        return self.predicted / self.case.measured - 1.0

    @property
    def memory_error(self) -> float | None:
        if self.case.memory is None or self.predicted_memory is None:
            return None
        return self.predicted_memory / self.case.memory - 1.0


@dataclass(frozen=True)
class SetAside:
    """A row that ``validate --stack`` leaves out, and why: the refusal of its plan by that
    stack, without the row's place (the row is named beside it) and without the refusal's
    advice, which is for a plan being chosen, not for one a measured run ran."""

    id: str
    field: str
    value: object
    rule: str

    @classmethod
    def of(cls, ident: str, e: SpecError, place: str) -> "SetAside":
        """Row ``ident``'s refusal ``e``, whose field may begin with the row's ``place``."""
        field = e.field
        for sep in (": ", "."):
            if field.startswith(place + sep):
                field = field[len(place) + len(sep):]
                break
        return cls(ident, field, e.value, e.rule)

    @property
    def why(self) -> str:
        """The refusal as an error would give it, without the advice."""
        return str(SpecError(self.field, self.value, self.rule))

    @property
    def kind(self) -> str:
        """The reason whatever the value: what rows set aside alike share."""
        return f"{self.field}: {self.rule}"


def run(path: Path, stack: StackSpec | None = None,
        set_aside: list[SetAside] | None = None) -> list[Outcome]:
    """Every row's outcome. With ``stack`` and a ``set_aside`` list (``validate --stack``: how
    that stack predicts the rows it can run), a row the stack cannot run, its plan refused or
    needing far more than the device holds (``check_ran``), joins the list."""
    path = Path(path)
    out = []
    rows: dict[str, _Row] = {}
    for case in load_cases(path, stack=stack, set_aside=set_aside):
        try:
            out.append(outcome(case))
        except SpecError as e:
            if stack is None or set_aside is None:
                raise
            rows = rows or {r.text("id"): r for r in _rows(path)}  # (read once, if at all)
            _own_error(rows[case.id], path.parent, ran=True)
            set_aside.append(SetAside.of(case.id, e, f"row {case.id}"))
    return out


def outcome(case: Case) -> Outcome:
    time, ev = predict(case)
    check_ran(case, ev)
    return Outcome(case, time, None if ev is None else ev.peak_memory)


MOST_OVER_HBM = 2.0
"""A measured run whose plan this memory model puts above this many times the device's memory is
refused: it ran, so its plan must be wrong (the model's largest over-prediction on the measured
runs' plans is 1.79x, NeMo 25.11's GPT-OSS-120B on 64 H100, whose row leaves recomputation
unstated and contradicts its own batch sizes; README "MoE runs")."""


def hbm_ratios(cases: list[Case]) -> list[tuple[float, Case]]:
    """(peak memory / HBM, case) of every step-time case's plan: a run that ran fitted, so a
    ratio above 1 points to the memory model or to a misstated plan (benchmarks/runs_fit.py)."""
    from .evaluate import evaluate

    out = []
    for case in cases:
        if case.metric != "layer_fwd_bwd_time":
            ev = evaluate(case.scenario, case.plan)
            out.append((ev.peak_memory / ev.capacity, case))
    return out


def check_ran(case: Case, ev) -> None:
    """Refuse a measured run (SpecError) whose plan cannot have fit by far (``MOST_OVER_HBM``)."""
    if ev is not None and ev.peak_memory > MOST_OVER_HBM * ev.capacity:
        from .textfmt import plan_short

        moe = case.scenario.model.moe is not None
        raise SpecError(f"row {case.id}: plan", plan_short(case.plan, moe),
                        f"needs {ev.peak_memory / GiB:.1f} GiB on a device of "
                        f"{ev.capacity / GiB:.1f} GiB by this memory model on stack "
                        f"{case.scenario.stack.name} (which fills in what the row leaves out), "
                        f"more than {MOST_OVER_HBM:g}x: a run that ran had another plan or "
                        "stack; give its recompute, zero_stage and degrees")


def report(outcomes: list[Outcome]) -> dict:
    """Every row and the summary, as ``validate --json`` prints them."""
    from .textfmt import plan_short

    rows = []
    for o in outcomes:
        # the plan predicted, blank knobs as the model chose them (as the text table's column;
        # a calibrating user's trial missed it in the JSON)
        plan = plan_short(o.case.plan, o.case.scenario.model.moe is not None)
        row = {"id": o.case.id, "metric": o.case.metric, "stack": o.case.scenario.stack.name,
               "plan": plan, "measured_s": o.case.measured, "predicted_s": o.predicted,
               "error": o.error}
        if o.case.memory is not None and o.predicted_memory is not None:
            row.update(measured_memory_gib=o.case.memory / GiB,
                       predicted_memory_gib=o.predicted_memory / GiB,
                       memory_error=o.memory_error)
        rows.append(row)
    return {"rows": rows, "count": len(rows), **tolerance_summary(
        [o.error for o in outcomes], [o.memory_error for o in outcomes])}


def mean_abs(errors) -> float:
    """The mean |error| of relative errors (signed fractions): validate's figure, and what
    calibrate prints of a fit's ``before``, ``after`` or ``loo`` and its notes compare."""
    return sum(abs(e) for e in errors) / len(errors)


def tolerance_summary(errors, memory_errors) -> dict:
    """The summary figures of step-time ``errors`` and peak-memory ``memory_errors`` (fractions,
    signed; None where a row has no peak) against the tolerance, and whether they keep it
    (``report``'s, and ``calibrate``'s after its fit)."""
    errors = [abs(e) for e in errors]
    mem = [abs(e) for e in memory_errors if e is not None]
    over = sum(1 for e in errors if e > ROW_TOLERANCE)
    memory_over = sum(1 for e in mem if e > MEMORY_TOLERANCE)
    mae = mean_abs(errors)
    return {"mean_abs_error": mae, "max_abs_error": max(errors), "rows_over": over,
            "memory_rows": len(mem), "memory_mean_abs_error": mean_abs(mem) if mem else None,
            "memory_max_abs_error": max(mem) if mem else None, "memory_rows_over": memory_over,
            "row_tolerance": ROW_TOLERANCE, "mean_tolerance": MEAN_TOLERANCE,
            "memory_tolerance": MEMORY_TOLERANCE,
            "ok": over == 0 and mae <= MEAN_TOLERANCE and memory_over == 0}


def table(outcomes: list[Outcome]) -> str:
    """A per-row text table with the mean absolute error (times in seconds)."""
    from .textfmt import aligned, plan_short, seconds

    if not outcomes:
        return "no rows"
    rows = []
    for o in outcomes:
        memory = (f"memory {o.case.memory / GiB:.1f} GiB, predicted "
                  f"{o.predicted_memory / GiB:.1f} ({o.memory_error * 100:+.1f}%)"
                  if o.memory_error is not None else "")
        moe = o.case.scenario.model.moe is not None
        rows.append([o.case.id, o.case.scenario.stack.name, plan_short(o.case.plan, moe),
                     seconds(o.case.measured), seconds(o.predicted), f"{o.error * 100:+.1f}%",
                     memory])
    header = ("id", "stack", "plan", "measured s", "predicted s", "error", "")
    lines = aligned(header, rows, right={3, 4, 5})
    mae = mean_abs([o.error for o in outcomes])
    worst = max(outcomes, key=lambda o: abs(o.error))
    lines.append(f"rows {len(outcomes)}  mean |error| {mae * 100:.1f}%  worst {worst.case.id} "
                 f"{worst.error * 100:+.1f}%")
    return "\n".join(lines)
