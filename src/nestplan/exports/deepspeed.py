"""DeepSpeed configuration JSON.

Batch keys satisfy DeepSpeed's rule ``train_batch_size = train_micro_batch_size_per_gpu ·
gradient_accumulation_steps · data-parallel size``. DeepSpeed takes tensor, pipeline and
sequence (context) parallelism from the model code or Megatron-DeepSpeed's arguments, not from
this file: the degrees are listed in the notes. Activation checkpointing is DeepSpeed's
full-layer checkpointing; fp8 runs through Transformer Engine in the model code.
"""

from __future__ import annotations

import json

from ..options import Precision, Recompute
from ..planfile import PlanFile
from . import Export, blocks_per_chunk, predicted_note, uniform_policy


def config(pf: PlanFile) -> tuple[dict, list[str]]:
    sc, par = pf.scenario, pf.plan
    tr = sc.training
    notes: list[str] = []
    policy, rec_notes = uniform_policy(par)
    notes += rec_notes
    if policy is Recompute.SELECTIVE:
        notes.append("selective recomputation has no DeepSpeed setting; the model code must "
                     "checkpoint the attention core (Megatron-DeepSpeed: "
                     "--recompute-granularity selective)")
    micro = tr.global_batch // (par.mbs * par.dp)
    cfg = {
        "train_batch_size": tr.global_batch,
        "train_micro_batch_size_per_gpu": par.mbs,
        "gradient_accumulation_steps": micro,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": par.zero, "overlap_comm": tr.overlap_grad_reduce,
                              "contiguous_gradients": True, "reduce_scatter": True},
        "bf16": {"enabled": True},
        "activation_checkpointing": {"partition_activations": par.sp,
                                     "contiguous_memory_optimization": False,
                                     "cpu_checkpointing": False,
                                     "number_checkpoints": None,
                                     "synchronize_checkpoint_boundary": False,
                                     "profile": False},
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if par.pp > 1:
        cfg["pipeline"] = {"stages": par.pp, "partition": "parameters",
                           "activation_checkpoint_interval": 1 if policy is Recompute.FULL else 0}
    if tr.precision is Precision.FP8:
        notes.append("fp8 matmuls: use Transformer Engine's fp8_autocast in the model code "
                     "(DeepSpeed has no fp8 setting); bf16 is enabled for the rest")
    if par.tp > 1 or par.pp > 1 or par.cp > 1 or par.ep > 1:
        notes.append(f"set in the model code / Megatron-DeepSpeed arguments: tensor parallel "
                     f"{par.tp}{' with sequence parallelism' if par.sp else ''}, pipeline "
                     f"{par.pp} (blocks per chunk {blocks_per_chunk(pf)}), sequence (context) "
                     f"parallel {par.cp}, expert parallel {par.ep}")
    if rec_notes:
        notes.append(predicted_note(pf, par.with_(recompute=(policy,))))
    return cfg, notes


def export(pf: PlanFile) -> Export:
    cfg, notes = config(pf)
    extras = {".notes.txt": "\n".join(notes) + "\n"} if notes else {}
    return Export(text=json.dumps(cfg, indent=2) + "\n", extras=extras, notes=notes)
