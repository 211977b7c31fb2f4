"""What the frameworks' own sharding code sends, measured on CPU, against the stacks' costs.

``frameworks_fsdp_gathers.py`` (beside this file) runs PyTorch's FSDP2 on two gloo ranks and
counts the parameter all-gathers of one step with and without checkpointing each sharded block.
"""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from nestplan.catalog import get_stack
from nestplan.evaluate import evaluate, scenario_from_names
from nestplan.specs import Parallelism

SCRIPT = Path(__file__).parent / "frameworks_fsdp_gathers.py"


@pytest.mark.frameworks
def test_fsdp_gathers_a_checkpointed_block_once_per_backward():
    """A whole-block checkpoint inside an FSDP unit re-runs its forward within the unit's
    backward, after the backward's own all-gather: no extra gather. The FSDP stacks cost it so;
    a stack that gathers operator by operator (DeepSpeed ZeRO-3) gathers again."""
    p = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    counts = json.loads(p.stdout.strip().splitlines()[-1])
    assert counts["checkpointed"] == counts["plain"] == 2 * counts["blocks"]
    # gradients: once a unit per step under PyTorch's pipeline schedule, once a micro-batch
    # outside one (pipeline_defers_grad_sync)
    assert counts["reductions_piped"] == counts["blocks"]
    assert counts["reductions_accumulated"] == counts["micro"] * counts["blocks"]
    # ZeRO-3 under the schedule: a backward leaves the weights gathered, every forward reshards
    # them, and the op after a forward gathers: m + 1 gathers a step, not two a micro-batch
    assert counts["gathers_piped_zero3"] == (counts["micro"] + 1) * counts["blocks"]

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=16,
                             stack="torchtitan")

    def zero_link(stack, policy):
        par = Parallelism(dp=16, zero=3, recompute=(policy,), mbs=1)
        ev = evaluate(replace(sc, stack=stack), par)
        return ev.link_time["dp"]

    fsdp = get_stack("torchtitan")
    assert zero_link(fsdp, "full") == pytest.approx(zero_link(fsdp, "none"), rel=1e-9)
    per_op = replace(fsdp, name="per-op", gather_whole_block=False)
    assert zero_link(per_op, "full") > 1.2 * zero_link(per_op, "none")



def test_torchtitans_pipelined_zero3_gathers_once_a_micro_batch_and_once_a_step():
    """What the CPU count above found, as the torchtitan stack costs it: under a pipeline,
    ZeRO-3's traffic beyond ZeRO-2's is m + 1 gathers a step (ZeRO-2 gathers once a step after
    the optimizer, and both reduce once a step), so it grows by one gather per micro-batch: the
    step's traffic at 2m micro-batches exceeds that at m by what ZeRO-3 adds to ZeRO-2 at m."""
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=8,
                             stack="torchtitan")

    def dp_link(zero, batch):
        par = Parallelism(pp=2, dp=8, zero=zero, mbs=1, recompute=("full",))
        more = replace(sc, training=replace(sc.training, global_batch=batch))
        return evaluate(more, par).link_time["dp"]

    added = dp_link(3, 64) - dp_link(2, 64)  # 8 micro-batches per replica
    assert added > 0
    assert dp_link(3, 128) - dp_link(3, 64) == pytest.approx(added, rel=1e-6)


def test_torchtitan_reduces_a_pipelines_gradients_once_a_step():
    """What the framework does (the CPU counts above), as the torchtitan stack costs it: under a
    pipeline, ZeRO-2's gradient reduce-scatters do not grow with the micro-batches and the
    gradients are held unsharded (fp32) until then; without one, each micro-batch reduces its
    own and the gradients stay sharded. Megatron-Core's distributed optimizer is unchanged."""
    fsdp = get_stack("torchtitan")

    def run(stack, pp, batch):
        sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096,
                                 global_batch=batch, stack=stack.name)
        sc = replace(sc, stack=stack)
        ev = evaluate(sc, Parallelism(pp=pp, dp=16 // pp, zero=2, recompute=("full",), mbs=1))
        return ev.link_time["dp"], ev.stages[0].memory.gradients

    piped, piped_grads = run(fsdp, 2, 64)
    assert run(fsdp, 2, 128)[0] == pytest.approx(piped, rel=1e-9)
    flat, flat_grads = run(fsdp, 1, 64)
    assert run(fsdp, 1, 128)[0] > 1.5 * flat  # (the gathers stay once a step)
    # a stage holds half the blocks, all their gradients: about 8/2 = 4 times a shard of 1/16
    assert piped_grads > 3.5 * flat_grads
    eager = replace(fsdp, pipeline_defers_grad_sync=False)
    assert run(eager, 2, 128)[0] > 1.5 * run(eager, 2, 64)[0]  # (the gathers stay once a step)


GQA_SCRIPT = Path(__file__).parent / "frameworks_gqa_tp.py"


@pytest.mark.frameworks
def test_tp_beyond_the_kv_heads_gathers_the_projection_as_megatron_core_does():
    """Megatron-Core's self-attention with TP 2 over one KV head (two CPU ranks): each rank holds
    1/tp of every head's query, key and value projections and all-gathers their output, whose
    gradient backward reduce-scatters (a user trial: nestplan had replicated the KV head on each
    rank, with no gather). The layer graph's projection and collectives are those bytes."""
    from nestplan import graph as G
    from nestplan.evaluate import layer_graph
    from nestplan.options import Precision
    from nestplan.specs import MLPKind, ModelSpec, Norm, Position, TrainingSpec, kv_heads_refusal

    c = dict(seq=64, hidden=256, heads=4, groups=1, tp=2)
    p = subprocess.run([sys.executable, str(GQA_SCRIPT), *(f"--{k}={v}" for k, v in c.items())],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    d = c["hidden"] // c["heads"]
    assert got["qkv_weight_shape"] == [(c["heads"] + 2 * c["groups"]) * d // c["tp"], c["hidden"]]
    gathered = c["seq"] * (c["heads"] + 2 * c["groups"]) * d * 2  # bf16 bytes
    assert got["forward"][0] == ["_allgather_base_", gathered]
    assert got["backward"][0] == ["_reduce_scatter_base_", gathered]

    model = ModelSpec(name="gqa", layers=1, hidden=c["hidden"], heads=c["heads"],
                      kv_heads=c["groups"], head_dim=d, ffn_hidden=4 * c["hidden"], vocab=1024,
                      mlp=MLPKind.SWIGLU, norm=Norm.RMSNORM, bias=False, position=Position.ROPE)
    tr = TrainingSpec(seq_len=c["seq"], global_batch=1, precision=Precision.BF16)
    layer = layer_graph(model, Parallelism(tp=c["tp"], sp=False, mbs=1), tr,
                        get_stack("megatron-core")).dense
    qkv = next(o for o in layer.ops if o.name == "qkv")
    assert qkv.shape[2] == got["qkv_weight_shape"][0]
    mine = [(k.kind, k.nbytes, k.phase) for k in layer.comms if k.name.startswith("qkv_out")]
    assert mine == [(G.CollKind.ALL_GATHER, gathered, "fwd"),
                    (G.CollKind.REDUCE_SCATTER, gathered, "bwd")]
    # torchtitan splits each KV head whole: refused there
    assert kv_heads_refusal(model, get_stack("torchtitan"), 2) is not None
    assert kv_heads_refusal(model, get_stack("megatron-core"), 2) is None


DEEPSPEED_ZERO = Path(__file__).parent / "frameworks_deepspeed_zero2.py"


@pytest.mark.frameworks
@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_zero_all_reduces_the_gradients_and_gathers_inside_its_step(stage):
    """DeepSpeed's ZeRO-1/2 optimizer with its defaults, on two gloo ranks
    (``frameworks_deepspeed_zero2.py``): the backward all-reduces the whole gradient (each bucket,
    every rank keeping its partition), not a reduce-scatter, and the step gathers the updated
    bf16 weights, synchronously, before it returns. The deepspeed stack costs both so
    (``zero_grad_allreduce``, ``optimizer_gather_waits``): a DeepSpeed user's trial found a
    reduce-scatter charged and the gather hidden behind the next forward, as Megatron's
    distributed optimizer hides it."""
    p = subprocess.run([sys.executable, str(DEEPSPEED_ZERO), str(stage)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    # as the export launches it: overlap_comm on, whose side stream changes none of this
    assert got["defaults"]["use_multi_rank_bucket_allreduce"] is True and got["overlap_comm"]
    assert got["backward"] == {"all_reduce": pytest.approx(1.0)}  # bytes per gradient byte
    gathers = {k: v for k, v in got["step"].items() if k.startswith("all_gather")}
    assert sum(gathers.values()) == pytest.approx(1.0)  # bytes per bf16 weight byte
    assert got["step"]["all_reduce"] < 1e-3  # (the gradient norm's scalar)
    assert got["step_waits"]  # issued synchronously: the next forward queues behind the gather

    st = get_stack("deepspeed")
    assert st.zero_grad_allreduce and st.optimizer_gather_waits
    sc = scenario_from_names("llama3-8b", "selene-a100-hdr", 64, seq_len=4096, global_batch=128,
                             stack="deepspeed")
    par = Parallelism(dp=64, zero=stage, mbs=1, recompute=("full",))

    def costed(**fields):
        return evaluate(replace(sc, stack=replace(st, **fields)), par)

    ds, scattered = costed(), costed(zero_grad_allreduce=False)
    # on the links, in units of one gather of the bf16 weights (a ring's all-reduce is two of
    # them, a reduce-scatter of the bf16 gradients one): ZeRO-1 reduces once a step, ZeRO-2 each
    # of the 2 micro-batches, and both gather once
    reductions = 1 if stage == 1 else 2
    assert ds.link_time["dp"] / scattered.link_time["dp"] == pytest.approx(
        (2 * reductions + 1) / (reductions + 1), rel=1e-6)
    hidden = costed(optimizer_gather_waits=False)
    assert ds.step_time > hidden.step_time  # the gather no longer hides behind a forward
    assert ds.time.dp - hidden.time.dp > 0

