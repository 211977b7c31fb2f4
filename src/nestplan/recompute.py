"""Activation recomputation policies: one home for what a policy keeps and what it runs again.

A stack names the policies it offers (``StackSpec.recompute``: name -> rule); plans, plan files,
``--recompute`` and the exports carry those names. The layer graph tags every operator with the
recompute module it belongs to and whether what it saves is internal to that module
(``graph.Op.modules``, ``graph.Op.saved_by``; ``Op.pinned`` for what a checkpoint of the module
keeps alive beyond that; ``graph.Comm.module``), the matmuls it runs as in eager code
(``Op.matmuls``) and its output size (``Op.out_bytes``). A rule turns those tags into the bytes a
layer keeps for backward, the share of each operator's forward that backward runs again, and the
working memory of the recomputation (:func:`effect`). Rules:

``none``
    keep everything the operators save.
``full``
    keep the layer's input; run the whole forward, with its communication, again in backward
    (Megatron ``--recompute-granularity full --recompute-method uniform --recompute-num-layers
    1``; torchtitan ``activation_checkpoint.mode = "full"``; DeepSpeed's and Composer's
    per-block checkpointing).
``modules:NAME[,NAME...]``
    checkpoint those modules (``MODULES``): drop the tensors they produce and keep themselves,
    and, for the output-discarding ones, their outputs wherever saved; run their operators and
    collectives again (Megatron ``--recompute-granularity selective --recompute-modules``;
    ``core_attn`` is its default and Korthikanti et al. 2022 §5's selective recomputation).
``matmul-outputs``
    torchtitan's per-op selective checkpointing (``selective_ac_option = "op"``): inside a
    checkpointed block keep the outputs of matmuls except every second one and the attention
    kernel's outputs; everything else runs again.
``every:N``
    full recomputation of every N-th block, none of the others (torchtitan's per-layer selective
    option ``selective_ac_option = "N"`` of 2024). Costs are the average over N blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from .caching import cached
from .errors import SpecError

MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
"""Recompute modules the layer graph tags: Megatron-Core's ``--recompute-modules`` choices
(megatron/core/transformer/transformer_config.py ``recompute_modules``, NVIDIA/Megatron-LM @
d98e8a64dd)."""
OUTPUT_DISCARDING = frozenset({"layernorm", "mla_up_proj", "moe_act"})
"""Modules Megatron checkpoints without their output (CheckpointWithoutOutput): the output is
dropped wherever a later op saved it and recomputed before that op's backward. The others use
normal checkpointing: inputs kept, internals dropped, the output kept by whoever saves it."""
_PARENT = {"moe_act": "moe", "shared_experts": "moe"}


def _inside(producer: str, module: str) -> bool:
    return producer == module or _PARENT.get(producer) == module

#: The policies a stack file may name without defining them.
STANDARD = {"none": "none", "selective": "modules:core_attn", "full": "full"}


@dataclass(frozen=True)
class Policy:
    """One named recomputation policy of a stack."""

    name: str
    rule: str

    @property
    def kind(self) -> str:
        """The rule's family: ``none``, ``full``, ``modules``, ``matmul-outputs`` or ``every``."""
        return self.rule.split(":", 1)[0]

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(self.rule.split(":", 1)[1].split(",")) if self.kind == "modules" else ()

    @property
    def every(self) -> int:
        return int(self.rule.split(":", 1)[1]) if self.kind == "every" else 0


NONE = Policy("none", "none")

_PARTIAL = ("modules", "matmul-outputs")
"""The kinds that keep part of a block: each stands in for the other across stacks."""


def closest(policy: Policy, offered: tuple[Policy, ...]) -> Policy | None:
    """The policy of ``offered`` (another stack's) that runs ``policy`` most nearly: the same
    rule, else the same kind, else for a partial kind (``_PARTIAL``) the other one and for
    ``every:N`` full recomputation; None when ``offered`` has nothing of the kind (a stack with
    no partial policy, say)."""
    for same in (lambda p: p.rule == policy.rule, lambda p: p.kind == policy.kind):
        found = next((p for p in offered if same(p)), None)
        if found is not None:
            return found
    kinds = _PARTIAL if policy.kind in _PARTIAL else ("full",) if policy.kind == "every" else ()
    return next((p for k in kinds for p in offered if p.kind == k), None)


MAX_EVERY = 512
"""The largest N of ``every:N``: the most blocks a model may have (``specs.MAX_LAYERS``); a larger
N recomputes the same one block per device (an N of 10^20 had been taken and exported)."""


def parse_rule(where: str, rule: object) -> str:
    """A rule string, checked; SpecError naming ``where`` otherwise."""
    text = str(rule).strip()
    allowed = ("allowed: none, full, modules:NAME[,NAME] (NAME: " + ", ".join(MODULES)
               + f"), matmul-outputs, every:N (2 <= N <= {MAX_EVERY})")
    if text in ("none", "full", "matmul-outputs"):
        return text
    head, _, tail = text.partition(":")
    if head == "modules" and tail:
        names = [m.strip() for m in tail.split(",")]
        twice = next((m for m in names if names.count(m) > 1), None)
        if twice is not None and twice in MODULES:  # (had collapsed without a word)
            raise SpecError(where, rule, f"module {twice} named twice; name each module once")
        if all(m in MODULES for m in names):
            return "modules:" + ",".join(names)
    if head == "every" and tail.isascii() and tail.isdigit() and 2 <= int(tail) <= MAX_EVERY:
        return f"every:{int(tail)}"
    raise SpecError(where, rule, allowed)


MAX_REPEAT = 4096
"""Largest ``name*k`` repeat a policy list takes (far more pipeline stages than any plan has)."""


def parse_names(where: str, value: object) -> tuple[str, ...]:
    """Policy names from a flag or file value: ``"full"``, ``"none,full"``, ``"none*3,full"``
    (``k`` stages in a row: what ``names_text`` writes) or a list of names. Whether the stack
    offers them is checked with the plan (``StackSpec.unsupported``)."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    names: list[str] = []
    for item in (str(r).strip() for r in items):
        name, star, count = item.rpartition("*")
        if not star:
            names.append(item)
            continue
        if not (count.isascii() and count.isdigit() and 1 <= int(count) <= MAX_REPEAT) \
                or not name.strip() or "*" in name:
            raise SpecError(where, value, f"{item!r}: a policy repeated over stages is name*k, "
                            f"k from 1 to {MAX_REPEAT}, e.g. none*3,full")
        names += [name.strip()] * int(count)
    if not names or not all(names):
        raise SpecError(where, value,
                        "give one policy name or one per pipeline stage, e.g. full or none,full")
    return tuple(names)


def names_text(names) -> str:
    """Per-stage policy names as ``--recompute`` takes them: one name when every stage has it,
    else ``runs_text``."""
    return names[0] if len(set(names)) == 1 else runs_text(names)


def runs_text(names) -> str:
    """Policy names in order, a run of one name as ``name*k`` (``none*3,full,none*4``)."""
    runs: list[list] = []
    for name in names:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return ",".join(name if k == 1 else f"{name}*{k}" for name, k in runs)


def standard(where: str, names) -> tuple[Policy, ...]:
    """Policies from a list of standard names (``none``, ``selective``, ``full``)."""
    out = []
    for name in names:
        if name not in STANDARD:
            raise SpecError(where, name, "allowed: " + ", ".join(STANDARD)
                            + " (or a table of name = rule to define others)")
        out.append(Policy(name, STANDARD[name]))
    return tuple(out)


@dataclass(frozen=True)
class Effect:
    """What a policy does to one layer, per micro-batch on one device."""

    saved: float
    """Bytes kept for backward."""
    shares: tuple[float, ...]
    """Per operator, the share of its forward that backward runs again (beside ``full``)."""
    full: float
    """Share of the layer's whole forward, with its communication, that runs again."""
    transient: float
    """Working memory while the layer's backward runs: the tensors recomputed for it."""
    comm_modules: tuple[str, ...] = ()
    """Modules whose forward collectives run again (``graph.Comm.module``)."""
    comm_kinds: tuple[str, ...] = ()
    """Kinds of forward collectives that run again, wherever they are (``graph.CollKind``
    values)."""

    def reruns(self, module: str, kind: str) -> bool:
        """Backward runs again a forward collective of ``module`` ("" outside the recompute
        modules) and ``kind`` (a ``graph.CollKind`` value), beside a full recomputation's."""
        return (bool(module) and module in self.comm_modules) or kind in self.comm_kinds


@cached(maxsize=4096)
def effect(policy: Policy, layer) -> Effect:
    """What ``policy`` keeps and recomputes for ``layer`` (a ``graph.LayerGraph``)."""
    ops = layer.ops
    everything = layer.saved_bytes
    none = (0.0,) * len(ops)
    kind = policy.kind
    if kind == "none":
        return Effect(everything, none, 0.0, 0.0)
    if kind == "full":
        return Effect(layer.input_bytes, none, 1.0, everything)
    if kind == "every":
        n = policy.every
        return Effect((layer.input_bytes + (n - 1) * everything) / n, none, 1.0 / n, everything)
    if kind == "modules":
        chosen = set(policy.modules)

        def dropped(o) -> bool:
            return any(_inside(o.saved_by, m) and (m in o.modules or m in OUTPUT_DISCARDING)
                       for m in chosen)
        drop = sum(o.saved for o in ops if dropped(o))
        pinned = sum(o.pinned for o in ops if o.modules & chosen)
        shares = tuple(1.0 if o.modules & chosen else 0.0 for o in ops)
        rerun = chosen | {child for child, parent in _PARENT.items() if parent in chosen}
        return Effect(everything - drop + pinned, shares, 0.0, drop, tuple(sorted(rerun)))
    return _matmul_outputs(layer)


def _matmul_outputs(layer) -> Effect:
    """torchtitan's per-op rule (torchtitan/distributed/activation_checkpoint.py, save list of
    matmuls, attention kernels, reduce-scatters and all-to-alls; ``mm_count % 2 == 0``
    recomputed). Collectives off the list run again with the forward: the all-gathers (TP's of a
    sequence-parallel input, measured with torchtitan 0.3's own ``SelectiveAC`` on two CPU ranks,
    tests/frameworks_tp_saved.py; CP's of K/V) and all-reduces, and the expert exchange's
    all-to-alls where the stack's dispatcher calls one the list does not hold
    (``LayerGraph.per_op_reruns``: ``StackSpec.per_op_saves_all_to_all``). The block's
    input stays, as under full recomputation; the router's small matmul is always recomputed
    (``force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]``), and so are the routed experts'
    grouped GEMMs (``torch._grouped_mm`` is not on the save list and is not counted as an mm:
    torchtitan 0.3.0 wheel; measured on its Qwen3 MoE block, tests/test_framework_memory.py)."""
    from .graph import CollKind, OpKind

    saved = layer.input_bytes
    count = 0
    shares = []
    for op in layer.ops:
        if op.kind is OpKind.MEMORY:
            shares.append(1.0)
            continue
        if op.kind is OpKind.ATTENTION:
            saved += op.out_bytes
            shares.append(0.0)
            continue
        if op.name == "router" or op.name.startswith("expert_"):
            shares.append(1.0)
            continue
        again = 0.0
        for part in op.matmuls:
            count += 1
            if count % 2:
                saved += op.out_bytes * part
            else:
                again += part
        shares.append(again)
    return Effect(saved, tuple(shares), 0.0, max(layer.saved_bytes - saved, 0.0),
                  comm_kinds=(CollKind.ALL_GATHER.value, CollKind.ALL_REDUCE.value,
                              *layer.per_op_reruns))
