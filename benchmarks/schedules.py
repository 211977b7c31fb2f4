#!/usr/bin/env python3
"""Pipeline schedules side by side: the bubble, the step and the memory of each, on a fixed plan
and as the search's best plan for each schedule.

Scenarios: Llama 3 405B on 16,384 H100 with the plan of the Llama 3 paper (TP 8, PP 16, DP 128,
16 micro-batches of one sequence per pipeline: "whose bubble at 16 micro-batches is large"),
GPT-3 175B on 1,024 devices of the NEST paper's H100 spine-leaf, and Llama 3 405B on only 128
H100, where memory binds. Every schedule is evaluated on a
stack that offers them all (``megatron-core`` behaviour; the schedules a real stack runs are
its ``schedules``), then ``plan --schedule`` finds the best plan under each. DualPipe, which the
search does not run, is evaluated on the best DualPipeV plan unfolded (twice the pipeline ranks,
half the replicas: the same compute and memory, the real ranks' network).

    python benchmarks/schedules.py
"""

from __future__ import annotations

from dataclasses import replace

from nestplan.errors import InfeasibleError, SpecError
from nestplan.evaluate import evaluate, scenario_from_names
from nestplan.schedule import SCHEDULES
from nestplan.search import driver
from nestplan.search.constraints import Constraints
from nestplan.specs import Parallelism, unfold
from nestplan.units import GiB

SCENARIOS = [
    ("llama3-405b on 16,384 x dgx-h100-ndr, seq 8192, batch 2048", "llama3-405b", "dgx-h100-ndr",
     16384, 8192, 2048, Parallelism(tp=8, pp=16, dp=128, mbs=1, zero=1, sp=True)),
    ("gpt3-175b on 1,024 x nest-h100-spineleaf, seq 2048, batch 4096", "gpt3-175b",
     "nest-h100-spineleaf", 1024, 2048, 4096,
     Parallelism(tp=8, pp=8, dp=16, mbs=1, zero=1, sp=True)),
    ("llama3-405b on 128 x dgx-h100-ndr, seq 8192, batch 64 (memory-bound)", "llama3-405b",
     "dgx-h100-ndr", 128, 8192, 64, Parallelism(tp=8, pp=16, dp=1, mbs=1, zero=0, sp=True)),
]
VP = {"many": 2, "one": 1, "two": 2}


def every_schedule(sc):
    return replace(sc, stack=replace(sc.stack, name=sc.stack.name + "+all-schedules",
                                     schedules=tuple(SCHEDULES)))


def line(label: str, ev) -> str:
    t = ev.time
    return (f"  {label:34s} step {ev.step_time:8.3f} s  bubble {t.bubble:7.3f} s "
            f"({t.bubble / ev.step_time:5.1%})  peak {ev.peak_memory / GiB:6.1f} GiB "
            f"{'fits' if ev.fits else 'does NOT fit'}  recompute "
            + "/".join(sorted(set(ev.plan.recompute))))


def main() -> None:
    for title, model, cluster, gpus, seq, batch, plan in SCENARIOS:
        sc = every_schedule(scenario_from_names(model, cluster, gpus, seq_len=seq,
                                                global_batch=batch))
        micro = sc.training.micro_batches(plan.mbs, plan.dp)
        print(f"{title}\n fixed plan tp{plan.tp} pp{plan.pp} dp{plan.dp} mbs{plan.mbs}, "
              f"{micro} micro-batches per pipeline, full recomputation:")
        for name, s in SCHEDULES.items():
            par = plan.with_(schedule=name, vp=VP[s.chunks], recompute=("full",))
            try:
                print(line(f"{name} (vp {par.vp})", evaluate(sc, par)))
            except SpecError as e:
                print(f"  {name:34s} cannot run this plan: {e}")
        print(" best plan the search finds under each schedule:")
        found = {}
        for name in SCHEDULES:
            if SCHEDULES[name].mirrored:  # not searched: the DualPipeV plan as its fold
                p = found.get("dualpipev")
                if p is None or p.dp % 2:
                    print(f"  {name:34s} not searched; no DualPipeV plan with even dp to unfold")
                    continue
                real = unfold(replace(p, mirror=True))
                print(line(f"{name}: tp{real.tp} pp{real.pp} dp{real.dp} cp{real.cp} (unfolded)",
                           evaluate(sc, real)))
                continue
            try:
                res = driver.run(sc, Constraints(schedule=name), top=1)
            except (InfeasibleError, SpecError) as e:
                print(f"  {name:34s} none: {str(e).splitlines()[0]}")
                continue
            p = found[name] = res.best.plan
            print(line(f"{name}: tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} vp{p.vp} mbs{p.mbs}",
                       res.best))
        print()


if __name__ == "__main__":
    main()
