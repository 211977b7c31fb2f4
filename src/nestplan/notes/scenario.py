"""Notes on a scenario before anything is evaluated: what its model, cluster, stack or sequence
length mean for the plans costed on it (said on stderr through ``errors.note``)."""

from __future__ import annotations

from ..errors import note


def trained_context(sc) -> None:
    """Say when a RoPE model is given a sequence longer than the context its configuration gives
    (``ModelSpec.trained_context``: a long-context trial's 1M tokens on Llama 3 8B's 8,192 went
    without a word, and the Megatron export set the longer length with no scaling)."""
    note(trained_context_text(sc))


def trained_context_text(sc) -> str | None:
    """``trained_context``'s note, also written into exports (a long-context trial: the Megatron
    export of Qwen3 at 128K carried its unscaled RoPE without it), or None. A RoPE model whose
    RoPE is scaled (Llama 3.1's, YaRN) is noted beyond the context its scaling was built for, the
    config's max_position_embeddings (a long-context trial's Llama 3.1 at 1M tokens, 8 times
    beyond, had gone without a word)."""
    from ..options import Position

    m, seq = sc.model, sc.training.seq_len
    if m.position is not Position.ROPE or not 0 < m.trained_context < seq:
        return None
    if m.rope_scaling or m.yarn:
        return (f"{m.name} was built for {m.trained_context:,} tokens with its RoPE scaled "
                f"(max_position_embeddings, trained_context in a model file): at --seq-len "
                f"{seq:,}, {seq / m.trained_context:.3g} times beyond, it is costed and exported "
                "with that scaling, which does not cover the length; training this long usually "
                "scales RoPE further (a larger factor, or YaRN's)")
    # (torchtitan's exports launch its own model definition, whose RoPE they note: a torchtitan
    # trial read "exported unscaled" here beside the export's "scales RoPE as torchtitan's
    # definition does")
    return (f"{m.name} was built for {m.trained_context:,} tokens (max_position_embeddings, "
            f"trained_context in a model file) and has no RoPE scaling: at --seq-len {seq:,} "
            "it is costed with its RoPE base "
            f"({m.rope_theta:g}) unscaled, and the Megatron export sets it so; longer-context "
            "training usually raises the base or scales RoPE (rope_theta or rope_scaling in the "
            "config)")


def default_workload(sc, seq_default: bool, batch_default: bool) -> None:
    """Say which of the workload's figures ``plan`` took as its defaults, not given (a Megatron
    user's trial planned an 8,192-token model at 4,096 without noticing): the model's own
    context beside a default sequence length."""
    tr, m = sc.training, sc.model
    taken = ([f"--seq-len {tr.seq_len:,}" + (f" (the model's context: {m.trained_context:,})"
                                               if m.trained_context > tr.seq_len else "")]
             if seq_default else []) + ([f"--global-batch {tr.global_batch:,}"]
                                        if batch_default else [])
    if taken:
        note(f"planned at the default {' and '.join(taken)}, not given: give your run's")


def added_depths(sc, model: str) -> None:
    """Say when --mtp-layers gives a model depths it does not have of its own (a user trial:
    a dense model's header then named them without a word of where they came from)."""
    from ..catalog import get_model

    added = sc.model.mtp_layers
    if added and not get_model(model).mtp_layers:
        note(f"--mtp-layers {added}: {sc.model.name} has no multi-token-prediction "
             f"depth of its own; {added} added after its last block (DeepSeek-V3's "
             "kind: a projection, one more block and a loss each, costed as such)")


def sequence(sc) -> None:
    """What the sequence length means for the model: a learned position table grown to it, a
    context beyond what the model was built for."""
    position_table(sc)
    trained_context(sc)


def position_table(sc) -> None:
    """Say when a learned position table must grow to the sequence length."""
    m, seq = sc.model, sc.training.seq_len
    if m.position_rows(seq) > m.max_positions > 0:
        note(f"{m.name} learns {m.max_positions:,} positions; at --seq-len {seq:,} its "
             f"table has {seq:,} rows (costed so, and exported as "
             "--max-position-embeddings): a model of its own, not a checkpoint of "
             f"{m.name}")


def straddling_domains(sc) -> None:
    """Say when the scale-up domains (an NVL72 rack, say) do not divide the job
    (``textfmt.partial_domain_text``; ``sweep`` says it of its grid)."""
    from ..textfmt import partial_domain_text

    note(partial_domain_text(sc.cluster, sc.gpus))


FASTEST_SCALE_OUT = 200e9
"""Bytes/s per device of the fastest scale-out networks announced: 1.6 Tb/s per Rubin GPU with
ConnectX-9 (NVIDIA at GTC DC, October 2025, as hardwareluxx.de reported it: "Neue
Netzwerkhardware: NVIDIA nennt Details zum ConnectX-9 und BlueField-4"; shipping today:
ConnectX-8, 800 Gb/s = 100 GB/s). A level beyond the first that gives a device more is noted as
a likely unit slip (Gb/s typed as GB/s: a datacenter trial's 400 "GB/s" leaf)."""


SLOWER_INSIDE = 4
"""How many times slower per device than a level beyond it a level must be to be noted: a
gigabit for a gigabyte's slip (8) and an academic's 100 Gb/s NIC typed as 100 GB/s beyond 25 GB/s
of PCIe (4; it had been 8 until then). Beyond a block, per device over the oversubscription.
The NEST paper's TPU v4 and spine-leaf clusters, 4 times faster beyond a block, are catalog
clusters, which are not noted; a copy of them is, one at 4:1 above the leaf is not."""


def unlikely_bandwidths(cluster) -> str | None:
    """What is implausible in a cluster's bandwidths, as a note's text (None: nothing): a level
    ``SLOWER_INSIDE`` times slower per device than one beyond it (a datacenter trial's NVLink of
    0.45 GB/s, TB/s typed as GB/s, was costed at 1.6 % MFU without a word), or a level beyond
    the first faster than any scale-out NIC (``FASTEST_SCALE_OUT``). A scale-up fabric of
    several tiers (NVLink across racks) may be faster there: the note says so."""
    from ..catalog import is_entry
    from ..units import GB

    if is_entry("clusters", cluster):
        return None  # (a catalog cluster's figures are sourced: the TPU v4 pod's ICI is faster)
    levels = cluster.levels
    for inner, outer in zip(levels, levels[1:]):
        # (beyond, what a device gets with every device crossing: its share over the
        # oversubscription; a review's sweep of the NEST spine-leaf at 4:1 had been noted)
        beyond = outer.bandwidth / outer.oversubscription
        if inner.bandwidth * SLOWER_INSIDE <= beyond:
            return (f"{cluster.name}: level {inner.name} gives a device "
                    f"{inner.bandwidth / GB:g} GB/s, {beyond / inner.bandwidth:.3g} times "
                    f"less than level {outer.name} beyond it ({beyond / GB:g} GB/s): "
                    "traffic inside a block is costed slower "
                    "than traffic between blocks; bandwidth_GBps is gigabytes per second per "
                    "device (450 for H100's NVLink, 50 for a 400 Gb/s NIC)")
    # (every such level at once: a datacenter trial fixed the one named and met the next)
    fast = [lvl for lvl in levels[1:] if lvl.bandwidth > FASTEST_SCALE_OUT]
    if fast:
        names = " and ".join(lvl.name for lvl in fast)
        speeds = " and ".join(f"{lvl.bandwidth / GB:g}" for lvl in fast)
        gives = (f"level {names} gives" if len(fast) == 1 else f"levels {names} give")
        return (f"{cluster.name}: {gives} a device {speeds} GB/s, more than any scale-out "
                f"network ({FASTEST_SCALE_OUT / GB:g} GB/s, 1.6 Tb/s per "
                "GPU): bandwidth_GBps is gigabytes per second (a 400 Gb/s NIC is 50: divide "
                "gigabits by 8); right only for a scale-up fabric of several tiers")
    return None


def unstated_efficiencies(cluster) -> str | None:
    """Say which levels of a cluster file give no ``efficiency`` and so are costed at their
    whole bandwidth (None: every level gives one, or a catalog cluster): a user trial's own file
    for the catalog's dgx-h100-ndr network ran its plan 1.8 % faster than the catalog's, whose
    levels give what NCCL's tests reach."""
    from ..catalog import is_entry

    if is_entry("clusters", cluster):
        return None
    unstated = [lvl.name for lvl in cluster.levels if not lvl.efficiency_stated]
    if not unstated:
        return None
    return (f"{cluster.name}: level{'s' if len(unstated) > 1 else ''} {', '.join(unstated)} "
            f"give{'s' if len(unstated) == 1 else ''} no efficiency, so collectives are costed "
            f"at the level's whole bandwidth (efficiency = 1.0); {_measured_efficiencies(cluster)}"
            ": give each level its efficiency")


def _measured_efficiencies(cluster) -> str:
    """What the catalog's clusters give as their levels' efficiencies, from NCCL's tests: a
    catalog cluster's of the same accelerator where there is one (a DeepSpeed trial's A100 file
    had been told H100's figures), else dgx-h100-ndr's. The NEST paper's clusters, which take
    its artifact's settings (efficiency 1.0 everywhere), are no reference (a review's)."""
    from ..catalog import get_cluster, list_names

    acc = cluster.accelerator.name
    measured = [get_cluster(n) for n in sorted(list_names("clusters"))]
    measured = [c for c in measured if any(lvl.efficiency < 1 for lvl in c.levels)]
    same = [c for c in measured if c.accelerator.name == acc]
    ref = same[0] if same else get_cluster("dgx-h100-ndr")
    levels = ", ".join(f"{lvl.name} {lvl.efficiency:g}" for lvl in ref.levels)
    return (f"the catalog's {ref.name}, {'on ' + acc + ' too, ' if same else ''}gives {levels} "
            "(NCCL's tests, sourced in its file)")


def cluster_texts(cluster) -> list[str]:
    """What is said of a cluster's network figures wherever a command takes it."""
    return [t for t in (unlikely_bandwidths(cluster), unstated_efficiencies(cluster)) if t]


def cluster_bandwidths(cluster) -> None:
    """Note ``cluster_texts`` of a cluster (a scenario's, or one ``list clusters`` shows)."""
    for text in cluster_texts(cluster):
        note(text)


def fused_pieces(sc) -> None:
    """Say which of the model's pieces that frameworks may run as eager kernels (``StackSpec.
    eager_ops``) the stack costs as fused ones."""
    from ..catalog import DEFAULT_STACK
    from ..graph import eager_split

    fused = eager_split(sc.model, sc.stack.eager_ops, sc.stack.eager_code)[1]
    if fused:
        note(f"stack '{sc.stack.name}' costs {sc.model.name}'s {', '.join(fused)} as "
             "fused kernels (not in its eager_ops): a framework that runs them as "
             f"separate kernels takes longer (stack '{DEFAULT_STACK}' costs them so)")


CP_SPLIT_NOTED_FROM = 16384
"""The sequence length from which a length no CP degree splits is noted."""


def no_cp_split(sc, con) -> None:
    """Say when the sequence is long enough for context parallelism but no CP degree the GPUs
    allow splits it into an even number of tokens per rank (load-balanced causal chunks), so the
    search runs without CP (a long-context trial's 131,071 tokens: a plan 14 % slower than at
    131,072, without a word)."""
    from ..specs import MIN_CP_CHUNK, cp_splits, divisors

    seq, gpus = sc.training.seq_len, sc.gpus
    # (a stack without CP says so itself; at a few thousand tokens CP hardly matters: a review
    # found 4,097 tokens told to take 4,096)
    if con.cp is not None or not sc.stack.offers("cp") or seq < CP_SPLIT_NOTED_FROM:
        return
    possible = [c for c in divisors(gpus)[1:] if seq // c >= MIN_CP_CHUNK]
    if not possible or any(cp_splits(seq, c) for c in possible):
        return
    step = 2 * possible[0]
    nearest = max(step, round(seq / step) * step)
    note(f"seq_len {seq:,}: no context-parallel degree splits it (seq_len / cp must be an even "
         f"number of tokens, each rank's at least {MIN_CP_CHUNK:,}), so the search ran without "
         f"CP; {nearest:,} tokens would offer cp {possible[0]}")


LARGEST_BATCH_TOKENS = 63e6
"""The largest global batch of a published pre-training run we know of, tokens: DeepSeek-V3's
15,360 sequences of 4,096 (DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv:2412.19437, §4.2;
Llama 3 405B's is 16M, arXiv:2407.21783, §3.4.1)."""
BATCH_NOTED_FROM = 16 * LARGEST_BATCH_TOKENS
"""The tokens a step from which a global batch is noted: likely given in tokens, not sequences."""


def huge_batch(sc, given: bool) -> None:
    """Say when the global batch holds far more tokens than any published run's: likely a count
    of tokens given as sequences (a DeepSpeed user's trial: 4,194,304 at 4,096 tokens planned a
    17-hour step without a word), or, not ``given``, the default at a very long sequence."""
    tr = sc.training
    tokens = tr.global_batch * tr.seq_len
    if tokens < BATCH_NOTED_FROM:
        return
    size = (f"{tr.global_batch:,} sequences of {tr.seq_len:,} tokens is {tokens / 1e9:,.1f} "
            f"billion tokens a step, over {tokens / LARGEST_BATCH_TOKENS:,.0f} times the largest "
            "published run's (DeepSeek-V3's 63M)")
    if not given:
        note(f"the default --global-batch of {size}: give your run's with --global-batch")
        return
    fewer = tr.global_batch // tr.seq_len
    hint = (f"; in tokens this one would be {fewer:,} sequence{'s' if fewer > 1 else ''}"
            if fewer else "")
    note(f"--global-batch {size}: global batch counts sequences{hint}")
