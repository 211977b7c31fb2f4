"""torchtitan (0.3) launch arguments: ``python -m torchtitan.train --module M --config C`` plus
``--section.key value`` overrides and the activation-checkpoint subcommand.

torchtitan 0.3 reads no configuration file: ``--module``/``--config`` pick a ``config_registry``
function (torchtitan ships Llama 3 8B/70B/405B; other models need one of the user's) and tyro
overrides its fields. Keys follow ``ParallelismConfig`` and ``TrainingConfig``. Data parallelism
is FSDP2: ZeRO-3 is ``data_parallel_shard_degree`` with resharding after forward, ZeRO-2 the same
without resharding, ZeRO-0 plain replication; ZeRO-1 has no equivalent and is exported as ZeRO-2.
Experts take their EP ranks from ``dp_shard · cp · tp`` and have no tensor parallelism of their
own (expert TP 1). Stages are given exactly with ``module_fqns_per_model_part`` (embedding
``tok_embeddings``, blocks ``layers.i``, head ``norm`` and ``lm_head``, as torchtitan 0.3's
``Decoder`` names its children: torchtitan/models/common/decoder.py). torchtitan numbers its
ranks pp, dp_replicate, dp_shard, cp, tp (tp fastest): a plan with another rank order is
launched through the rank map written beside the arguments.
"""

from __future__ import annotations

from dataclasses import fields, replace

from ..axes import MEGATRON_ORDER
from ..catalog import get_model, get_stack
from ..errors import SpecError
from ..options import Norm, Position, Precision, TPOverlap
from ..placement import layouts
from ..notes.plan import eager_float8_text
from ..planfile import PlanFile
from ..recompute import closest
from ..schedule import SCHEDULES
from ..specs import (LLAMA31_ROPE, blocks_per_chunk, list_text, mtp_refusal,
                     tied_pipeline_refusal)
from ..units import fmt_gib
from . import (Export, capacity_notes, closest_schedule, evaluate, fit_notes, launched_as,
               mesh_json, headline, mtp_note, predicted_note, rank_files, rank_note,
               uniform_policy)

TORCHTITAN_ORDER = MEGATRON_ORDER
"""How torchtitan numbers ranks: its device mesh's dimensions pp, dp_replicate, dp_shard, cp, tp,
the last fastest (the module docstring), which is Megatron's order of nestplan's axes."""
REGISTRY = {"llama3-8b": ("llama3", "llama3_8b"), "llama3-70b": ("llama3", "llama3_70b"),
            "llama3-405b": ("llama3", "llama3_405b"),
            # torchtitan/models/deepseek_v3/config_registry.py (0.3.0 wheel): without MTP depths
            "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
            # torchtitan/models/gpt_oss/config_registry.py (0.3.0 wheel): gpt_oss_120b, the
            # 36-layer, 128-expert model of __init__.py's model_registry("120b")
            "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b"),
            # torchtitan/models/qwen3/config_registry.py (0.3.0 wheel): qwen3_30b_a3b, the model
            # of __init__.py's _30b_a3b (48 layers of 2,048, 32 query and 4 KV heads of 128, 128
            # experts of 768 top-8, vocabulary 151,936, RoPE base 10^6: the catalog's)
            "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b")}
"""Catalog models torchtitan 0.3 defines: (``--module``, ``--config``). A model given another
way (a HuggingFace config) that is one of them exports with it too (``registry_entry``)."""
LOSS_ONLY_COMPILE = {"deepseek_v3_671b", "deepseek_v3_671b_float8"}
"""``REGISTRY`` configs whose own compile options compile the loss alone (``CompileConfig(enable=
True, components=["loss"])``, torchtitan/models/deepseek_v3/config_registry.py, 0.3.0 wheel); the
Float8 one builds its converters with ``model_compile_enabled`` taken from them, False."""
MAX_SEQ_LEN = {"llama3_8b": 131072, "llama3_70b": 131072, "llama3_405b": 131072,
               "deepseek_v3_671b": 16384, "gpt_oss_120b": 131072, "qwen3_30b_a3b": 40960}
"""The longest sequence each ``REGISTRY`` config trains: its RoPE's ``max_seq_len``, beyond which
torchtitan's Trainer refuses to start ("exceeds attention RoPE maximum supported sequence length",
Decoder.Config.update_from_config, torchtitan/models/common/decoder.py); from the model_registry
flavours the configs build (models/llama3/__init__.py 8B, 70B, 405B; deepseek_v3 671B, qwen3
30B-A3B, gpt_oss 120b; 0.3.0 wheel)."""
FLOAT8_CONFIGS = {"llama3_405b", "deepseek_v3_671b_float8"}
"""Registry configs that train with a Float8 converter in their model spec, which no argument
removes (torchtitan/models/llama3/config_registry.py llama3_405b: converters=[Float8Linear
Converter], with torch.compile and async TP on; deepseek_v3/config_registry.py
deepseek_v3_671b_float8; 0.3.0 wheel). An fp8 plan of another ``REGISTRY`` config exports
``<config>_float8``: DeepSeek-V3's exists, the others' are for the user to write (``_float8_config``)."""
PLACEHOLDER = ("MODULE", "CONFIG")
TORCHTITAN_SCHEDULES = tuple(n for n, s in SCHEDULES.items() if s.torchtitan)
"""Schedules torchtitan runs (``parallelism.pipeline_parallel_schedule``)."""


def _scaling_text(sc) -> str:
    return "none" if sc is None else f"{sc.kind}, factor {sc.factor:g}"


def registry_entry(m) -> tuple[str, str, str | None]:
    """torchtitan's (``--module``, ``--config``) for model ``m``, and a note where its definition
    scales RoPE otherwise: the entry of the catalog model ``m`` is in every field but the name,
    the RoPE scaling and the MTP depths (a model read from a HuggingFace config too; the depths,
    which ``--mtp-layers`` sets, have a note of their own); ``PLACEHOLDER`` for a model torchtitan
    does not define."""
    for name, entry in REGISTRY.items():
        catalog = get_model(name)
        # every torchtitan 0.3 Llama 3 definition scales RoPE as Llama 3.1 does
        # (ComplexRoPE.Config(scaling="llama") with its defaults: torchtitan/models/llama3/
        # __init__.py and models/common/rope.py, 0.3.0 wheel)
        rope = LLAMA31_ROPE if entry[0] == "llama3" else None
        if any(getattr(m, f.name) != getattr(catalog, f.name)
               for f in fields(m) if f.compare
               and f.name not in ("name", "rope_scaling", "mtp_layers")):
            continue  # (a model file that keeps a catalog name but changes the model is another)
        if m.rope_scaling == rope:
            return (*entry, None)
        return (*entry, f"the model's RoPE scaling ({_scaling_text(m.rope_scaling)}) is not that "
                        f"of torchtitan's {entry[1]} ({_scaling_text(rope)}): the launched run "
                        "scales RoPE as torchtitan's definition does")  # (a user trial had read
        # the note, which ended "trains with torchtitan's", as cut short)
    return (*PLACEHOLDER, None)


def definition_text(m) -> str:
    """What a torchtitan model definition of ``m`` must hold for the export's plan and
    prediction to be its: the sizes, and each feature that departs from torchtitan's Llama 3
    (no biases, untied embeddings, RoPE on every head dimension, full causal attention)."""
    parts = [f"dim {m.hidden}, {m.layers} layers, {m.heads} heads ({m.kv_heads} KV) of "
             f"{m.head_dim}, {m.mlp.value} FFN {m.ffn_hidden}, vocabulary {m.vocab}"]
    if m.position is Position.ROPE:
        parts.append(f"RoPE theta {m.rope_theta:g}"
                     + (f" on {m.rope_fraction:g} of each head" if m.rope_fraction != 1 else ""))
    else:
        parts.append(f"{m.position.value} positions")
    parts += [text for on, text in (
        (m.bias, "biases on every linear layer"), (m.qkv_bias and not m.bias, "q/k/v biases"),
        (m.tied_embeddings, "output layer tied to the embedding"), (m.qk_norm, "QK norms"),
        (m.attention_sinks, "attention sinks"), (m.norm is not Norm.RMSNORM, "LayerNorm"),
        (bool(m.sliding_window), f"a {m.sliding_window}-token sliding window on "
                                 f"{len(m.local_layers) or m.layers} layers"),
        (m.mla is not None, "multi-head latent attention"),
        (m.moe is not None, m.moe is not None and (
            f"{m.moe.experts} experts of {m.moe.ffn_hidden}, top {m.moe.top_k}"
            + (f", {m.moe.shared_experts} shared" if m.moe.shared_experts else "")
            + (f", on one layer in {m.moe.layer_freq}" if m.moe.layer_freq > 1 else "")
            + (f", the first {m.moe.first_dense_layers} layer(s) dense"
               if m.moe.first_dense_layers else ""))),
        (bool(m.mtp_layers), f"{m.mtp_layers} multi-token-prediction depth(s)")) if on]
    return "; ".join(parts)


def _checkpointing(pf: PlanFile):
    """The plan's one policy (``uniform_policy``, with its notes), torchtitan's mode nearest to
    it (its activation-checkpointing modes are its stack's policy names: none, selective, full),
    the plan's stack's policy that runs that mode, and the rules ``launched_as`` gives policies
    the stack lacks. A torchtitan stack's plan runs torchtitan's mode: as the stack's policy of
    that rule (a stack file's every:2 runs as its full), else as the mode's rule (a user trial's
    core-attention policy had been predicted as itself, 167 GiB, while torchtitan ran per-op
    checkpointing, 82 GiB); another framework's plan keeps its policy (own_prediction maps
    it)."""
    policy, notes = uniform_policy(pf)
    runs = closest(policy, get_stack("torchtitan").recompute)
    stack = pf.scenario.stack
    if stack.export_format != "torchtitan" or runs.rule == policy.rule:
        return policy, notes, runs, policy, {}
    same = next((p for p in stack.recompute if p.rule == runs.rule), None)
    return policy, notes, runs, same or policy, {} if same else {policy.name: runs.rule}


def arguments(pf: PlanFile) -> tuple[list[list[str]], list[str], object]:
    """The argument groups (one option with its values each), the notes, and the plan actually
    exported."""
    return _arguments(pf)[:3]


def _arguments(pf: PlanFile):
    """``arguments``, and the plan file as launched (``launched_as``: its stack with the policy
    torchtitan runs), which the export's predictions are of."""
    sc, par = pf.scenario, pf.plan
    m, tr = sc.model, sc.training
    notes = fit_notes(pf)
    policy, rec_notes, runs, ran, rules = _checkpointing(pf)
    titan = get_stack("torchtitan")  # its own rules
    mode = runs.name
    if runs.kind != policy.kind:  # Megatron's module checkpointing, intervals
        # named by its rule too: the two stacks' 'selective' differ (a user trial read "policy
        # 'selective' ... runs 'selective' instead" as a contradiction)
        rec_notes.append(f"recompute policy '{policy.name}' ({policy.rule}) has no torchtitan "
                         f"equivalent; its activation checkpointing runs its own '{mode}' "
                         f"({runs.rule}) instead, which keeps "
                         + ("other tensors" if mode == "selective" else "less"))
    notes += rec_notes
    zero, etp = par.zero, par.expert_tp
    if zero == 1:
        notes.append("ZeRO-1 (sharded optimizer only) has no FSDP2 equivalent; exported as "
                     "ZeRO-2 (fsdp_reshard_after_forward = never)")
        zero = 2
    runs = titan.expert_tps(par.tp, par.ep, biased=m.biased_experts)
    if m.moe is not None and etp not in runs:
        notes.append(f"expert tensor parallelism {etp} cannot be expressed (torchtitan's "
                     "experts have no TP of their own: sharded over EP with it, over TP "
                     f"without); exported with expert TP {runs[0]}")
        etp = runs[0]
    if titan.replicas_hold_experts(par.with_(zero=zero)):
        notes.append(f"expert parallelism {par.ep} must divide dp_shard·cp·tp, and ZeRO-0 "
                     "replicates data parallelism; exported as ZeRO-2 (FSDP over the "
                     "data-parallel ranks)")
        zero = 2
    exported = par.with_(recompute=(ran.name,), zero=zero,
                         etp=etp if m.moe is not None else par.etp)
    exported, sched_notes = closest_schedule(pf, exported, TORCHTITAN_SCHEDULES, "torchtitan",
                                             titan)
    micro = tr.micro_batches(par.mbs, par.dp)
    if titan.micro_refusal(exported.pipeline.name, par.pp, micro) is not None:
        # a plan searched for another stack (one of torchtitan's never has it): GPipe runs them
        sched_notes.append(f"torch's {exported.pipeline.torchtitan} schedule refuses {micro} "
                           f"micro-batches per replica for {par.pp} stages (fewer than stages); "
                           "exported with GPipe, which runs them with the same bubble and holds "
                           "every micro-batch's activations")
        exported = exported.with_(schedule="gpipe")
    notes += sched_notes
    module, config, rope_note = registry_entry(m)
    notes += [rope_note] if rope_note else []
    if (why := tied_pipeline_refusal(m, titan, exported.pp)) is not None:  # (another stack's
        # plan: the definition note below would ask for the tying torchtitan refuses: a review's)
        notes.append(f"torchtitan will not start this plan: {why.removesuffix('; use pp = 1')} "
                     "(Decoder.Config.update_from_config raises 'Weight tying is not supported "
                     f"with Pipeline Parallel'): plan again with --stack torchtitan, which keeps "
                     f"pp = 1, or untie the model")
    if (module, config) == PLACEHOLDER:
        known = ", ".join(c for _, c in REGISTRY.values())
        notes.append(f"{m.name} is none of the torchtitan 0.3 definitions nestplan matches models "
                     f"to ({known}; torchtitan ships others, which it does not check): replace "
                     "MODULE and CONFIG with a config_registry entry, torchtitan's or yours, "
                     f"whose model is the planned one: {definition_text(m)}")
    elif tr.seq_len > MAX_SEQ_LEN[config]:  # (a user trial's 32K DeepSeek-V3 would not start)
        notes.append(f"torchtitan's {config} trains sequences of at most "
                     f"{MAX_SEQ_LEN[config]:,} tokens (its RoPE's max_seq_len) and refuses "
                     f"{tr.seq_len:,} at start-up (Decoder.Config.update_from_config, "
                     "torchtitan/models/common/decoder.py): give it a config_registry function "
                     "of yours whose model spec sets max_seq_len to at least that, with the RoPE "
                     "scaling you train with")
    if tr.precision is Precision.FP8 and (module, config) != PLACEHOLDER:
        config = _float8_config(config, m.moe is not None, notes)
    groups = [["--module", module], ["--config", config]]

    def opt(key: str, value):
        if isinstance(value, bool):
            name = key if value else key.replace(".", ".no-", 1)
            groups.append([f"--{name}"])
        else:
            groups.append([f"--{key}", str(value)])

    if zero == 0 and par.cp > 1:  # (fsdp_enabled: dp_shard > 1 or cp > 1, parallel_dims.py)
        notes.append(f"torchtitan shards the weights over the context-parallel ranks whenever "
                     f"cp > 1 (FSDP over dp_shard·cp: torchtitan/distributed/parallel_dims.py, "
                     f"0.3.0 wheel): this ZeRO-0 plan runs sharded over cp = {par.cp}, with less "
                     "memory and other collectives than predicted")
    opt("parallelism.data_parallel_replicate_degree", par.dp if zero == 0 else 1)
    opt("parallelism.data_parallel_shard_degree", 1 if zero == 0 else par.dp)
    opt("parallelism.fsdp_reshard_after_forward", "always" if zero == 3 else "never")
    opt("parallelism.tensor_parallel_degree", par.tp)
    opt("parallelism.enable_sequence_parallel", par.sp)
    opt("parallelism.context_parallel_degree", par.cp)
    opt("parallelism.expert_parallel_degree", par.ep)
    opt("parallelism.pipeline_parallel_degree", par.pp)
    if par.pp > 1:
        opt("parallelism.pipeline_parallel_schedule", exported.pipeline.torchtitan)
        opt("parallelism.pipeline_parallel_microbatch_size", par.mbs)
        sizes = list(blocks_per_chunk(m, exported))  # the exported plan's chunks
        empty = [c for c, n in enumerate(sizes[1:-1], 1) if n == 0]
        if empty:  # a model part names its modules: one in the middle must hold blocks
            raise SpecError("stage_layers", list_text(sizes), f"model chunk {empty[0]} holds no "
                            "blocks, which torchtitan's module_fqns_per_model_part cannot "
                            "express; give it blocks")
        parts, start = [], 0
        for c, n in enumerate(sizes):
            part = (["tok_embeddings"] if c == 0 else []) + [
                f"layers.{i}" for i in range(start, start + n)] + (
                ["norm", "lm_head"] if c == len(sizes) - 1 else [])
            parts.append(",".join(part))
            start += n
        groups.append(["--parallelism.module_fqns_per_model_part", *parts])
    # a DP rank's batch: every micro-batch of the step with PP; one micro-batch per
    # gradient-accumulation step without
    opt("training.local_batch_size", par.mbs * (micro if par.pp > 1 else 1))
    opt("training.global_batch_size", tr.global_batch)
    opt("training.seq_len", tr.seq_len)
    st = sc.stack
    unrun, why_unrun, graphed, advice = _not_launched(
        st, m, par, placeholder=(module, config) == PLACEHOLDER)
    notes += advice
    # said either way: torchtitan 0.3 graphs each step's forward and backward unless told not to
    opt("training.disable_cuda_graphs", not graphed)
    if st.export_format == "torchtitan":  # what the stack's costs assume torchtitan runs
        # (compiled where they fuse or overlap TP: StackSpec.torch_compiled)
        asynctp = st.async_tp(par.tp, layouts(par, sc.cluster, sc.gpus).tp)
        if st.tp_overlap is TPOverlap.FULL and par.tp > 1 and not asynctp:
            notes.append(f"TP {par.tp} leaves one NVLink domain, where torch's async TP cannot "
                         "pair its ranks: exported without it, as costed")
        compiled = st.torch_compiled(asynctp)
        if compiled:
            why = [w for w, on in (("fused norms", st.fused_norm),
                                   ("fused gated MLPs", st.fused_gated_mlp),
                                   ("async TP", asynctp)) if on]
            notes.append(f"stack {st.name} costs {' and '.join(why)}, which torchtitan runs under "
                         "torch.compile: exported with --compile.enable --compile.components "
                         "model,loss"
                         + (" --compile.enable_async_tensor_parallel" if asynctp else ""))
            # (a registry config may compile the loss alone, DeepSeek-V3's do, and the model
            # then runs eagerly: a torchtitan MoE user's trial)
            groups.append(["--compile.components", "model,loss"])
            if config in LOSS_ONLY_COMPILE and config in FLOAT8_CONFIGS:
                notes.append(f"torchtitan's {config} builds its Float8 converters with "
                             "model_compile_enabled false (from its own compile options, which "
                             "compile the loss alone: config_registry.py), so it warns that "
                             "float8 MoE training needs compile; exported with the model "
                             "compiled (--compile.components model,loss), the run is the one "
                             "predicted and the warning can be ignored")
        # both said either way: a registry config may turn them on (llama3_405b does)
        opt("compile.enable", compiled)
        opt("compile.enable_async_tensor_parallel", asynctp)
    if tr.precision is Precision.FP8 and (module, config) == PLACEHOLDER:
        notes.append("fp8: give your config_registry function's model spec the converters "
                     f"{float8_converters(m.moe is not None)}; nestplan's prediction assumes "
                     "those fp8 matmuls")
    if tr.precision is Precision.FP8 and (st.fp8_param_gather or st.fp8_tp_gather):
        notes.append(_float8_gathers_note(pf, exported))
    eager = eager_float8_text(sc, par)  # (in the launched file too: a torchtitan trial's had none)
    if eager:
        notes.append(eager)
    if tr.precision is not Precision.FP8 and config in FLOAT8_CONFIGS:
        notes.append(f"torchtitan's {config} trains with a Float8 converter in its model spec, "
                     "which no argument removes: the plan is costed in bf16, so launch a copy "
                     "of that config_registry function without the converter, or the run trains "
                     "in fp8")
    if tr.document_span is None:
        # a user trial's 64K-token plan was costed at 3.7 times the attention of 2K documents
        notes.append("torchtitan 0.3 masks attention per document (block_causal: "
                     "get_attention_config, torchtitan/models/common/config_utils.py), so a "
                     "query attends within its own document; the prediction assumes documents "
                     f"that fill each {tr.seq_len:,}-token sequence: give --attention-span N, "
                     "your documents' typical length, to cost shorter ones")
    groups.append([f"activation-checkpoint:{mode}"])
    notes += rank_note(par, TORCHTITAN_ORDER, "torchtitan", "tp fastest, then cp, dp, pp",
                       "python -m torchtitan.train ARGUMENTS")
    if m.mtp_layers:  # a model-spec setting, not an argument
        # (its loss too, as the registry's MTP config sets it; and not under PP or CP, which
        # torchtitan refuses: a torchtitan MoE user's trial followed the note into a crash)
        refused = [why for axis, degree in (("pp", exported.pp), ("cp", exported.cp))
                   if (why := mtp_refusal(m, titan, axis, degree)) is not None]
        if refused:
            notes.append(f"torchtitan will not start this plan with the model's depths built "
                         f"in: {refused[0]} (MTPDecoder.Config."
                         "update_from_config, torchtitan/models/deepseek_v3/mtp.py, raises "
                         "NotImplementedError): plan again with --stack torchtitan, which keeps "
                         "them apart")
        notes.append(f"the model trains {m.mtp_layers} multi-token-prediction depth(s): build its "
                     f"model spec with num_mtp_layers={m.mtp_layers} (torchtitan's DeepSeek-V3 "
                     "model_registry) and its loss as MTPLoss.Config (as the registry's "
                     "deepseek_v3_debugmodel_mtp does), or the run trains without them "
                     f"({mtp_note(pf)})")
    notes += capacity_notes(pf, "torchtitan")
    # (REGISTRY's configs chunk their loss, this stack not; with MTP depths the run's MTPLoss
    # does not chunk either)
    if (module, config) != PLACEHOLDER and st.loss_chunks == 1 and not m.mtp_layers:
        notes.append(_chunked_loss_note(pf, exported, config))
    notes += _registry_cp_notes(st, m, exported, config, (module, config) == PLACEHOLDER,
                                tr.seq_len)
    launched, exported = launched_as(pf, exported, rules)
    unrun_note = None
    if unrun:  # the run as launched, with what torchtitan runs in their place
        costed = evaluate(launched.scenario, exported, stack_offers=False)
        launched, _ = launched_as(pf, exported, rules, **unrun)
        ran = evaluate(launched.scenario, exported, stack_offers=False)
        which = "them" if len(why_unrun) > 1 else "it"
        unrun_note = f"stack {st.name} asks for " + "; ".join(why_unrun) + (
            ": not launched, which changes no prediction here"
            if (ran.step_time, ran.peak_memory) == (costed.step_time, costed.peak_memory)
            else f": the predictions are of the run as launched without {which}, "
            f"{ran.step_time:.3f} s a step ({costed.step_time:.3f} s as the stack costs it)")
    if rec_notes or sched_notes or zero != par.zero or exported.expert_tp != par.expert_tp:
        notes.append(predicted_note(launched, exported, "torchtitan", saved=pf))
    notes += [unrun_note] if unrun_note else []
    return groups, notes, exported, launched


def _not_launched(st, m, par, *, placeholder: bool) -> tuple[dict, list[str], bool, list[str]]:
    """What of a torchtitan stack's behaviour (``st``, a stack file's, say) torchtitan 0.3 does
    not run as exported: the stack fields it runs in their place, what each was, whether the
    export graphs the step (``training.disable_cuda_graphs`` off), and what the user's own config
    must build for the rest (notes). Another format's stack is costed as torchtitan's own runs it
    (``headline``), which graphs nothing.

    * CUDA graphs: torchtitan captures one graph of each step's forward and backward
      (``wrap_with_cuda_graph`` around ``fwd_bwd_fn``, trainer.py, 0.3.0 wheel), refused with PP
      and with EP over a dispatcher that syncs with the host, which every one costed here does
      (``_validate_cuda_graphs``, same file): a stack's ``full_iteration`` runs where the plan
      has neither, ``layers`` nowhere.
    * Dispatchers: its model specs choose theirs (``moe_comm_backend``, "standard" in every
      registry model: torchtitan/models/common/config_utils.py ``make_token_dispatcher_config``,
      models/qwen3/__init__.py), all-to-all or DeepEP's (``deepep``), none by launch argument: a
      registry config runs the all-to-all; a config of the user's may build DeepEP's.
    * Expert overlap: it overlaps no expert exchange with another micro-batch, nor the shared
      experts with it."""
    if st.export_format != "torchtitan":
        return {}, [], False, []
    graphable = par.pp == 1 and (m.moe is None or par.ep == 1)  # (torchtitan's own refusals)
    graphed = st.cuda_graphs == "full_iteration" and graphable
    unrun, why, advice = {}, [], []
    if st.cuda_graphs != "none" and not graphed:
        unrun.update(cuda_graphs="none", cuda_graph_modules=())
        why.append("per-layer CUDA graphs (cuda_graphs = layers), which torchtitan does not "
                   "capture" if st.cuda_graphs == "layers" else "a CUDA graph of each step, "
                   "which torchtitan refuses with " + (
                       "pipelining" if par.pp > 1 else "expert parallelism over its "
                       "dispatchers that sync with the host"))
    experts = m.moe is not None and par.ep > 1
    if experts and st.moe_dispatcher == "flex" and placeholder:
        advice.append(f"stack {st.name} costs DeepEP's dispatcher (moe_dispatcher = flex): "
                      "build your config's model spec with moe_comm_backend = \"deepep\" "
                      "(torchtitan 0.3 takes no launch argument for it)")
    elif experts and st.moe_dispatcher != "alltoall":
        unrun["moe_dispatcher"] = "alltoall"
        why.append(f"the {st.moe_dispatcher} dispatcher, where torchtitan's registry model runs "
                   "the all-to-all (DeepEP only in a model spec built with moe_comm_backend = "
                   "\"deepep\")")
    if experts and (st.moe_overlap == "batch" or (st.moe_overlap == "shared"
                                                  and m.moe.shared_experts)):
        unrun["moe_overlap"] = "none"
        why.append(f"the expert exchange overlapped (moe_overlap = {st.moe_overlap}), which "
                   "torchtitan.train does not run (only its graph_trainer experiment)")
    if st.cuda_graphs == "none" and graphable:
        # (a torchtitan trial found the flag set with no word of why; with PP or EP torchtitan
        # graphs nothing anyway, and where a stack's graphs are not run ``why`` says so)
        advice.append(f"--training.disable_cuda_graphs: stack {st.name} costs an eager step "
                      "(cuda_graphs = none), so the export turns off the graph of each step's "
                      "forward and backward that torchtitan 0.3 captures by default; a stack "
                      "file with cuda_graphs = \"full_iteration\" costs the graphed step and "
                      "exports without the flag")
    return unrun, why, graphed, advice


def _float8_gathers_note(pf: PlanFile, exported) -> str:
    """What a stack that moves fp8 in its all-gathers (``fp8_param_gather``, ``fp8_tp_gather``:
    torchtitan's 2024 Float8 with tensorwise scaling) is predicted at as torchtitan 0.3 runs it:
    its Float8 converter offers rowwise recipes only (``Float8LinearConverter.Config.recipe_name``,
    torchtitan/components/quantization/float8.py, 0.3.0 wheel), which gather weights in bf16
    (a user trial's 70B plan was 18 % faster as predicted than as launched)."""
    sc = pf.scenario
    st = sc.stack
    bf16 = evaluate(replace(sc, stack=replace(st, fp8_param_gather=False, fp8_tp_gather=False)),
                    exported, stack_offers=False)
    which = " and ".join(w for w, on in (("FSDP", st.fp8_param_gather),
                                         ("tensor-parallel", st.fp8_tp_gather)) if on)
    return (f"stack {st.name} moves fp8 in the {which} all-gathers (torchtitan's 2024 tensorwise "
            "Float8); torchtitan 0.3's Float8 converter offers rowwise scaling only, which gathers "
            f"in bf16: as launched the step is predicted at {bf16.step_time:.3f} s")


VARLEN_CONFIGS = {"gpt_oss_120b"}
"""``REGISTRY`` configs whose model_registry defaults to varlen attention, which torchtitan 0.3
refuses under context parallelism (models/gpt_oss/__init__.py attn_backend="varlen";
NotImplementedError in distributed/full_dtensor.py and context_parallel/api.py, 0.3.0 wheel)."""
LOSS_CHUNKS = 8
"""Chunks of the sequence the loss of every ``REGISTRY`` config runs over
(ChunkedLossWrapper.Config's num_chunks, torchtitan/components/loss.py, 0.3.0 wheel)."""


CP_COSTED = {"ring": "a ring exchange of K/V (Transformer Engine's)",
             "allgather": "an all-gather of K/V gathered again in the backward (torch's SDPA "
                          "context parallelism, torchtitan in 2024)",
             "te_allgather": "Transformer Engine's all-gather of K/V (windowed attention or sinks)"}
"""What a stack's ``cp_exchange_for`` costs, in the words of the note that tells it from
torchtitan 0.3's (a user trial: a megatron-core plan's note had named 2024's SDPA exchange)."""


def _registry_cp_notes(st, m, par, config: str, placeholder: bool, seq_len: int) -> list[str]:
    """What torchtitan 0.3's registry configs do with this plan's sequence and context
    parallelism that the stack does not cost (a review's): GPT-OSS's varlen attention refuses
    CP; its FlexAttention CP keeps the gathered K/V, which a stack with another exchange does not
    cost; its chunked loss needs each rank's sequence divisible by its chunks."""
    out = []
    if placeholder:
        return out
    if par.cp > 1 and config in VARLEN_CONFIGS:
        out.append(f"torchtitan's {config} runs varlen attention, which torchtitan 0.3 refuses "
                   "under context parallelism (NotImplementedError: distributed/full_dtensor.py)"
                   ": the run does not start as exported")
    elif par.cp > 1 and st.cp_exchange_for(m) != "flex_allgather":
        out.append(f"torchtitan 0.3 runs context parallelism through FlexAttention, whose "
                   f"attention keeps the all-gathered K/V; stack {st.name} costs "
                   f"{CP_COSTED[st.cp_exchange_for(m)]}, which keeps only its own shard (plan "
                   "with --stack torchtitan, or torchtitan-0.3-compile for a compiled run, to cost "
                   "it)")
    local = seq_len // par.cp
    if local % LOSS_CHUNKS:
        out.append(f"torchtitan's {config} computes the loss over {LOSS_CHUNKS} chunks of each "
                   f"rank's sequence, which must divide it: {local:,} tokens (seq_len / cp) do "
                   "not, and the run stops at its first loss (ChunkedLossWrapper, torchtitan/"
                   "components/loss.py)")
    return out


def float8_converters(moe: bool) -> str:
    """The Float8 converters a torchtitan model spec needs to run what nestplan costs in fp8: every
    linear layer but the output head and (MoE) the router, which the cost model runs in bf16
    (``graph``'s ``lowp=False``), and (MoE) the experts' grouped GEMMs, which
    ``Float8LinearConverter`` leaves in bf16 (it swaps linear layers only): as torchtitan 0.3's
    own configs set them (llama3_405b; deepseek_v3_671b_float8, torchtitan/models/*/
    config_registry.py, 0.3.0 wheel). A torchtitan MoE user's trial: the note had named the
    linear converter alone, which leaves two thirds of Qwen3-30B-A3B's GEMM FLOP in bf16."""
    compile_ = "; model_compile_enabled as the config compiles the model"
    if moe:
        return ('Float8LinearConverter.Config(filter_fqns=["lm_head", "router.gate"]) and '
                f"Float8GroupedExpertsConverter.Config() (as deepseek_v3_671b_float8 has{compile_})")
    return f'Float8LinearConverter.Config(filter_fqns=["lm_head"]) (as llama3_405b has{compile_})'


def _float8_config(config: str, moe: bool, notes: list[str]) -> str:
    """The registry config an fp8 plan of ``config``'s model launches: itself where it trains with
    a Float8 converter, else its ``_float8`` sibling, which only DeepSeek-V3 has; for the others a
    note asks for that function, so that the run does not start in bf16 under the name of a
    config that exists (a user trial's fp8 Llama 3 70B plan had exported ``llama3_70b``, which
    trains in bf16); ``moe``: the model has experts (``float8_converters``)."""
    if config in FLOAT8_CONFIGS:
        return config
    named = f"{config}_float8"
    if named not in FLOAT8_CONFIGS:
        notes.append(f"fp8: torchtitan 0.3's registry has no {named}; write it, a copy of "
                     f"config_registry.{config} with {float8_converters(moe)} in its model "
                     "spec's converters, or the run does not start; nestplan's prediction "
                     "assumes those fp8 matmuls")
    return named


def _chunked_loss_note(pf: PlanFile, exported, config: str) -> str:
    """torchtitan 0.3's configs (every one of ``REGISTRY``'s: loss=ChunkedLossWrapper.Config(...)
    in torchtitan/models/*/config_registry.py, 0.3.0 wheel) compute the loss over chunks of the
    sequence, 8 by default (``ChunkedLossWrapper.Config.num_chunks``, torchtitan/components/
    loss.py), which a stack of whole-logit loss (``loss_chunks`` 1: torchtitan-2024 and its
    variants) does not cost: the head's device holds a chunk's logits, not the sequence's (a user
    trial's 128K plan counted about 20 GiB of them)."""
    from ..cost.device import config_costs

    st = pf.scenario.stack
    logits = config_costs(pf.scenario, exported).logits  # a micro-batch's, as the model counts
    return (f"torchtitan's {config} computes the loss over chunks of the sequence "
            f"(ChunkedLossWrapper, 8 by default), which stack {st.name} does not: the predicted "
            "peak of the devices with the output layer counts the whole sequence's logits, "
            f"{fmt_gib(logits * st.loss_saved_bytes)} GiB a micro-batch keeps for backward and "
            f"{fmt_gib(st.loss_transient_bytes * logits)} GiB more at the loss's backward; the "
            "launched run holds about an eighth of them (--stack torchtitan, or torchtitan-0.3-compile "
            "for a compiled run, costs the chunks); the memory model's shortfall on held-out "
            "torchtitan runs, where a note gives it, is of runs that held the whole logits, as "
            "this prediction does (a torchtitan MoE trial read the two notes as opposite)")


def export(pf: PlanFile) -> Export:
    sc = pf.scenario
    groups, notes, exported, launched = _arguments(pf)
    predicted, stack_notes = headline(launched, exported, "torchtitan")
    notes += stack_notes
    lines = [f"# nestplan export for torchtitan 0.3: {sc.model.name} on {sc.gpus} x "
             f"{sc.cluster.accelerator.name} ({sc.cluster.name})",
             "# run: torchrun ... -m torchtitan.train $(grep -v '^#' THIS_FILE)",
             # (tyro parses what follows a subcommand as the subcommand's: a user trial's flags
             # appended after the file's had failed to parse)
             f"# the last line, {groups[-1][0]}, is a subcommand: any flags of your own go "
             "before $(...), not after it",
             *(f"# {line}" for line in predicted)]
    lines += [f"# note: {n}" for n in notes]
    lines += [" ".join(g) for g in groups]
    extras = {".mesh.json": mesh_json(pf.plan),
              **rank_files(pf.plan, TORCHTITAN_ORDER, sc.cluster.host_size, "torchtitan")}
    return Export(text="\n".join(lines) + "\n", extras=extras, notes=notes, plan=exported)
