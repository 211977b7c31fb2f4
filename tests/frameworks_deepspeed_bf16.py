"""Measure what DeepSpeed's BF16_Optimizer keeps on each rank (run by ``test_framework_memory.py``
in a fresh process): the optimizer DeepSpeed's engine picks for bf16 weights under its pipeline
engine without ZeRO, run as the pipeline engine runs it (the parameters' gradients zeroed before
each micro-batch's backward and added into the optimizer's buffer after it), over two gloo
ranks, for ``MICRO`` micro-batches and one step. Prints one JSON object: bytes per parameter of
each kind on rank 0, the bytes the step all-gathers, and the optimizer the engine picks.
"""

import os

import torch
import torch.distributed as dist
from torch import nn

MICRO = 2
WIDTH = 256


def engine_choice() -> str:
    """What ``DeepSpeedEngine._do_optimizer_sanity_check`` returns for bf16 weights, no ZeRO, no
    ``data_types.grad_accum_dtype`` and the pipeline engine."""
    import deepspeed.runtime.engine as E

    class Engine:  # the engine's answers that the check reads
        pipeline_parallelism = True

        def get_data_types(self):
            return torch.bfloat16, torch.bfloat16  # grad_accum_dtype unset: the model's dtype

        def zero_optimization(self):
            return False

    return E.DeepSpeedEngine._do_optimizer_sanity_check(Engine(), None)


def run(rank: int, world: int) -> dict:
    # deepspeed.comm looks for these before it takes the process group already set up (else it
    # tries MPI discovery); no port is bound, the group exists
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import deepspeed.comm as dcomm
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config

    # deepspeed.comm on a CPU builds its shared-memory all-reduce (a C++ extension, ~45 s of one
    # core on a fresh machine) for gloo ranks; a GPU run reduces through NCCL, and gloo carries
    # the same collectives here, so the op is declared unavailable and the build skipped
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    dcomm.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                          nn.Linear(4 * WIDTH, WIDTH)).to(torch.bfloat16)
    names = {p: n for n, p in model.named_parameters()}
    opt = BF16_Optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), names,
                         bfloat16_config=DeepSpeedBF16Config(enabled=True),
                         dp_process_group=dist.group.WORLD, grad_acc_dtype=torch.bfloat16)
    gathered = []
    real = dcomm.all_gather_into_tensor

    def counted(output, tensor, *a, **k):
        gathered.append(output.numel() * output.element_size())
        return real(output, tensor, *a, **k)

    dcomm.all_gather_into_tensor = counted
    import deepspeed.runtime.utils as U
    U.dist.all_gather_into_tensor = counted
    for _ in range(MICRO):  # deepspeed/runtime/pipe/engine.py _exec_backward_pass
        opt.clear_lp_grads()
        model(torch.randn(4, WIDTH, dtype=torch.bfloat16)).float().pow(2).mean().backward()
        opt.update_hp_grads(clear_lp_grads=False)
    opt.step()
    params = sum(p.numel() for p in model.parameters())

    def size(tensors):
        return sum(t.numel() * t.element_size() for t in tensors) / params

    states = [v for s in opt.optimizer.state.values() for v in s.values()
              if torch.is_tensor(v) and v.numel() > 1]
    return {
        "engine_picks": engine_choice(),
        "weights": size(model.parameters()),
        "parameter_gradients": size(p.grad for p in model.parameters() if p.grad is not None),
        "accumulation_buffer": size(opt.fp32_groups_gradients_flat),
        "master": size(opt.fp32_groups_flat_partition),
        "adam": size(states),
        "gathered": sum(gathered) / params,
    }


if __name__ == "__main__":
    import ranks  # beside this file

    ranks.print_result(run, 2, (2,))
