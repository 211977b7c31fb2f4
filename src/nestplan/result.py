"""The result of evaluating a plan: metrics and typed breakdowns of time and memory."""

from __future__ import annotations

from dataclasses import dataclass, fields

from .cost.memory import MemoryBreakdown
from .specs import Parallelism, Scenario, capped_moe_load, embedding_copies, uneven_split
from .units import TFLOPS, GiB, fmt_gib, fmt_gib_against


def scenario_json(sc: Scenario) -> dict:
    """What a ``--json`` output says of its scenario: model, cluster, size, workload (with the
    packed documents' attention span, null for the whole sequence) and stack, the MoE workload's
    settings (null without experts) and the MTP depths trained."""
    return {
        "model": sc.model.name,
        "cluster": sc.cluster.name,
        "gpus": sc.gpus,
        "seq_len": sc.training.seq_len,
        "global_batch": sc.training.global_batch,
        "precision": sc.training.precision.value,
        "stack": sc.stack.name,
        "attention_span": sc.training.attention_span,
        "moe_imbalance": sc.training.moe_imbalance if sc.model.moe is not None else None,
        "moe_capacity_factor": sc.training.moe_capacity if sc.model.moe is not None else None,
        "mtp_layers": sc.model.mtp_layers,
    }


SUMMARY_KEYS = ("step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "fits", "tp", "pp", "dp",
                "cp", "ep", "vp", "schedule", "sp", "zero", "recompute", "mbs", "rank_order")
"""The keys of :meth:`Evaluation.to_json` that summarise a plan in one row."""


@dataclass(frozen=True, kw_only=True)
class TimeBreakdown:
    """One step, seconds, split so that the parts add up to the step time.

    Per-micro-batch work is counted on the pipeline's slowest device (the one that sets the
    steady state); ``bubble`` is the rest of the schedule's span.
    """

    compute: float
    """Forward + backward compute."""
    recompute: float
    """Forward passes repeated by activation recomputation (their host waits are ``host``)."""
    host: float
    """Forward time waiting on the host (MoE layers: ``StackSpec.moe_layer_host``), in the
    forward and in the forward passes that recomputation runs again."""
    tp: float
    """Exposed tensor-parallel communication (including expert-TP)."""
    cp: float
    """Exposed context-parallel K/V exchange."""
    ep: float
    """Exposed expert-parallel all-to-all."""
    zero: float
    """Exposed per-micro-batch ZeRO-2/3 gathers and reduce-scatters."""
    pp: float
    """Exposed pipeline send/recv."""
    bubble: float
    """Pipeline fill and drain."""
    dp: float
    """Exposed data-parallel traffic at the step's end: the gradient reduction after the last
    backward and the sharded optimizer's parameter all-gather."""
    embedding: float
    """Exposed all-reduce of the embedding's gradient with its copy on the last stage (a tied
    output weight, multi-token prediction's table) at the step's end, beside dp's reduction."""
    optimizer: float
    """Optimizer step (memory-bound: reads and writes the device's optimizer state)."""
    step_host: float = 0.0
    """Per-step host time that overlaps nothing (the stack's ``step_overhead``: launches,
    data loading, logging, the loss's synchronisation)."""

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True, kw_only=True)
class StageReport:
    """One pipeline stage (physical device position)."""

    index: int
    blocks: tuple[tuple[int, int], ...]
    """Transformer blocks per model chunk on this stage, as [first, last) ranges."""
    has_embedding: bool
    has_head: bool
    time_per_microbatch: float
    """Forward + backward (+ recompute) of one micro-batch, seconds."""
    chunk_fwd: tuple[float, ...]
    """Forward seconds of one micro-batch through each model chunk of this stage."""
    chunk_bwd: tuple[float, ...]
    """Backward (+ recompute) seconds of one micro-batch through each model chunk."""
    chunk_wgt: tuple[float, ...]
    """The weight-gradient part of ``chunk_bwd`` (a split schedule runs it apart)."""
    send: float
    """Seconds to send one micro-batch's activations (or gradients) to the next stage."""
    end: float
    """Seconds after this stage's last operation: exposed gradient reduction, optimizer step."""
    memory: MemoryBreakdown
    recompute: str
    devices: tuple[int, ...]
    """Device ids running this stage (every replica and TP/CP rank)."""


def stage_times(stages) -> tuple[list, list, list, list]:
    """The stages' per-chunk forward, backward and weight-gradient seconds and their sends, as
    ``schedule.simulate`` takes them: (fwd, bwd, send, wgt)."""
    return ([list(s.chunk_fwd) for s in stages], [list(s.chunk_bwd) for s in stages],
            [s.send for s in stages], [list(s.chunk_wgt) for s in stages])


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What a plan does on a cluster."""

    scenario: Scenario
    plan: Parallelism
    micro_batches: int
    """Micro-batches per replica per step."""
    step_time: float
    """Seconds per optimizer step."""
    tokens_per_s: float
    model_flops: float
    """Model FLOP per step (full attention, no recompute: the usual MFU convention)."""
    logged_model_flops: float = 0.0
    """Model FLOP per step as the framework of the stack's export format logs them
    (``evaluate.framework_flops_per_sequence``): Megatron-LM since 8873b55d6a (2025-03-06) with
    attention over the whole sequence and its core at half for the causal mask, torchtitan with
    attention unmasked over all of seq_len whatever the document masks; MFU's count for others."""
    hardware_flops: float
    """FLOP actually executed per step (causal masking skipped, recomputation included)."""
    time: TimeBreakdown
    link_time: dict[str, float]
    """Per axis, seconds of one step its collectives occupy the links (hidden or not)."""
    stages: tuple[StageReport, ...]
    eager_kernels: float
    """Seconds of ``time.compute`` spent in eager kernels that a fused one would replace
    (``StackSpec.eager_ops``)."""
    last_stage: int = 0
    """The stage whose step ends last: ``time``'s dp, embedding and optimizer are its, as is
    ``link_time``'s dp beside the slowest stage's ZeRO traffic (a datacenter trial's data-parallel
    time fell from 1:1 to 4:1 oversubscription, the stage having changed unnamed)."""
    uneven_chunks: float = 0.0
    """Seconds a schedule whose chunks on a device hold different numbers of blocks ends later,
    simulated with each chunk's own time (``schedule.simulate``), than the closed form, which
    spreads each device's blocks evenly over its chunks; in ``step_time`` and ``time.bubble``
    (two user trials: the search had ranked first a plan whose simulation was 7 % later than the
    next plan's)."""

    @property
    def gpus(self) -> int:
        return self.scenario.gpus

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops / self.step_time / self.gpus / TFLOPS

    @property
    def logged_tflops_per_gpu(self) -> float:
        """Model TFLOP/s per GPU as the stack's framework logs them (``logged_model_flops``):
        Megatron-LM's "throughput per GPU (TFLOP/s/GPU)", torchtitan's "tflops"."""
        return self.logged_model_flops / self.step_time / self.gpus / TFLOPS

    @property
    def peak_flops(self) -> float:
        return self.scenario.cluster.accelerator.peak_flops(self.scenario.training.precision)

    @property
    def mfu(self) -> float:
        """Model FLOP utilisation against the peak of the matmul precision in use. Model FLOP as
        PaLM counts them (and Megatron-LM did until 2025-03: ``logged_tflops_per_gpu``):
        attention over each query's whole context (the sequence, or its document or window) as
        if unmasked, no recomputation; with causal attention at long sequences it exceeds
        ``hfu``, and can exceed 1."""
        return self.model_flops / self.step_time / self.gpus / self.peak_flops

    @property
    def hfu(self) -> float:
        """Hardware FLOP utilisation: the FLOP the devices run (causal attention's masked half
        skipped, recomputation included) against the same peak."""
        return self.hardware_flops / self.step_time / self.gpus / self.peak_flops

    @property
    def peak_memory(self) -> float:
        return max(s.memory.total for s in self.stages)

    @property
    def capacity(self) -> float:
        return self.scenario.cluster.accelerator.hbm_bytes

    @property
    def fits(self) -> bool:
        """The predicted peak fits in HBM."""
        return self.peak_memory <= self.capacity

    @property
    def margin(self) -> float:
        """HBM left free at the predicted peak, bytes (negative when it does not fit)."""
        return self.capacity - self.peak_memory

    @property
    def headroom(self) -> float:
        """The margin a recommended plan keeps (``Scenario.memory_headroom`` of HBM), bytes."""
        return self.capacity * self.scenario.memory_headroom

    @property
    def within_headroom(self) -> bool:
        """It fits with the headroom to spare: what ``plan`` recommends."""
        return self.peak_memory <= self.scenario.memory_limit

    @property
    def worst_stage(self) -> StageReport:
        return max(self.stages, key=lambda s: s.memory.total)

    @property
    def slowest_stage(self) -> int:
        """The pipeline stage whose micro-batch takes longest: ``time``'s per-micro-batch parts
        (compute, recompute, host, tp, cp, ep, zero, pp) and ``link_time``'s tp, cp and ep are
        its."""
        return max(self.stages, key=lambda s: s.time_per_microbatch).index

    @property
    def why_not(self) -> str | None:
        """Why the plan does not fit, or None."""
        if self.fits:
            return None
        s = self.worst_stage
        m = s.memory
        big = max(("activations", m.activations), ("optimizer", m.optimizer),
                  ("weights", m.weights), ("gradients", m.gradients), ("transient", m.transient),
                  ("reserved", m.reserved), key=lambda kv: kv[1])
        need, capacity = fmt_gib_against(m.total, self.capacity)
        return (f"stage {s.index} needs {need} GiB of {capacity} GiB "
                f"(short by {fmt_gib(m.total - self.capacity)} GiB; largest part: {big[0]} "
                f"{big[1] / GiB:.1f} GiB)")

    def schedule_ops(self) -> list:
        """Every operation of one step under the plan's schedule (``schedule.Op``), simulated from
        the stages' per-chunk times (``schedule.simulate``): the report's timeline, and what
        evaluate's step takes where a device's chunks differ (``uneven_chunks``)."""
        from .schedule import simulate

        fwd, bwd, send, wgt = stage_times(self.stages)
        return simulate(fwd, bwd, self.micro_batches, send, schedule=self.plan.pipeline, wgt=wgt)

    @property
    def capped_moe_load(self) -> float | None:
        """The most the plan's expert ranks can receive over the mean where the stated load is
        more (what the plan is costed at instead: ``specs.capped_moe_load``), else None."""
        sc = self.scenario
        tr = sc.training
        return capped_moe_load(sc.model, self.plan.ep, tr, sc.stack.pads_experts(tr))

    @property
    def group_levels(self) -> dict[str, tuple[int, str | None]]:
        """Each parallel group's size and the highest network level it crosses
        (``placement.group_levels``)."""
        return self._group_levels()

    def _group_levels(self, every: bool = False) -> dict[str, tuple[int, str | None]]:
        from .placement import group_levels

        sc = self.scenario
        return group_levels(self.plan, sc.cluster, sc.gpus, sc.model.moe is not None,
                            embedding_copies(sc.model, self.plan), every=every)

    def to_json(self) -> dict:
        """The ``--json`` contract (DESIGN §4) plus breakdowns."""
        p = self.plan
        sc = self.scenario
        worst = self.worst_stage.memory
        return {
            **scenario_json(sc),
            "step_time_s": self.step_time,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "logged_tflops_per_gpu": self.logged_tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            # the peak both are over: the plan's matmul precision's (fp8's for an fp8 plan; a
            # script-writing user's trial found a sweep over precisions mixing them unsaid)
            "mfu_peak_tflops": self.peak_flops / TFLOPS,
            "peak_memory_gib": self.peak_memory / GiB,
            "capacity_gib": self.capacity / GiB,
            "fits": self.fits,
            "why_not": self.why_not,
            "margin_gib": self.margin / GiB,
            "memory_headroom_gib": self.headroom / GiB,
            "within_headroom": self.within_headroom,
            **p.to_dict(),
            # the split where it is not the default one, as plan --json's entries give it
            "stage_layers": list(split) if (split := uneven_split(sc.model, p)) else None,
            "etp": p.expert_tp if sc.model.moe is not None else None,  # no experts: none
            # always text, as --recompute takes it ("full", "none*3,full"); "stages" has each
            "recompute": p.recompute_text,
            "micro_batches": self.micro_batches,
            # micro-batches per round of an interleaved (looped) schedule; none otherwise
            "round_size": p.pipeline.rounds_of(p.pp, p.vp, self.micro_batches),
            "time_s": {f.name: getattr(self.time, f.name) for f in fields(self.time)},
            "slowest_stage": self.slowest_stage,
            "last_stage": self.last_stage,
            "eager_kernels_s": self.eager_kernels,
            "uneven_chunks_s": self.uneven_chunks,
            "link_time_s": dict(self.link_time),
            # every axis, one device's group too (size 1, no level), so a script need not know
            # which are left out (a pipeline engineer's trial read a missing "cp" as an error)
            "groups": {axis: {"size": n, "top_level": level}
                       for axis, (n, level) in self._group_levels(every=True).items()},
            "memory_gib": {f.name: getattr(worst, f.name) / GiB for f in fields(worst)},
            "stages": [
                {"stage": s.index, "blocks": [list(b) for b in s.blocks],
                 "embedding": s.has_embedding, "head": s.has_head,
                 "recompute": s.recompute,
                 "time_per_microbatch_s": s.time_per_microbatch,
                 "memory_gib": s.memory.total / GiB,
                 "devices": list(s.devices)}
                for s in self.stages
            ],
        }
