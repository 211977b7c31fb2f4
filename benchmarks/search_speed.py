"""Search time and peak memory of ``nestplan plan`` (NEST), printed as figures, not asserted.

Targets (issue "Find the best plan"): GPT-3 175B on 1,024 devices of nest-h100-spineleaf within
10 s and 2 GB; Llama-3 405B on 16,384 H100s within 60 s. Also prints how search time grows with
the device count (64 to 65,536) and with the layer count. Every search runs in a fresh process so
that its peak resident memory is its own. The torchtitan row searches its larger space: six
pipeline schedules (megatron-core: two).

    python benchmarks/search_speed.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
from dataclasses import replace
from nestplan.evaluate import scenario_from_names
from nestplan.search import driver
from nestplan.search.constraints import Constraints
from nestplan.options import Precision
model, cluster, gpus, seq, batch, layers, stack, precision = sys.argv[1:9]
sc = scenario_from_names(model, cluster, int(gpus), seq_len=int(seq), global_batch=int(batch),
                         stack=stack, precision=Precision.parse("precision", precision))
if int(layers):
    sc = replace(sc, model=replace(sc.model, layers=int(layers)))
t0 = time.perf_counter()
res = driver.run(sc, Constraints(), top=1)
secs = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
p = res.best.plan
print(json.dumps({"seconds": secs, "rss_mb": rss, "space": res.configurations,
                  "solved": res.solved, "step": res.best.step_time,
                  "plan": f"tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} vp{p.vp} z{p.zero} mbs{p.mbs}"
                          + (f" {p.pipeline.name}" if p.pp > 1 else "")}))
"""


def search(model, cluster, gpus, seq, batch, layers=0, stack="megatron-core", precision="bf16"):
    out = subprocess.run([sys.executable, "-c", CHILD, model, cluster, str(gpus), str(seq),
                          str(batch), str(layers), stack, precision], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(label, r):
    print(f"{label:46s} {r['seconds']:8.2f} s {r['rss_mb']:8.0f} MB {r['solved']:7,d} / "
          f"{r['space']:9,d}  {r['plan']:40s} {r['step']:8.3f} s")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only the two targets")
    args = ap.parse_args(argv)
    print(f"{'search':46s} {'time':>10s} {'peak RSS':>11s} {'DP solved / space':>19s}  "
          f"{'best plan':32s} {'step':>10s}")
    row("gpt3-175b, 1,024 x nest-h100-spineleaf", search("gpt3-175b", "nest-h100-spineleaf",
                                                          1024, 2048, 4096))
    row("llama3-405b, 16,384 x dgx-h100-ndr", search("llama3-405b", "dgx-h100-ndr", 16384, 8192,
                                                      2048))
    row("llama3-70b, 1,024 x dgx-h100-ndr, torchtitan", search(
        "llama3-70b", "dgx-h100-ndr", 1024, 8192, 4096, stack="torchtitan"))
    if args.quick:
        return
    print("\nmixtures of experts (every EP and expert-TP fold in the space; the nemo stack's "
          "MoE host wait):")
    row("  qwen3-235b-a22b, 256 x gb200-nvl72-ndr, fp8", search(
        "qwen3-235b-a22b", "gb200-nvl72-ndr", 256, 4096, 8192, stack="nemo", precision="fp8"))
    row("  deepseek-v3, 256 x gb200-nvl72-ndr, fp8", search(
        "deepseek-v3", "gb200-nvl72-ndr", 256, 4096, 4096, stack="nemo", precision="fp8"))
    row("  kimi-k2, 256 x dgx-h100-ndr (80 GB: tight)", search(
        "kimi-k2", "dgx-h100-ndr", 256, 4096, 1024))
    print("\ngrowth with the device count (llama3-70b on dgx-h100-ndr, seq 8192, 4 sequences "
          "per device up to 16,384 sequences):")
    for gpus in (64, 256, 1024, 4096, 16384, 65536):
        row(f"  {gpus:,} devices", search("llama3-70b", "dgx-h100-ndr", gpus, 8192,
                                           min(4 * gpus, 16384)))
    print("\ngrowth with the layer count (gpt3-175b widths on 1,024 x nest-h100-spineleaf):")
    for layers in (24, 48, 96, 192):
        row(f"  {layers} layers", search("gpt3-175b", "nest-h100-spineleaf", 1024, 2048, 4096,
                                         layers))
    print("\nthe slowest searches known within the limits: deep models whose plans must "
          "recompute to fit\n(on 1,024 x dgx-h100-ndr, seq 8192, 4,096 sequences):")
    row("  llama3-70b widths, 256 layers", search("llama3-70b", "dgx-h100-ndr", 1024, 8192, 4096,
                                                  256))
    row("  llama3-8b widths, 512 layers (the limit)", search("llama3-8b", "dgx-h100-ndr", 1024,
                                                             8192, 4096, 512))


if __name__ == "__main__":
    main()
