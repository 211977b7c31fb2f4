"""Run every method on the NEST paper's scenarios and write ``benchmarks/paper_scenarios.md``.

Scenarios come from ``../shared/data/nest_paper/`` (Figure 5 and 6 on ``nest-tpuv4-fattree``,
Table 3 on ``nest-h100-spineleaf``); each keeps the paper's fixed inputs (global batch 4,096
sequences, the micro-batch size, EP = 4 for Mixtral). Two scenarios the paper lacks are added:
an oversubscribed Clos and 16,384 GPUs. Every method's plan of every scenario is also written to
``benchmarks/paper_plans.json``, which ``tests/test_exports.py`` exports to every framework.

    python benchmarks/paper_scenarios.py [--quick]      # --quick: the H100 rows only
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from nestplan.errors import InfeasibleError, SpecError
from nestplan.evaluate import evaluate, scenario_from_names
from nestplan.search import methods
from nestplan.search.constraints import Constraints
from nestplan.specs import Parallelism

HERE = Path(__file__).parent
PAPER = HERE.parent.parent / "shared" / "data" / "nest_paper"
OUT = HERE / "paper_scenarios.md"
PLANS = HERE / "paper_plans.json"

MODEL = {"megatronbert": ("bert-large", 512), "llama2": ("llama2-7b", 4096),
         "llama3": ("llama3-70b", 4096), "megatrongpt3": ("gpt3-175b", 2048),
         "mixtral": ("mixtral-8x7b", 4096)}
CLUSTER = {"tpuv4_fatTree": "nest-tpuv4-fattree", "h100_spineLeaf": "nest-h100-spineleaf"}
PAPER_METHOD = {"Manual": "manual", "MCMC": "mcmc", "Phaze": "phaze", "NEST": "nest",
                "AlpaE": "alpa"}
RUN = ("nest", "manual", "phaze", "alpa", "mist", "mcmc")
BATCH = 4096
# Figure 5 normalises to Manual at the smallest N where the paper's Manual plan runs
FIG5_REF = {"megatronbert": 64, "llama2": 64, "llama3": 128, "megatrongpt3": 128, "mixtral": 128}


def load_reference():
    table = defaultdict(dict)
    with open(PAPER / "reference_results.csv", newline="") as f:
        for r in csv.DictReader(f):
            fig = ("fig5" if r["source_table"].startswith("Figure 5") else "fig6"
                   if r["source_table"].startswith("Figure 6") else "h100")
            key = (fig, r["setup"].split("_mbs")[0], r["model"], int(r["num_devices"]),
                   int(r["mbs"]))
            table[key][PAPER_METHOD[r["method"]]] = (float(r["ratio"]) if r["ratio"] else None,
                                                     r["runtime_s"])
    return table


def load_paper_manual() -> dict:
    """The paper's own Manual plans that fit their N (``baselines.csv``), by (setup, model, N),
    with whether the artifact recomputes that model's activations (``models.csv``)."""
    with open(PAPER / "models.csv", newline="") as f:
        recomputes = {r["model"]: r["activation_recomputation"] == "yes" for r in csv.DictReader(f)}
    out = {}
    with open(PAPER / "baselines.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["method"] == "Manual" and r["fits_in_num_devices"] == "yes":
                if r["model"] in MODEL:  # (the models the figures ran)
                    out[(r["setup"], r["model"], int(r["num_devices"]))] = (
                        r, recomputes[r["model"]])
    return out


def paper_manual_plan(setup, model, gpus, manual):
    """The paper's Manual plan at ``gpus``, scored by nestplan (None where the paper has none or
    nestplan cannot run it: a global batch its replicas do not divide). Its p, t and d, the
    artifact's recomputation (full or none), micro-batch 1, the stack's other defaults; Mixtral's
    EP 4, which the artifact gave devices of their own (p·t·d·ep of them), folds over 4 times the
    data-parallel ranks, as Megatron-Core lays it out."""
    found = manual.get((setup, model, gpus))
    if found is None:
        return None
    row, recomputes = found
    name, seq = MODEL[model]
    ep = int(row["ep_assumed"] or 1)
    sc = scenario_from_names(name, CLUSTER[setup], gpus, seq_len=seq, global_batch=BATCH)
    tp, st = int(row["t"]), sc.stack
    # the rest as evaluate's flags leave them: the stack's sequence parallelism, expert TP, ZeRO
    par = Parallelism(tp=tp, pp=int(row["p"]), dp=int(row["d"]) * ep, ep=ep,
                      etp=st.default_etp(tp, ep, biased=sc.model.biased_experts)
                      if sc.model.moe is not None else None,
                      sp=st.sp_for(tp, sc.model.moe is not None), mbs=1,
                      recompute=("full" if recomputes else "none",))
    par = par.with_(zero=st.zero_unsaid(par))
    try:
        return evaluate(sc, par)
    except SpecError:
        return None


def run_scenario(setup, model, gpus, mbs, cache):
    key = (setup, model, gpus, mbs)
    if key in cache:
        return cache[key]
    name, seq = MODEL[model]
    sc = scenario_from_names(name, CLUSTER[setup], gpus, seq_len=seq, global_batch=BATCH)
    con = Constraints(mbs=mbs, ep=4 if model == "mixtral" else None)
    out = {}
    for m in RUN:
        t0 = time.perf_counter()
        try:
            res = methods.run_method(m, sc, con, top=1)
            out[m] = (res.best, time.perf_counter() - t0)
        except (InfeasibleError, SpecError) as e:
            out[m] = (None, str(e))
        print(f"  {setup} {model} {gpus} mbs{mbs} {m}: "
              + (f"{out[m][0].step_time:.3f} s" if out[m][0] else "no plan"), file=sys.stderr,
              flush=True)
    cache[key] = out
    return out


def shape(ev) -> str:
    p = ev.plan
    parts = [f"t{p.tp}", f"p{p.pp}", f"d{p.dp}"] + ([f"c{p.cp}"] if p.cp > 1 else []) + (
        [f"e{p.ep}"] if p.ep > 1 else []) + ([f"v{p.vp}"] if p.vp > 1 else []) + [
        f"z{p.zero}", "rc:" + "+".join(sorted({r[:3] for r in p.recompute}))]
    return " ".join(parts)


def fmt(x) -> str:
    return "—" if x is None else f"{x:.2f}"


SEARCHING = ("phaze", "alpa", "mist", "mcmc")


def margins_text(margins) -> tuple[str, str]:
    """NEST's median and largest margin over each searching baseline, as prose."""
    def pct(r):
        return f"{(r - 1) * 100:.0f} %" if r < 1.5 else f"{r:.1f}x"
    median = ", ".join(f"{m} {pct(statistics.median(r for r, _ in margins[m]))}"
                       for m in SEARCHING if margins[m])
    largest = "; ".join(f"{m} {pct(r)} on {where}" for m in SEARCHING if margins[m]
                        for r, where in [max(margins[m])])
    return median, largest


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only the H100 (Table 3) rows")
    args = ap.parse_args(argv)
    ref = load_reference()
    manual = load_paper_manual()
    cache = {}
    lines = ["# The NEST paper's scenarios, re-run with nestplan", "",
             "Generated by `python benchmarks/paper_scenarios.py` (do not edit by hand).",
             "Each cell is *ours / paper's* throughput ratio to the reference Manual plan "
             "(Figure 5: Manual at the smallest N where the paper's Manual runs; Figure 6: "
             "Manual at N = 256, micro-batch 1; Table 3: Manual at the same N). Every method is "
             "scored with nestplan's full cost model on the scenario's cluster; \"—\" = no plan "
             "(nothing fits, or the paper printed none). Scenarios keep the paper's fixed "
             "inputs: global batch 4,096 sequences, its micro-batch size, EP = 4 for Mixtral. "
             "`manual` is nestplan's own Megatron rules; the column *nest over the paper's "
             "Manual plan* scores the paper's reference Manual plan itself (`baselines.csv`: "
             "its p, t, d, the artifact's recomputation, micro-batch 1; Mixtral's EP 4 folded "
             "over the data-parallel ranks) and gives NEST's throughput over it, *ours / the "
             "paper's NEST ratio*: the comparison the paper makes, both plans scored by one "
             "model (\"—\" where the paper's plan does not run here: a global batch its "
             "replicas do not divide, or none at that N).",
             ""]
    groups = [k for k in ref if not args.quick or k[0] == "h100"]
    groups.sort(key=lambda k: (k[0], k[2], k[3], k[4]))
    wins = total = 0
    over_paper = []  # (ours, the paper's) NEST over the paper's own Manual plan
    margins = defaultdict(list)  # searching baseline -> (its step over NEST's, scenario)
    sections = {"fig5": "Figure 5 (nest-tpuv4-fattree, micro-batch 1)",
                "fig6": "Figure 6 (nest-tpuv4-fattree, 256 devices, micro-batch sweep)",
                "h100": "Table 3 (nest-h100-spineleaf)"}
    current = None
    for fig, setup, model, gpus, mbs in groups:
        if fig != current:
            current = fig
            lines += ["", f"## {sections[fig]}", "",
                      "| model | N | mbs | nest | manual | phaze | alpa | mist | mcmc | "
                      "nest over the paper's Manual plan | "
                      "nest plan | nest step (s) | search s (ours / paper) |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        res = run_scenario(setup, model, gpus, mbs, cache)
        # the reference N: Figure 5's smallest where the paper's Manual runs, Figure 6's 256, at
        # micro-batch 1; Table 3's own N
        ref_n = FIG5_REF[model] if fig == "fig5" else 256 if fig == "fig6" else gpus
        base = (res if fig == "h100" else run_scenario(setup, model, ref_n, 1, cache))["manual"][0]
        paper_plan = paper_manual_plan(setup, model, ref_n, manual)
        paper = ref[(fig, setup, model, gpus, mbs)]
        cells = []
        for m in RUN:
            ev = res[m][0]
            ours = ev.tokens_per_s / base.tokens_per_s if ev and base else None
            theirs = paper.get(m, (None, ""))[0] if m != "mist" else None
            cells.append(f"{fmt(ours)} / {fmt(theirs)}" if m != "mist" else fmt(ours))
        nest = res["nest"][0]
        paper_ratio, paper_secs = paper.get("nest", (None, ""))
        # NEST against the paper's own reference plan, both scored here: the paper's NEST ratio
        # beside it (a NEST-paper trial found compare's manual, Megatron's rules, no stand-in)
        if nest and paper_plan and paper_ratio:
            over_paper.append((nest.tokens_per_s / paper_plan.tokens_per_s, paper_ratio))
        cells.append(fmt(nest.tokens_per_s / paper_plan.tokens_per_s
                         if nest and paper_plan else None)
                     + ("" if paper_plan is None or paper_plan.fits else " (it does not fit)")
                     + f" / {fmt(paper_ratio)}")
        if nest:
            total += 1
            others = [res[m][0] for m in RUN[1:] if res[m][0]]
            wins += all(nest.step_time <= o.step_time * (1 + 1e-9) for o in others)
            for m in SEARCHING:
                if res[m][0]:
                    where = f"{MODEL[model][0]} on {gpus} ({sections[fig].split(' (')[0]})"
                    margins[m].append((res[m][0].step_time / nest.step_time, where))
        secs = f"{res['nest'][1]:.1f} / {paper_secs or '—'}" if nest else "—"
        lines.append(f"| {MODEL[model][0]} | {gpus} | {mbs} | " + " | ".join(cells)
                     + f" | {shape(nest) if nest else '—'} | "
                     + (f"{nest.step_time:.2f}" if nest else "—") + f" | {secs} |")
    lines += ["", f"NEST's plan is at least as fast as every baseline's in {wins} of {total} "
              "scenarios with a NEST plan."]
    if over_paper:
        ours, theirs = zip(*over_paper)
        lines += ["", f"Over the paper's own Manual plan, scored here, NEST's throughput is "
                  f"{min(ours):.2f}-{max(ours):.2f}x (median {statistics.median(ours):.2f}) in "
                  f"the {len(ours)} scenarios where the paper's plan runs and the paper gives a "
                  f"NEST ratio; the paper's: {min(theirs):.2f}-{max(theirs):.2f}x (median "
                  f"{statistics.median(theirs):.2f})."]
    lines += [""]
    median, largest = margins_text(margins)
    plans = [] if args.quick else [ev for res in cache.values() for ev, _ in res.values() if ev]
    if not args.quick:
        extra, evs = extra_scenarios()
        lines += extra
        plans += evs
    lines += [DISCUSSION[0], DISCUSSION[1], DISCUSSION[2].format(median=median, largest=largest),
              *DISCUSSION[3:]]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)
    if plans:
        write_plans(plans)


def write_plans(evs) -> None:
    """Every distinct plan, with the catalog names of its scenario (for the export tests)."""
    seen, rows = set(), []
    for ev in evs:
        sc, tr = ev.scenario, ev.scenario.training
        row = {"model": sc.model.name, "cluster": sc.cluster.name, "gpus": sc.gpus,
               "seq_len": tr.seq_len, "global_batch": tr.global_batch,
               "plan": ev.plan.to_dict()}
        key = json.dumps(row, sort_keys=True)
        if key not in seen:
            seen.add(key)
            rows.append(row)
    PLANS.write_text(json.dumps(rows, indent=0) + "\n")
    print(f"wrote {PLANS} ({len(rows)} plans)", file=sys.stderr)


def extra_scenarios() -> list[str]:
    cases = [("llama3-70b", "meta-h100-roce-7to1", 8192, 8192, 2048,
              "Llama-3 70B, 8,192 H100 across pods joined 1:7 (Meta's Clos)"),
             ("llama3-70b", "dgx-h100-ndr", 8192, 8192, 2048,
              "the same on a non-blocking DGX H100 fat tree"),
             ("llama3-405b", "meta-h100-roce-7to1", 16384, 8192, 2048,
              "Llama-3 405B on 16,384 H100 (1:7 Clos, as Meta's)"),
             ("llama3-405b", "dgx-h100-ndr", 16384, 8192, 2048,
              "Llama-3 405B on 16,384 H100 (non-blocking fat tree)")]
    evs = []
    lines = ["## Scenarios the paper lacks", "",
             "Free search (every knob), tokens/s of each method and its ratio to Manual.", "",
             "| scenario | nest | manual | phaze | alpa | mist | mcmc | nest plan | nest step (s) |"
             " nest search (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, cluster, gpus, seq, batch, label in cases:
        sc = scenario_from_names(name, cluster, gpus, seq_len=seq, global_batch=batch)
        res = {}
        for m in RUN:
            t0 = time.perf_counter()
            try:
                res[m] = (methods.run_method(m, sc, Constraints(), top=1).best,
                          time.perf_counter() - t0)
            except (InfeasibleError, SpecError):
                res[m] = (None, None)
            print(f"  {label} {m}", file=sys.stderr, flush=True)
        evs += [ev for ev, _ in res.values() if ev]
        base = res["manual"][0]
        cells = [f"{res[m][0].tokens_per_s:,.0f} ({res[m][0].tokens_per_s / base.tokens_per_s:.2f}x)"
                 if res[m][0] and base else "—" for m in RUN]
        nest, t = res["nest"]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {shape(nest) if nest else '—'} | "
                     + (f"{nest.step_time:.2f} | {t:.1f}" if nest else "— | —") + " |")
    return lines + [""], evs


DISCUSSION = ["## Where and why our ratios differ from the paper's", "", """\
The paper's ratios cannot be reproduced by a correct cost model, and ours should not match them.
The artifact (see `../shared/data/nest_paper/README.md`) adds compute in milliseconds to network
time in seconds, so its network weighs about 1,000 times too little and its "network-aware" search
is in effect a memory-constrained load balancer; it charges a recomputed forward pass the backward
time; it keeps no optimizer state (SGD); it copies the LM head into every Llama and Mixtral layer
(Llama-3 70B is modelled with ~154 B parameters, which is why a TPU v4 stage holds at most two of
its layers); it scores baselines with their stage order reversed, which alone makes Manual tie NEST
on Llama-2; it fixes EP, CP, SP, micro-batch and recomputation, searches no placement and knows
only 1F1B. nestplan models Adam state, real activations, the optimizer step, communication in
seconds on the levels each group crosses, and searches ZeRO, recomputation per stage, interleaving,
SP/CP and the rank order, so:

* **The setups' latencies are taken as given, and they dominate small models.** `setups.csv`
  gives 0.1, 0.2 and 0.3 ms per hop for the node, rack and fabric levels, 14-30 times the
  catalog's NVLink and InfiniBand hops (3.4, 14 and 15 µs, NCCL's own latencies). Taken at face
  value every ring collective inside a node costs at least 0.7 ms, so Megatron's TP = 8 with
  full recomputation (Manual) pays several milliseconds per layer for layers that compute in
  about 0.1 ms (BERT-large, micro-batch 1). That is most of why Manual trails by two orders of
  magnitude on BERT-large and by 3.2x on Llama-2 7B; with the catalog's hop latencies it still
  trails, by 6.7x and 1.5x (a trial's run of 2026-12-06: TP 8 and full recomputation cost that
  much on these models); NEST and every searching baseline move to pure data parallelism there.
  In the artifact the same latencies were added to millisecond compute as if they were
  milliseconds, i.e. they counted 1,000 times less.
* **Manual is otherwise sound.** With a correct memory model Megatron's rules are feasible
  wherever the paper's Manual plans were (they were mis-scored with reversed stages, and some did
  not fit at all: "—" at N = 64).
* **The gap comes from different places.** Against Manual, NEST wins by avoiding tensor
  parallelism and full recomputation where memory allows (ZeRO-1/2/3 and context parallelism
  instead), by interleaving the pipeline of GPT-3 and Mixtral, and by choosing the rank order
  (on `nest-h100-spineleaf` a leaf gives a device 12.5 GiB/s, a quarter of the spine's 50,
  and traffic that crosses the spine crosses a leaf too, so every group beyond a node runs at
  the leaf's rate). Against the
  searching baselines the median margin is small ({median}) because they search the same space
  with a different view of the network or of memory; where that view misleads them it is large
  (at most: {largest}). The paper's gains come from balancing a stage-0-heavy,
  head-in-every-layer model.
* **Network weighs what it should.** On the H100 spine-leaf setup, where the rack level carries
  12.5 GiB/s, communication decides plans, so network-agnostic baselines (phaze, mist) lose more
  than in the paper, whose network was almost invisible.
* **Figure 6's micro-batch sweep** changes little for us: larger micro-batches make GEMMs a bit
  more efficient but need more activation memory, which NEST buys back with ZeRO-2/3 and context
  parallelism, so Llama-2 and Llama-3 stay within a few percent; only BERT-large, whose GEMMs are
  tiny, gains (1.24x at micro-batch 8). The paper's gains with micro-batch size come from its
  per-micro-batch cost structure.
* **Search time** is seconds instead of the artifact's minutes to hours (GPT-3 on 1,024 TPU v4
  devices: 3 h 42 min there), on two CPU cores, while searching a larger space exactly.
""", ""]


if __name__ == "__main__":
    main()
