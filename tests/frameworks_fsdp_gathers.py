"""Count FSDP2's collectives in one training step on CPU (run by ``test_framework_comm.py`` in a
fresh process): the parameter all-gathers with and without activation checkpointing of each
sharded block, the gradient reduce-scatters of ``MICRO`` micro-batches run by PyTorch's own
pipeline schedule (``Schedule1F1B``) against the same micro-batches accumulated outside one, and
the all-gathers of a step of ZeRO-3 (resharded after forward) under that schedule (the second
step: the first also infers the stage's shapes).

Two gloo ranks (FSDP2 skips the collective on one rank). Each block is its own ``fully_shard``
unit, as torchtitan and Composer wrap transformer blocks; the checkpointed variant wraps the
block's body in non-reentrant ``torch.utils.checkpoint`` inside the unit, as torchtitan's
``apply_ac`` does before ``fully_shard``. The pipeline is one stage per rank (its own process
group), the data parallelism FSDP2's over both, as torchtitan builds a stage of a pipeline with
FSDP, reshard_after_forward false (nestplan's ZeRO-2). Prints one JSON object.
"""


import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

BLOCKS = 3
MICRO = 4


class Block(nn.Module):
    def __init__(self, checkpointed: bool):
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)
        self.checkpointed = checkpointed

    def body(self, x):
        return x + self.down(torch.relu(self.up(x)))

    def forward(self, x):
        if self.checkpointed:
            return checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)


def _rank(rank: int) -> dict:
    from torch.distributed.fsdp import fully_shard
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as group

    gathers, reductions = [], []
    real, real_reduce = group.foreach_all_gather, group.foreach_reduce

    def counted(*args, **kwargs):
        gathers.append(1)
        return real(*args, **kwargs)

    def counted_reduce(*args, **kwargs):
        reductions.append(1)
        return real_reduce(*args, **kwargs)

    group.foreach_all_gather, group.foreach_reduce = counted, counted_reduce
    result = {}
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(*(Block(checkpointed) for _ in range(BLOCKS)))
        for block in model:
            fully_shard(block)
        fully_shard(model)
        gathers.clear()
        model(torch.randn(4, 16)).sum().backward()
        result["checkpointed" if checkpointed else "plain"] = len(gathers)
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    own = [dist.new_group([r]) for r in range(2)]  # each rank a one-stage pipeline of its own
    for piped in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(*(Block(False) for _ in range(BLOCKS)))
        for block in model:
            fully_shard(block, reshard_after_forward=False)
        fully_shard(model, reshard_after_forward=False)
        reductions.clear()
        x = torch.randn(4 * MICRO, 16)
        if piped:
            stage = PipelineStage(model, 0, 1, torch.device("cpu"), group=own[rank])
            Schedule1F1B(stage, MICRO, loss_fn=lambda out, target: out.sum()).step(
                x, target=torch.zeros(4 * MICRO, 16))
        else:
            for part in x.chunk(MICRO):
                model(part).sum().backward()
        result["reductions_piped" if piped else "reductions_accumulated"] = len(reductions)
    # ZeRO-3 (resharded after forward) under the schedule: its parameter gathers in one step
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(False) for _ in range(BLOCKS)))
    for block in model:
        fully_shard(block, reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=True)
    stage = PipelineStage(model, 0, 1, torch.device("cpu"), group=own[rank])
    schedule = Schedule1F1B(stage, MICRO, loss_fn=lambda out, target: out.sum())
    for step in range(2):  # the first step also runs the stage's shape inference
        gathers.clear()
        schedule.step(torch.randn(4 * MICRO, 16), target=torch.zeros(4 * MICRO, 16))
    result["gathers_piped_zero3"] = len(gathers)
    return result


def main():
    import ranks  # beside this file

    ranks.print_result(_rank, 2, wrap=lambda result: {"blocks": BLOCKS, "micro": MICRO,
                                                      **result})


if __name__ == "__main__":
    main()
