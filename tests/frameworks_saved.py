#!/usr/bin/env python3
"""Measure the activation bytes that the frameworks' own transformer blocks save for backward.

A standalone helper for the memory-model checks: tests run it in a subprocess (it needs the
``frameworks`` extra: torch CPU, megatron-core, torchtitan) and compare its JSON with nestplan's
prediction. Checked with torch 2.13 (CPU), megatron-core 0.16.1 and torchtitan 0.3.0.

    python tests/frameworks_saved.py megatron --seq 256 --batch 1 --hidden 512 --heads 8 \
        --groups 2 --ffn 1408 --policy none|selective|full [--modules core_attn,layernorm,...]
        [--swiglu-fusion] [--no-rope]
        [--moe-experts 4 --topk 2 --moe-ffn 512 [--shared-ffn 1024 --shared-gate]]
        [--mla 192,64,64,32,64]    # multi-latent attention, its core the flash stand-in
    python tests/frameworks_saved.py torchtitan --seq 256 ... \
        --policy none|full|selective-op|selective-layer
        [--moe-experts 4 --topk 2 --moe-ffn 512]    # Qwen3 MoE blocks instead of Llama 3's
    python tests/frameworks_saved.py --all    # the small matrix below, as a JSON list
    python tests/frameworks_saved.py --batch '[["megatron", "--policy", "full"], ...]'
        # several runs of one framework in one process (what the tests use)

Each run prints ONE JSON object on stdout (the frameworks' chatter goes to stderr):
``framework``, ``policy``, ``config``, ``saved_bytes_per_block`` (bytes held for backward by a
stack of two blocks, divided by two), the same per token per hidden unit, breakdowns
(``sxs_bytes_per_block``, ``rmsnorm_*``, see ``summarise``), ``tensors`` (one entry per storage:
shape and dtype of the largest tensor seen on it, the storage's nbytes, origin, module,
per_block) and ``notes``.

Method
------
* Two transformer blocks with bf16 parameters run one forward pass on CPU (training mode,
  dropout 0) on a bf16 input that requires grad (standing for the previous block's output). During
  the forward ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor autograd saves. They
  are counted once per storage object (views share one; an address freed in place and given to
  a later tensor is two), at the size the storage has when the forward ends (output-discarding
  checkpointing frees a saved output's storage in place), and only if autograd still holds them
  then (a weak reference to the packed tensor: a dropped branch of the graph frees what it
  saved). Backward then runs once, as a check (its bf16 matrix products in fp32:
  ``Fp32Matmuls``).
* Not counted: parameters and whatever shares a parameter's storage (e.g. ``weight.t()``), module
  buffers (e.g. torchtitan's RoPE table, a slice of which RoPE saves), and inputs shared by all
  blocks (attention mask, rotary table): those are listed with ``"per_block": false``.
* ``origin``: an aten op's autograd kernel packs while it builds its node, so that node holds the
  last sequence number (``torch._C._autograd._get_sequence_nr() - 1``); the graph is walked after
  the forward to name the numbers (``MmBackward0`` ...). ``ctx.save_for_backward`` of a custom
  autograd.Function is packed by ``Function.apply`` itself, named after the class
  (``CheckpointFunctionBackward`` ...); ``torch.utils.checkpoint (saved inputs)`` marks the inputs a
  non-reentrant checkpoint keeps. ``module`` is the innermost module running at the time.
* Inside a non-reentrant checkpoint region the checkpoint's own saved-tensor hooks replace ours
  (only the innermost pair of hooks acts): nothing saved there is held, except that per-op
  selective checkpointing (``create_selective_checkpoint_contexts``) keeps the outputs of the ops
  its policy saves in a cache of its own. That cache is read after the forward (origin
  ``sac:<op>``, no module) and merged by storage.

Caveats (also in ``notes``)
---------------------------
* What is listed is what the CPU path of the frameworks' Python code saves. Known differences
  from GPU: torch's RMSNorm has no fused CPU kernel (its decomposition saves fp32 copies; see
  ``saved_bytes_per_block_fused_rmsnorm``); Megatron's local spec materialises attention
  (``DotProductAttention`` saves the s x s probabilities: ``sxs_bytes_per_block``); torchtitan's
  FlexAttention has no CPU backward, so its kernel call is replaced by ``flash_attention_standin``,
  an op that saves what a flash/flex kernel saves.
* Bytes per block are total / 2. For torchtitan ``selective-layer`` (every 2nd block fully
  checkpointed) the two blocks differ and the figure is their average, what a long stack tends to.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import types
import warnings
import weakref

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves
from torch.utils._python_dispatch import TorchDispatchMode

MEGATRON_POLICIES = ("none", "selective", "full")
TORCHTITAN_POLICIES = ("none", "full", "selective-op", "selective-layer")
N_BLOCKS = 2
_FUNCTION_APPLY_CODE = torch.autograd.Function.apply.__code__


# --------------------------------------------------------------------------------- counting
def _local(t: torch.Tensor) -> torch.Tensor:
    """A tensor-parallel DTensor's shard on this rank (what its storage is), else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


class SavedTensorCounter:
    """Record what autograd saves for backward during a forward pass (see the module docstring)."""

    def __init__(self, root: nn.Module, shared: dict[str, torch.Tensor]):
        self.param_ptrs = {_local(p).untyped_storage().data_ptr() for p in root.parameters()}
        self.buffer_ptrs = {_local(b).untyped_storage().data_ptr() for b in root.buffers()}
        self.shared = {_local(t).untyped_storage().data_ptr(): name for name, t in shared.items()}
        self.module_names = {id(m): name or "<root>" for name, m in root.named_modules()}
        self.module_stack: list[str] = []
        self.entries: dict[int, dict] = {}       # storage object (StorageImpl address) -> record
        self.sac_storages: list[dict] = []       # per-op SAC caches to read after the forward
        self._hooks: list = []

    # -- hooks
    def _record(self, t: torch.Tensor, origin_seq: int | None, origin: str | None, ref) -> None:
        t = _local(t)
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0 or ptr in self.param_ptrs or ptr in self.buffer_ptrs:
            return
        # One entry per storage object (its StorageImpl, which views share), not per address:
        # output-discarding checkpointing frees a saved output's memory in place while the saved
        # tensor lives on, and the allocator may give that address to a later tensor, which had
        # then been merged into the first one's entry (its origins and module mixed, so which
        # bytes counted as the norms' depended on the allocator's state).
        key = storage._cdata
        e = self.entries.get(key)
        if e is not None and not any(r() is not None for r in e["refs"]):
            e = None              # what was saved there was freed; the object may be reused
        if e is None:
            e = self.entries[key] = {"nbytes": 0, "view_nbytes": -1, "seqs": [], "origins": [],
                                     "refs": [], "ptr": ptr,
                                     "module": self.module_stack[-1] if self.module_stack else ""}
        e["nbytes"] = max(e["nbytes"], storage.nbytes())
        if t.numel() * t.element_size() > e["view_nbytes"]:      # describe the largest view
            e["view_nbytes"] = t.numel() * t.element_size()
            e["shape"], e["dtype"] = list(t.shape), str(t.dtype)
        if origin_seq is not None:
            e["seqs"].append(origin_seq)
        if origin is not None:
            e["origins"].append(origin)
        e["refs"].append(ref)

    def _pack(self, t: torch.Tensor):
        caller = sys._getframe(1)
        if caller.f_code is _FUNCTION_APPLY_CODE:
            # ctx.save_for_backward of a custom autograd.Function, packed by Function.apply after
            # its forward ran (which may have taken more sequence numbers): name it by class.
            name = caller.f_locals["cls"].__name__
            if name.startswith("GeneratedBackwardFor_"):     # a custom op's autograd
                name = name[len("GeneratedBackwardFor_"):]
            self._record(t, None, f"{name}Backward", weakref.ref(t))
        elif caller.f_code.co_filename.endswith(os.path.join("torch", "utils", "checkpoint.py")):
            # non-reentrant torch.utils.checkpoint keeps the region's inputs (save_inputs)
            self._record(t, None, "torch.utils.checkpoint (saved inputs)", weakref.ref(t))
        else:
            # An aten op's autograd kernel: the node under construction took the last number.
            self._record(t, torch._C._autograd._get_sequence_nr() - 1, None, weakref.ref(t))
        return t

    def _pre_hook(self, module, args):
        name = self.module_names.get(id(module))
        if name is None:          # a module made on the fly (e.g. a Softmax inside a forward)
            parent = self.module_stack[-1] if self.module_stack else "<root>"
            name = f"{parent}.<{type(module).__name__}>"
        self.module_stack.append(name)

    def _post_hook(self, module, args, output):
        if self.module_stack:
            self.module_stack.pop()

    @contextlib.contextmanager
    def forward(self):
        from torch.nn.modules import module as nn_module
        self._hooks = [nn_module.register_module_forward_pre_hook(self._pre_hook),
                       nn_module.register_module_forward_hook(self._post_hook, always_call=True)]
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                yield self
        finally:
            for h in self._hooks:
                h.remove()
            self.module_stack.clear()

    # -- results
    def finish(self, outputs: list[torch.Tensor]) -> list[dict]:
        """Name the saving nodes, add the SAC caches and return one record per live storage."""
        names: dict[int, str] = {}
        todo = [t.grad_fn for t in outputs if t.grad_fn is not None]
        seen = set()
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            names[node._sequence_nr()] = node.name()
            todo.extend(n for n, _ in node.next_functions)
        for storage in self.sac_storages:          # {op key: {call index: cached outputs}}
            for key, calls in storage.items():
                for entry in calls.values():
                    for leaf in tree_leaves(entry):   # outputs are wrapped in _VersionWrapper
                        x = getattr(leaf, "val", None)
                        if isinstance(x, torch.Tensor):
                            self._record(x, None, f"sac:{key}", lambda x=x: x)
        records = []
        for e in self.entries.values():
            ptr = e["ptr"]
            live = [t for t in (r() for r in e["refs"]) if t is not None]
            if not live:
                continue      # autograd let go of it before the forward pass ended
            # bytes the storage holds now: output-discarding checkpointing (Megatron's
            # CheckpointWithoutOutput) frees a saved output's storage in place (resize_(0))
            now = max(_local(t).untyped_storage().nbytes() for t in live)
            if now == 0:
                continue
            origins = list(dict.fromkeys(
                [names.get(s, "?") for s in e["seqs"]] + e["origins"]))
            records.append({"shape": e["shape"], "dtype": e["dtype"], "nbytes": now,
                            "origin": ", ".join(origins), "module": e["module"],
                            "per_block": ptr not in self.shared,
                            **({"shared_input": self.shared[ptr]} if ptr in self.shared else {})})
        return records


def summarise(records: list[dict], a) -> dict:
    """Per-block totals, with two views that a GPU comparison needs:

    * ``sxs_bytes_per_block``: tensors of shape [b, heads, s, s] or [b * heads, s, s]
      (materialised attention scores/probabilities), and the total without them;
    * ``rmsnorm_*``: torch's RMSNorm has no fused kernel on CPU: its decomposition saves a fp32
      copy of the input, the fp32 normalised input and the fp32 rstd. The fused CUDA kernel
      (and Transformer Engine's) saves the bf16 input and the fp32 rstd [tokens]. The
      ``*_fused_rmsnorm`` total swaps the one for the other, norm by norm.
    """
    per_block = [r for r in records if r["per_block"]]
    total = sum(r["nbytes"] for r in per_block)
    scores_numel = a.batch * a.heads * a.seq * a.seq          # [b, heads, s, s] or [b*heads, s, s]
    sxs = sum(r["nbytes"] for r in per_block
              if r["shape"][-2:] == [a.seq, a.seq] and math.prod(r["shape"]) == scores_numel)
    norm_modules = {r["module"] for r in per_block if "norm" in r["module"].rsplit(".", 1)[-1]}
    norm_cpu = sum(r["nbytes"] for r in per_block if r["module"] in norm_modules)
    tokens = a.seq * a.batch
    # each norm's input (its widest record: the fp32 copy of it) in bf16, and the fp32 rstd
    norm_fused = sum(2 * max(math.prod(r["shape"]) for r in per_block if r["module"] == m)
                     + tokens * 4 for m in norm_modules)
    return {"saved_bytes_per_block": total / N_BLOCKS,
            "saved_bytes_per_block_per_token_per_hidden": total / N_BLOCKS / (tokens * a.hidden),
            "sxs_bytes_per_block": sxs / N_BLOCKS,
            "saved_bytes_per_block_without_sxs": (total - sxs) / N_BLOCKS,
            "rmsnorm_cpu_bytes_per_block": norm_cpu / N_BLOCKS,
            "rmsnorm_fused_bytes_per_block": norm_fused / N_BLOCKS,
            "saved_bytes_per_block_fused_rmsnorm": (total - norm_cpu + norm_fused) / N_BLOCKS,
            "shared_input_bytes": sum(r["nbytes"] for r in records if not r["per_block"])}


def run_and_count(root: nn.Module, forward, shared: dict[str, torch.Tensor],
                  sac_storages: list | None = None) -> list[dict]:
    """Run ``forward()`` under the counter, check that backward runs, return the records.
    ``sac_storages`` is a list that the forward fills with per-op SAC caches."""
    counter = SavedTensorCounter(root, shared)
    if sac_storages is not None:
        counter.sac_storages = sac_storages
    with counter.forward():
        out = forward()
    outs = [o for o in (out if isinstance(out, (list, tuple)) else [out])
            if isinstance(o, torch.Tensor) and o.requires_grad]
    records = counter.finish(outs)
    with Fp32Matmuls():   # the check only: what was saved is counted already
        sum(o.float().sum() for o in outs).backward()
    return records


class Fp32Matmuls(TorchDispatchMode):
    """Run bf16 matrix products in fp32 and round the result to bf16. torch's CPU bf16 GEMM on
    machines without bf16 instructions (AVX2) is slow, and 20x slower again where the second
    operand is row-major, as in a linear layer's input gradient (``grad @ weight``: 450 ms against
    4.5 ms in fp32 for 256x1408 @ 1408x512 on two cores, torch 2.13): the backward check of the
    Megatron-Core runs spent 52 of its 75 s there. Shapes, dtypes and the graph are unchanged;
    only the products' rounding differs, and nothing is measured during the backward."""

    PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default,
                torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.PRODUCTS and any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16
                                         for a in args):
            up = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a
                  for a in args]
            return func(*up, **kwargs).to(torch.bfloat16)
        return func(*args, **kwargs)


# --------------------------------------------------------------------------------- Megatron-Core
def _init_gloo() -> None:
    import torch.distributed as dist
    if not dist.is_initialized():            # one rank: an in-process store, no port needed
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def megatron_on_cpu() -> None:
    """What building Megatron-Core's layers on CPU needs (as in shared/tools/megatron_layer_cpu.py;
    also tests/test_framework_params.py):
    * the global memory buffer (DotProductAttention) and the MoE router ask torch.cuda for the
      current device -> answer "cpu";
    * a one-rank gloo group and model-parallel state (once: a batch runs several configs);
    * MLA: without Transformer Engine, megatron.core.extensions.transformer_engine hands
      multi_latent_attention.py mock classes, so it believes TE is there and its
      isinstance(linear_proj, TELinear) test fails -> tell it there is no TE."""
    torch.cuda.current_device = lambda: "cpu"
    _init_gloo()
    from megatron.core import parallel_state
    from megatron.core.transformer import multi_latent_attention as mla_module

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    if not isinstance(mla_module.TELinear, type):
        mla_module.HAVE_TE = False


def megatron_saved(a) -> dict:
    notes = []
    # Patches for CUDA-only helpers (besides megatron_on_cpu's):
    megatron_on_cpu()
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as mcore_random
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig
    #  * the CUDA RNG tracker's fork() (dropout regions) -> a null context;
    mcore_random.get_cuda_rng_tracker().fork = lambda *args, **kw: contextlib.nullcontext()
    #  * recompute (CheckpointFunction) stashes and restores the CUDA RNG state with
    #    _get_cuda_rng_state / _set_cuda_rng_state -> no-ops on CPU (the CPU state is still kept).
    mcore_random._get_cuda_rng_state = lambda *args, **kw: None
    mcore_random._set_cuda_rng_state = lambda *args, **kw: None
    #  * output-discarding checkpointing (CheckpointWithoutOutput: layernorm, moe_act) asks
    #    Transformer Engine whether fp8 is on -> without TE, answer "off" (no autocast context)
    if not getattr(mcore_random, "HAVE_TE", True):
        class _NoFP8:
            @staticmethod
            def is_fp8_enabled():
                return False
        mcore_random.FP8GlobalStateManager = _NoFP8
        mcore_random.activation_recompute_forward = lambda **kw: contextlib.nullcontext()
        mcore_random.fp8_autocast = lambda **kw: contextlib.nullcontext()
    notes.append("Megatron patches: torch.cuda.current_device -> 'cpu'; CUDA RNG tracker fork() -> "
                 "null context; tensor_parallel.random._get/_set_cuda_rng_state -> no-ops "
                 "(checkpoint recompute); without Transformer Engine, CheckpointWithoutOutput's "
                 "fp8 query answers 'off'; no effect on what is saved.")

    moe = a.moe_experts > 0
    if moe:
        #  * MoE: without Transformer Engine, moe_utils never defines te_general_gemm, which the
        #    router's gating linear tests (NameError) -> define it as None (the torch.mm path).
        from megatron.core.transformer.moe import moe_utils
        if not hasattr(moe_utils, "te_general_gemm"):
            moe_utils.te_general_gemm = None
            notes.append("Megatron MoE patch: moe_utils.te_general_gemm = None (undefined without "
                         "Transformer Engine; the router then uses torch.mm).")
    kw = {}
    if a.policy == "selective":
        kw = dict(recompute_granularity="selective")      # recompute_modules default: core_attn
        if a.modules:
            kw["recompute_modules"] = a.modules.split(",")
    elif a.policy == "full":
        kw = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    if moe:
        # The alltoall dispatcher creates a torch.cuda.Stream at construction; allgather runs on CPU.
        kw.update(num_moe_experts=a.moe_experts, moe_router_topk=a.topk,
                  moe_ffn_hidden_size=a.moe_ffn, moe_token_dispatcher_type="allgather",
                  expert_model_parallel_size=1, moe_grouped_gemm=False,
                  moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                  moe_router_pre_softmax=a.topk == 1)     # Megatron requires it for top-1
        if a.shared_ffn:
            kw.update(moe_shared_expert_intermediate_size=a.shared_ffn,
                      moe_shared_expert_gate=a.shared_gate)
    if a.swiglu_fusion:
        # Megatron-LM's default (--bias-swiglu-fusion): SwiGLUFunction saves only its input. Its
        # math is wrapped in torch.compile (jit_fuser); run it eagerly, as compiling on CPU
        # takes long and does not change what the autograd.Function saves.
        import torch._dynamo.config as dynamo_config
        dynamo_config.disable = True
        kw.update(bias_activation_fusion=True)
        notes.append("swiglu fusion on (bias_activation_fusion=True, Megatron-LM's default "
                     "--bias-swiglu-fusion): SwiGLUFunction saves only the fc1 output; its "
                     "torch.compile'd math runs eagerly (torch._dynamo.config.disable).")
    else:
        notes.append("swiglu fusion off (TransformerConfig default bias_activation_fusion=False): "
                     "the unfused glu computes silu(x_glu) * (x_linear + glu_linear_offset); the "
                     "'+ offset' (0.0) makes a copy of x_linear that the multiply saves, on top of "
                     "the fc1 output that silu keeps (5 ffn-sized tensors instead of 4, or 3 fused).")
    config_class = TransformerConfig
    if a.mla:  # DeepSeek-V3's attention at a small size (its q/kv norms: qk_layernorm)
        from megatron.core.transformer.transformer_config import MLATransformerConfig
        config_class = MLATransformerConfig
        q_lora, kv_lora, nope, rope_dim, v_dim = a.mla
        kw.update(q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_head_dim=nope,
                  qk_pos_emb_head_dim=rope_dim, v_head_dim=v_dim, rope_type="rope",
                  qk_layernorm=True)
    cfg = config_class(num_layers=N_BLOCKS, hidden_size=a.hidden, num_attention_heads=a.heads,
                       num_query_groups=a.heads if a.mla else a.groups, ffn_hidden_size=a.ffn,
                       gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                       normalization="RMSNorm", add_bias_linear=False,
                       use_cpu_initialization=True, bf16=True, params_dtype=torch.bfloat16,
                       hidden_dropout=0.0, attention_dropout=0.0, **kw)
    spec = get_gpt_layer_local_spec(num_experts=a.moe_experts if moe else None,
                                    moe_grouped_gemm=False, multi_latent_attention=bool(a.mla),
                                    qk_layernorm=bool(a.mla))
    if a.mla:
        spec.submodules.self_attention.submodules.core_attention = MegatronFlashCore
    block = TransformerBlock(cfg, spec, post_layer_norm=False)
    block.train()

    torch.manual_seed(0)
    x = torch.randn(a.seq, a.batch, a.hidden, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.triu(torch.ones(1, 1, a.seq, a.seq, dtype=torch.bool), diagonal=1)
    shared = {"attention_mask": mask}
    fwd_kw = {}
    if a.rope and not a.mla:  # (MLA applies its own rotary embedding inside the attention)
        rope = RotaryEmbedding(kv_channels=a.hidden // a.heads, rotary_percent=1.0)
        fwd_kw["rotary_pos_emb"] = shared["rotary_pos_emb"] = rope(a.seq)
    records = run_and_count(block, lambda: block(x, attention_mask=mask, **fwd_kw), shared)

    if a.mla:
        notes.append("MLA (MLATransformerConfig, the local spec's MLASelfAttention with its q and "
                     "kv RMSNorms, rope_type 'rope'): its core attention is MegatronFlashCore, the "
                     "flash stand-in (saves q, k, v, the output and the log-sum-exp, as TE's fused "
                     "attention does); the local DotProductAttention cannot take MLA's heads. "
                     "HAVE_TE is set false in multi_latent_attention.py (mock TE classes).")
    notes.append("Megatron local spec (get_gpt_layer_local_spec): DotProductAttention materialises "
                 "attention. It saves the fp32 softmax output [b, heads, s, s] (the unfused torch "
                 "path of FusedScaleMaskSoftmax, used on CPU, upcasts: attention_softmax_in_fp32) "
                 "and the bf16 probabilities [b*heads, s, s] that probs @ v keeps: "
                 "sxs_bytes_per_block. It also saves q and k, v repeated to all "
                 "heads (GQA repeat_interleave) for the two bmm's. A flash/fused attention keeps "
                 "instead q, k, v, the output and a fp32 log-sum-exp [b, heads, s].")
    if a.rope:
        notes.append("RoPE on: megatron's unfused apply_rotary_pos_emb saves per call the bf16 "
                     "cos/sin [s, 1, 1, head_dim] it computes from the shared rotary table.")
    if a.policy == "selective":
        notes.append("selective: recompute_granularity='selective', recompute_modules=['core_attn'] "
                     "(Megatron's default): CheckpointFunction keeps the inputs of core attention: q "
                     "and k after RoPE (new tensors) and v, a view of the fused linear_qkv output, "
                     "which keeps that whole [s, b, (heads + 2 groups) * head_dim] storage alive.")
    if a.policy == "full":
        notes.append("full: recompute_method='uniform', recompute_num_layers=1: each layer's input "
                     "is kept by CheckpointFunction (reentrant), nothing else.")
    if moe:
        notes.append("MoE: SequentialMLP experts (moe_grouped_gemm=False), allgather dispatcher "
                     "(alltoall creates a torch.cuda.Stream, impossible on CPU), 1 rank; "
                     "load balancing 'none'. The router's gating linear (RouterGatingLinearFunction) "
                     "saves its input, the pre-MLP norm output: tokens*hidden*2 bytes.")
        router_in = [r for r in records if "RouterGatingLinear" in r["origin"]]
        notes.append(f"router-saved tensors: {[(r['shape'], r['dtype'], r['nbytes']) for r in router_in]}")
    return finish_result("megatron", a, records, notes)


# --------------------------------------------------------------------------------- torchtitan
def _causal_attention_math(q, k, v, scale: float):
    """fp32 causal softmax attention on [b, heads, s, d]; k/v may have fewer (GQA) heads."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q.shape[-2]
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    lse = torch.logsumexp(scores.masked_fill(causal, float("-inf")), dim=-1)
    probs = torch.exp(scores.masked_fill(causal, float("-inf")) - lse.unsqueeze(-1))
    return probs @ v.float(), lse


@torch.library.custom_op("frameworks_saved::flash_attention", mutates_args=())
def flash_attention_standin(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-in for a flash/flex attention kernel: (output, fp32 log-sum-exp [b, heads, s]).

    One opaque op (a custom op, so that per-op SAC sees one op, as it sees flex_attention, and
    not the math inside). The output takes q's memory layout, as flex and flash kernels do.
    """
    out32, lse = _causal_attention_math(q, k, v, scale)
    out = _like(q, v.shape[-1])
    out.copy_(out32)
    return out, lse


def _like(q: torch.Tensor, width: int) -> torch.Tensor:
    """An empty tensor of q's shape with the last dimension ``width`` (v's: MLA's heads are
    wider for q and k than for v) in q's memory layout."""
    order = sorted(range(q.dim()), key=lambda i: -q.stride(i))   # outermost dimension first
    shape = [*q.shape[:-1], width]
    out = q.new_empty([shape[i] for i in order])
    return out.permute(*sorted(range(q.dim()), key=order.__getitem__))


@flash_attention_standin.register_fake
def _(q, k, v, scale):
    return _like(q, v.shape[-1]), q.new_empty(q.shape[:-1], dtype=torch.float32)


class MegatronFlashCore(nn.Module):
    """Megatron-Core's core attention as Transformer Engine's fused attention runs it, on CPU:
    the stand-in kernel above (it saves q, k, v, the output and the log-sum-exp) on Megatron's
    [s, b, heads, d] tensors, the output [s, b, heads * d_v] a view of what it keeps, as TE's is.
    The local spec's DotProductAttention cannot take MLA's heads (q and k wider than v)."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type,
                 attention_dropout=None, softmax_scale=None, **kw):
        super().__init__()
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None, **kw):
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))   # [b, heads, s, d]
        scale = self.softmax_scale or q.shape[-1] ** -0.5
        out, _ = flash_attention_standin(q, k, v, scale)
        s, b = query.shape[:2]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def _standin_setup_context(ctx, inputs, output):
    q, k, v, scale = inputs
    ctx.scale = scale
    ctx.save_for_backward(q, k, v, *output)      # what a flash kernel saves: q, k, v, out, lse


def _standin_backward(ctx, grad_out, grad_lse):
    q, k, v, _, _ = ctx.saved_tensors
    with torch.enable_grad():                     # recompute a plain math attention
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        out32, _ = _causal_attention_math(q_, k_, v_, ctx.scale)
        grads = torch.autograd.grad(out32.to(q.dtype), (q_, k_, v_), grad_out)
    return (*grads, None)


flash_attention_standin.register_autograd(_standin_backward, setup_context=_standin_setup_context)
STANDIN_OP = torch.ops.frameworks_saved.flash_attention.default


def _standin_flex_attn(q, k, v, *, score_mod=None, block_mask=None, scale=None,
                       enable_gqa=False, return_aux=None, kernel_options=None):
    """Replaces ``FlexAttention.compiled_flex_attn`` (same signature and return value)."""
    out, lse = flash_attention_standin(q, k, v, q.shape[-1] ** -0.5 if scale is None else scale)
    return out, types.SimpleNamespace(lse=lse if (return_aux is not None and return_aux.lse) else None)


def torchtitan_saved(a) -> dict:
    import torchtitan.distributed.activation_checkpoint as tt_ac
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import FlexAttention, get_causal_mask_mod
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

    notes = []
    # The attention core: torchtitan's FlexAttention.forward (layout transposes included) runs as
    # is; only the kernel call is replaced (FlexAttention has no backward on CPU).
    FlexAttention.compiled_flex_attn = staticmethod(_standin_flex_attn)

    head_dim = a.hidden // a.heads
    if a.mla:  # the registry's DeepSeek-V3 blocks, dense (MLA with its q/kv norms, SwiGLU FFN)
        from torchtitan.models.deepseek_v3 import DeepSeekV3Model, _build_dsv3_layers
        q_lora, kv_lora, nope, rope_dim, v_dim = a.mla
        cfg = DeepSeekV3Model.Config(
            dim=a.hidden, vocab_size=256, norm=RMSNorm.Config(normalized_shape=a.hidden),
            tok_embeddings=Embedding.Config(num_embeddings=256, embedding_dim=a.hidden),
            lm_head=Linear.Config(in_features=a.hidden, out_features=256),
            layers=_build_dsv3_layers(
                n_layers=N_BLOCKS, n_dense_layers=N_BLOCKS, dim=a.hidden, n_heads=a.heads,
                q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope_head_dim=nope,
                qk_rope_head_dim=rope_dim, v_head_dim=v_dim, mscale=1.0, dense_hidden_dim=a.ffn,
                # (the MoE arguments the builder requires; every layer here is dense)
                moe_hidden_dim=a.moe_ffn, num_experts=4, num_shared_experts=1, router_top_k=2,
                router_score_func="softmax", attn_backend="flex", moe_comm_backend="standard",
                non_blocking_capacity_factor=None,
                rope=ComplexRoPE.Config(dim=rope_dim, max_seq_len=a.seq, theta=10000.0)),
            mtp_layers=[])
    elif a.moe_experts:  # the registry's Qwen3 MoE blocks (QK norms, cos/sin RoPE, grouped experts)
        from torchtitan.models.common import CosSinRoPE
        from torchtitan.models.qwen3 import Qwen3Model, _build_qwen3_moe_layers, _qwen3_norm
        cfg = Qwen3Model.Config(
            dim=a.hidden, vocab_size=256, norm=_qwen3_norm(a.hidden),
            tok_embeddings=Embedding.Config(num_embeddings=256, embedding_dim=a.hidden),
            lm_head=Linear.Config(in_features=a.hidden, out_features=256),
            layers=_build_qwen3_moe_layers(
                n_layers=N_BLOCKS, dim=a.hidden, n_heads=a.heads, n_kv_heads=a.groups,
                head_dim=head_dim, moe_hidden_dim=a.moe_ffn, num_experts=a.moe_experts,
                top_k=a.topk, fuse_qkv=True, attn_backend="flex", moe_comm_backend="standard",
                rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=a.seq, theta=1000000.0)))
    else:
        cfg = Llama3Model.Config(
            dim=a.hidden, vocab_size=256,
            tok_embeddings=Embedding.Config(num_embeddings=256, embedding_dim=a.hidden),
            norm=RMSNorm.Config(normalized_shape=a.hidden),
            lm_head=Linear.Config(in_features=a.hidden, out_features=256),
            layers=_build_llama3_layers(
                n_layers=N_BLOCKS, dim=a.hidden, n_heads=a.heads, n_kv_heads=a.groups,
                hidden_dim=a.ffn, fuse_qkv=True, attn_backend="flex",
                rope=ComplexRoPE.Config(dim=head_dim, max_seq_len=a.seq, theta=500000,
                                        scaling="llama")))
    torch.manual_seed(0)
    model = cfg.build()
    model.init_states(buffer_device=torch.device("cpu"))
    # Only the blocks are measured: Decoder.forward passes through missing embedding/norm/head.
    model.tok_embeddings = model.norm = model.lm_head = None
    for p in model.parameters():              # bf16 parameters (as FSDP's param_dtype gives);
        p.data = p.data.to(torch.bfloat16)     # buffers (the complex RoPE table) keep their dtype
    model.train()

    sac_contexts = []
    if a.policy == "full":
        tt_ac.FullAC.Config().build(dump_folder="").apply(model)
    elif a.policy == "selective-op":
        sac = tt_ac.SelectiveAC.Config().build(dump_folder="")
        # The stand-in takes flex_attention's place in the save list (get_save_ops is the
        # documented override point).
        sac.get_save_ops = lambda: tt_ac._get_default_save_ops() | {STANDIN_OP}
        sac.apply(model)
        original = tt_ac.create_selective_checkpoint_contexts

        def recording_contexts(policy_fn, *args, **kw):   # observe the SAC cache, change nothing
            contexts = original(policy_fn, *args, **kw)
            sac_contexts.append(contexts[0].storage)
            return contexts
        tt_ac.create_selective_checkpoint_contexts = recording_contexts
    elif a.policy == "selective-layer":
        # torchtitan 0.3 dropped layer-level selective AC (selective_ac_option="2"); earlier
        # releases wrapped every ac_freq-th block in the full-AC checkpoint_wrapper and left the
        # others alone. Emulated with torchtitan's own FullAC wrapper on blocks 1, 3, ...
        full = tt_ac.FullAC.Config().build(dump_folder="")
        for name, blk in list(model.layers.named_children()):
            if (int(name) + 1) % 2 == 0:
                model.layers.register_module(name, full._wrap_block(blk, base_fqn=f"layers.{name}"))

    mask = create_block_mask(get_causal_mask_mod(), None, None, a.seq, a.seq, device="cpu",
                             _compile=False)
    x = torch.randn(a.batch, a.seq, a.hidden, dtype=torch.bfloat16, requires_grad=True)
    records = run_and_count(model, lambda: model(x, positions=None, attention_masks=mask), {},
                            sac_storages=sac_contexts)

    if a.mla:
        notes.append("torchtitan 0.3 deepseek_v3 blocks, both dense (the registry's "
                     "_build_dsv3_layers: MLA with its q and kv RMSNorms, ComplexRoPE on the rope "
                     "dims, SwiGLU FeedForward with hidden_dim = --ffn).")
    elif a.moe_experts:
        notes.append("torchtitan 0.3 qwen3 MoE blocks (the registry's _build_qwen3_moe_layers: "
                     "fused wqkv, per-head q/k RMSNorms, CosSinRoPE, a softmax top-k router and "
                     "GroupedExperts (torch._grouped_mm, which runs forward and backward on CPU) "
                     "behind the local token dispatcher, no shared expert); the combine casts the "
                     "experts' outputs to fp32 before weighting them by the scores and keeps that "
                     "copy (token_dispatcher.py).")
    else:
        notes.append("torchtitan 0.3 llama3 blocks (Llama3TransformerBlock configs from the "
                     "registry's _build_llama3_layers: fused wqkv, ComplexRoPE, nn.RMSNorm, SwiGLU "
                     "FeedForward with hidden_dim = --ffn).")
    notes.append("Run by Decoder.forward with embedding, final norm and head removed; bf16 "
                 "parameters (as FSDP's param_dtype gives), buffers unchanged; positions=None "
                 "(RoPE multiplies by a slice of its table, a buffer: nothing new saved); causal "
                 "BlockMask from torch's create_block_mask(_compile=False).")
    notes.append("Attention core: FlexAttention.forward runs as is, its kernel call "
                 "(FlexAttention.compiled_flex_attn) is replaced by the custom op "
                 "frameworks_saved::flash_attention (FlexAttention has no backward on CPU), which "
                 "saves what a flash/flex kernel saves: q and k after RoPE, v, the output and a fp32 "
                 "log-sum-exp [b, heads, s]. k and v are saved as torchtitan passes them, unrepeated "
                 "(n_kv_heads heads, enable_gqa=True). The output takes q's layout, so the "
                 ".contiguous() before wo is a no-op and wo's saved input is the same storage.")
    notes.append("CPU: nn.RMSNorm has no fused CPU kernel; its decomposition saves a fp32 copy of the "
                 "input, the fp32 normalised input and the fp32 rstd per norm (rmsnorm_cpu_bytes_"
                 "per_block); the fused CUDA kernel saves the bf16 input and rstd "
                 "(saved_bytes_per_block_fused_rmsnorm).")
    if a.policy == "full":
        notes.append("full: torchtitan FullAC (checkpoint_wrapper, non-reentrant torch.utils."
                     "checkpoint): each block keeps only its input.")
    elif a.policy == "selective-op":
        notes.append("selective-op: torchtitan SelectiveAC (per-op SAC, default options): the SAC "
                     "cache keeps the outputs of the save-list ops (origin sac:<op>): the attention "
                     "op (out and lse; the stand-in op is added to the save list where "
                     "flex_attention stands) and the mm outputs except every 2nd mm of a block; plus "
                     "the block input kept by the checkpoint. Everything else, q/k/v and the norms "
                     "included, is recomputed.")
    elif a.policy == "selective-layer":
        notes.append("selective-layer: torchtitan 0.3 has no layer-level selective AC any more "
                     "(selective_ac_option '2' is gone); emulated as earlier releases did it with "
                     "ac_freq=2: torchtitan's FullAC wrapper on every 2nd block (layers.1), the other "
                     "block plain. saved_bytes_per_block is the average of the two blocks.")
    return finish_result("torchtitan", a, records, notes)


# --------------------------------------------------------------------------------- driver
def finish_result(framework: str, a, records: list[dict], notes: list[str]) -> dict:
    config = {k: getattr(a, k) for k in ("seq", "batch", "hidden", "heads", "groups", "ffn")}
    if framework == "megatron":
        config.update(rope=a.rope, swiglu_fusion=a.swiglu_fusion)
        if a.moe_experts:
            config.update(moe_experts=a.moe_experts, topk=a.topk, moe_ffn=a.moe_ffn)
    else:
        config["rope"] = True
    config["n_blocks_measured"] = N_BLOCKS
    records.sort(key=lambda r: -r["nbytes"])
    result = {"framework": framework, "policy": a.policy, "config": config,
              **summarise(records, a), "tensors": records}
    notes.append(f"torch {torch.__version__}, CPU; counted per storage, parameters and buffers "
                 "excluded; shared inputs (per_block false) excluded from the per-block bytes.")
    result["notes"] = notes
    return result


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("framework", nargs="?", choices=("megatron", "torchtitan"))
    ap.add_argument("--all", action="store_true", help="run the small matrix, print a JSON list")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--groups", type=int, default=2, help="KV heads (query groups)")
    ap.add_argument("--ffn", type=int, default=1408)
    ap.add_argument("--policy", default="none",
                    choices=sorted(set(MEGATRON_POLICIES + TORCHTITAN_POLICIES)))
    ap.add_argument("--no-rope", dest="rope", action="store_false",
                    help="Megatron: do not pass rotary_pos_emb (torchtitan always applies RoPE)")
    ap.add_argument("--modules", default="",
                    help="Megatron, policy selective: recompute_modules, comma-separated "
                    "(default: Megatron's, core_attn)")
    ap.add_argument("--swiglu-fusion", action="store_true",
                    help="Megatron: bias_activation_fusion=True (Megatron-LM's default)")
    ap.add_argument("--moe-experts", type=int, default=0,
                    help="an MoE layer with N experts (torchtitan: its Qwen3 MoE blocks)")
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--moe-ffn", type=int, default=512)
    ap.add_argument("--mla", type=lambda t: [int(x) for x in t.split(",")], default=None,
                    metavar="Q,KV,NOPE,ROPE,V",
                    help="multi-latent attention with these q and kv LoRA ranks and "
                    "q/k nope, q/k rope and v head dims (e.g. 192,64,64,32,64)")
    ap.add_argument("--shared-ffn", type=int, default=0,
                    help="Megatron MoE: a shared expert of this intermediate size")
    ap.add_argument("--shared-gate", action="store_true",
                    help="Megatron MoE: its sigmoid gate (moe_shared_expert_gate)")
    a = ap.parse_args(argv)
    if not a.all:
        if a.framework is None:
            ap.error("give a framework or --all")
        allowed = MEGATRON_POLICIES if a.framework == "megatron" else TORCHTITAN_POLICIES
        if a.policy not in allowed:
            ap.error(f"{a.framework} policies: {', '.join(allowed)}")
        if a.framework != "megatron" and (a.swiglu_fusion or not a.rope or a.shared_ffn):
            ap.error("--swiglu-fusion, --no-rope and --shared-ffn are for megatron only")
        if (a.shared_ffn and not a.moe_experts) or (a.shared_gate and not a.shared_ffn):
            ap.error("--shared-ffn needs --moe-experts, --shared-gate needs --shared-ffn")
        if a.mla is not None and len(a.mla) != 5:
            ap.error("--mla takes five numbers: Q,KV,NOPE,ROPE,V")
        if a.mla and a.moe_experts and a.framework == "torchtitan":
            ap.error("torchtitan: --mla builds dense DeepSeek-V3 blocks; leave out --moe-experts")
    return a


def run_matrix() -> list[dict]:
    """Every policy of both frameworks at seq 256 and 512 (default dims), plus Megatron with the
    fused SwiGLU and one MoE config of each framework; each run in a fresh subprocess (the
    frameworks keep global state, and the script patches some)."""
    import subprocess
    runs = []
    for seq in (256, 512):
        runs += [["megatron", "--seq", str(seq), "--policy", p] for p in MEGATRON_POLICIES]
        runs += [["torchtitan", "--seq", str(seq), "--policy", p] for p in TORCHTITAN_POLICIES]
    runs.append(["megatron", "--seq", "256", "--policy", "none", "--swiglu-fusion"])
    for framework in ("megatron", "torchtitan"):
        runs.append([framework, "--seq", "256", "--policy", "none",
                     "--moe-experts", "4", "--topk", "2", "--moe-ffn", "512"])
    results = []
    for args in runs:
        r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{r.stderr[-3000:]}")
        results.append(json.loads(r.stdout))
    return results


def _measure(a) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stdout(sys.stderr):    # keep stdout for the JSON
            return megatron_saved(a) if a.framework == "megatron" else torchtitan_saved(a)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if argv[:1] == ["--batch"]:
        # several runs of ONE framework in this process (the tests' way: one start-up), given
        # as a JSON list of argument lists; prints a JSON list of results in that order
        runs = json.loads(argv[1])
        if len({r[0] for r in runs}) > 1:
            raise SystemExit("--batch: one framework per batch")
        print(json.dumps([_measure(parse(r)) for r in runs]))
        return
    a = parse(argv)
    if a.all:
        print(json.dumps(run_matrix(), indent=1))
        return
    print(json.dumps(_measure(a), indent=1))


if __name__ == "__main__":
    main()
