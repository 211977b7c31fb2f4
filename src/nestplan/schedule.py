"""Pipeline schedules, the one home: which exist, what each runs in which order, how long a step
takes under it (closed form) and what each device holds at its peak.

A schedule runs, on every pipeline device, forwards (F) and backwards of micro-batches through
the device's model chunks. Schedules that split the backward run the input-gradient part (B) as
soon as they can and the weight-gradient part (W) later, to fill the pipeline's idle time (Qi et
al., "Zero Bubble Pipeline Parallelism", ICLR 2024); the others run B and W as one backward.

The closed form. With ``m`` micro-batches, ``v`` chunks per device, ``X_i`` the forward +
backward time of one micro-batch on device ``i`` (all its chunks), ``F_i`` its forward part and
``W_i`` its weight-gradient part, a schedule's span is::

    T = (m - 1/v) · max_i X_i + sum_i Y_i / v

and device ``i`` then still runs ``(X_i - Y_i)/v`` of weight gradients (its ``tail``; the cost model
adds it to what the device does after its last backward). 1F1B, interleaved 1F1B and GPipe have
``Y = X``: for equal stages ``(m + (p - 1)/v)·X``, the bubble of ``(p - 1)/v`` micro-batch times
(Narayanan et al. SC'21 §2.2; GPipe's all-forwards-then-all-backwards has the same span, Huang et
al. 2019). ZB-H1 has ``Y = X - W - min(W, F)``: for equal stages ``m·X + (p - 1)(F + B - W)`` when
``W <= F`` (the bubble Qi et al. §3.1 give for it, a third of 1F1B's when F = B = W), and
``m·X + (p - 1)·B`` when ``W > F``.

Looped schedules (interleaved 1F1B and zero bubble) run a round of ``g`` micro-batches of each
chunk in turn (:func:`round_size`: the least ``g`` from ``p`` up whose last round, shorter, is
empty or at least ``p`` long, as Megatron-Core's
``--microbatch-group-size-per-virtual-pipeline-stage`` and, where they run the count, PyTorch's
classes run them; which counts a framework takes is its stack's rule); the span above does not
depend on ``g``. With fewer
micro-batches than devices (one round of ``m < p``, which PyTorch's interleaved 1F1B runs) the
pipeline never fills: every micro-batch goes round all ``p`` devices, chunk after chunk, which
takes ``(m - 1)/v · max X + sum Y``, for equal stages ``(p + (m - 1)/v)·X``; a device much
slower than the others still runs its ``m`` micro-batches, which the form above keeps, so the
span is the larger of the two (:func:`span_forms`; for one chunk they are the same).

Why these are exact for equal stages (each device ``F``, ``B``, ``W`` per micro-batch, sends
free; the split schedules with ``m >= p`` and ``W <= B``, which every layer the
cost model builds satisfies: ``W`` is half of the GEMMs' backward, ``B`` the other half and the
rest): under 1F1B the last device idles ``(p - 1)·F`` before its first forward and never after;
its last backward ends ``m·X`` later and the gradient needs ``p - 1`` backwards to reach device
0. Interleaving cuts each of those hops to a chunk, ``1/v`` of the work. Under ZB-H1 device 0
idles ``(p - 1)·B`` while the first gradient comes back and never after; the drain's backwards
are ``B`` alone (their ``W`` wait), and the last device, never idle after its first forward,
finishes ``(p - 1)·F + m·X`` in: the span is ``m·X`` plus the larger of the two idle times,
``(p - 1)·max(F, B)`` = ``(p - 1)·(B + max(F - W, 0))`` once the ``W`` that device ``i`` defers
(one per step from its ``i``-th) are counted. ``tests/test_schedules.py`` checks every closed form
against :func:`simulate` running the schedule's own operation order: equal where this docstring
says exact; for devices within ±50 % of each other and sends up to a tenth of a forward, within
-6 %/+11 % from ``4·p`` micro-batches on and -9 %/+22 % from ``p`` on (measured over 1,500 random
cases per schedule: -4.2 %/+9.8 % and -8.1 %/+19.3 %; the closed form charges every device's
bubble at the slowest device's pace).

ZB-V (Qi et al. §6; torchtitan's ``ZBVZeroBubble``) places two chunks per device in a V: device
``i`` holds model chunks ``i`` and ``2p - 1 - i``, so the turn from chunk ``p - 1`` to ``p`` stays
on the last device and the embedding and the head share device 0. Its ``Y`` is the device's
input-gradient part ``B`` (plus twice what a forward longer than it adds): for equal stages with
per-chunk ``F = B = W`` (the paper's condition for zero bubble) the span is ``m·X + (p - 1)·B/2``
exactly, a sixth of 1F1B's bubble; elsewhere the bounds above hold. DualPipeV (DeepSeek-V3's
DualPipe on the same V; torchtitan's ``DualPipeV``) runs some backwards whole and pairs a
forward with a backward of the other chunk in its steady state; its ``Y`` is ZB-H1's, exact for
``F = B = W`` per chunk (the span ``m·X + (p - 1)(F + B - W)/2``), and it holds ``2p + 1``
chunk-micro-batches on every device.

DualPipe (DeepSeek-V3's own, ``deepseek-ai/DualPipe`` ``dualpipe/dualpipe.py`` at 3da1bbe) runs
the model in ``p`` stages over ``p`` ranks in both directions at once: rank ``r`` holds stage
``r`` and stage ``p - 1 - r`` (two copies of every stage's parameters, their gradients summed
between the two ranks), half the micro-batches enter at rank 0 and half at rank ``p - 1``. Its
``step`` runs on rank ``r`` exactly DualPipeV's steps for position ``h = min(r, p - 1 - r)`` of
``p/2`` with ``m/2`` micro-batches (the same step counts with ``half_rank`` and
``half_num_chunks``; the repository's README compares the two "based on the same number of PP
stages": the same bubble and per-device memory on half the devices). So DualPipe on ``p`` ranks
and ``d`` replicas costs what DualPipeV on ``p/2`` positions and ``2d`` replicas costs (:func:`fold`),
but for its network: the two copies of a stage reduce their gradients between mirror ranks
``h`` and ``p - 1 - h``, and the turn from stage ``p/2 - 1`` to ``p/2`` is a send between ranks
``p/2 - 1`` and ``p/2``, where the V turns on one device. ``simulate`` runs DualPipe's own
two-directional order on all ``p`` ranks; ``tests/test_schedules.py`` checks it against the fold.

Memory: a micro-batch's activations stay until its backward (its ``W`` under the split schedules,
which needs the layer inputs), so a device holds at its peak the micro-batches it has started
and not finished: ``p - i`` under 1F1B, Megatron's warm-up count under interleaving, all ``m``
under GPipe, under ZB-H1 and interleaved zero bubble ``p`` per chunk on every device (read off
the order: device ``i`` defers ``i`` weight gradients), under ZB-V ``2p`` per device. A
deferred ``W`` needs only the GEMMs' inputs and output gradients; counting the micro-batch's
whole activations until then assumes that what its ``B`` frees (the attention's and norms' saved
tensors) is about what ``W`` keeps (the output gradients, which no forward saves): an
approximation, not measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from .caching import cached

MICRO_BATCHES = "micro-batches"
"""The field ``Schedule.check`` names when the micro-batch count per replica breaks a rule."""

OpKey = tuple[str, int, int]
"""(kind, local chunk, micro-batch) of one operation on a device."""


@dataclass(frozen=True)
class Schedule:
    name: str
    """The name plans, ``--schedule`` and stacks use."""
    title: str
    chunks: str
    """How many model chunks per device it runs: ``one`` (vp = 1), ``many`` (vp >= 2) or
    ``two`` (vp = 2)."""
    bubble: str = "whole"
    """What each device adds to the span beyond the bottleneck (``Y``): ``whole`` (its whole
    per-micro-batch time), ``deferred`` (less the weight gradients that fill the bubble) or
    ``input`` (its input-gradient backward: ZB-V). ``bubble_share`` and the search's bounds
    (``search.space._spread``) read it."""
    min_micro: int = 0
    """Fewest micro-batches per replica it runs with, in multiples of ``pp`` (``check``)."""
    holds_all: bool = False
    """Every micro-batch's activations are held at the peak (all forwards run first)."""
    v_shape: bool = False
    """Chunks are placed in a V (device ``i`` holds chunks ``i`` and ``2p - 1 - i``: the model
    goes down the pipeline and back), not looped (device ``i`` holds ``i, i + p, ...``)."""
    torchtitan: str | None = None
    """torchtitan's ``parallelism.pipeline_parallel_schedule`` name (None: it has none)."""
    megatron: bool = False
    """Megatron-Core runs it (``--num-layers-per-virtual-pipeline-stage`` picks interleaving)."""
    folds_to: str | None = None
    """For a schedule whose pipeline's two halves run the model in opposite directions
    (DualPipe: ``pp`` model stages, each on two ranks ``r`` and ``pp - 1 - r``), the schedule
    whose order each rank runs on half the ranks and half the micro-batches; the cost model runs
    that fold (``specs.fold``)."""

    def check(self, pp: int, vp: int, micro: int | None = None) -> tuple[str, object, str] | None:
        """Why a plan with these degrees cannot use this schedule, as (field, value, rule);
        ``micro`` (micro-batches per replica) None: the degrees alone."""
        if self.chunks == "one" and vp != 1:
            return "vp", vp, f"schedule {self.name} runs one model chunk per device; use vp = 1"
        if self.chunks == "many" and pp > 1 and vp < 2:
            return "vp", vp, f"schedule {self.name} needs vp >= 2 model chunks per device"
        if self.chunks == "two" and vp != 2:
            return "vp", vp, f"schedule {self.name} runs exactly 2 model chunks per device (vp = 2)"
        if self.mirrored and pp % 2:
            return "pp", pp, f"schedule {self.name} needs an even number of pipeline ranks"
        if self.mirrored and pp < 4:
            return "pp", pp, (f"schedule {self.name} is modelled from 4 pipeline ranks (2 ranks "
                              "hold the whole model twice)")
        if micro is None:
            return None
        g = round_size(pp, micro) if self.looped_rounds and self.split_backward else 0
        if g and micro % g:  # (a shorter last round is Megatron-Core's, which has no zero bubble)
            return MICRO_BATCHES, micro, (f"schedule {self.name} runs whole rounds only, as "
                                          f"torch does: rounds of {g} leave a last one of "
                                          f"{micro % g} (pp = {pp}); a multiple of {pp} runs")
        if pp > 1 and micro < self.min_micro * pp:
            return MICRO_BATCHES, micro, (f"schedule {self.name} needs at least "
                                          f"{self.min_micro * pp} per replica (pp = {pp})")
        if self.mirrored and micro % 2:
            return MICRO_BATCHES, micro, (f"schedule {self.name} needs an even count per "
                                          "replica (half enter at each end)")
        return None

    @property
    def implied_vp(self) -> int | None:
        """The vp this schedule fixes by itself (one chunk: 1; two: 2), None where it runs any
        from 2 up (the one home of what a fixed schedule says of an unfixed vp)."""
        return {"one": 1, "two": 2}.get(self.chunks)

    @property
    def least_vp(self) -> int:
        """The fewest model chunks per device it runs."""
        return self.implied_vp or 2

    @property
    def looped_rounds(self) -> bool:
        """Runs looped chunks (device ``i`` holds ``i, i + p, ...``) over the micro-batches in
        rounds (:func:`round_size` micro-batches of chunk 0, then of chunk 1, ...); which counts
        a framework runs is its stack's rule (``StackSpec.interleaved_rounds``)."""
        return self.chunks == "many"

    def rounds_of(self, pp: int, vp: int, micro: int) -> int | None:
        """Micro-batches per round when this schedule interleaves ``micro`` micro-batches over
        ``pp`` stages of ``vp`` chunks (:func:`round_size`); None when it does not."""
        return round_size(pp, micro) if self.looped_rounds and pp > 1 and vp > 1 else None

    def model_chunks(self, pp: int, vp: int) -> int:
        """Distinct model chunks (``pp·vp``; a mirrored schedule holds each one twice)."""
        return pp * vp // 2 if self.mirrored else pp * vp

    @property
    def mirrored(self) -> bool:
        """Its pipeline's two halves run the model in opposite directions (``folds_to``)."""
        return self.folds_to is not None

    @property
    def split_backward(self) -> bool:
        """Runs the weight-gradient part of the backward (W) apart from the input-gradient
        part, to fill the pipeline's idle time."""
        return self.bubble != "whole"

    def device_of(self, chunk: int, pp: int) -> int:
        """The pipeline device that runs model chunk ``chunk`` (model order; of a mirrored
        schedule, the one of the first half)."""
        if self.mirrored:
            return min(chunk, pp - 1 - chunk)
        if self.v_shape:
            return chunk if chunk < pp else 2 * pp - 1 - chunk
        return chunk % pp

    def chunks_of(self, stage: int, pp: int, vp: int) -> list[int]:
        """The model chunks device ``stage`` runs, by local index."""
        if self.mirrored:  # the stages of the rank and its mirror (DualPipe's phases)
            h = min(stage, pp - 1 - stage)
            return [h, pp - 1 - h]
        if self.v_shape:
            return [stage, 2 * pp - 1 - stage]
        return list(range(stage, pp * vp, pp))

    def per_device(self, sizes, pp: int, vp: int) -> list[list[int]]:
        """``sizes`` (one value per model chunk, in model order) as each device holds them, by
        local chunk index (:meth:`chunks_of`)."""
        return [[sizes[c] for c in self.chunks_of(d, pp, vp)] for d in range(pp)]

    def hop(self, chunk: int, pp: int) -> int | None:
        """Which stage boundary the activations cross from ``chunk`` to ``chunk + 1``: the
        boundary after device ``i`` is ``i`` (device ``p - 1`` to 0 when looped chunks wrap
        around); None when both chunks are on one device. Mirrored: the boundary the micro-
        batches entering at rank 0 cross (those entering at the other end cross
        ``pp - 2 - chunk``)."""
        if self.mirrored:
            return chunk
        a, b = self.device_of(chunk, pp), self.device_of(chunk + 1, pp)
        if a == b:
            return None
        return pp - 1 if (a, b) == (pp - 1, 0) and not self.v_shape else min(a, b)

    def hops(self, pp: int, vp: int) -> tuple[int, ...]:
        """The stage boundary each chunk-to-chunk transfer of one micro-batch's forward crosses,
        in model order (transfers inside a device left out)."""
        return _hops(self.name, pp, vp)

    def model_order(self, per_device: list[list[int]], pp: int, vp: int) -> tuple[int, ...]:
        """Chunk sizes in model order from each device's sizes by local index."""
        out = []
        for c in range(self.model_chunks(pp, vp)):
            d = self.device_of(c, pp)
            out.append(per_device[d][self.chunks_of(d, pp, vp).index(c)])
        return tuple(out)

    def held_states(self, stage: int, pp: int, vp: int, micro: int) -> tuple[tuple[int, ...], ...]:
        """Every mix of micro-batches per chunk that the device holds at some point and that no
        other it holds exceeds in every chunk; the first is ``held``'s. Its peak is the heaviest
        of them for its chunks' bytes: in the steady state of a looped schedule the mix shifts
        toward the earlier chunks (their backwards come last), so where those are heavier a later
        mix of as many micro-batches holds more (a review: 2.4 GiB more on Llama 3 70B with
        three blocks in each of the first two chunks and two in the others, measured on
        Megatron-Core's own schedule table)."""
        if self.holds_all or vp == 1:
            return (tuple(self.held(stage, pp, vp, micro)),)
        if self.split_backward:
            g = round_size(pp, micro)
            return _states(self.name, stage, pp, vp, min(micro, _states_settled(self.name, g)), g)
        return _states(self.name, stage, pp, vp, micro, 0)

    def held(self, stage: int, pp: int, vp: int, micro: int) -> list[int]:
        """Micro-batches of each of the device's ``vp`` chunks whose activations it holds when it
        first holds the most micro-batches (``held_states``: not always its heaviest mix)."""
        if self.holds_all:
            return [micro] * vp
        if self.split_backward:  # read off the order: W deferred keeps micro-batches longer
            g = round_size(pp, micro)
            return list(_held(self.name, stage, pp, vp, min(micro, _settled(self.name, g)), g))
        return chunks_in_flight(stage, pp, vp, micro)

    def bubble_share(self, x, f, w):
        """``Y`` of the closed form for a device with per-micro-batch time ``x``, forward part
        ``f`` and weight-gradient part ``w`` (numbers or arrays)."""
        import numpy as np  # here, not at start-up: specs import this module

        if self.bubble == "whole":
            return x
        if self.bubble == "input":  # and what a forward longer than it adds
            b = x - f - w
            return b + 2 * np.maximum(f - b, 0.0)
        return x - w - np.minimum(w, f)

    def tail(self, x, f, w, vp: int = 1):
        """Weight-gradient work a device runs after the span: ``(X - Y)/v``."""
        import numpy as np

        if self.bubble == "whole":
            return 0.0 * x
        return np.maximum(x - self.bubble_share(x, f, w), 0.0) / vp

    def order(self, rank: int, pp: int, vp: int, micro: int) -> tuple[OpKey, ...]:
        """The operations of device ``rank`` in the order it runs them."""
        return _orders(self.name, pp, vp, micro)[rank]


SCHEDULES: dict[str, Schedule] = {s.name: s for s in (
    Schedule("gpipe", "GPipe: all forwards, then all backwards", "one", holds_all=True,
             torchtitan="GPipe"),
    Schedule("1f1b", "1F1B (PipeDream-Flush): one forward, one backward", "one",
             torchtitan="1F1B", megatron=True),
    Schedule("interleaved-1f1b", "interleaved 1F1B over vp model chunks per device", "many",
             torchtitan="Interleaved1F1B", megatron=True),
    Schedule("zb-h1", "zero bubble ZB-H1: weight gradients fill the bubble; every device holds "
             "up to pp micro-batches", "one", "deferred", min_micro=1),
    Schedule("interleaved-zb", "interleaved zero bubble (ZB1P) over vp model chunks per device",
             "many", "deferred", min_micro=1, torchtitan="InterleavedZeroBubble"),
    Schedule("zbv", "zero bubble ZB-V: two chunks per device in a V, weight gradients fill the "
             "bubble", "two", "input", min_micro=2, v_shape=True,
             torchtitan="ZBVZeroBubble"),
    Schedule("dualpipev", "DualPipeV: DeepSeek's DualPipe on a V of two chunks per device, "
             "forward and backward of different micro-batches paired", "two", "deferred",
             min_micro=2, v_shape=True, torchtitan="DualPipeV"),
    Schedule("dualpipe", "DualPipe (DeepSeek-V3): pp stages run from both ends at once, every "
             "rank holding its stage and its mirror's (two copies of the parameters)", "two",
             "deferred", min_micro=2, folds_to="dualpipev"),
)}
"""Every schedule nestplan models, by name."""


def span_forms(pp: int, vp: int, micro: int) -> tuple[tuple[float, float], ...]:
    """The closed form as the largest of linear forms ``a·max X + b·sum Y``, their ``(a, b)``:
    ``(m - 1/v, 1/v)``; with fewer micro-batches than devices also ``((m - 1)/v, 1)``, which is
    the larger for devices alike (module docstring; for one chunk the two are the same)."""
    full = (micro - 1.0 / vp, 1.0 / vp)
    if micro >= pp or vp == 1:
        return (full,)
    return ((micro - 1.0) / vp, 1.0), full


def span(x: list[float], y: list[float], micro: int, vp: int) -> float:
    """The closed form over the devices ``x`` (:func:`span_forms`)."""
    if not x:
        return 0.0
    top, total = max(x), sum(y)
    return max(a * top + b * total for a, b in span_forms(len(x), vp, micro))


def resolve(name: str | None, vp: int) -> Schedule:
    """The schedule a plan names; None: 1F1B, or interleaved 1F1B when ``vp > 1`` (Megatron's
    choice by the number of virtual stages)."""
    if name is None:
        return SCHEDULES["interleaved-1f1b" if vp > 1 else "1f1b"]
    return SCHEDULES[name]


def is_default(name: str | None, vp: int) -> bool:
    """Whether ``name`` is the schedule a plan with ``vp`` chunks per device runs when it names
    none (``resolve``; None itself is): a plan, a plan file or the search writes it as None."""
    return name is None or name == resolve(None, vp).name


# ------------------------------------------------------------------------------------- memory

def warmup_chunks(stage: int, pp: int, vp: int, micro: int) -> int:
    """Micro-batch chunks whose activations device ``stage`` holds at its peak under 1F1B.

    1F1B: stage ``i`` runs ``p - i`` forwards before its first backward. Interleaved (Megatron's
    ``get_pp_rank_microbatches``, torch's ``_get_warmup_ops``): ``2·(p - i - 1) + (v - 1)·g``
    warm-up forwards for rounds of ``g`` (:func:`round_size`), plus the one in flight. Never more
    than the ``m·v`` chunks that exist.
    """
    return min(_warmup_forwards(stage, pp, vp, micro) + 1, micro * vp)


def _warmup_forwards(rank: int, pp: int, vp: int, micro: int) -> int:
    """Forwards device ``rank`` runs before its first backward under (interleaved) 1F1B:
    ``p - i - 1``; interleaved ``2·(p - i - 1) + (v - 1)·g`` (:func:`warmup_chunks`)."""
    if vp == 1:
        return min(pp - rank - 1, micro)
    return min(2 * (pp - rank - 1) + (vp - 1) * round_size(pp, micro), micro * vp)


def chunks_in_flight(stage: int, pp: int, vp: int, micro: int) -> list[int]:
    """How many micro-batches of each of the device's ``vp`` chunks are held at the peak: those
    of its warm-up forwards and the one in flight, the first of :func:`forward_order`."""
    total = warmup_chunks(stage, pp, vp, micro)
    if vp == 1:
        return [total]
    held = [0] * vp
    for _, (chunk, _) in zip(range(total), forward_order(pp, vp, micro)):
        held[chunk] += 1
    return held


# ------------------------------------------------------------------------------------- orders

@cached(maxsize=65536)
def round_size(pp: int, micro: int) -> int:
    """Micro-batches per round of a looped schedule: the least ``g`` from ``p`` up whose last,
    shorter round is empty or at least ``p`` long (``m % g`` is 0 or ``>= p``; ``m`` when ``m <
    p``), as Megatron-Core runs it with ``--microbatch-group-size-per-virtual-pipeline-stage g``
    (default ``p``; schedules.py's ``get_schedule_table`` and its check of the remainder): the
    least round holds the least in flight. Where PyTorch's interleaved schedules run ``m`` (a
    multiple of ``max(1, m // p)``) that is their ``microbatches_per_round``, ``m / max(1, m //
    p)``, which divides ``m`` (a shorter round would leave ``m >= (m // p + 1)·p``)."""
    if micro <= pp:
        return micro
    return next(g for g in range(pp, micro + 1) if micro % g == 0 or micro % g >= pp)


def rounds_text(pp: int, micro: int) -> str:
    """How a looped schedule groups ``micro`` micro-batches over ``pp`` stages, where that is not
    in rounds of ``pp``: "rounds of 5, the last of 4", "one round of 3"; else ""."""
    g = round_size(pp, micro)
    if g == pp:
        return ""
    if g == micro:
        return f"one round of {g}"
    last = f", the last of {micro % g}" if micro % g else ""
    return f"rounds of {g}{last}"


def forward_order(pp: int, vp: int, micro: int):
    """The (local chunk, micro-batch) of each forward a device of a looped schedule runs, in
    order: a round of :func:`round_size` micro-batches of chunk 0, of chunk 1, ..., then the
    next round; the last round takes what is left (Megatron-Core's ``get_schedule_table``)."""
    g = round_size(pp, micro)
    for start in range(0, micro, g):
        end = micro if start + g >= micro else start + g
        for chunk in range(vp):
            for mb in range(start, end):
                yield chunk, mb


def _one_f_one_b(rank: int, pp: int, vp: int, micro: int) -> tuple[OpKey, ...]:
    """Megatron's order: warm-up forwards, then one forward and one backward alternately, then
    the cool-down backwards (interleaved: a round of :func:`round_size` micro-batches of each
    chunk in turn; PyTorch's ``ScheduleInterleaved1F1B`` runs the same order,
    ``tests/test_schedules.py`` compares them)."""
    total = micro * vp
    warm = _warmup_forwards(rank, pp, vp, micro)
    table = list(forward_order(pp, vp, micro))

    def nth(k: int, backward: bool) -> OpKey:
        local, mb = table[k]
        return ("B", vp - 1 - local, mb) if backward else ("F", local, mb)

    ops, f, b = [], 0, 0
    for _ in range(warm):
        ops.append(nth(f, False))
        f += 1
    while f < total:
        ops.append(nth(f, False))
        f += 1
        ops.append(nth(b, True))
        b += 1
    while b < total:
        ops.append(nth(b, True))
        b += 1
    return tuple(ops)


def _zero_bubble(rank: int, pp: int, vp: int, micro: int,
                 group: int | None = None) -> tuple[OpKey, ...]:
    """The zero-bubble order of ZB-H1 (one chunk) and its interleaved form, by the rule PyTorch's
    ``ScheduleInterleavedZeroBubble`` follows (``_get_1f1b_rank_ops`` with
    ``enable_zero_bubble``, torch/distributed/pipelining/schedules.py, torch 2.13): ``(v - 1)·g +
    (p - 1 - i)`` warm-up forwards on device ``i`` (chunks in rounds of ``g`` micro-batches,
    :func:`round_size`, or ``group`` when given: ``_held`` builds a settled count's prefix), then
    one forward and one input-gradient backward per step (backwards from the last chunk down),
    then the cool-down backwards; from its ``i``-th step on, every step also runs the oldest
    pending weight gradient, and the ones left run at the end. ``tests/test_schedules.py``
    compares this order with PyTorch's own."""
    total = micro * vp
    g = group or round_size(pp, micro)
    warm = min((vp - 1) * g + (pp - 1 - rank), total)
    nf, nb = [0] * vp, [0] * vp
    ops: list[OpKey] = []
    backwards: list[OpKey] = []
    w_done = 0

    def forward(step: int) -> OpKey:
        local = (step // g) % vp
        nf[local] += 1
        return ("F", local, nf[local] - 1)

    def backward(step: int) -> OpKey:
        local = vp - 1 - ((step - warm) // g) % vp
        nb[local] += 1
        return ("B", local, nb[local] - 1)

    for step in range(warm):
        ops.append(forward(step))
    for step in range(warm, total + warm):
        if step < total:
            ops.append(forward(step))
        b = backward(step)
        ops.append(b)
        backwards.append(b)
        if step - warm >= rank:
            ops.append(("W", *backwards[w_done][1:]))
            w_done += 1
    ops += [("W", *b[1:]) for b in backwards[w_done:]]
    return tuple(ops)


def _zbv(rank: int, pp: int, micro: int) -> tuple[OpKey, ...]:
    """ZB-V's order (Qi et al. §6), by the rule of PyTorch's ``ScheduleZBVZeroBubble``
    (torch/distributed/pipelining/schedules.py, torch 2.13): local chunk 0 is model chunk ``i``
    (going down the pipeline), chunk 1 is ``2p - 1 - i`` (coming back). Device ``i`` runs
    ``2(p - i) - 1`` forwards of chunk 0, then ``i`` pairs of forwards of chunk 1 and 0, then
    ``p - i`` rounds of forward, input gradient and weight gradient of chunk 1; in the steady
    state a round of F, B, W of chunk 0 then of chunk 1; the cool-down runs the input gradients
    of both chunks (``i`` pairs), then of chunk 0 each followed by one of its deferred weight
    gradients, and the weight gradients left, chunk 1's first. ``tests/test_schedules.py``
    compares it with PyTorch's own."""
    ops: list[OpKey] = []
    f, b, w = [0, 0], [0, 0], [0, 0]

    def run(*steps: tuple[str, int]):
        for kind, local in steps:
            count = {"F": f, "B": b, "W": w}[kind]
            ops.append((kind, local, count[local]))
            count[local] += 1

    for _ in range(2 * (pp - rank) - 1):
        run(("F", 0))
    for _ in range(rank):
        run(("F", 1), ("F", 0))
    for _ in range(pp - rank):
        run(("F", 1), ("B", 1), ("W", 1))
    while f[1] < f[0] or f[0] < micro:
        if f[0] < micro:
            run(("F", 0))
        run(("B", 0), ("W", 0), ("F", 1), ("B", 1), ("W", 1))
    for _ in range(rank):
        run(("B", 0), ("B", 1))
    for _ in range(pp - rank):
        run(("B", 0), ("W", 0))
    while w[1] < b[1]:
        run(("W", 1))
    while w[0] < b[0]:
        run(("W", 0))
    return tuple(ops)


def _dualpipev(rank: int, pp: int, micro: int) -> tuple[OpKey, ...]:
    """DualPipeV's order (DeepSeek-V3's DualPipe cut to a V: Qi et al.'s placement with DualPipe's
    schedule), by the rule of PyTorch's ``ScheduleDualPipeV`` (torch/distributed/pipelining/
    schedules.py, torch 2.13, after deepseek-ai/DualPipe). Local chunk 0 is model chunk ``i``,
    chunk 1 is ``2p - 1 - i``. ``X`` is a whole backward (input and weight gradient together),
    ``B`` an input-gradient backward whose weight gradient (``W``) runs later, in order. In the
    steady state a forward of one chunk and a whole backward of the other run back to back
    (DualPipe's overlapped "F&B" pair, whose communication the other's compute hides: nestplan
    charges that through the stack's expert-exchange overlap). ``tests/test_schedules.py``
    compares the order with PyTorch's own, pairs as two operations."""
    ops: list[OpKey] = []
    count: dict[tuple[str, int], int] = {}
    pending: list[tuple[int, int]] = []  # (local, micro-batch) of deferred weight gradients

    def run(kind: str, local: int):
        key = (("B" if kind == "X" else kind), local)
        mb = count.get(key, 0)
        ops.append((kind, local, mb))
        count[key] = mb + 1
        if kind == "B":
            pending.append((local, mb))

    def weight():
        if pending:
            local, mb = pending.pop(0)
            ops.append(("W", local, mb))

    for _ in range((pp - rank - 1) * 2):
        run("F", 0)
    for _ in range(rank + 1):
        run("F", 0)
        run("F", 1)
    for _ in range(pp - rank - 1):
        run("B", 1)
        weight()
        run("F", 1)
    for _ in range(micro - 2 * pp + rank + 1):
        run("F", 0)  # PyTorch pairs these two, except on the last device the first time
        run("X", 1)
        run("F", 1)
        run("X", 0)
    for _ in range(pp - rank - 1):
        run("X", 1)
        run("F", 1)
        run("X", 0)
    split = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        run("B" if split else "X", 1)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        run("B" if split else "X", 0)
    for _ in range(pp - rank - 1):
        weight()
        run("B" if split else "X", 0)
    for _ in range(rank + 1):
        weight()
    return tuple(ops)


def _mirrored(folds_to: str, rank: int, pp: int, vp: int, micro: int) -> tuple[OpKey, ...]:
    """A mirrored schedule's order on rank ``rank`` of ``pp``: its fold's (``folds_to``) for
    position ``min(rank, pp - 1 - rank)`` of ``pp/2`` with half the micro-batches (DualPipe:
    ``dualpipe.py``'s ``step`` runs DualPipeV's eight steps with ``half_rank`` and
    ``half_num_chunks``). Local chunk 0 is stage ``h``, 1 is stage ``pp - 1 - h``; micro-batch
    ``j`` of local chunk ``c`` is the ``j``-th of those entering at rank 0 when ``c`` is the
    rank's own direction (chunk 0 on the first half), else the ``j``-th entering at rank
    ``pp - 1`` (:func:`direction`)."""
    return _order_of(folds_to, min(rank, pp - 1 - rank), pp // 2, vp, micro // 2)


def direction(rank: int, local: int, pp: int) -> int:
    """Under a mirrored schedule, which end the micro-batches of the rank's local chunk
    ``local`` enter at: 0 (rank 0) or 1 (rank ``pp - 1``)."""
    return local ^ int(rank >= pp // 2)


def _held_after_forwards(order: tuple[OpKey, ...], vp: int, split: bool):
    """Yield the micro-batches of each chunk in flight (forward run, backward or W not yet) after
    each forward of ``order``."""
    now = [0] * vp
    for kind, local, _ in order:
        if kind == "F":
            now[local] += 1
            yield tuple(now)
        elif kind == ("W" if split else "B") or kind == "X":
            now[local] -= 1


def _held_by_order(order: tuple[OpKey, ...], vp: int, split: bool) -> list[int]:
    """Micro-batches of each chunk in flight when the device first holds the most."""
    return list(max(_held_after_forwards(order, vp, split), key=sum, default=(0,) * vp))


def _pareto_states(order: tuple[OpKey, ...], vp: int, split: bool) -> tuple[tuple[int, ...], ...]:
    """The mixes of micro-batches per chunk held after each forward of ``order`` that no other
    exceeds in every chunk, ``_held_by_order``'s first (one walk of the order)."""
    states = list(_held_after_forwards(order, vp, split))
    first = max(states, key=sum, default=(0,) * vp)
    # a mix another exceeds holds less in all, so is met after it in descending totals; one
    # that a kept mix does not exceed is exceeded by none (what exceeds it, or a mix that
    # exceeds that, was kept)
    kept: list[tuple[int, ...]] = []
    for p in sorted(set(states), key=sum, reverse=True):
        if not any(all(a >= b for a, b in zip(q, p)) for q in kept):
            kept.append(p)
    return (first, *sorted(p for p in kept if p != first))


@cached(maxsize=65536)
def _states(name: str, stage: int, pp: int, vp: int, micro: int,
            group: int) -> tuple[tuple[int, ...], ...]:
    """``_pareto_states`` of one device's order (zero bubble: in rounds of ``group``)."""
    build = _builder(name)
    order = (build(stage, pp, vp, micro, group) if build is _zero_bubble
             else _order_of(name, stage, pp, vp, micro))
    return _pareto_states(order, vp, SCHEDULES[name].split_backward)


def _states_settled(name: str, group: int) -> int | float:
    """A micro-batch count past which ``_states`` no longer changes for rounds of ``group`` (inf:
    not known): ``2·group + 2`` for zero bubble, whose steady steps repeat once two rounds have
    passed (checked for every count up to ten rounds: tests/test_schedules.py), where the first
    peak settles after one (``_settled``)."""
    return 2 * group + 2 if _builder(name) is _zero_bubble else math.inf


@cached(maxsize=65536)
def _held(name: str, stage: int, pp: int, vp: int, micro: int, group: int) -> tuple[int, ...]:
    # one device's order, not every device's (the search asks for many micro-batch counts); a
    # zero-bubble order in rounds of ``group``, the count's or a longer count's (``_settled``)
    build = _builder(name)
    order = (build(stage, pp, vp, micro, group) if build is _zero_bubble
             else _order_of(name, stage, pp, vp, micro))
    return tuple(_held_by_order(order, vp, True))


def _settled(name: str, group: int) -> int | float:
    """A micro-batch count past which ``_held`` no longer changes for rounds of ``group`` (inf:
    not known). In ``_zero_bubble``'s order, device ``i``'s warm-up and steady steps do not
    depend on the count while forwards remain; the warm-up's ``(v - 1)·g + p - 1 - i`` forwards
    and the ``i`` steps before its first weight gradient each add one micro-batch in flight,
    after which every step adds one forward and retires one weight gradient, and the cool-down
    only retires. So the peak (and the first order reaching it, which ``_held_by_order`` keeps)
    is the same for every count with ``m·v >= (v - 1)·g + p + 1``: ``g + 2`` micro-batches and
    more, as ``g >= p`` (``tests/test_schedules.py`` compares counts up to ``p + 2 + 3·p``)."""
    return group + 2 if _builder(name) is _zero_bubble else math.inf


@cached(maxsize=1024)
def _hops(name: str, pp: int, vp: int) -> tuple[int, ...]:
    s = SCHEDULES[name]
    return tuple(h for h in (s.hop(c, pp) for c in range(s.model_chunks(pp, vp) - 1))
                 if h is not None)


def _order_of(name: str, rank: int, pp: int, vp: int, micro: int) -> tuple[OpKey, ...]:
    return _builder(name)(rank, pp, vp, micro)


def _builder(name: str):
    """The function that builds one device's order of the schedule ``name``:
    ``(rank, pp, vp, micro) -> ops``."""
    if name == "gpipe":
        return _gpipe
    if name == "zbv":
        return lambda rank, pp, vp, micro: _zbv(rank, pp, micro)
    if name == "dualpipev":
        return lambda rank, pp, vp, micro: _dualpipev(rank, pp, micro)
    if SCHEDULES[name].mirrored:
        return lambda rank, pp, vp, micro: _mirrored(SCHEDULES[name].folds_to, rank, pp, vp,
                                                     micro)
    return _zero_bubble if SCHEDULES[name].split_backward else _one_f_one_b


def _gpipe(rank: int, pp: int, vp: int, micro: int) -> tuple[OpKey, ...]:
    """GPipe: every forward, then every backward."""
    return tuple([("F", 0, mb) for mb in range(micro)] + [("B", 0, mb) for mb in range(micro)])


@cached(maxsize=64)
def _orders(name: str, pp: int, vp: int, micro: int) -> tuple[tuple[OpKey, ...], ...]:
    return tuple(_order_of(name, r, pp, vp, micro) for r in range(pp))


# ---------------------------------------------------------------------------------- simulation

class Op(NamedTuple):
    """One forward, backward or weight-gradient pass of one micro-batch through one chunk (a
    named tuple: a step of a long pipeline simulates half a million of them)."""

    stage: int
    """Pipeline device position."""
    chunk: int
    """Model chunk in model order (``Schedule.chunks_of`` the stage, by local index)."""
    kind: str
    """``"F"`` (forward), ``"B"`` (backward, with any recomputation; under a split schedule its
    input-gradient part), ``"W"`` (weight gradient, split schedules) or ``"X"`` (a whole backward
    in a split schedule: DualPipeV's)."""
    micro: int
    start: float
    """Seconds from the start of the step."""
    end: float


def simulate(fwd: list[list[float]], bwd: list[list[float]], micro: int,
             send: list[float] | None = None, *, schedule: Schedule | None = None,
             wgt: list[list[float]] | None = None) -> list[Op]:
    """Every operation of one step with its start and end, each device running its operations
    in the schedule's order; an operation starts when its device is free and its input has
    arrived (the previous chunk's forward output, or the next chunk's gradient, plus the send
    time between the two devices; a W follows its own B).

    ``fwd[i][c]`` and ``bwd[i][c]`` are the seconds of one micro-batch through local chunk ``c``
    of device ``i`` (each device holds the same number of chunks), ``bwd`` the whole backward;
    ``wgt[i][c]`` the weight-gradient part of it (a split schedule runs ``bwd - wgt`` as B and
    ``wgt`` as W); ``send[i]`` the transfer time between device ``i`` and the next one (device
    ``pp - 1`` sends to device 0 between looped chunks; a V sends back up the same links).
    ``schedule``: 1F1B, or interleaved 1F1B with several chunks, when not given. A mirrored
    schedule's micro-batches entering at rank ``pp - 1`` are numbered after those entering at
    rank 0.
    """
    timed, _ = _timeline(fwd, bwd, micro, send, schedule, wgt, keep=True)
    return list(map(Op._make, timed))


def simulated_ends(fwd: list[list[float]], bwd: list[list[float]], micro: int,
                   send: list[float] | None = None, *, schedule: Schedule | None = None,
                   wgt: list[list[float]] | None = None) -> list[float]:
    """When each device's last operation of :func:`simulate` ends, without building the
    operations (a plan of 4,096 micro-batches has half a million); memoised, as a search meets
    the same stage times again under another rank order or ZeRO stage (a third of a 405B
    search's simulations)."""
    def rows(table):
        return None if table is None else tuple(map(tuple, table))

    return list(_ends(rows(fwd), rows(bwd), micro, None if send is None else tuple(send),
                      schedule, rows(wgt)))


@cached(maxsize=4096)
def _ends(fwd, bwd, micro: int, send, schedule, wgt) -> tuple[float, ...]:
    schedule = schedule or resolve(None, len(fwd[0]))
    short = _ends_by_rounds(fwd, bwd, micro, send, schedule, wgt)
    if short is not None:
        return short
    return tuple(_timeline(fwd, bwd, micro, send, schedule, wgt, keep=False)[1])


class _Rounds(NamedTuple):
    """How a long step is the step of ``base`` micro-batches with ``rounds`` more rounds of
    ``size`` micro-batches run in its steady state (``_rounds_of``)."""

    base: int
    rounds: int
    size: int
    cut: tuple[int, ...]
    """Per device: the index in its order of ``base`` where the added rounds go."""
    span: tuple[int, ...]
    """Per device: its operations per round."""
    window: tuple[int, ...]
    """Per device: how many operations before the cut must end one round's time after the
    operation a round earlier."""


# Rounds of micro-batches the shorter step runs (its warm-up, settling and cool-down; the rest
# are taken as whole rounds), the longer where the shorter has not settled (a slow device's
# backlog can take a few rounds to reach its steady pace).
_SETTLE_ROUNDS = (4, 16)


def _ends_by_rounds(fwd, bwd, micro: int, send, schedule: Schedule, wgt):
    """:func:`_timeline`'s device ends for ``micro`` micro-batches from a shorter simulation,
    where that is exact (to 1e-9 of the step: floating-point sums repeat to within rounding, so
    the repetition is checked to within that share per added round); None where it is not
    known to be.

    A step's order is its warm-up, rounds of steady state and its cool-down; with more
    micro-batches only the rounds are more (``_rounds_of`` checks the orders say so). Each
    operation ends at the max of its device's previous end and its input's end plus the send,
    plus its own time: shifting every input by ``λ`` shifts its end by ``λ``. So once, in a
    simulation of ``base`` micro-batches, every operation in a window before the cut ends ``λ``
    after the same operation a round earlier, and that window holds everything a later
    operation waits for (``_Rounds.window``), each added round ends ``λ`` after the one before
    and everything after the cut ``λ`` later per round: the device ends are ``base``'s plus
    ``rounds·λ``. Otherwise (not settled in ``base``, or orders of another shape) None, and the
    caller simulates the whole step."""
    pp, vp = len(fwd), len(fwd[0])
    for settle in _SETTLE_ROUNDS:
        plan = _rounds_of(schedule.name, pp, vp, micro, settle)
        if plan is None:
            return None
        ends = _shifted_ends(fwd, bwd, send, schedule, wgt, plan)
        if ends is not None:
            return ends
    return None


def _shifted_ends(fwd, bwd, send, schedule: Schedule, wgt, plan: _Rounds):
    """``_ends_by_rounds`` with one ``base``: None where its window does not repeat."""
    pp = len(fwd)
    timed, free = _timeline(fwd, bwd, plan.base, send, schedule, wgt, keep=True)
    ends: list[list[float]] = [[] for _ in range(pp)]
    for op in timed:  # each device's operations are appended in its order
        ends[op[0]].append(op[5])
    # a window that repeats to within ``tol`` a round drifts by at most that every added round
    # (devices whose times nearly tie: a review's), so the ends stay within 1e-9 of the step
    lam = None
    tol = 1e-9 * max(free) / plan.rounds
    for r in range(pp):
        e, c, span = ends[r], plan.cut[r], plan.span[r]
        for i in range(c - plan.window[r], c):
            d = e[i] - e[i - span]
            if lam is None:
                lam = d
            elif abs(d - lam) > tol:
                return None
    return tuple(f + plan.rounds * lam for f in free)


@cached(maxsize=1024)
def _rounds_of(name: str, pp: int, vp: int, micro: int, settle: int) -> _Rounds | None:
    """For ``micro`` micro-batches under schedule ``name``: the shorter step whose simulation
    gives the step's (``_ends_by_rounds``), where the orders show one exists. Checked, per
    device, on the operation orders alone: the order of ``micro`` is the order of ``base`` with
    ``rounds`` copies of its last round before the cut inserted there, each a round's
    micro-batches later, and what follows the cut a round later per copy; the window before the
    cut repeats with the round; an operation before the cut waits only for operations before
    their device's cut, and one in the last round or after the cut only for operations in the
    window or after the cut. None where a simulation of ``micro`` is as short."""
    s = SCHEDULES[name]
    if s.mirrored or pp < 2:
        return None
    size = s.rounds_of(pp, vp, micro) or pp
    least = size * settle
    if micro < least + 2 * size:
        return None
    base = least + (micro - least) % size
    if s.rounds_of(pp, vp, base) not in (None, size):
        return None
    rounds = (micro - base) // size
    chunk_of = [s.chunks_of(r, pp, vp) for r in range(pp)]
    last = s.model_chunks(pp, vp) - 1
    short = [s.order(r, pp, vp, base) for r in range(pp)]
    cuts, spans = [], []
    for r in range(pp):
        a, b = short[r], s.order(r, pp, vp, micro)
        extra = len(b) - len(a)
        if extra <= 0 or extra % rounds:
            return None
        span = extra // rounds
        c = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        if c < span:
            return None
        tail = [(k, loc, mb + size * n) for n in range(1, rounds + 1)
                for k, loc, mb in a[c - span:c]]
        tail += [(k, loc, mb + size * rounds) for k, loc, mb in a[c:]]
        if b[c:] != tuple(tail):
            return None
        cuts.append(c)
        spans.append(span)
    # where each operation's end is: (device, index) by (end list, model chunk, micro-batch)
    where = {}
    for r, order in enumerate(short):
        for i, (kind, local, mb) in enumerate(order):
            where["B" if kind == "X" else kind, chunk_of[r][local], mb] = (r, i)

    def waits_for(r: int, kind: str, local: int, mb: int):
        g = chunk_of[r][local]
        if kind == "F":
            return where["F", g - 1, mb] if g > 0 else None
        if kind == "W":
            return where["B", g, mb]
        return where["B", g + 1, mb] if g < last else where["F", g, mb]

    window = [spans[r] for r in range(pp)]
    for r, order in enumerate(short):
        for i, op in enumerate(order):
            dep = waits_for(r, *op)
            if dep is None:
                continue
            d, j = dep
            if i < cuts[r] and j >= cuts[d]:
                return None
            if i >= cuts[r] - spans[r] and j < cuts[d]:
                window[d] = max(window[d], cuts[d] - j)
    for r, order in enumerate(short):
        c, span, w = cuts[r], spans[r], window[r]
        if c - w - span < 0:
            return None
        if any(order[i] != (order[i - span][0], order[i - span][1], order[i - span][2] + size)
               for i in range(c - w, c)):
            return None
    return _Rounds(base, rounds, size, tuple(cuts), tuple(spans), tuple(window))


def _timeline(fwd, bwd, micro: int, send, schedule, wgt, *, keep: bool):
    """:func:`simulate`'s operations as ``(stage, chunk, kind, micro, start, end)`` tuples (an
    empty list unless ``keep``), and each device's last end."""
    pp, vp = len(fwd), len(fwd[0])
    schedule = schedule or resolve(None, vp)
    send = send or [0.0] * pp
    wgt = wgt or [[0.0] * vp for _ in range(pp)]
    split = schedule.split_backward
    orders = [schedule.order(r, pp, vp, micro) for r in range(pp)]
    chunk_of = [schedule.chunks_of(r, pp, vp) for r in range(pp)]
    last = schedule.model_chunks(pp, vp) - 1

    def wire(g: int, way: int) -> float:
        """Transfer between chunk ``g`` and ``g + 1`` (either way) of a micro-batch that
        entered at end ``way`` (a mirrored schedule's second end crosses the boundaries
        backwards)."""
        h = schedule.hop(g, pp)
        if h is not None and way:
            h = pp - 2 - h
        return 0.0 if h is None else send[h]

    wires = [[wire(g, way) for g in range(last)] for way in (0, 1)]
    # When each forward and backward ends, by chunk and micro-batch id: a list per chunk (a
    # mirrored schedule's second end numbers its micro-batches after the first's)
    mirrored = schedule.mirrored
    ids = micro + max((mb for order in orders for _, _, mb in order), default=0) + 1
    ends = {kind: [[None] * ids for _ in range(last + 1)] for kind in "FBW"}
    # each device's operations in its order, as (the end list of the operation it waits for or
    # None, its micro-batch id, the transfer before it, its seconds, its own end list, its
    # chunk, its kind); all but the micro-batch id depend on the kind and chunk alone
    steps = []
    for r in range(pp):
        mine, known = [], {}
        for kind, local, mb in orders[r]:
            way = direction(r, local, pp) if mirrored else 0
            mb += way * (micro // 2)
            part = known.get((kind, local))
            if part is None:
                g = chunk_of[r][local]
                if kind == "F":
                    dep, delay = (ends["F"][g - 1], wires[way][g - 1]) if g > 0 else (None, 0.0)
                    t = fwd[r][local]
                elif kind == "W":
                    dep, delay, t = ends["B"][g], 0.0, wgt[r][local]
                else:  # B, or X: a whole backward in a schedule that splits the others
                    dep, delay = ((ends["B"][g + 1], wires[way][g]) if g < last
                                  else (ends["F"][g], 0.0))
                    t = bwd[r][local] - (wgt[r][local] if split and kind == "B" else 0.0)
                part = known[kind, local] = (dep, delay, t, ends["B" if kind == "X" else kind][g],
                                             g, kind)
            dep, delay, t, own, g, kind = part
            mine.append((dep, mb, delay, t, own, g, kind))
        steps.append(mine)
    pos, free = [0] * pp, [0.0] * pp
    timed: list[tuple] = []
    counts = [len(mine) for mine in steps]
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            mine, i, now, n = steps[r], pos[r], free[r], counts[r]
            while i < n:
                dep, mb, delay, t, own, g, kind = mine[i]
                if dep is not None:
                    ready = dep[mb]
                    if ready is None:
                        break
                    ready += delay
                    if ready > now:
                        now = ready
                if keep:
                    timed.append((r, g, kind, mb, now, now + t))
                now += t
                own[mb] = now
                i += 1
            if i != pos[r]:
                pos[r], free[r], progress = i, now, True
    if any(pos[r] < len(orders[r]) for r in range(pp)):
        raise ValueError("pipeline schedule deadlocked")  # an internal error, not user input
    return timed, free


def makespan(ops: list[Op]) -> float:
    return max((o.end for o in ops), default=0.0)
