"""Validation against measured training runs (``shared/data/published_runs.csv``, and the
held-out runs of ``tests/data/held_out_runs.csv``).

Each row names a model, a cluster and a plan, sometimes with gaps. Gaps are filled by rules that
depend only on the software the run used (its ``software`` column, or its id's prefix), never on
the row's measured time:

* ``megatron-2021`` / ``megatron-2022``, Megatron-LM on Selene (``nar21-*``, ``kor22-*``):
  attention materialised (FlashAttention did not exist yet), dropout, tied embeddings, fp16
  gradients all-reduced without overlap, no tensor-parallel overlap for Narayanan (early 2021)
  and backward overlap for Korthikanti (2022); no interleaving when the paper does not say; a
  model-parallel size without a t/p split uses t = 8 (one node), as every large run of the paper
  does. ZeRO-3 rows are DeepSpeed of 2021: flat data-parallel rings (see
  ``TrainingSpec.flat_dp_collectives``).
* ``megatron-deepspeed``, Megatron-DeepSpeed of 2021-22 (MT-NLG, BLOOM): as ``megatron-2021``,
  with DeepSpeed's pipeline engine, whose sends and receives block (no p2p overlap).
* ``megatron-core``, Megatron-Core on H100 (``mlm24-*``): flash attention, untied embeddings (the
  README's parameter counts), distributed optimizer with overlapped gradient reduce and parameter
  gather, full TP overlap (``--tp-comm-overlap``, which needs sequence parallelism), fp32
  gradients. Also the rule for a row of unknown software.
* ``nemo``, NeMo on DGX H100 (``nemo2407-*``): the launcher configs: flash attention, distributed
  optimizer with bf16 gradient sync, overlapped DP communication, sequence parallelism when
  tp > 1, backward TP overlap.

Benchmark runs were tuned for speed and fitted in memory: when a row states no micro-batch size
(or, outside NeMo, no recomputation), the fastest setting that fits according to this model is
assumed (``_tuned``). Packed SQuAD fine-tuning attends within each ~256-token example.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from .options import AttentionImpl, MLPKind, Norm, Position, Precision, Recompute, TPOverlap
from .errors import SpecError
from .axes import parse_order
from .specs import ModelSpec, MoESpec, Parallelism, Scenario, TrainingSpec, check_plan

CLUSTER_OF = {"A100-SXM4-80GB": "selene-a100-hdr", "H100-SXM5-80GB": "dgx-h100-ndr",
              "H200": "dgx-h200-ndr", "B200": "dgx-b200-ndr"}
"""The cluster of a row that names only its GPU: the published runs' clusters (``clusters.md``),
and NVIDIA's DGX designs for the newer GPUs. A ``cluster`` column (a catalog name, or a TOML
path relative to the CSV) overrides it."""
GPU_ALIASES = {"A100-SXM-80GB": "A100-SXM4-80GB", "A100-80GB": "A100-SXM4-80GB",
               "H100-SXM-80GB": "H100-SXM5-80GB", "H100-80GB": "H100-SXM5-80GB",
               "H100": "H100-SXM5-80GB", "H200-SXM-141GB": "H200", "B200-SXM-180GB": "B200"}
SOFTWARE_OF_SOURCE = {"nar21": "megatron-2021", "kor22": "megatron-2022", "mlm24": "megatron-core",
                      "nemo2407": "nemo"}
"""The software stack of a row, by its id's prefix; a ``software`` column overrides it."""
SOFTWARE = ("megatron-2021", "megatron-2022", "megatron-deepspeed", "megatron-core", "nemo")
COLUMNS = ("id", "model", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
           "seq_len", "gpu", "num_gpus", "tp", "pp", "vp", "dp", "cp", "zero_stage",
           "sequence_parallel", "recompute", "micro_batch", "global_batch", "precision", "regime",
           "metric", "step_time_s", "confidence")
"""Columns every runs CSV has (those of ``published_runs.csv`` that the model reads)."""
METRICS = ("step_time", "layer_fwd_bwd_time")
# Packed fine-tuning on SQuAD v1.1: attention stays inside each example (block-diagonal).
# SQuAD paragraphs average ~120 words (Rajpurkar et al. 2016); with the question and the prompt
# template an example is ~256 Llama tokens. An assumption, stated here once.
SQUAD_PACKED_SPAN = 256
ROW_TOLERANCE = 0.15
MEAN_TOLERANCE = 0.07


@dataclass(frozen=True)
class Case:
    """A measured run turned into a scenario and a plan."""

    id: str
    metric: str
    measured: float
    scenario: Scenario
    plan: Parallelism
    confidence: str


class _Row:
    """One CSV row; malformed fields raise a SpecError naming the row and the column."""

    MAY_BE_ZERO = ("zero_stage", "shared_experts")

    def __init__(self, data: dict, where: str):
        self.data, self.where = data, where
        self._software: str | None = None

    def text(self, key: str) -> str:
        return (self.data.get(key) or "").strip()

    def number(self, key: str, default: int | None = None) -> int | None:
        v = self.text(key)
        if not v:
            return default
        try:
            n = int(v)
        except ValueError:
            raise SpecError(f"{self.where}.{key}", v, "must be a whole number") from None
        if n < 0 or (n == 0 and key not in self.MAY_BE_ZERO):
            raise SpecError(f"{self.where}.{key}", v, "must be >= 0" if key in self.MAY_BE_ZERO
                            else "must be positive")
        return n

    def seconds(self, key: str) -> float:
        v = self.text(key)
        try:
            x = float(v)
        except ValueError:
            x = float("nan")
        if not 0 < x < float("inf"):
            raise SpecError(f"{self.where}.{key}", v, "must be a positive number of seconds")
        return x

    def yes_no(self, key: str) -> bool | None:
        v = self.text(key).lower()
        if v not in ("", "yes", "no"):
            raise SpecError(f"{self.where}.{key}", v, "allowed: yes, no, or blank")
        return None if not v else v == "yes"

    def required(self, key: str) -> int:
        n = self.number(key)
        if n is None:
            raise SpecError(f"{self.where}.{key}", "", "must be given")
        return n

    def path(self, key: str, base: Path) -> str:
        """The column as a catalog name, or as a file path relative to the CSV."""
        name = self.text(key)
        if "/" not in name and not name.endswith((".toml", ".json")):
            return name
        path = base / name
        if not path.is_file():
            raise SpecError(f"{self.where}.{key}", name, f"no such file ({path})")
        return str(path)

    def software(self) -> str:
        if self._software is None:
            given = self.text("software")
            if given and given not in SOFTWARE:
                raise SpecError(f"{self.where}.software", given, "allowed: " + ", ".join(SOFTWARE))
            # a run of unknown provenance is taken as today's Megatron-Core defaults
            self._software = given or SOFTWARE_OF_SOURCE.get(self.text("id").split("-")[0],
                                                             "megatron-core")
        return self._software


def _model(row: _Row, base: Path) -> ModelSpec:
    name = row.text("model")
    if not row.text("layers"):  # a catalog model, TOML or config.json named in the model column
        from .catalog import get_model

        return get_model(row.path("model", base))
    h, heads = row.required("hidden"), row.required("heads")
    llama, nemotron = "llama" in name.lower(), "nemotron" in name.lower()
    soft = row.software()
    if llama:
        mlp, norm, bias, pos = MLPKind.SWIGLU, Norm.RMSNORM, False, Position.ROPE
    elif nemotron:
        mlp, norm, bias, pos = MLPKind.SQUARED_RELU, Norm.LAYERNORM, False, Position.ROPE
    else:
        mlp, norm, bias, pos = MLPKind.GELU, Norm.LAYERNORM, True, Position.LEARNED
    gpt = not (llama or nemotron)
    if h % heads:
        raise SpecError(f"{row.where}.heads", heads, f"must divide hidden = {h}")
    experts = row.number("experts")
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
        tied_embeddings=gpt and soft != "megatron-core", moe=moe,
    )


def _training(row: _Row) -> TrainingSpec:
    soft = row.software()
    seq = row.required("seq_len")
    gb = row.number("global_batch") or row.required("micro_batch")
    precision = Precision.parse(f"{row.where}.precision", row.text("precision") or "bf16")
    if soft in ("megatron-2021", "megatron-2022", "megatron-deepspeed"):
        zero3 = row.text("zero_stage") == "3" and soft == "megatron-2021"  # DeepSpeed of 2021
        return TrainingSpec(seq_len=seq, global_batch=gb, precision=precision,
                            attention=AttentionImpl.MATERIALIZED, grad_bytes=2,
                            overlap_grad_reduce=False, overlap_param_gather=False,
                            tp_overlap=TPOverlap.BACKWARD if soft == "megatron-2022"
                            else TPOverlap.NONE,
                            # DeepSpeed's pipeline engine sends and receives synchronously
                            # (runtime/pipe/p2p.py asserts async_op == False)
                            overlap_p2p=soft != "megatron-deepspeed",
                            flat_dp_collectives=zero3)
    if soft == "megatron-core":
        return TrainingSpec(seq_len=seq, global_batch=gb, precision=precision,
                            attention=AttentionImpl.FLASH, grad_bytes=4, tp_overlap=TPOverlap.FULL)
    return TrainingSpec(seq_len=seq, global_batch=gb, precision=precision,
                        attention=AttentionImpl.FLASH, grad_bytes=2, tp_overlap=TPOverlap.BACKWARD,
                        attention_span=SQUAD_PACKED_SPAN if row.text("regime") in ("sft", "lora")
                        else None)


def _plan(row: _Row, gpus: int) -> Parallelism:
    soft = row.software()
    tp, pp = row.number("tp"), row.number("pp")
    if tp is None:  # Narayanan Table 2 gives only the model-parallel size t·p
        other = row.text("other_metrics")
        mp = other.split("model_parallel_size=")[1].split(";")[0] if "model_parallel_size=" in other \
            else ""
        if not mp.isdigit() or int(mp) % 8 or int(mp) == 0:
            raise SpecError(f"{row.where}.tp", "", "must be given (or model_parallel_size=N, a "
                            "multiple of 8, in other_metrics)")
        mp = int(mp)
        tp, pp = 8, mp // 8
    pp = pp or 1
    cp = row.number("cp", 1)
    dp = row.number("dp") or gpus // (tp * pp * cp)
    zero = row.number("zero_stage")
    if zero is None:
        zero = 1 if soft in ("megatron-core", "nemo") else 0
    # NeMo's launcher configs set no activation checkpointing; elsewhere see _case
    rec = row.text("recompute") or "none"
    sp = row.yes_no("sequence_parallel")
    if sp is None:
        sp = soft in ("megatron-core", "nemo") and tp > 1
    order = row.text("rank_order")
    return Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=row.number("ep", 1), etp=row.number("etp"),
                       vp=row.number("vp", 1), sp=sp,
                       zero=zero, recompute=(Recompute.parse(f"{row.where}.recompute", rec),),
                       mbs=row.number("micro_batch", 1),  # see _tuned when unstated
                       **({"rank_order": parse_order(order)} if order else {}))


def _tuned(sc: Scenario, plan: Parallelism, *, free_mbs: bool, free_recompute: bool) -> Parallelism:
    """Fill unstated knobs of a benchmark run: the run fitted in memory and was tuned for speed,
    so take the fastest micro-batch size and/or recomputation that fits (by this model)."""
    from .evaluate import evaluate

    per_replica = sc.training.global_batch // plan.dp
    sizes = [d for d in range(1, per_replica + 1) if per_replica % d == 0] if free_mbs else [plan.mbs]
    policies = list(Recompute) if free_recompute else [plan.recompute[0]]
    best, best_time = None, float("inf")
    for mbs in sizes:
        for policy in policies:
            candidate = plan.with_(mbs=mbs, recompute=(policy,))
            try:
                ev = evaluate(sc, candidate)
            except SpecError:
                continue
            if ev.fits and ev.step_time < best_time:
                best, best_time = candidate, ev.step_time
    return best or plan.with_(recompute=(Recompute.FULL,) if free_recompute else plan.recompute)


def _cluster(row: _Row, base: Path):
    from .catalog import get_cluster

    if row.text("cluster"):
        return get_cluster(row.path("cluster", base))
    gpu = row.text("gpu").upper()
    gpu = GPU_ALIASES.get(gpu, gpu)
    if gpu not in CLUSTER_OF:
        raise SpecError(f"{row.where}.gpu", gpu, "known: " + ", ".join(CLUSTER_OF)
                        + "; or name a catalog cluster (or cluster TOML) in a cluster column")
    return get_cluster(CLUSTER_OF[gpu])


def _case(row: _Row, base: Path) -> Case:
    metric = row.text("metric")
    if metric not in METRICS:
        raise SpecError(f"{row.where}.metric", metric, "allowed: " + ", ".join(METRICS))
    gpus = row.required("num_gpus")
    plan = _plan(row, gpus)
    if metric == "layer_fwd_bwd_time":
        gpus = plan.tp
    sc = Scenario(model=_model(row, base), cluster=_cluster(row, base), gpus=gpus,
                  training=_training(row))
    free_mbs = not row.text("micro_batch")
    free_recompute = not row.text("recompute") and row.software() != "nemo"
    if metric == "step_time" and (free_mbs or free_recompute):
        plan = _tuned(sc, plan, free_mbs=free_mbs, free_recompute=free_recompute)
    check_plan(sc, plan)  # here, so that a plan's mistakes name the row
    return Case(row.text("id"), metric, row.seconds("step_time_s"), sc, plan,
                row.text("confidence"))


def load_cases(path: Path, *, include_lora: bool = False) -> list[Case]:
    """Rows of a runs CSV (the columns of ``published_runs.csv``, see ``COLUMNS``) as cases
    (LoRA rows skipped unless asked). Optional columns: ``cluster`` (catalog
    name or TOML path relative to the CSV), ``software`` (one of ``SOFTWARE``), ``rank_order``,
    ``ep``, ``etp``; a blank ``layers`` makes ``model`` a catalog name or a model file (relative
    to the CSV)."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise SpecError(f"{path}: missing columns", ", ".join(missing),
                                "a runs CSV needs the columns of published_runs.csv")
            rows = []
            for data in reader:
                rows.append((reader.line_num, data))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise SpecError("--csv", str(path), f"cannot read it as CSV ({e})") from None
    cases = []
    for i, data in rows:
        row = _Row(data, f"{path.name} line {i} ({(data.get('id') or '').strip() or 'no id'})")
        if row.text("regime") == "lora" and not include_lora:
            continue
        try:
            cases.append(_case(row, path.parent))
        except SpecError as e:
            if e.field.startswith(row.where):
                raise
            raise SpecError(f"{row.where}: {e.field}", e.value, e.allowed) from None
    if not cases:
        raise SpecError("--csv", str(path), "holds no run to check (LoRA rows are skipped)")
    return cases


def predict(case: Case) -> float:
    """The model's prediction for the case's metric, seconds."""
    from .evaluate import evaluate, layer_time

    if case.metric == "layer_fwd_bwd_time":
        return layer_time(case.scenario, case.plan)
    return evaluate(case.scenario, case.plan).step_time


@dataclass(frozen=True)
class Outcome:
    case: Case
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.case.measured - 1.0


def run(path: Path) -> list[Outcome]:
    return [Outcome(c, predict(c)) for c in load_cases(path)]


def table(outcomes: list[Outcome]) -> str:
    """A per-row text table with the mean absolute error."""
    lines = [f"{'id':40s} {'conf':6s} {'plan':28s} {'measured':>10s} {'predicted':>10s} {'error':>7s}"]
    for o in outcomes:
        p = o.case.plan
        desc = (f"t{p.tp} p{p.pp} d{p.dp}" + (f" c{p.cp}" if p.cp > 1 else "")
                + (f" v{p.vp}" if p.vp > 1 else "") + (" sp" if p.sp else "")
                + f" z{p.zero} {p.recompute[0].value[:3]} b{p.mbs}")
        lines.append(f"{o.case.id:40s} {o.case.confidence:6s} {desc:28s} {o.case.measured:10.4f} "
                     f"{o.predicted:10.4f} {o.error * 100:+6.1f}%")
    mae = sum(abs(o.error) for o in outcomes) / len(outcomes)
    worst = max(outcomes, key=lambda o: abs(o.error))
    lines.append(f"rows {len(outcomes)}  mean |error| {mae * 100:.1f}%  worst {worst.case.id} "
                 f"{worst.error * 100:+.1f}%")
    return "\n".join(lines)
