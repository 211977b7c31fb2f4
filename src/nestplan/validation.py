"""Validation against measured training runs (``shared/data/published_runs.csv``).

Each row names a model, a cluster and a plan, sometimes with gaps. Gaps are filled by rules that
depend only on the software the run used (its source), never on the row's measured time:

* Megatron-LM 2021-22 on Selene (``nar21-*``, ``kor22-*``): attention materialised (FlashAttention
  did not exist yet), dropout, tied embeddings, fp16 gradients all-reduced without overlap, no
  tensor-parallel overlap for Narayanan (early 2021) and backward overlap for Korthikanti (2022);
  no interleaving when the paper does not say; a model-parallel size without a t/p split uses
  t = 8 (one node), as every large run of the paper does. ZeRO-3 rows are DeepSpeed of 2021:
  flat data-parallel rings (see ``TrainingSpec.flat_dp_collectives``).
* Megatron-Core on H100 (``mlm24-*``): flash attention, untied embeddings (the README's parameter
  counts), distributed optimizer with overlapped gradient reduce and parameter gather, full TP
  overlap (``--tp-comm-overlap``, which needs sequence parallelism), bf16, fp32 gradients.
* NeMo 24.07 on DGX H100 (``nemo2407-*``): the launcher configs: fp8, flash attention, distributed
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
from .specs import ModelSpec, Parallelism, Scenario, TrainingSpec

CLUSTER_OF = {"A100-SXM4-80GB": "selene-a100-hdr", "H100-SXM5-80GB": "dgx-h100-ndr"}
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


def _int(row: dict, key: str, default: int | None = None) -> int | None:
    v = row.get(key, "").strip()
    return int(v) if v else default


def _source(row: dict) -> str:
    return row["id"].split("-")[0]


def _model(row: dict) -> ModelSpec:
    name = row["model"].lower()
    h = _int(row, "hidden")
    heads = _int(row, "heads")
    llama, nemotron = "llama" in name, "nemotron" in name
    src = _source(row)
    if llama:
        mlp, norm, bias, pos = MLPKind.SWIGLU, Norm.RMSNORM, False, Position.ROPE
    elif nemotron:
        mlp, norm, bias, pos = MLPKind.SQUARED_RELU, Norm.LAYERNORM, False, Position.ROPE
    else:
        mlp, norm, bias, pos = MLPKind.GELU, Norm.LAYERNORM, True, Position.LEARNED
    gpt = not (llama or nemotron)
    return ModelSpec(
        name=row["model"], layers=_int(row, "layers"), hidden=h, heads=heads,
        kv_heads=_int(row, "kv_heads", heads), head_dim=h // heads,
        ffn_hidden=_int(row, "ffn_hidden", 4 * h),
        vocab=_int(row, "vocab", 50257),  # NeMo GPT-3: GPT-2 BPE, padded by the framework
        mlp=mlp, norm=norm, bias=bias, dropout=gpt, position=pos,
        max_positions=_int(row, "seq_len") if pos is Position.LEARNED else 0,
        tied_embeddings=gpt and src != "mlm24",
    )


def _training(row: dict) -> TrainingSpec:
    src = _source(row)
    seq = _int(row, "seq_len")
    gb = _int(row, "global_batch") or _int(row, "micro_batch")
    if src in ("nar21", "kor22"):
        deepspeed = row["zero_stage"] == "3"
        return TrainingSpec(seq_len=seq, global_batch=gb, precision=Precision.BF16,
                            attention=AttentionImpl.MATERIALIZED, grad_bytes=2,
                            overlap_grad_reduce=False, overlap_param_gather=False,
                            tp_overlap=TPOverlap.NONE if src == "nar21" else TPOverlap.BACKWARD,
                            flat_dp_collectives=deepspeed)
    if src == "mlm24":
        return TrainingSpec(seq_len=seq, global_batch=gb, precision=Precision.BF16,
                            attention=AttentionImpl.FLASH, grad_bytes=4, tp_overlap=TPOverlap.FULL)
    return TrainingSpec(seq_len=seq, global_batch=gb, precision=Precision.parse(
        "precision", row["precision"] or "bf16"), attention=AttentionImpl.FLASH, grad_bytes=2,
        tp_overlap=TPOverlap.BACKWARD,
        attention_span=SQUAD_PACKED_SPAN if row["regime"] in ("sft", "lora") else None)


def _plan(row: dict, gpus: int) -> Parallelism:
    src = _source(row)
    tp, pp = _int(row, "tp"), _int(row, "pp")
    if tp is None:  # Narayanan Table 2 gives only the model-parallel size t·p
        mp = int(row["other_metrics"].split("model_parallel_size=")[1].split(";")[0])
        tp, pp = 8, mp // 8
    cp = _int(row, "cp", 1)
    dp = _int(row, "dp") or gpus // (tp * pp * cp)
    zero = _int(row, "zero_stage")
    if zero is None:
        zero = 1 if src in ("mlm24", "nemo2407") else 0
    # NeMo's launcher configs set no activation checkpointing; elsewhere see load_cases
    rec = row["recompute"] or "none"
    sp_col = row["sequence_parallel"]
    sp = (sp_col == "yes") if sp_col else (src in ("mlm24", "nemo2407") and tp > 1)
    return Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, vp=_int(row, "vp", 1), sp=sp, zero=zero,
                       recompute=(Recompute.parse("recompute", rec),),
                       mbs=_int(row, "micro_batch", 1))  # see _tuned when unstated


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


def load_cases(path: Path, *, include_lora: bool = False) -> list[Case]:
    """Rows of a published-runs CSV as cases (LoRA rows skipped unless asked)."""
    from .catalog import get_cluster

    cases = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["regime"] == "lora" and not include_lora:
                continue
            gpus = _int(row, "num_gpus")
            plan = _plan(row, gpus)
            if row["metric"] == "layer_fwd_bwd_time":
                gpus = plan.tp
            sc = Scenario(model=_model(row), cluster=get_cluster(CLUSTER_OF[row["gpu"]]), gpus=gpus,
                          training=_training(row))
            free_mbs = not row["micro_batch"]
            free_recompute = not row["recompute"] and _source(row) != "nemo2407"
            if row["metric"] == "step_time" and (free_mbs or free_recompute):
                plan = _tuned(sc, plan, free_mbs=free_mbs, free_recompute=free_recompute)
            cases.append(Case(row["id"], row["metric"], float(row["step_time_s"]), sc, plan,
                              row["confidence"]))
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
