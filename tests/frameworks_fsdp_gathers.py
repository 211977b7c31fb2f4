"""Count FSDP2's parameter all-gathers in one training step on CPU, with and without activation
checkpointing of each sharded block (run by ``test_framework_comm.py`` in a fresh process).

Two gloo ranks (FSDP2 skips the collective on one rank). Each block is its own ``fully_shard``
unit, as torchtitan and Composer wrap transformer blocks; the checkpointed variant wraps the
block's body in non-reentrant ``torch.utils.checkpoint`` inside the unit, as torchtitan's
``apply_ac`` does before ``fully_shard``. Prints one JSON object: all-gathers per step for each.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.checkpoint import checkpoint

BLOCKS = 3


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


def _rank(rank: int, port: str, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.fsdp import fully_shard
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as group

    gathers = []
    real = group.foreach_all_gather

    def counted(*args, **kwargs):
        gathers.append(1)
        return real(*args, **kwargs)

    group.foreach_all_gather = counted
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
    if rank == 0:
        out.put(result)
    dist.destroy_process_group()


def main():
    port = sys.argv[1] if len(sys.argv) > 1 else "29561"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    result = out.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    print(json.dumps({"blocks": BLOCKS, **result}))


if __name__ == "__main__":
    main()
