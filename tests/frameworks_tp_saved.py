#!/usr/bin/env python3
"""What a tensor-parallel, sequence-parallel SwiGLU MLP keeps for backward under torch's own
TP API, on two CPU ranks (gloo): the plan torchtitan applies to its Llama blocks' feed-forward
(``ffn_norm``: ``SequenceParallel()``; ``feed_forward``: ``PrepareModuleInput(input_layouts=
(Shard(1),), desired_input_layouts=(Replicate(),))``; ``w1``, ``w3``: ``ColwiseParallel()``;
``w2``: ``RowwiseParallel(output_layouts=Shard(1))``: parallelize_llama.py apply_tp @
pytorch/torchtitan 3f20451bc3b0de6d292946b1774581856014a0a9).

    python tests/frameworks_tp_saved.py --tokens 128 --hidden 256 --ffn 512 [--tp 2]
        [--ac none|op|full[,...]]    # torchtitan 0.3's per-op SelectiveAC or FullAC on the block

Prints ONE JSON list on stdout, an object per ``--ac`` mode: ``tp``, ``tokens`` (the whole
sequence, batch 1), ``hidden``, ``ffn``, ``ac``, ``saved`` (rank 0's storages autograd holds after
the forward, once per storage, not the parameters or the block's input: ``shape``, ``dtype``,
``nbytes``, ``origin``, the backward nodes that saved it; counted by ``frameworks_saved.py``'s
``SavedTensorCounter`` on each DTensor's shard; inside a checkpoint its own hooks act instead of
the counter's, so none is seen) and ``backward_collectives`` (the collectives rank 0 runs in the
backward, in order). Needs the ``frameworks`` extra (torch, CPU).
"""

from __future__ import annotations

import argparse


def worker(rank: int, a) -> list[dict]:
    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    from frameworks_saved import SavedTensorCounter  # beside this file

    mesh = init_device_mesh("cpu", (a.tp,))

    class FeedForward(nn.Module):  # torchtitan's Llama SwiGLU: w2(silu(w1(x)) * w3(x))
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(a.hidden, a.ffn, bias=False)
            self.w2 = nn.Linear(a.ffn, a.hidden, bias=False)
            self.w3 = nn.Linear(a.hidden, a.ffn, bias=False)

        def forward(self, x):
            return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))

    class Half(nn.Module):  # the feed-forward half of a block: h + ffn(ffn_norm(h))
        def __init__(self):
            super().__init__()
            self.ffn_norm = nn.RMSNorm(a.hidden)
            self.feed_forward = FeedForward()

        def forward(self, x):
            return x + self.feed_forward(self.ffn_norm(x))

    def measure(ac: str) -> dict:
        torch.manual_seed(0)
        block = Half().to(torch.bfloat16)
        parallelize_module(block, mesh, {
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })
        # this rank's sequence shard, as the previous block's reduce-scatter leaves it
        x = torch.randn(1, a.tokens // a.tp, a.hidden, dtype=torch.bfloat16, requires_grad=True)
        run = block
        if ac != "none":  # torchtitan's own wrappers, as it applies them to a block
            import torchtitan.distributed.activation_checkpoint as tt_ac

            wrapper = tt_ac.SelectiveAC if ac == "op" else tt_ac.FullAC
            run = wrapper.Config().build(dump_folder="")._wrap_block(block, base_fqn="layers.0")
        counter = SavedTensorCounter(block, {"input": x})
        with counter.forward():
            y = run(x)
        y = y.to_local() if hasattr(y, "to_local") else y
        saved = [dict(shape=r["shape"], dtype=r["dtype"].removeprefix("torch."),
                      nbytes=r["nbytes"], origin=r["origin"])
                 for r in counter.finish([y]) if r["per_block"]]
        calls.clear()
        with Watch():
            y.sum().backward()
        return dict(tp=a.tp, tokens=a.tokens, hidden=a.hidden, ffn=a.ffn, ac=ac, saved=saved,
                    backward_collectives=list(calls))

    calls: list[str] = []

    class Watch(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace in ("_c10d_functional", "c10d"):
                calls.append(func.name().split("::")[-1].split(".")[0])
            return func(*args, **(kwargs or {}))

    return [measure(ac) for ac in a.ac.split(",")]


def main() -> None:
    import ranks  # beside this file

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--ac", default="none", help="none, op or full, or several: none,op,full")
    a = p.parse_args()
    ranks.print_result(worker, a.tp, (a,))


if __name__ == "__main__":
    main()
