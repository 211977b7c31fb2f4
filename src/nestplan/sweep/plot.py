"""The summary plot of a sweep: tokens/s per GPU of the best plan found, against the GPU count.

One panel per model and method when several are swept (at most ``MAX_PANELS``), one series per
combination of the other varied parameters (at most ``MAX_SERIES`` per panel: the fastest half and
the slowest half where there are more, as the panel's title says; what every series of a panel
shares is in its title, the rest in the labels). Infeasible and failed points
are omitted. When the GPU count is not varied, the first varied numeric parameter is the x axis.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from ..catalog import looks_like_path
from ..loaders import write_text_atomic
from ..svg import Svg, line_chart
from .spec import Parameter, Point, SweepSpec, level_key

MAX_SERIES = 10
MAX_PANELS = 8
WIDTH = 640.0
Y = "tokens_per_s_per_gpu"
ALIKE_NAMED = 24
"""Most characters of the labels of series drawn as one that a legend entry names (else it
counts them)."""


def write_plot(spec: SweepSpec, points: list[Point]) -> Path:
    """Write ``<output stem>.svg`` from the results CSV; returns its path."""
    from .run import read_rows

    by_id = {p.id: p for p in points}
    results, omitted = [], 0
    for row in read_rows(spec.output):
        point = by_id.get(row["id"])
        if point is None:
            continue
        if row["status"] == "ok" and row[Y]:
            results.append((point, float(row[Y])))
        else:
            omitted += 1
    path = spec.output.with_suffix(".svg")
    write_text_atomic(path, str(summary_svg(spec, results, omitted=omitted)))
    return path


_NETWORK_UNITS = {"bandwidth_GBps": "{:g} GB/s", "bandwidth_GiBps": "{:g} GiB/s",
                  "latency_us": "{:g} µs", "oversubscription": "{:g}:1", "efficiency": "eff. {:g}",
                  "size": "size {:g}"}


def _part(p: Parameter, v) -> str:
    if (split := level_key(p.key)) is not None:
        # (blank: the point's cluster has no such level)
        return f"no {split[0]}" if v is None else f"{split[0]} " + _NETWORK_UNITS[split[1]].format(v)
    if p.key == "network":  # a named network of [grid.networks]
        return str(v)
    if p.kind is str:
        return _file_name(p, str(v))
    return f"{p.key}={str(v).lower() if p.kind is bool else format(v, 'g')}"


def _short(value: str) -> str:
    """A file given by path by its name (a HuggingFace config.json by its folder's); a catalog name
    as it is."""
    if not looks_like_path(value):
        return value
    path = Path(value)
    return (path.parent.name or value) if path.name == "config.json" else path.stem


def _file_name(p: Parameter, value: str) -> str:
    """``value`` of ``p`` by its short name, unless another of ``p``'s values has the same one
    (then as given)."""
    short = _short(value)
    clash = sum(_short(str(v)) == short for v in p.values) > 1
    return value if clash else short


def _label(params: list[Parameter], values: tuple, chars: int = 34) -> str:
    """``nest, spine 2:1, rack 25 GB/s``: names by value, network values with units."""
    return _fit(", ".join(_part(p, v) for p, v in zip(params, values)) or "all points", chars)


def _fit(text: str, chars: int = 100) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "…"


def summary_svg(spec: SweepSpec, results: list[tuple[Point, float]], *, omitted: int) -> Svg:
    """The plot as an Svg: a header, then one line chart per panel, stacked."""
    params = {p.key: p for p in spec.parameters}
    varied = list(spec.varied())
    numeric = [p for p in varied if p.kind in (int, float)]
    x = params["gpus"] if len(params["gpus"].values) > 1 or not numeric else numeric[0]
    by = [params[k] for k in ("model", "method") if len(params[k].values) > 1 and k != x.key]
    rest = [p for p in varied if p.key != x.key and p not in by]
    fixed = [p for p in spec.parameters if len(p.values) == 1]

    panels: dict = {}
    levelless = sum(point[x.key] is None for point, _ in results)  # (x a level they lack)
    for point, y in results:
        if point[x.key] is None:
            continue
        key = tuple(point[p.key] for p in by)
        series = tuple(point[p.key] for p in rest)
        panels.setdefault(key, {}).setdefault(series, []).append((float(point[x.key]), y))
    shown = [k for k in itertools.product(*(p.values for p in by)) if k in panels]
    notes = [f"{levelless} point{'s' if levelless > 1 else ''} on clusters without "
             f"{level_key(x.key)[0]} not drawn"] if levelless else []
    if len(shown) > MAX_PANELS:
        notes.append(f"{len(shown) - MAX_PANELS} more panels not drawn (see the CSV)")
        shown = shown[:MAX_PANELS]

    charts = []
    for key in shown:
        groups = panels[key]
        # the fastest and the slowest half each where they are too many (a network study's
        # slowest designs are half its answer: a datacenter trial's)
        ranked = sorted(groups, key=lambda s: -max(y for _, y in groups[s]))
        keep = ranked if len(ranked) <= MAX_SERIES else (
            ranked[:MAX_SERIES // 2] + ranked[len(ranked) - MAX_SERIES // 2:])
        grid_order = sorted(keep, key=lambda s: tuple(
            p.values.index(v) if v is not None else len(p.values) for p, v in zip(rest, s)))
        # a panel per model and method that vary; else the one model (and method) it shows
        title = (" · ".join(_part(p, v) for p, v in zip(by, key))
                 or " · ".join(_part(p, p.values[0]) for p in fixed if p.key in ("model", "method"))
                 or spec.path.stem)
        # what every drawn series of the panel shares goes to its title, so that the labels name
        # what tells them apart (they had been cut to "h100-plain, nic400, spi…")
        alike = [i for i, p in enumerate(rest) if len({s[i] for s in keep}) == 1]
        title += "".join(f" · {_part(rest[i], keep[0][i])}" for i in alike)
        differ = [p for i, p in enumerate(rest) if i not in alike]
        kept_note = (f" ({MAX_SERIES} of {len(groups)} series: the {MAX_SERIES // 2} fastest "
                     f"and the {MAX_SERIES // 2} slowest)") if len(groups) > MAX_SERIES else ""
        # series with the same points (e.g. networks the plan does not feel) are drawn once,
        # labelled by the first with a count of the others
        same: dict = {}
        for s in grid_order:
            same.setdefault(tuple(sorted(groups[s])), []).append(s)
        def name(member):
            return _label(differ, tuple(v for i, v in enumerate(member) if i not in alike), 200)

        def alike_text(members):
            """The series drawn as the first: named where short (a NEST-paper trial's "spine 1:1
            (= 1 more)" hid which), else counted."""
            others = ", ".join(name(m) for m in members[1:])
            return "" if not others else (f" (= {others})" if len(others) <= ALIKE_NAMED
                                          else f" (= {len(members) - 1} more)")

        names = [name(members[0]) + alike_text(members) for members in same.values()]
        longest = max(map(len, names), default=0)
        per_row = 3 if longest <= 26 else 2 if longest <= 42 else 1
        series = [(_fit(n, {3: 26, 2: 42, 1: 90}[per_row]), groups[members[0]])
                  for n, members in zip(names, same.values())]
        # (the note whole, the rest cut to fit beside it: a review's)
        charts.append(line_chart(series, title=_fit(title, 80 - len(kept_note)) + kept_note,
                                 xlabel="GPUs" if x.key == "gpus" else x.key.removeprefix("network."),
                                 ylabel="tokens/s per GPU",
                                 logx=x.key == "gpus" and max(x.values) >= 4 * min(x.values),
                                 width=WIDTH, per_row=per_row))

    head = 52.0
    height = head + sum(c.height + 12 for c in charts) + (0 if charts else 40)
    svg = Svg(WIDTH, height, label=f"sweep {spec.path.name}: tokens/s per GPU")
    svg.rect(0, 0, WIDTH, height, "#ffffff")
    svg.text(12, 18, _fit(f"{spec.path.name}: tokens/s per GPU of the best plan found"),
             size=14, weight="600")
    svg.text(12, 34, _fit(f"{len(results) - levelless} points drawn, {omitted} infeasible or failed "
                          "omitted"
                          + ("; " + "; ".join(notes) if notes else "")), size=11, fill="#555")
    if fixed:
        # (a fixed cluster under varied levels is its file's name only: a datacenter trial's
        # "fixed: h100-ft-1to1-400g" headed lines at 4:1 and 800G)
        overridden = any(p.key == "network" or p.key.startswith("network.") for p in varied)
        tail = "; its levels as the labels set them" if overridden and "cluster" in {
            p.key for p in fixed} else ""
        svg.text(12, 48, "fixed: " + _label(fixed, tuple(p.values[0] for p in fixed),
                                            110 - len(tail)) + tail, size=10, fill="#555")
    y = head
    for c in charts:
        svg.parts.append(f'<svg x="0" y="{y:g}" ' + str(c)[len("<svg "):])
        y += c.height + 12
    if not charts:
        svg.text(12, head + 20, "no point succeeded: nothing to draw", size=12)
    return svg
