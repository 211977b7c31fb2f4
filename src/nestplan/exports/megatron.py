"""Megatron-LM / Megatron-Core command-line arguments (``pretrain_gpt.py``).

Names follow Megatron-LM's ``megatron/training/arguments.py``. Non-uniform pipelines use
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` when only the
first and last stages differ, and ``--pipeline-model-parallel-layout`` otherwise (E = embedding,
t = transformer block, m = multi-token-prediction depth, L = loss/head, ``|`` ends a model chunk;
chunks are dealt round-robin). Multi-token prediction is ``--mtp-num-layers``; without a layout
Megatron runs the depths on the last stage, as nestplan does.
Megatron builds its process groups in the order tp-cp-ep-dp-pp; a plan with another rank order is
launched through the rank map written beside the arguments.
"""

from __future__ import annotations

from itertools import groupby

from ..axes import MEGATRON_ORDER, Axis
from ..catalog import get_stack
from ..options import MLPKind, Norm, Position, Precision, TPOverlap
from .. import graph as G
from ..evaluate import layer_graph
from ..placement import layouts, reach
from ..planfile import PlanFile
from ..schedule import SCHEDULES
from ..specs import (DEFAULT_NORM_EPS, DEFAULT_ROPE_THETA, LLAMA31_ROPE, blocks_per_chunk,
                     sinks_cp_refusal)
from . import (FORMAT_STACKS, Export, closest_schedule, evaluate, fit_notes, headline,
               launched_as, launching_stack, mesh_json, predicted_note, prediction, rank_files,
               rank_note)


MEGATRON_SCHEDULES = tuple(n for n, s in SCHEDULES.items() if s.megatron)
"""Schedules Megatron-Core runs (1F1B; interleaved with virtual stages)."""


PP_DP_ORDER = (Axis.TP, Axis.CP, Axis.PP, Axis.DP)
"""Megatron-LM's rank order under --use-tp-pp-dp-mapping: 'tp-cp-ep-pp-dp' instead of
'tp-cp-ep-dp-pp' (megatron/training/initialize.py @ d98e8a64dd)."""

LAUNCH_ARGS = "eval \"set -- $(grep -v '^#' FILE)\""
"""How the export's header says to read its arguments into bash's "$@" (FILE: the export):
eval keeps the layout string's quotes and joins the lines their trailing backslashes continue."""


def launch_order(par, model) -> tuple:
    """The rank order the export launches Megatron-LM in: its default, or its pp-before-dp one
    (``PP_DP_ORDER``, --use-tp-pp-dp-mapping) where that is the plan's, so that no rank wrapper
    is needed. Under that order Megatron-Core asserts, for a pipelined MoE model, that the
    experts' data-parallel size is the attention's (initialize_model_parallel,
    megatron/core/parallel_state.py @ d98e8a64dd): expert TP x EP must then be TP x CP."""
    if par.ranks_ordered_as(MEGATRON_ORDER) or not par.ranks_ordered_as(PP_DP_ORDER):
        return MEGATRON_ORDER
    if model.moe is not None and par.pp > 1 and par.expert_tp * par.ep != par.tp * par.cp:
        return MEGATRON_ORDER
    return PP_DP_ORDER


def _layout(sizes: list[int], mtp: int = 0) -> str:
    chunks = []
    for c, n in enumerate(sizes):
        text = ("E" if c == 0 else "") + ("t" * n if n <= 2 else f"t*{n}") + (
            "m" * mtp + "L" if c == len(sizes) - 1 else "")
        chunks.append(text)
    return "|".join(chunks)


YARN_CONTEXT = 4096
"""Tokens of pre-trained context Megatron-Core's YaRN assumes where none is given
(``YarnRotaryEmbedding``'s and MLATransformerConfig's ``original_max_position_embeddings``,
argument_utils.py's fallback; @ NVIDIA/Megatron-LM d98e8a64dd)."""

MLA_YARN_DEFAULTS = {"original context": YARN_CONTEXT, "beta_fast": 32.0, "beta_slow": 1.0}
"""What MLA's YaRN runs with where Megatron-LM has no flag: MLATransformerConfig's
``original_max_position_embeddings``, ``beta_fast`` and ``beta_slow``
(megatron/core/transformer/transformer_config.py @ NVIDIA/Megatron-LM d98e8a64dd; the
``--yarn-*`` flags fill only standard attention's, megatron/training/argument_utils.py
``_apply_yarn_config_from_args``)."""


def standard_yarn_refusal(m) -> str | None:
    """Why Megatron-LM cannot run ``m``'s YaRN on standard attention (None where it can, or the
    model has none, or MLA runs it): validate_args allows multi-token prediction with rope or
    no position embedding only (megatron/training/arguments.py), and ``YarnRotaryEmbedding``
    rotates whole heads, without --rotary-percent (yarn_rotary_pos_embedding.py; both @
    NVIDIA/Megatron-LM d98e8a64dd)."""
    if m.yarn is None or m.mla is not None:
        return None
    if m.mtp_layers:
        return ("Megatron-LM trains multi-token prediction with rope or no position embedding "
                "only")
    if m.rope_fraction != 1:
        return (f"Megatron-Core's YaRN rotates whole heads (no --rotary-percent "
                f"{m.rope_fraction:g})")
    return None


def _yarn_args(m, refusal: str | None, notes: list[str]) -> list[str]:
    """The flags of ``m``'s YaRN (``ModelSpec.yarn``), with notes for what they cannot say.
    MLA reads ``--rotary-scaling-factor``, ``--mscale`` and ``--mscale-all-dim`` into its own
    config, whose RoPE is YaRN by default; standard attention takes ``--position-embedding-type
    yarn`` (set by the caller where ``standard_yarn_refusal`` allows it) and the ``--yarn-*``
    flags too (arguments.py @ d98e8a64dd); ``refusal``: ``standard_yarn_refusal``'s."""
    y = m.yarn
    if refusal is not None:
        notes.append(f"YaRN (x{y.factor:g} context, cos/sin x{y.attention_factor:.4g}) not "
                     f"exported: {refusal}; the arguments run plain RoPE, set YaRN in the model's "
                     "config if your Megatron-LM runs it")
        return []
    args = [f"--rotary-scaling-factor {y.factor:.10g}", f"--mscale {y.mscale:.10g}",
            f"--mscale-all-dim {y.mscale_all_dim:.10g}"]
    if m.mla is not None:
        have = {"original context": y.original_max_positions or YARN_CONTEXT,
                "beta_fast": y.beta_fast,
                "beta_slow": y.beta_slow}
        off = [f"{k} {have[k]:g} (Megatron-Core: {v:g})" for k, v in MLA_YARN_DEFAULTS.items()
               if have[k] != v]
        if not y.round_to_int:
            off.append("an unrounded correction range (Megatron-Core rounds it)")
        if off:
            notes.append("MLA's YaRN has no Megatron-LM flag for " + ", ".join(off)
                         + ": set MLATransformerConfig's fields as the model's config gives them")
    else:
        if y.original_max_positions:
            args.append(f"--yarn-original-max-position-embeddings {y.original_max_positions}")
        args += [f"--yarn-beta-fast {y.beta_fast:g}", f"--yarn-beta-slow {y.beta_slow:g}"]
        if not y.round_to_int:
            args.append("--no-yarn-correction-range-round-to-int")
    if not y.original_max_positions:
        notes.append("YaRN's pre-trained context is not stated by the model; Megatron-Core "
                     f"takes {YARN_CONTEXT:,} tokens")
    return args


def _rope_scaling_args(sc, notes: list[str], mla: bool) -> list[str]:
    """Megatron-LM's flags for a Llama 3.1 or linear RoPE scaling (``ModelSpec.rope_scaling``),
    with a note where its flags cannot say all of it. With --use-rope-scaling pretrain_gpt.py
    runs Llama 3.1's (``LLAMA31_ROPE``) and no other: Megatron-Core fixes the frequency factors
    and pre-trained context (``RotaryEmbedding._apply_scaling``, megatron/core/models/common/
    embeddings/rotary_pos_embedding.py @ d98e8a64dd), and ``gpt_config_from_args`` passes no
    --rope-scaling-factor to the model (megatron/training/argument_utils.py, same commit: its
    GPTModelConfig keeps 8)."""
    if mla:  # MLA builds its own RoPE, scaled by YaRN only (megatron/core/transformer/
        # multi_latent_attention.py @ d98e8a64dd)
        notes.append(f"the {sc.kind} RoPE scaling (factor {sc.factor:g}) not exported: "
                     "Megatron-Core's MLA scales its RoPE by YaRN only")
        return []
    if sc.kind == "llama3":
        if sc != LLAMA31_ROPE:
            notes.append(f"the Llama 3.1 RoPE scaling (factor {sc.factor:g}, frequency factors "
                         f"{sc.low_freq_factor:g} and {sc.high_freq_factor:g}, pre-trained context "
                         f"{sc.original_max_positions:,}) is not the one pretrain_gpt.py runs "
                         "(factor 8, 1, 4, 8,192: it passes no --rope-scaling-factor to the model "
                         "and Megatron-Core fixes the rest): set GPTModelConfig.rope_scaling_factor "
                         "and RotaryEmbedding._apply_scaling's arguments")
        return ["--use-rope-scaling", f"--rope-scaling-factor {sc.factor:g}"]
    if sc.factor == int(sc.factor):  # (an integer flag: arguments.py @ d98e8a64dd)
        return [f"--rotary-seq-len-interpolation-factor {int(sc.factor)}"]
    notes.append(f"linear RoPE scaling by {sc.factor:g} not exported: Megatron-LM's "
                 "--rotary-seq-len-interpolation-factor takes an integer")
    return []


def _without_local_attention(pf: PlanFile, exported) -> str:
    """The prediction of the exported plan when the launched run attends to whole sequences, as
    these arguments, which carry no local attention, have it do."""
    from dataclasses import replace

    from ..textfmt import memory_verdict
    from ..units import GiB, fmt_time

    sc = pf.scenario
    whole = evaluate(replace(sc, model=sc.model.without_local_attention()), exported)
    return (f"the predictions above keep the local attention; launched as these arguments are, "
            f"with every layer attending to the whole sequence, the step is predicted at "
            f"{fmt_time(whole.step_time)} and the peak at {whole.peak_memory / GiB:.1f} GiB "
            f"({memory_verdict(whole)})")


def _gather_without_reduce(pf: PlanFile, exported) -> str:
    """Why --overlap-param-gather is left out of a stack that overlaps the gathers and not the
    gradient reduction (Megatron-Bridge runs it; pretrain_gpt.py's validate_args asserts
    "Must use --overlap-param-gather with --overlap-grad-reduce": megatron/training/
    arguments.py @ NVIDIA/Megatron-LM d98e8a64dd; an MoE user's trial): the header predicts the
    run as launched, its gathers waiting (``launched_as``); the note gives the step with them
    overlapped, as the stack runs them."""
    from ..units import fmt_time

    sc = pf.scenario
    overlapped = prediction(pf, exported)[0]
    return (f"stack {sc.stack.name} overlaps the parameter all-gathers but not the gradient "
            "reduction, which Megatron-LM's pretrain_gpt.py refuses (validate_args: "
            "--overlap-param-gather needs --overlap-grad-reduce; Megatron-Bridge runs the pair): "
            "--overlap-param-gather is left out, so the gathers wait, as the prediction with "
            f"stack {sc.stack.name} above has them (with them overlapped, as the stack runs them: "
            f"{fmt_time(overlapped.step_time)}; add --overlap-grad-reduce to overlap both)")


def _wgrad_delay_refused(args: list[str], m) -> str | None:
    """What in these arguments makes Megatron-LM's validate_args refuse --delay-wgrad-compute, in
    words, or None (megatron/training/arguments.py @ NVIDIA/Megatron-LM d98e8a64dd): under
    --overlap-grad-reduce, a weight gradient inside a CUDA graph (the attention graphed, or the
    router graphed beside shared experts that do not overlap it) needs gradient-accumulation
    fusion, and a graphed attention no biases."""
    if "--delay-wgrad-compute" not in args or "--overlap-grad-reduce" not in args:
        return None
    graphed = next((a.split()[1:] for a in args if a.startswith("--cuda-graph-modules ")), [])
    shared = any(a.startswith("--moe-shared-expert-intermediate-size ") for a in args)
    if not ("attn" in graphed or ("moe_router" in graphed and shared
                                  and "--moe-shared-expert-overlap" not in args)):
        return None
    if "--no-gradient-accumulation-fusion" in args:
        return ("weight gradients in a CUDA graph and no gradient-accumulation fusion (which "
                "Megatron-FSDP turns off)")
    if "attn" in graphed and (m.bias or m.qkv_bias):
        return "a CUDA-graphed attention that carries biases"
    return None


def _connections_note(args: list[str], par, acc) -> list[str]:
    """The CUDA_DEVICE_MAX_CONNECTIONS that Megatron-LM's validate_args asks of these arguments
    (megatron/training/arguments.py @ d98e8a64dd): Megatron-FSDP refuses 1; below compute
    capability 10 (``get_device_arch_version() < 10``: before Blackwell), tensor or context
    parallelism requires 1 unless the expert exchange overlaps compute; from 10 on, nothing (a
    user trial's GB200 plan had been told to set it "on GPUs before Blackwell")."""
    if "--use-megatron-fsdp" in args:
        return ["leave CUDA_DEVICE_MAX_CONNECTIONS unset or above 1: Megatron-LM refuses 1 with "
                "Megatron-FSDP"]
    cc = acc.compute_capability
    if (par.tp > 1 or par.cp > 1) and "--overlap-moe-expert-parallel-comm" not in args \
            and (cc is None or cc < 10):
        where = ("on GPUs before Blackwell" if cc is None
                 else f"on {acc.name} (compute capability {cc:g}, before Blackwell's 10)")
        return [f"set CUDA_DEVICE_MAX_CONNECTIONS=1 in the environment {where}: Megatron-LM "
                "requires it with tensor or context parallelism"]
    return []


FP32_ROUTER_EXPERTS = 32
"""Experts from which the router runs in fp32: TransformerConfig warns below it ("Using a large
number of experts (e.g. >=32) without fp32 routing", megatron/core/transformer/
transformer_config.py @ NVIDIA/Megatron-LM d98e8a64dd), and Megatron-Bridge's DeepSeek, Kimi and
GLM bridges set moe_router_dtype = "fp32" (src/megatron/bridge/models/ @ 067f987df0; an MoE
user's trial). Its cost, one fp32 GEMM of the tokens by the experts, is left out."""


def _router_args(moe) -> list[str]:
    """The router as Megatron-Core's flags name it (the models' own Megatron-LM configurations:
    examples/post_training/modelopt/conf/*/*.sh @ NVIDIA/Megatron-LM d98e8a64dd). A top-1
    softmax router scores before the top-k: TransformerConfig refuses it otherwise, the
    softmax over one chosen expert having no gradient (transformer_config.py, megatron-core
    0.16)."""
    args = []
    if moe.router_score == "sigmoid":
        args.append("--moe-router-score-function sigmoid")
    elif moe.router_pre_softmax or moe.top_k == 1:
        args.append("--moe-router-pre-softmax")
    if moe.router_expert_bias:
        args.append("--moe-router-enable-expert-bias")
    if moe.router_groups > 1:
        args += [f"--moe-router-num-groups {moe.router_groups}",
                 f"--moe-router-group-topk {moe.router_group_top_k}"]
    if moe.router_scale != 1:
        args.append(f"--moe-router-topk-scaling-factor {moe.router_scale:g}")
    if moe.experts >= FP32_ROUTER_EXPERTS:
        args.append("--moe-router-dtype fp32")
    # the balancing loss: Megatron-Core's default is an aux_loss at coefficient 0, none in effect
    # (TransformerConfig.moe_router_load_balancing_type, moe_aux_loss_coeff @ d98e8a64dd)
    if moe.aux_loss:
        kind = "seq_aux_loss" if moe.aux_loss_per_sequence else "aux_loss"
        args += [f"--moe-router-load-balancing-type {kind}", f"--moe-aux-loss-coeff {moe.aux_loss:g}"]
    else:
        args.append("--moe-router-load-balancing-type none")
    return args


def _moe_pattern(m) -> str:
    """``--moe-layer-freq`` as Megatron's pattern syntax."""
    return _pattern([1 if m.is_moe_layer(i) else 0 for i in range(m.layers)])


def _cp_exchange_args(m, par, stack, notes: list[str]) -> list[str]:
    """``--cp-comm-type`` under context parallelism: ``p2p``, the ring, unless the plan's stack
    (megatron-core for another format's) gathers K/V
    (``cp_exchange_for``: a stack file's ``cp_exchange = "allgather"``) or Transformer Engine
    refuses its default ring (``p2p``) under context parallelism (``cp_gathers_windows``):
    over sliding windows ``all_gather``, with learnable softmax offsets (GPT-OSS's sinks) ``a2a``,
    the only one TE takes there, which needs each TP rank's query and KV heads divisible by cp
    (``attn_forward_func_with_cp`` and its a2a path, transformer_engine/pytorch/attention/
    dot_product_attention/context_parallel.py @ NVIDIA/TransformerEngine d0067d0da). Megatron-Core
    passes the value to TE unchanged (extensions/transformer_engine.py @ d98e8a64dd): TE's
    spelling."""
    if par.cp == 1:
        return []
    te = get_stack(FORMAT_STACKS["megatron"])  # Transformer Engine's rules hold whatever the stack
    chosen = launching_stack(stack, "megatron").cp_exchange_for(m)
    if not (te.cp_exchange_for(m) == "te_allgather"
            or chosen in ("allgather", "te_allgather", "flex_allgather")):
        # the ring the cost model charges, written out though it is the default (arguments.py
        # @ d98e8a64dd: default ['p2p']), so that the launch says what was predicted (a
        # long-context trial's)
        return ["--cp-comm-type p2p"]
    if not m.attention_sinks:
        return ["--cp-comm-type all_gather"]  # as the cost model gathers K/V there
    # (a plan of another stack's: the rule TE's own plans keep, specs.sinks_cp_refusal)
    rule = sinks_cp_refusal(m, te, par.tp, par.cp)
    runs = "" if rule is None else f"; {rule}, which this plan's do not: it does not run as exported"
    notes.append("context parallelism with attention sinks: Transformer Engine runs it only with "
                 "the all-to-all exchange (--cp-comm-type a2a, exported), which the predictions "
                 f"above cost as a K/V all-gather{runs}")
    return ["--cp-comm-type a2a"]


def _window_args(m, notes: list[str]) -> list[str]:
    """A sliding window (``ModelSpec.sliding_window``) as Megatron-LM takes it: ``--window-size``
    (left, right) counts the tokens before each one that it attends to, transformers'
    ``sliding_window`` the window with the token itself (its flash path passes ``(w - 1, w - 1)``:
    modeling_flash_attention_utils.py, 5.23.0 wheel), and ``--window-attn-skip-freq`` the layers
    that attend to the whole sequence: every N-th (1-based) or a pattern, 1 for a windowed layer
    (``is_layer_window_attention``, megatron/core/transformer/utils.py @ d98e8a64dd)."""
    flags = [int(i in m.local_layers) for i in range(m.layers)] if m.local_layers else None
    if flags is None and m.local_share < 1:
        notes.append(f"a sliding window of {m.sliding_window} tokens on {m.local_share:.0%} of "
                     "the layers, which the model does not list (local_layers): set "
                     "--window-size and --window-attn-skip-freq as its recipe does")
        return []
    args = [f"--window-size {m.sliding_window - 1},0"]
    if flags is not None and not all(flags):
        every = _every_nth([1 - f for f in flags], divides=False, least=2)
        args.append(f"--window-attn-skip-freq {every}" if every else
                    f"--window-attn-skip-freq '{_pattern(flags)}'")
    return args


def _nope_args(m) -> list[str]:
    """Llama 4's NoPE layers as ``--no-rope-freq``: its chunked layers are those with RoPE and the
    others attend globally without it (``no_rope_layers``; ``hf._llama4``). Megatron-Core skips
    RoPE where the flag's per-layer list holds 1; an integer N is every N-th layer
    (``TransformerConfig.__post_init__``, megatron/core/transformer/transformer_config.py @
    d98e8a64dd)."""
    if not (m.local_span and not m.sliding_window and m.local_layers
            and m.position is Position.ROPE):
        return []
    flags = [int(i not in m.local_layers) for i in range(m.layers)]
    if not any(flags):
        return []
    # (an integer only where it divides the layers, which TransformerConfig asserts)
    every = _every_nth(flags, divides=True)
    return [f"--no-rope-freq {every}" if every else f"--no-rope-freq '{_pattern(flags)}'"]


def _every_nth(marks: list[int], *, divides: bool, least: int = 1) -> int | None:
    """The N (at least ``least``) for which ``marks`` (one 0/1 per layer) marks exactly every
    N-th layer (1-based), as Megatron-LM's integer frequency flags name a pattern; ``divides``:
    only an N that divides the layers. None: no such N (the flag then takes ``_pattern``)."""
    layers = len(marks)
    return next((n for n in range(least, layers + 1) if (not divides or layers % n == 0)
                 and marks == [int((i + 1) % n == 0) for i in range(layers)]), None)


def _pattern(flags: list[int]) -> str:
    """A per-layer 0/1 list in Megatron-LM's pattern syntax (no spaces: its parser allows only
    digits, ``,[]()+*``), e.g. ``([0]*3+[1]*58)``."""
    runs = [(f, len(list(group))) for f, group in groupby(flags)]
    if len(runs) <= 4:
        return "(" + "+".join(f"[{f}]*{n}" for f, n in runs) + ")"
    return "[" + ",".join(str(f) for f in flags) + "]"


def _layer_graphs(sc) -> tuple[list[str], list[str]]:
    """Per-layer CUDA graphs as Megatron-Core accepts them for this model and workload
    (transformer_config.py @ d98e8a64dd): whole layers (``local``), or the stack's modules
    (``transformer_engine``) less those the model or workload lacks."""
    m, tr, st = sc.model, sc.training, sc.stack
    padded = st.pads_experts(tr)
    dense = m.num_moe_layers < m.layers  # `mlp` only where dense layers exist
    if not st.cuda_graph_modules:
        if m.moe is None or padded:
            return ["--cuda-graph-impl local"], []
        # an MoE layer without padding has dynamic shapes: graph the attention (and the MLPs of
        # dense layers) and leave the MoE layers eager, as the cost model runs them
        return ["--cuda-graph-impl local",
                "--cuda-graph-modules attn" + (" mlp" if dense else "")], []
    token_copy = not padded and st.moe_dispatcher == "alltoall" and tr.moe_capacity is not None
    # `moe` as the cost model runs it: graphed only when padded (StackSpec.graphs_moe_layers)
    lacks = {"mlp": not dense, "moe": m.moe is None or not st.graphs_moe_layers(tr),
             "moe_router": m.moe is None, "moe_preprocess": m.moe is None or token_copy}
    kept = [x for x in st.cuda_graph_modules if not lacks.get(x, False)]
    dropped = [x for x in st.cuda_graph_modules if x not in kept]
    notes = [f"CUDA graph modules {', '.join(dropped)} left out: Megatron-Core refuses them for "
             "this model and workload (see StackSpec.cuda_graph_modules)"] if dropped else []
    if not kept:
        return [], notes
    return ["--cuda-graph-impl transformer_engine",
            "--cuda-graph-modules " + " ".join(kept)], notes


def _recompute_flags(policy, present, sizes: list[int]) -> tuple[list[str], list[str], bool]:
    """Megatron-LM's flags for one recompute policy, notes on them, and whether the flags only
    approximate the policy. ``present``: the modules the model has (only those are exported:
    Megatron-Core refuses moe_act without grouped experts and mla_up_proj without MLA,
    transformer_config.py @ d98e8a64dd; leaving the others out changes nothing the cost model
    runs, no operator of the model being in them); ``sizes``: blocks per model chunk of the
    stage the flags are for."""
    notes, approximated = [], policy.kind in ("matmul-outputs", "every")
    if policy.kind == "matmul-outputs":
        notes.append(f"recompute policy '{policy.name}' (per-op checkpointing) has no "
                     "Megatron equivalent; exported as selective recomputation of the "
                     "attention core, which keeps more")
    elif policy.kind == "every":
        notes.append(f"recompute policy '{policy.name}' ({policy.rule}) is approximated by "
                     f"--recompute-method block: the first ceil(n/{policy.every}) blocks of each "
                     "model chunk recompute fully, n the largest chunk on the stage (Megatron "
                     "takes one count per process; a smaller chunk recomputes more than its "
                     f"share of one block in every {policy.every}; the predictions are the "
                     "policy's)")
    modules = tuple(x for x in policy.modules if x in present)
    if policy.modules and not modules:
        notes.append(f"recompute policy '{policy.name}' recomputes nothing in this model (it "
                     f"has none of {', '.join(policy.modules)}): exported without recomputation")
    if policy.kind == "full":
        return ["--recompute-granularity full", "--recompute-method uniform",
                "--recompute-num-layers 1"], notes, approximated
    if policy.kind == "every":
        return ["--recompute-granularity full", "--recompute-method block",
                f"--recompute-num-layers {-(-max(sizes) // policy.every)}"], notes, approximated
    if policy.kind == "matmul-outputs" or (policy.kind == "modules" and modules):
        flags = ["--recompute-granularity selective"]
        if modules not in ((), ("core_attn",)):  # Megatron's default module list
            flags.append("--recompute-modules " + " ".join(modules))
        return flags, notes, approximated
    return [], notes, approximated


def _stage_script(pf: PlanFile, stage_flags: list[list[str]], order: tuple) -> str:
    """A bash wrapper for torchrun (``--no-python``) that runs its arguments with the recompute
    flags of the process's pipeline stage added. Megatron numbers ranks in ``order``, the launch
    order (tp-cp-ep-dp-pp; the rank map gives that numbering for another plan order; tp-cp-pp-dp
    under --use-tp-pp-dp-mapping), so the stage of rank ``RANK`` is ``(RANK / s) % pp`` for the
    pipeline axis's stride ``s`` in it: ``RANK / (tp·cp·dp)`` where pp is outermost (a user
    trial's script had assumed that under the mapping, and given stage 0's flags to ranks of
    stages 1 and 8)."""
    sc, par = pf.scenario, pf.plan
    stride = reach(par.with_(rank_order=order), Axis.PP) // par.pp
    inner = "·".join(a.value for a in order[:order.index(Axis.PP)])
    if stride * par.pp == par.devices:  # pp outermost
        stage, how = f"RANK / {stride}", f"RANK / {stride} ({inner})"
    else:
        stage = f"( RANK / {stride} ) % {par.pp}"
        how = f"(RANK / {stride}) % {par.pp} ({inner}, pp)"
    lines = ["#!/usr/bin/env bash",
             f"# nestplan: each pipeline stage's recomputation for {sc.model.name} on {sc.gpus} x "
             f"{sc.cluster.accelerator.name} ({par.recompute_text})",
             "# run: torchrun --no-python ... bash THIS_FILE python pretrain_gpt.py ARGUMENTS",
             f"# RANK, the Megatron rank (torchrun's, or the rank map's where the export wrote "
             f"one: its .ranks.sh sets it before this script runs), is in stage {how}",
             'if [ -z "${RANK:-}" ]; then echo "RANK is not set (run under torchrun)" >&2; '
             "exit 2; fi",
             f"case $(( {stage} )) in"]
    stages: dict[tuple[str, ...], list[int]] = {}
    for s, flags in enumerate(stage_flags):
        stages.setdefault(tuple(flags), []).append(s)
    for flags, which in stages.items():
        if flags:
            lines.append(f"  {'|'.join(map(str, which))}) set -- \"$@\" {' '.join(flags)} ;;")
    lines += ["esac", 'exec "$@"']
    return "\n".join(lines) + "\n"


def export(pf: PlanFile) -> Export:
    sc, par = pf.scenario, pf.plan
    m, tr = sc.model, sc.training
    notes = fit_notes(pf)
    # each stage's recompute policy: Megatron-LM's flags are per process, so stages that differ
    # get theirs from the stage script (``_stage_script``); the plan keeps every policy
    policies = [sc.stack.policy(par.recompute_of(s)) for s in range(par.pp)]
    exported, sched_notes = closest_schedule(pf, par, MEGATRON_SCHEDULES, "Megatron-Core",
                                             get_stack("megatron-core"))
    notes += sched_notes
    # a plan searched for another stack: Megatron-Core's own rule on biased experts
    why = get_stack("megatron-core").bias_refusal(exported.expert_tp, biased=m.biased_experts)
    if why is not None:
        notes.append(f"expert tensor parallelism {exported.expert_tp} cannot be expressed "
                     f"({why[2]}); exported with expert TP 1")
        exported = exported.with_(etp=1)
    # the run the arguments launch, where they cannot say what the plan's stack runs: per-op
    # checkpointing as Megatron's selective recomputation, and the parameter gathers waited for
    # where the stack does not overlap the gradient reduction (``_gather_without_reduce``); the
    # predictions and the notes that quote a step are of it
    gathers = sc.stack.overlap_param_gather and par.zero >= 1 and par.dp * par.cp > 1
    gathers_wait = gathers and not sc.stack.overlap_grad_reduce
    launched, launched_plan = launched_as(pf, exported, {
        p.name: "modules:core_attn" for p in policies if p.kind == "matmul-outputs"},
        **({"overlap_param_gather": False} if gathers_wait else {}))
    order = launch_order(par, m)
    args: list[str] = [
        f"--tensor-model-parallel-size {par.tp}",
        f"--pipeline-model-parallel-size {par.pp}",
        f"--context-parallel-size {par.cp}",
    ]
    if order == PP_DP_ORDER:  # the plan's own order: no rank wrapper (a user trial's)
        args.append("--use-tp-pp-dp-mapping")
    if par.sp:
        args.append("--sequence-parallel")
    args += _cp_exchange_args(m, par, sc.stack, notes)
    overlap = sc.stack.tp_overlap_for(layouts(exported, sc.cluster, sc.gpus).tp)
    if overlap is TPOverlap.FULL and par.tp > 1 and par.sp:
        # Transformer Engine's userbuffers: a TransformerConfig field, so a Megatron-LM flag,
        # which validate_args allows only with SP (megatron/training/arguments.py @ d98e8a64dd);
        # without SP the cost model exposes the forward all-reduces, as Megatron runs them
        args.append("--tp-comm-overlap")
    elif sc.stack.tp_overlap is TPOverlap.FULL and overlap is not TPOverlap.FULL and par.tp > 1 \
            and par.sp:
        notes.append(f"TP {par.tp} leaves one NVLink domain, where Transformer Engine's "
                     "userbuffer overlap cannot run: exported without --tp-comm-overlap, as "
                     "costed")
    if m.moe is not None:
        args += [f"--expert-model-parallel-size {par.ep}",
                 f"--expert-tensor-parallel-size {exported.expert_tp}",
                 f"--num-experts {m.moe.experts}", f"--moe-router-topk {m.moe.top_k}",
                 f"--moe-ffn-hidden-size {m.moe.ffn_hidden}", "--moe-grouped-gemm",
                 f"--moe-token-dispatcher-type {sc.stack.moe_dispatcher}",
                 # the cost model's permutation and unpermutation are one memory pass each, as
                 # Transformer Engine's fused kernels run them; Megatron-Core's default is the
                 # unfused path (moe_permute_fusion False: transformer_config.py @ d98e8a64dd),
                 # and Megatron-Bridge's MoE providers turn it on (gpt_oss_provider.py @
                 # NVIDIA-NeMo/Megatron-Bridge 355cef4570)
                 "--moe-permute-fusion"]
        args += _router_args(m.moe)
        if m.moe.scores_on_input:
            # the router's score scales each expert's input (Llama 4): a TransformerConfig field,
            # so a flag of Megatron-LM's (its transformer group is built from the config's
            # fields: ArgumentGroupFactory, megatron/training/arguments.py @ d98e8a64dd; a user
            # trial found the export had said there was none); experts.py takes it at top-1 only
            if m.moe.top_k == 1:
                args.append("--moe-apply-probs-on-input")
            else:  # (Megatron-Core asserts top-1 in the experts' forward: experts.py)
                notes.append("the router's score scales each expert's input, not its output: "
                             "Megatron-Core's --moe-apply-probs-on-input runs at top-1 only "
                             f"and this model routes to {m.moe.top_k}, so the export leaves it "
                             "out and the run weights the experts' outputs instead")
        # (StackSpec.flex_backend: a MoE trial's GB200 export had asked for deepep, which its
        # recipes' rows did not run)
        if (backend := sc.stack.flex_backend(sc.cluster)) is not None:
            args.append(f"--moe-flex-dispatcher-backend {backend}")
            if backend == "hybridep":  # (a review's: the launch fails without it)
                notes.append("--moe-flex-dispatcher-backend hybridep needs DeepEP built with "
                             "HybridEP (deep_ep.HybridEPBuffer, which Megatron-Core imports in "
                             "megatron/core/transformer/moe/fused_a2a.py)")
        if tr.moe_capacity is not None:
            args.append(f"--moe-expert-capacity-factor {tr.moe_capacity:g}")
            if sc.stack.pads_experts(tr):
                args.append("--moe-pad-expert-input-to-capacity")
        if sc.stack.moe_overlap == "batch" and par.ep > 1:
            args.append("--overlap-moe-expert-parallel-comm")
            if sc.stack.delay_wgrad:
                args.append("--delay-wgrad-compute")
            if m.mtp_layers and par.pp == 1:  # (a user trial's, on the installed 0.16.1)
                notes.append("the expert all-to-all overlapped with a multi-token-prediction "
                             "depth and no pipeline runs on Megatron-LM @ d98e8a64dd, which these "
                             "flags are for; megatron-core 0.16 refuses it (\"Pipeline model "
                             "parallel size must be larger than 1 when enabling "
                             "overlap_moe_expert_parallel_comm with MTP layer\")")
        elif sc.stack.moe_overlap == "shared" and m.moe.shared_experts:
            args.append("--moe-shared-expert-overlap")
        if m.moe.shared_experts:
            args.append("--moe-shared-expert-intermediate-size "
                        f"{m.moe.shared_experts * (m.moe.shared_ffn_hidden or m.moe.ffn_hidden)}")
        if m.moe.shared_expert_gate:  # (TransformerConfig fields are Megatron-LM's flags)
            args.append("--moe-shared-expert-gate")
        if m.moe.first_dense_layers or m.moe.layer_freq > 1 or m.moe.layers:
            args.append(f"--moe-layer-freq '{_moe_pattern(m)}'")
    if m.mla is not None:
        a = m.mla
        args += ["--multi-latent-attention", f"--kv-lora-rank {a.kv_lora_rank}",
                 f"--qk-head-dim {a.qk_nope_head_dim}",
                 f"--qk-pos-emb-head-dim {a.qk_rope_head_dim}", f"--v-head-dim {a.v_head_dim}"]
        if a.q_lora_rank:
            args.append(f"--q-lora-rank {a.q_lora_rank}")
    sizes = list(blocks_per_chunk(m, exported))  # the exported plan's chunks
    uniform = len(set(sizes)) == 1
    if exported.vp > 1 and not sc.stack.overlap_p2p:
        # Megatron-LM overlaps the interleaved schedule's sends by default (its only flag is
        # --no-overlap-p2p-communication), and refuses to turn that off over two stages
        # (validate_args, megatron/training/arguments.py @ d98e8a64dd)
        if par.pp > 2:
            args.append("--no-overlap-p2p-communication")
        else:
            notes.append(f"stack '{sc.stack.name}' does not overlap the pipeline's sends, which "
                         "Megatron-LM always does with interleaving over two stages: the launched "
                         "run overlaps them")
    group = exported.pipeline.rounds_of(par.pp, exported.vp, tr.micro_batches(par.mbs, par.dp))
    if group not in (None, par.pp):
        # rounds of pp by default; the least group Megatron-Core's checks allow, which
        # nestplan's interleaved order runs (megatron/core/model_parallel_config.py l.431-445,
        # pipeline_parallel/schedules.py l.1160-1180 @ d98e8a64dd)
        args.append(f"--microbatch-group-size-per-virtual-pipeline-stage {group}")
    if uniform:
        if exported.vp > 1:
            args.append(f"--num-layers-per-virtual-pipeline-stage {sizes[0]}")
    elif exported.vp == 1 and (par.pp == 2 or len(set(sizes[1:-1])) == 1) and min(
            sizes[0], sizes[-1]) > 0:  # Megatron wants blocks on both ends for these flags
        args += [f"--decoder-first-pipeline-num-layers {sizes[0]}",
                 f"--decoder-last-pipeline-num-layers {sizes[-1]}"]
    else:
        args.append(f"--pipeline-model-parallel-layout '{_layout(sizes, m.mtp_layers)}'")
    present = layer_graph(m, exported, tr, sc.stack).modules
    # (an every:N policy's count follows its stage's chunks, so its flags are per stage)
    local = exported.pipeline.per_device(sizes, par.pp, exported.vp)
    keys = [(p, tuple(local[s]) if p.kind == "every" else ()) for s, p in enumerate(policies)]
    by_key = {k: _recompute_flags(k[0], present, list(k[1])) for k in dict.fromkeys(keys)}
    notes += dict.fromkeys(why for _, whys, _ in by_key.values() for why in whys)
    stage_flags = [by_key[k][0] for k in keys]
    staged = len(set(map(tuple, stage_flags))) > 1  # flags per stage: the stage script's
    if not staged:
        args += stage_flags[0]
    if par.zero == 1:
        args.append("--use-distributed-optimizer")
    elif par.zero in (2, 3):  # the flags Megatron-FSDP's user guide lists as required
        strategy = "optim_grads" if par.zero == 2 else "optim_grads_params"
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}",
                 "--use-distributed-optimizer", "--no-gradient-accumulation-fusion",
                 "--ckpt-format fsdp_dtensor"]
        # (Megatron-FSDP asserts this format: megatron/training/arguments.py @ NVIDIA/Megatron-LM
        # d98e8a64dd; an MoE user's trial, continuing a pre-training run, was not told)
        notes.append("Megatron-FSDP saves and loads only --ckpt-format fsdp_dtensor: a "
                     "torch_dist checkpoint to continue from (a run without it, or one imported "
                     "from HuggingFace) is converted first, with Megatron-LM's "
                     "tools/checkpoint/checkpoint_inspector.py convert-torch-dist-to-fsdp-dtensor "
                     "(its --param-to-param-group-map-json, and --swiglu for a gated MLP: "
                     "examples/megatron_fsdp/sbatch_checkpoint_convert.sh @ NVIDIA/Megatron-LM "
                     "d98e8a64dd)")
    if sc.stack.overlap_grad_reduce and (par.dp * par.cp) > 1:
        args.append("--overlap-grad-reduce")
    if gathers_wait:
        notes.append(_gather_without_reduce(pf, exported))
    elif gathers:
        args.append("--overlap-param-gather")
    if tr.document_span is not None:  # (costed within documents: masked so; a long-context
        # trial's export had quoted the per-document step and left the masking to the user)
        args.append("--dataloader-inter-document-masking")
        if par.cp > 1:  # (a review: the pairing is not one nestplan's tests run)
            notes.append("with context parallelism, --dataloader-inter-document-masking hands "
                         "Transformer Engine each document as a THD sub-sequence, which it splits "
                         "over the CP ranks in 2·cp chunks (lengths padded to a multiple of "
                         f"{2 * par.cp})"
                         + ("; with attention sinks it needs cuDNN 9.18 or later (TE refuses "
                            "sinks in THD under CP before: context_parallel.py @ d0067d0da)"
                            if m.attention_sinks else "")
                         + ": nestplan costs the documents, not that padding, and does not run "
                         "this pairing in its tests; compare the first steps' loss with a run "
                         "without CP")
    args += [f"--micro-batch-size {par.mbs}", f"--global-batch-size {tr.global_batch}",
             f"--seq-length {tr.seq_len}",
             f"--max-position-embeddings {max(tr.seq_len, m.max_positions)}",
             f"--num-layers {m.layers}", f"--hidden-size {m.hidden}",
             f"--num-attention-heads {m.heads}", f"--kv-channels {m.head_dim}",
             f"--ffn-hidden-size {m.ffn_hidden}"]
    if m.mtp_layers:
        args.append(f"--mtp-num-layers {m.mtp_layers}")
    if sc.stack.cuda_graphs == "full_iteration":  # validate_args wants the NaN check off with it
        args += ["--cuda-graph-impl full_iteration", "--no-check-for-nan-in-loss-and-grad"]
    elif sc.stack.cuda_graphs == "layers":
        graph_args, graph_notes = _layer_graphs(sc)
        args += graph_args
        notes += graph_notes
    refused = _wgrad_delay_refused(args, m)
    if refused is not None:
        args.remove("--delay-wgrad-compute")
        notes.append(f"--delay-wgrad-compute left out: Megatron-LM refuses it under "
                     f"--overlap-grad-reduce with {refused} (validate_args); the expert exchange "
                     "still overlaps the other micro-batch, and the prediction does not cost the "
                     "delay apart")
    if m.kv_heads != m.heads:
        args += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    # the model's checkpoints hold the norms' weights: Qwen3's per-head QK norms, and with MLA
    # its low-rank queries' and keys' norms (DeepSeek's q_a_layernorm and kv_a_layernorm), which
    # Megatron builds only with the flag (Megatron-Bridge's DeepSeek providers set qk_layernorm:
    # src/megatron/bridge/models/deepseek/deepseek_provider.py @ NVIDIA-NeMo/Megatron-Bridge
    # 355cef4570)
    if m.qk_norm or m.mla is not None:
        args.append("--qk-layernorm")
    elif m.qk_l2_norm:  # Llama 4's weightless norms (a TransformerConfig field, qk_l2_norm)
        args.append("--qk-l2-norm")
    if m.glu_clamp:
        # the clamped GLU is GPT-OSS's (the one family that has it): quick GeLU on the clamped
        # gate times the clamped linear half plus 1 (transformers' GptOssExperts, alpha 1.702),
        # which Megatron-Core runs as written with these flags (megatron/core/transformer/mlp.py
        # and fusions/fused_bias_geglu.py @ d98e8a64dd)
        args += ["--quick-geglu", "--glu-linear-offset 1",
                 f"--activation-func-clamp-value {m.glu_clamp:g}"]
    elif m.mlp is MLPKind.SWIGLU:
        args.append("--swiglu")
    elif m.mlp is MLPKind.GEGLU:
        # Megatron-LM gates with GeLU only as --quick-geglu (x·sigmoid(1.702x), the sigmoid
        # approximation of GeLU: megatron/core/fusions/fused_bias_geglu.py @ d98e8a64dd)
        args.append("--quick-geglu")
        if m.bias:  # its fused bias-activation kernels take GeLU or SwiGLU only: MLP.forward
            # refuses quick GeLU with them (megatron/core/transformer/mlp.py @ d98e8a64dd)
            args.append("--no-bias-gelu-fusion")
        notes.append("the MLP is gated by GeLU, which Megatron-LM's flags give only as "
                     "--quick-geglu, x·sigmoid(1.702x) (exact for quick_gelu; for the erf or tanh "
                     "GeLU set TransformerConfig's activation_func with gated_linear_unit)")
    elif m.mlp is MLPKind.SQUARED_RELU:
        args.append("--squared-relu")
    if m.norm is Norm.RMSNORM:
        args.append("--normalization RMSNorm")
    if m.norm_eps != DEFAULT_NORM_EPS:  # (Megatron-Core's default)
        args.append(f"--norm-epsilon {m.norm_eps:g}")
    if not m.bias:
        args.append("--disable-bias-linear")
    if m.qkv_bias:
        args.append("--add-qkv-bias")
    if m.attention_sinks:  # GPT-OSS's sinks: a learned offset per head in the softmax
        args.append("--softmax-type learnable")
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    yarn_refusal = standard_yarn_refusal(m)
    standard_yarn = m.yarn is not None and m.mla is None and yarn_refusal is None
    args.append("--position-embedding-type " + (
        ("yarn" if standard_yarn else "rope") if m.position is Position.ROPE else "learned_absolute"))
    if m.rope_fraction != 1:  # (a fraction, despite its name: arguments.py @ d98e8a64dd)
        args.append(f"--rotary-percent {m.rope_fraction:g}")
    if m.position is Position.ROPE and m.rope_theta != DEFAULT_ROPE_THETA:  # Megatron's default
        args.append(f"--rotary-base {round(m.rope_theta)}")  # an int (arguments.py @ d98e8a64dd)
        if m.rope_theta != round(m.rope_theta):
            notes.append(f"RoPE base {m.rope_theta:g} exported as {round(m.rope_theta)}: "
                         "Megatron-LM's --rotary-base takes an integer")
    if m.yarn is not None:
        args += _yarn_args(m, yarn_refusal, notes)
    if m.rope_scaling is not None:
        args += _rope_scaling_args(m.rope_scaling, notes, m.mla is not None)
    if m.position is Position.ALIBI:
        notes.append("ALiBi position biases have no Megatron-Core argument; the model uses "
                     "learned absolute positions in the export")
    # Llama 4's chunks change nothing where a sequence fits in one (a user trial's note had
    # quoted the same step and peak as the plan's)
    chunked = bool(m.local_span) and not m.sliding_window and m.local_span < sc.training.seq_len
    unexported = ([f"RoPE scaled by x{m.rope_mscale:.4g}"] if m.rope_mscale != 1 and m.yarn is None
                  else []) \
        + ([f"chunked attention on {m.local_share:.0%} of the layers (Llama 4's; Megatron-LM "
            "has no flag for chunks)"]
           if chunked else []) \
        + (["the experts' biases without the other layers' (Megatron-Core's add_bias_linear "
            "gives every linear layer one or none)"] if m.biased_experts and not m.bias else [])
    if unexported:
        listed = ", ".join(unexported[:-1]) + " and " + unexported[-1] if len(unexported) > 1 \
            else unexported[0]
        notes.append(listed + " not exported (nestplan keeps their cost, not "
                     "their parameters): set them as the model's recipe does")
    windows = _window_args(m, notes) if m.sliding_window else []
    args += windows + _nope_args(m)
    if chunked:
        notes.append(_without_local_attention(launched, launched_plan))
    fused_ops = G.eager_split(m, sc.stack.eager_ops)[1]
    fused = [what for what, op in (("the GLU clamp", "glu_clamp"),
                                   ("the experts' output bias", "expert_bias")) if op in fused_ops]
    if fused and sc.stack.export_format == "megatron":
        # Transformer Engine's op fuser runs both inside the fused grouped MLP (a TransformerConfig
        # field, so a Megatron-LM flag: megatron/training/arguments.py @ d98e8a64dd builds the
        # transformer arguments from TransformerConfig)
        args.append("--use-transformer-engine-op-fuser")
        notes.append(f"stack '{sc.stack.name}' runs {' and '.join(fused)} fused, as Transformer "
                     "Engine's op fuser does: exported with --use-transformer-engine-op-fuser")
    if not m.dropout:
        args += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    args.append("--bf16")
    if sc.stack.grad_bytes == 2:  # bf16 gradient buffers and reductions: without the flag
        # Megatron-LM accumulates and reduces bf16 models' gradients in fp32 (validate_args,
        # megatron/training/arguments.py @ d98e8a64dd), twice the memory the plan was costed with
        args.append("--grad-reduce-in-bf16")
    if tr.precision is Precision.FP8:
        # per-tensor current scaling on Hopper, MXFP8 (1x32 blocks, Blackwell's tensor cores) from
        # compute capability 10: both run with layernorm and moe_act recomputation, unlike
        # Megatron's default, delayed scaling (transformer_config.py @ d98e8a64dd), and both cast
        # each input once, as the cost model charges; NeMo's Hopper recipes use the first
        # (*_FP8_CS), its Blackwell ones the second (fp8_mx, e.g. _enable_deepseek_full_iteration_
        # mxfp8, src/megatron/bridge/perf_recipes/deepseek/common.py @ NVIDIA-NeMo/Megatron-Bridge
        # 067f987df0; a MoE trial's GB200 export had asked for the Hopper recipe), MXFP8 in
        # e4m3 as their bf16_with_mxfp8_mixed sets it (training/mixed_precision.py there; an
        # accelerator file without a compute capability is taken as pre-Blackwell)
        mx = (sc.cluster.accelerator.compute_capability or 0.0) >= 10.0
        args += [f"--fp8-format {'e4m3' if mx else 'hybrid'}",
                 f"--fp8-recipe {'mxfp8' if mx else 'tensorwise'}",
                 "--transformer-impl transformer_engine"]
        # the stack whose memory the run is predicted with
        if par.zero >= 1 and launching_stack(sc.stack, "megatron").fp8_primary_weights:
            # fp8 weights in place of bf16 ones and of Transformer Engine's cached fp8 copies, as
            # the memory model counts them (StackSpec.fp8_primary_weights); Megatron-LM allows it
            # with the distributed optimizer or FSDP (validate_args @ d98e8a64dd)
            args.append("--fp8-param-gather")
            if mx and par.zero == 1:  # under MXFP8 the distributed optimizer's parameter
                # all-gather reuses the gradient buffer, "only when fp8_recipe is mxfp8 and
                # fp8_param_gather is True" (distributed_data_parallel_config.py @ d98e8a64dd),
                # as NeMo's recipe sets it; Megatron-FSDP (ZeRO 2/3) turns it off (validate_args)
                args.append("--reuse-grad-buf-for-mxfp8-param-ag")
    notes += _connections_note(args, par, sc.cluster.accelerator)
    notes += rank_note(par, order, "Megatron", "tp-cp-ep-dp-pp",
                       "python pretrain_gpt.py ARGUMENTS")
    if staged:
        how = par.recompute_text + ("" if len(set(policies)) > 1 else
                                    ", with a count of blocks per stage")
        notes.append("the stages recompute differently (" + how + "), so these "
                     "arguments hold no --recompute-* flag: launch through the stage script, "
                     "which adds each stage's: torchrun --no-python ... bash PATH.stages.sh "
                     "python pretrain_gpt.py ARGUMENTS" + (
                         " (inside the rank wrapper, which sets RANK first: torchrun "
                         "--no-python ... bash PATH.ranks.sh bash PATH.stages.sh python "
                         "pretrain_gpt.py ARGUMENTS)"
                         if not par.ranks_ordered_as(order) else ""))
    if sched_notes or any(approximated for _, _, approximated in by_key.values()) \
            or exported.expert_tp != par.expert_tp:
        notes.append(predicted_note(launched, launched_plan, "megatron", saved=pf))
    predicted, stack_notes = headline(launched, launched_plan, "megatron")
    notes += stack_notes
    head = [f"# nestplan export for Megatron-LM (pretrain_gpt.py): {m.name} on {sc.gpus} x "
            f"{sc.cluster.accelerator.name} ({sc.cluster.name})",
            *(f"# {line}" for line in predicted),
            f"# vocabulary: {m.vocab} (set by the tokenizer; Megatron pads it to a multiple "
            f"of 128·tp)",
            # (a user trial pasted the whole file, comments too, after pretrain_gpt.py)
            f"# to launch: paste the argument lines below (not these comments) after "
            f"\"pretrain_gpt.py \\\" in a script, or in bash, FILE being this file: "
            f"{LAUNCH_ARGS}; torchrun ... pretrain_gpt.py \"$@\""]
    head += [f"# note: {n}" for n in notes]
    extras = {".stages.sh": _stage_script(pf, stage_flags, order)} if staged else {}
    extras.update(rank_files(par, order, sc.cluster.host_size, "Megatron"))
    if not par.ranks_ordered_as(order):  # Megatron's own order needs no mesh either
        extras[".mesh.json"] = mesh_json(par)
    text = "\n".join(head) + "\n" + " \\\n".join(args) + "\n"
    return Export(text=text, extras=extras, notes=notes, plan=exported)
