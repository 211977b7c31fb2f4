"""How long one plan evaluation takes in-process (the search calls it many times).

Target (issue "Predict any training plan"): under 5 ms for a 100-layer model. Prints figures;
machines are shared and noisy, so this is not a test.

    python benchmarks/eval_speed.py
"""

from __future__ import annotations

import functools
import statistics
import subprocess
import sys
import time

from nestplan import graph as G
from nestplan.cost.compute import _layer_cost
from nestplan.cost.device import _config_costs
from nestplan.evaluate import evaluate, scenario_from_names
from nestplan.placement import _layouts
from nestplan.specs import Parallelism


def clear_caches():
    """The cost model's caches only (``caching.clear`` would also drop the parsed catalog, which
    a process evaluating many plans keeps)."""
    for cached in (G.build, _layer_cost, _layouts, _config_costs):
        cached.cache_clear()


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    cases = [
        ("gpt3-175b", "selene-a100-hdr", 1024, 2048, 1536,
         Parallelism(tp=8, pp=8, dp=16, vp=3, sp=True, mbs=1)),
        ("llama3-405b", "dgx-h100-ndr", 16384, 8192, 2048,
         Parallelism(tp=8, pp=16, dp=128, zero=1, sp=True, mbs=1)),
        ("mixtral-8x22b", "meta-h100-roce-7to1", 1024, 4096, 1024,
         Parallelism(tp=2, pp=8, dp=64, ep=8, sp=True, zero=1, mbs=1)),
    ]
    print(f"{'scenario':44s} {'layers':>6s} {'cold ms':>9s} {'warm ms':>9s}")
    for model, cluster, gpus, seq, gb, par in cases:
        sc = scenario_from_names(model, cluster, gpus, seq_len=seq, global_batch=gb)
        run = functools.partial(evaluate, sc, par)
        cold = []
        for _ in range(5):
            clear_caches()
            cold += timed(run, 1)
        warm = timed(run, 50)
        print(f"{model + ' on ' + str(gpus) + ' ' + cluster:44s} {sc.model.layers:6d} "
              f"{statistics.median(cold) * 1e3:9.2f} {statistics.median(warm) * 1e3:9.2f}")
    print("cold: layer graphs, layouts and layer costs rebuilt; warm: cached (as in a search)")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nestplan.cli", "evaluate", "--model", "gpt3-175b",
                    "--cluster", "selene-a100-hdr", "--gpus", "1024", "--tp", "8", "--pp", "8",
                    "--mbs", "1", "--global-batch", "1536", "--seq-len", "2048", "--json"],
                   check=True, capture_output=True)
    print(f"nestplan evaluate end to end (with interpreter start-up): "
          f"{(time.perf_counter() - t0) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
