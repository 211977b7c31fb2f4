"""DeepSpeed configuration JSON.

Batch keys satisfy DeepSpeed's rule ``train_batch_size = train_micro_batch_size_per_gpu ·
gradient_accumulation_steps · data-parallel size``. DeepSpeed takes tensor, pipeline and
sequence (context) parallelism from the model code or Megatron-DeepSpeed's arguments, not from
this file: the degrees and the stage split are listed in the notes. DeepSpeed's pipeline engine
runs plain 1F1B with ZeRO 0 or 1 only (``runtime/pipe/engine.py`` asserts it), so a plan with
interleaved stages or ZeRO-2/3 under pipelining is exported as the closest plan it runs, with
nestplan's prediction for it. Activation checkpointing is DeepSpeed's full-layer checkpointing;
fp8 runs through Transformer Engine in the model code.
"""

from __future__ import annotations

import json

from ..axes import MEGATRON_ORDER
from ..graph import FP32
from ..options import Precision
from ..planfile import PlanFile
from ..specs import blocks_per_chunk
from ..units import GiB
from . import (Export, capacity_notes, closest_schedule, evaluate, fit_notes, headline,
               mtp_note, predicted_note, rank_files, rank_note, uniform_policy)

DEEPSPEED_ORDER = MEGATRON_ORDER
"""How DeepSpeed numbers ranks, as Megatron does: ``PipeModelDataParallelTopology`` lays its
axes out as ``['pipe', 'data', 'model']``, the last fastest (deepspeed/runtime/pipe/topology.py
@ microsoft/DeepSpeed 2eafdd39db): tensor (model) parallel fastest, then data, then pipeline.
It has no context axis; the model code's sequence parallel ranks sit beside the tensor ones, as
in Megatron's order."""


REDUCE_BUCKET = 40_000_000
"""Elements (not bytes) of each gradient-reduction and parameter-gather bucket the export asks
for (ZeRO-3's gather: its prefetch bucket, ``stage3_prefetch_bucket_size``, DeepSpeed's 5e7 by
default; its live parameters stay at DeepSpeed's 1e9): Megatron-Core's least (``bucket_size =
max(40000000, ...)``, megatron/core/distributed/distributed_data_parallel.py @
NVIDIA/Megatron-LM d98e8a64dd)."""


def _fp32_buffer_text(sc, par) -> str:
    """What an fp32 gradient-accumulation buffer (4 bytes a parameter beside the weights) would
    make of ``par``'s most loaded stage: its GiB, the peak and whether that fits (a DeepSpeed
    trial's 70B pipeline went from 51.8 to 87.6 GiB of an 80 GB H100, unsaid)."""
    ev = evaluate(sc, par, stack_offers=False)  # (as ``prediction`` has it: evaluated once)
    per_param = FP32 / sc.stack.weight_bytes  # (the weights' bytes per parameter, unsharded here)
    def extra(s):
        return s.memory.weights * per_param

    stage = max(ev.stages, key=lambda s: s.memory.total + extra(s))
    peak = stage.memory.total + extra(stage)
    return (f"{extra(stage) / GiB:.1f} GiB more on stage {stage.index}: {peak / GiB:.1f} of "
            f"{ev.capacity / GiB:.1f} GiB, " + ("which does not fit" if peak > ev.capacity
                                                 else "within the device"))


def config(pf: PlanFile) -> tuple[dict, list[str], object]:
    """The configuration, the notes, and the plan actually exported."""
    sc, par = pf.scenario, pf.plan
    tr = sc.training
    notes = fit_notes(pf)
    policy, rec_notes = uniform_policy(pf)
    notes += rec_notes
    # the pipeline engine runs 1F1B only: every device's chunks become one
    exported, sched = closest_schedule(pf, par.with_(recompute=(policy.name,)), ("1f1b",),
                                       "DeepSpeed")
    if par.pipeline.mirrored:
        notes += sched
    elif par.vp > 1:
        notes.append(f"DeepSpeed's pipeline engine has no interleaved schedule: the {par.vp} "
                     "virtual stages per device become one (each device keeps as many blocks, "
                     "now one contiguous range)")
    elif par.pp > 1 and par.pipeline.name != "1f1b":
        notes.append(f"DeepSpeed's pipeline engine runs 1F1B only; the plan's {par.pipeline.name} "
                     "is exported as 1F1B")
    if par.pp > 1 and par.zero >= 2:
        notes.append(f"ZeRO-{par.zero} is incompatible with DeepSpeed's pipeline engine; "
                     "exported as ZeRO-1")
        exported = exported.with_(zero=1)
    if policy.kind == "every":
        notes.append(f"recompute policy '{policy.name}' ({policy.rule}) has no DeepSpeed "
                     f"setting; the model code must checkpoint one transformer block in every "
                     f"{policy.every} (deepspeed.checkpointing.checkpoint around those blocks)")
    elif policy.kind in ("modules", "matmul-outputs"):
        notes.append(f"recompute policy '{policy.name}' ({policy.rule}) has no DeepSpeed "
                     "setting; the model code must checkpoint what it names (Megatron-DeepSpeed: "
                     "--recompute-granularity selective for the attention core)")
    elif policy.kind == "full" and par.pp == 1:
        notes.append("full recomputation: wrap each transformer block in "
                     "deepspeed.checkpointing.checkpoint in the model code (configured by the "
                     "activation_checkpointing section)")
    micro = tr.micro_batches(par.mbs, par.dp)
    if par.pp > 1 and exported.zero <= 1:
        # data_types.grad_accum_dtype unset: the model's bf16 (DeepSpeedEngine.get_data_types and
        # _do_optimizer_sanity_check, deepspeed/runtime/engine.py, deepspeed 0.19.8)
        why = ((", which DeepSpeed warns is not numerically safe over many accumulation steps; "
                "fp32 accumulation is refused at ZeRO-0; at ZeRO-1 it adds an fp32 buffer of")
               if exported.zero == 0 else
               ("; fp32 accumulation switches DeepSpeed to its BF16_Optimizer, whose fp32 buffer "
                "adds"))
        notes.append("the pipeline engine accumulates the micro-batches' gradients in bf16 "
                     f"(data_types.grad_accum_dtype unset){why} 4 bytes per parameter that this "
                     f"plan's memory does not hold ({_fp32_buffer_text(sc, exported)})")
    st = sc.stack
    if exported.zero == 3 and st.overlap_grad_reduce != st.overlap_param_gather:
        # one key for both streams: ZeRO-3's gathers (parameter_offload.py) and its reductions
        # (stage3.py) run on side streams with it, on the default stream without (0.19.8 wheel;
        # a review's finding)
        on, off = (("reductions", "gathers") if st.overlap_grad_reduce
                   else ("gathers", "reductions"))
        notes.append(f"DeepSpeed's overlap_comm overlaps ZeRO-3's gathers and reductions alike; "
                     f"stack {st.name} overlaps its {on} but not its {off}: exported as "
                     f"overlap_comm = {str(st.overlap_grad_reduce).lower()}, so the launched run "
                     f"{'overlaps' if st.overlap_grad_reduce else 'shows'} its {off} too, "
                     f"{'faster' if st.overlap_grad_reduce else 'slower'} than predicted")
    cfg = {
        "train_batch_size": tr.global_batch,
        "train_micro_batch_size_per_gpu": par.mbs,
        "gradient_accumulation_steps": micro,
        "gradient_clipping": 1.0,
        # REDUCE_BUCKET, not DeepSpeed's 5e8: ZeRO-1/2 keep two bf16 buckets with overlap_comm
        # (setup_buckets, deepspeed/runtime/zero/stage_1_and_2.py, 0.19.8), 1.9 GiB at its
        # default that the memory model does not count (a user trial's), 0.15 GiB here, within
        # the stack's reserve
        # ZeRO-3 takes no allgather_bucket_size (only Stage1And2ZeroOptimizer and the
        # BF16_Optimizer do: engine.py, 0.19.8); it gathers ahead up to its prefetch bucket (a
        # DeepSpeed user's trial)
        "zero_optimization": {"stage": exported.zero, "overlap_comm": sc.stack.overlap_grad_reduce,
                              "contiguous_gradients": True, "reduce_scatter": True,
                              "reduce_bucket_size": REDUCE_BUCKET,
                              ("stage3_prefetch_bucket_size" if exported.zero == 3 else
                               "allgather_bucket_size"): REDUCE_BUCKET},
        "bf16": {"enabled": True},
        # partitioning applies to checkpointed activations only
        "activation_checkpointing": {"partition_activations": par.sp and policy.kind != "none",
                                     "contiguous_memory_optimization": False,
                                     "cpu_checkpointing": False,
                                     "number_checkpoints": None,
                                     "synchronize_checkpoint_boundary": False,
                                     "profile": False},
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if par.pp > 1:
        # read by the pipeline engine; stages and the split are PipelineModule arguments
        cfg["pipeline"] = {"activation_checkpoint_interval": 1 if policy.kind == "full" else 0}
        split = list(blocks_per_chunk(sc.model, exported))  # one chunk per stage
        # DeepSpeed's 'uniform' (and its default, 'parameters') counts the embedding and head
        # among the layers it balances; 'type:REGEX' counts the layers whose class matches
        # (PipelineModule._partition_layers, deepspeed/runtime/pipe/module.py, 0.19.8), as
        # Megatron-DeepSpeed's GPT model passes 'type:transformer' (a user trial's 'uniform' had
        # split Llama 3 8B's 32 blocks 17/15)
        how = ("partition_method='type:<the block class>' (Megatron-DeepSpeed's "
               "'type:transformer') balances the blocks alone, giving this even split"
               if len(set(split)) == 1 else "this uneven split needs the parts set in code "
               "(partition_method 'type:<the block class>' balances the blocks evenly)")
        notes.append(f"pipeline: PipelineModule(num_stages={par.pp}) with blocks per stage "
                     f"{list(split)} (embedding on stage 0, head on stage {par.pp - 1}); "
                     f"{how}; 'uniform' and the default 'parameters' count the embedding and "
                     "head too")
    if tr.precision is Precision.FP8:
        # a TE linear layer saves its quantized weight for the backward (wt_save in _Linear's
        # forward, transformer_engine/pytorch/module/linear.py @ NVIDIA/TransformerEngine
        # d0067d0da), made anew each forward unless is_first_microbatch is passed (Megatron-Core
        # passes it, and its stack counts one cached copy): row- and column-wise, about the bf16
        # weight's bytes again per micro-batch in flight (a user trial's question)
        from ..evaluate import chunk_bounds, layer_graph

        mg = layer_graph(sc.model, exported, tr, sc.stack)
        # each stage's (one chunk a stage here) block weights, experts aside: AutoEP's experts
        # are no TE modules; the last stage's with the head's multi-token-prediction depths
        weights = [sum(mg.block(i).block_weights for i in range(a, b))
                   for a, b in chunk_bounds(sc.model, exported)]
        weights[-1] += mg.head.block_weights
        copy = 2 * max(weights)  # row- and column-wise fp8, per device of the busiest stage
        notes.append("fp8 matmuls: use Transformer Engine's fp8_autocast in the model code "
                     "(DeepSpeed has no fp8 setting); bf16 is enabled for the rest. Each TE "
                     "linear layer keeps its fp8 weight for the backward of every micro-batch "
                     "in flight unless the model passes is_first_microbatch (as Megatron-Core "
                     f"does): about {copy / GiB:.1f} GiB a micro-batch on the busiest stage, "
                     f"{'up to ' + str(par.pp) + ' at once on the first, ' if par.pp > 1 else ''}"
                     "which the deepspeed stacks' memory does not count")
    autoep = par.ep > 1 and sc.stack.expert_layer_injected  # DeepSpeed's own EP layer
    if autoep:
        # AutoEP (deepspeed/module_inject/auto_ep_config.py parse_autoep_config, 0.19.2 and later):
        # it finds the model's MoE blocks itself (a preset per model family, or the patterns)
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": par.ep,
                                  "expert_tensor_parallel_size": par.expert_tp}
        notes.append(f"expert parallelism: DeepSpeed's AutoEP over {par.ep} ranks of each "
                     "pipeline stage (expert_parallel; DeepSpeed 0.19.2 or later); it detects the "
                     "model's MoE blocks by its presets (Mixtral, Qwen3-MoE, DeepSeek-V2/V3), "
                     "else set expert_parallel.preset_model or its patterns")
    if par.tp > 1 or par.cp > 1 or (par.ep > 1 and not autoep):
        etp = (f", expert tensor parallel {par.expert_tp}"
               if sc.model.moe is not None and par.expert_tp != par.tp else "")
        notes.append(f"set in the model code / Megatron-DeepSpeed arguments: tensor parallel "
                     f"{par.tp}{' with sequence parallelism' if par.sp else ''}, sequence "
                     f"(context) parallel {par.cp}, expert parallel {par.ep}{etp}")
    if par.cp > 1:  # (a user trial: the note above had read as the ring the plan was costed with)
        notes.append(f"DeepSpeed's sequence parallelism is DeepSpeed-Ulysses (DistributedAttention, "
                     "deepspeed/sequence/layer.py; Megatron-DeepSpeed's --ds-sequence-parallel-"
                     "size): all-to-alls that trade sequence shards for heads around the "
                     f"attention (the heads divided over the {par.cp} ranks), not the ring "
                     "exchange of keys and values this plan's context parallelism was costed "
                     "with; its time and memory differ from the prediction")
    if sc.model.mtp_layers:
        notes.append(f"the model trains {sc.model.mtp_layers} multi-token-prediction depth(s), "
                     "which DeepSpeed does not add: the launched run trains them only if the "
                     f"model code has them ({mtp_note(pf)})")
    notes += capacity_notes(pf, "deepspeed")
    notes += rank_note(par, DEEPSPEED_ORDER, "DeepSpeed",
                       "tensor parallel fastest, then data, then pipeline",
                       "python TRAIN_SCRIPT ARGUMENTS")
    if exported != par.with_(recompute=(policy.name,)) or rec_notes:
        notes.append(predicted_note(pf, exported, "deepspeed"))
    return cfg, notes, exported


def export(pf: PlanFile) -> Export:
    cfg, notes, exported = config(pf)
    # the JSON holds no comments: the predictions head the notes file, as they head the others
    head, stack_notes = headline(pf, exported, "deepspeed")
    notes += stack_notes
    extras = {".notes.txt": "\n".join(head + notes) + "\n",
              **rank_files(pf.plan, DEEPSPEED_ORDER, pf.scenario.cluster.host_size, "DeepSpeed")}
    return Export(text=json.dumps(cfg, indent=2) + "\n", extras=extras, notes=notes,
                  plan=exported)
