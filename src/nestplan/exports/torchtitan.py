"""torchtitan job configuration (TOML: ``[job]``, ``[training]``, ``[parallelism]``,
``[activation_checkpoint]``).

Keys follow torchtitan's ``ParallelismConfig`` and ``TrainingConfig``. torchtitan shards data
parallelism with FSDP2: ZeRO-3 is ``data_parallel_shard_degree`` with resharding after forward,
ZeRO-2 the same without resharding, ZeRO-0 plain replication; ZeRO-1 has no equivalent and is
exported as ZeRO-2. Stages are given exactly with ``module_fqns_per_model_part`` (embedding
``tok_embeddings``, blocks ``layers.i``, head ``norm`` and ``output``). torchtitan's device mesh
is ordered pp, dp_replicate, dp_shard, cp, tp (tp innermost).
"""

from __future__ import annotations

from ..axes import Axis
from ..options import Precision, Recompute
from ..planfile import PlanFile
from . import Export, blocks_per_chunk, evaluate, mesh_json, predicted_note, uniform_policy

TORCHTITAN_ORDER = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def sections(pf: PlanFile) -> tuple[dict, list[str], object]:
    """The TOML sections (as dicts), the notes, and the plan actually exported."""
    sc, par = pf.scenario, pf.plan
    m, tr = sc.model, sc.training
    notes: list[str] = []
    policy, rec_notes = uniform_policy(par)
    notes += rec_notes
    zero = par.zero
    if zero == 1:
        notes.append("ZeRO-1 (sharded optimizer only) has no FSDP2 equivalent; exported as "
                     "ZeRO-2 (fsdp_reshard_after_forward = never)")
        zero = 2
    exported = par.with_(recompute=(policy,), zero=zero)
    micro = tr.global_batch // (par.mbs * par.dp)
    parallelism = {
        "data_parallel_replicate_degree": par.dp if zero == 0 else 1,
        "data_parallel_shard_degree": 1 if zero == 0 else par.dp,
        "fsdp_reshard_after_forward": "always" if zero == 3 else "never",
        "tensor_parallel_degree": par.tp,
        "enable_sequence_parallel": par.sp,
        "pipeline_parallel_degree": par.pp,
        "pipeline_parallel_schedule": "Interleaved1F1B" if par.vp > 1 else "1F1B",
        "pipeline_parallel_microbatch_size": par.mbs,
        "context_parallel_degree": par.cp,
        "expert_parallel_degree": par.ep,
    }
    if par.pp > 1:
        sizes = blocks_per_chunk(pf)
        parts, start = [], 0
        for c, n in enumerate(sizes):
            part = (["tok_embeddings"] if c == 0 else []) + [
                f"layers.{i}" for i in range(start, start + n)] + (
                ["norm", "output"] if c == len(sizes) - 1 else [])
            parts.append(part)
            start += n
        parallelism["module_fqns_per_model_part"] = parts
    if m.moe is not None and par.expert_tp not in (1, par.tp):
        notes.append(f"expert tensor parallelism {par.expert_tp} cannot be expressed "
                     "(torchtitan's experts borrow the TP ranks)")
    training = {"local_batch_size": par.mbs * (micro if par.pp > 1 else 1),
                "global_batch_size": tr.global_batch, "seq_len": tr.seq_len,
                "mixed_precision_param": "bfloat16"}
    ac = {"mode": policy.value}
    if policy is Recompute.SELECTIVE:
        ac["selective_ac_option"] = "op"
    out = {"job": {"description": f"nestplan plan: {m.name} on {sc.gpus} x "
                                  f"{sc.cluster.accelerator.name}"},
           "training": training, "parallelism": parallelism, "activation_checkpoint": ac}
    if tr.precision is Precision.FP8:
        out["model"] = {"converters": ["float8"]}
    if par.rank_order != TORCHTITAN_ORDER:
        notes.append("the plan's rank order (" + "-".join(a.value for a in par.rank_order)
                     + ") differs from torchtitan's mesh (tp innermost, then cp, dp, pp): "
                     "launch rank r on the device at its coordinates in the .mesh.json file")
    if rec_notes or zero != par.zero:
        notes.append(predicted_note(pf, exported))
    return out, notes, exported


def export(pf: PlanFile) -> Export:
    out, notes, exported = sections(pf)
    ev = evaluate(pf.scenario, exported)
    lines = [f"# nestplan export for torchtitan; predicted step {ev.step_time:.3f} s, "
             f"{ev.tokens_per_s:,.0f} tokens/s, peak memory {ev.peak_memory / 2**30:.1f} GiB"]
    lines += [f"# note: {n}" for n in notes]
    for name, table in out.items():
        lines += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return Export(text="\n".join(lines) + "\n", extras={".mesh.json": mesh_json(pf.plan)},
                  notes=notes)
