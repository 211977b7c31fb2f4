#!/usr/bin/env python3
"""What Megatron-Core's self-attention does when the tensor-parallel degree exceeds the model's
KV heads, on two CPU ranks (gloo): each rank's ``linear_qkv`` holds a 1/tp share of every head's
query, key and value projections, and the forward all-gathers the projection's output over TP
before the rank takes its KV head and its queries (``get_query_key_value_tensors``,
megatron/core/transformer/attention.py, megatron-core 0.16.1; the same at NVIDIA/Megatron-LM
d98e8a64dd).

    python tests/frameworks_gqa_tp.py --seq 64 --hidden 256 --heads 4 --groups 1 [--tp 2]

Prints ONE JSON object on stdout: the configuration, ``qkv_weight_shape`` (rank 0's
``linear_qkv.weight``), and ``forward`` / ``backward``: the collectives rank 0 runs in each (in
order: the c10d op and the bytes of the tensor it fills or reduces). Sequence parallelism off,
so the attention's only tensor-parallel collectives are this gather and the output projection's
all-reduce. Needs the ``frameworks`` extra (torch CPU, megatron-core).
"""

from __future__ import annotations

import argparse


def worker(rank: int, a) -> dict:
    import contextlib

    import torch

    from frameworks_saved import megatron_on_cpu  # beside this file

    torch.cuda.current_device = lambda: "cpu"
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(a.tp, 1)  # (before megatron_on_cpu's 1-rank state)
    megatron_on_cpu()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as mcore_random
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    # dropout regions fork the CUDA RNG tracker: a null context on CPU (dropout is 0)
    mcore_random.get_cuda_rng_tracker().fork = lambda *args, **kw: contextlib.nullcontext()
    cfg = TransformerConfig(num_layers=1, hidden_size=a.hidden, num_attention_heads=a.heads,
                            num_query_groups=a.groups, ffn_hidden_size=4 * a.hidden,
                            tensor_model_parallel_size=a.tp, normalization="RMSNorm",
                            add_bias_linear=False, use_cpu_initialization=True, bf16=True,
                            params_dtype=torch.bfloat16, hidden_dropout=0.0,
                            attention_dropout=0.0)
    attention = build_module(get_gpt_layer_local_spec().submodules.self_attention, config=cfg,
                             layer_number=1)
    attention.train()
    torch.manual_seed(0)
    x = torch.randn(a.seq, 1, a.hidden, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.triu(torch.ones(1, 1, a.seq, a.seq, dtype=torch.bool), diagonal=1)

    calls: list[list] = []

    class Watch(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace in ("_c10d_functional", "c10d"):
                tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs))
                           if isinstance(t, torch.Tensor)]
                calls.append([func.name().split("::")[-1].split(".")[0],
                              max((t.numel() * t.element_size() for t in tensors), default=0)])
            return func(*args, **(kwargs or {}))

    with Watch():
        out, _ = attention(x, attention_mask=mask)
    forward = list(calls)
    calls.clear()
    with Watch():
        out.float().sum().backward()
    return dict(seq=a.seq, hidden=a.hidden, heads=a.heads, groups=a.groups, tp=a.tp,
                qkv_weight_shape=list(attention.linear_qkv.weight.shape),
                forward=forward, backward=list(calls))


def main() -> None:
    import ranks  # beside this file

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--tp", type=int, default=2)
    a = p.parse_args()
    ranks.print_result(worker, a.tp, (a,))


if __name__ == "__main__":
    main()
