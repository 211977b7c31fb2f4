"""Measure what DeepSpeed's ZeRO-1/2 optimizer sends in one step (run by
``test_framework_comm.py`` in a fresh process): ``DeepSpeedZeroOptimizer`` as nestplan's
DeepSpeed export configures it (its buckets, ``overlap_comm``, ``reduce_scatter``) and otherwise
DeepSpeed's defaults (``use_multi_rank_bucket_allreduce``), over two gloo ranks, one
micro-batch's backward and the step, bf16 weights and gradients. Prints one JSON object for rank
0: the bytes of each collective, by kind, per bf16 gradient or weight byte of the model, those of
the backward (with its reduction epilogue) and those of the step apart, and whether every
collective of the step is issued synchronously (no ``async_op``: the GPU stream then queues the
next forward behind it).
"""

import os

import torch
import torch.distributed as dist
from torch import nn

WIDTH = 256


class _Timers:
    """The timers the optimizer starts and stops (the engine's are for logging only)."""

    def __call__(self, name):
        return self

    def start(self):
        pass

    def stop(self, *a, **k):
        pass

    def log(self, *a, **k):
        pass


def run(rank: int, world: int, stage: int) -> dict:
    # deepspeed.comm looks for these before it takes the process group already set up
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    sent: list[tuple[str, str, int]] = []
    phase = ["backward"]
    # what each collective moves, in bytes of the tensor it reduces or the output it gathers
    # (torch.distributed's own functions, which deepspeed.comm calls by keyword or keeps from its
    # start: wrapped before it starts)
    first = {"all_reduce": "tensor", "reduce": "tensor", "all_gather": "tensor_list",
             "all_gather_into_tensor": "output_tensor", "reduce_scatter_tensor": "input"}

    def nbytes(t):
        return sum(nbytes(x) for x in t) if isinstance(t, (list, tuple)) else \
            t.numel() * t.element_size()

    waited = []  # (phase, whether the call waits: not async_op, so the stream queues behind it)

    def counting(kind, real):
        def call(*args, **kwargs):
            sent.append((phase[0], kind, nbytes(args[0] if args else kwargs[first[kind]])))
            waited.append((phase[0], not kwargs.get("async_op", False)))
            return real(*args, **kwargs)
        return call

    for kind in first:
        setattr(dist, kind, counting(kind, getattr(dist, kind)))
    import deepspeed.comm as dcomm
    import deepspeed.ops

    # (the CPU shared-memory all-reduce extension is not built: gloo carries the collectives, as
    # in frameworks_deepspeed_bf16.py)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    dcomm.init_distributed(dist_backend="gloo")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    from nestplan.catalog import get_stack
    from nestplan.exports.deepspeed import REDUCE_BUCKET

    # as nestplan's DeepSpeed export configures it (its bucket sizes and overlap_comm), the rest
    # DeepSpeed's defaults
    defaults = DeepSpeedZeroConfig()
    overlap_comm = get_stack("deepspeed").overlap_grad_reduce
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                          nn.Linear(4 * WIDTH, WIDTH)).to(torch.bfloat16)
    names = {p: n for n, p in model.named_parameters()}
    opt = DeepSpeedZeroOptimizer(
        torch.optim.AdamW(model.parameters(), lr=1e-3), names, _Timers(), {},
        reduce_bucket_size=REDUCE_BUCKET,
        use_multi_rank_bucket_allreduce=defaults.use_multi_rank_bucket_allreduce,
        allgather_bucket_size=REDUCE_BUCKET, dp_process_group=dist.group.WORLD,
        reduce_scatter=True, overlap_comm=overlap_comm, contiguous_gradients=True,
        partition_grads=stage == 2,
        communication_data_type=torch.bfloat16, gradient_accumulation_dtype=torch.float32,
        bf16_master_weights_and_gradients=False, check_grad_overflow=False)
    loss = model(torch.randn(4, WIDTH, dtype=torch.bfloat16)).float().pow(2).mean()
    # as DeepSpeedEngine.backward runs it at a gradient accumulation boundary (one micro-batch):
    # _backward_prologue, the loss's backward (ZeRO-2's hooks reduce), allreduce_gradients
    opt.backward_prologue()
    opt.enter_backward()
    opt.set_gradient_accumulation_boundary(True)
    loss.backward()
    if stage == 2:
        opt.overlapping_partition_gradients_reduce_epilogue()
    else:
        opt.reduce_gradients(pipeline_parallel=False)
    opt.backward_epilogue()
    opt.exit_backward()
    phase[0] = "step"
    opt.step()
    params = sum(p.numel() for p in model.parameters())
    bf16_bytes = 2 * params
    out: dict = {"defaults": {"use_multi_rank_bucket_allreduce":
                              defaults.use_multi_rank_bucket_allreduce},
                 "overlap_comm": overlap_comm,
                 "step_waits": all(w for p, w in waited if p == "step")}
    for when in ("backward", "step"):
        kinds: dict = {}
        for p, kind, n in sent:
            if p == when:
                kinds[kind] = kinds.get(kind, 0) + n / bf16_bytes
        out[when] = kinds
    return out


if __name__ == "__main__":
    import sys

    import ranks  # beside this file

    ranks.print_result(run, 2, (2, int(sys.argv[1]) if len(sys.argv) > 1 else 2))
