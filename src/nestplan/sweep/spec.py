"""The sweep file: strict loading into a frozen ``SweepSpec``, and expansion into points.

Format (TOML; units in the keys as in cluster files; every grid value is a list, and a single
value stands for a one-element list)::

    [sweep]                           # optional
    output = "results.csv"            # relative to this file; default <file stem>.csv beside it
    parquet = false                   # also write <output stem>.parquet (needs pyarrow)

    [grid]
    model = ["llama3-8b", "gpt3-175b"]   # required: catalog names or paths (relative to this file)
    cluster = ["nest-h100-spineleaf"]    # required: catalog names or paths
    gpus = [64, 128, 256]                # required
    method = ["nest", "manual"]          # default ["nest"]
    stack = ["megatron-core", "torchtitan"]  # optional (default megatron-core): names or paths
    seq_len = [4096]                     # default [4096]
    global_batch = [1024]                # default [1024]
    precision = ["bf16"]                 # default ["bf16"]
    # attention_span (packed documents) may be varied too, and mtp_layers (depths trained)
    # and memory_headroom_pct (as plan's flags)

    [grid.network.spine]              # a level that every cluster of the grid has
    oversubscription = [1, 2, 4]      # also bandwidth_GBps or bandwidth_GiBps (replaces the
    bandwidth_GBps = [25, 50]         # level's bandwidth), latency_us, efficiency, size

    [grid.networks.nic800]            # named networks: each sets several levels at once (one
    leaf = { bandwidth_GBps = 100 }   # value per key), and the grid's `network` column takes
    spine = { bandwidth_GBps = 100 }  # each name in turn (a NIC upgrade moves every level)

    [constraints]                     # optional: knobs fixed for every search, as plan's flags
    tp = 8                            # tp pp dp cp ep etp vp zero mbs (integers), sp and
    recompute = "full"                # tp_within_node (booleans), recompute ("full" or one per
                                      # stage), rank_order ("tp-cp-dp-pp"), schedule

Every value is checked when the file is loaded (names, level names, numbers), so a mistake stops
the sweep before any work. A point's id is a short hash of its parameters and the constraints,
stable across runs and file edits that keep the point: the results CSV is keyed on it.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..axes import order_text
from ..caching import cached
from ..errors import SpecError
from ..specs import MAX_HEADROOM, MAX_MTP_LAYERS, valid_headroom

if TYPE_CHECKING:
    from ..search.constraints import Constraints

FORMAT_VERSION = 1
"""Part of every point's id: bump when the meaning of a parameter changes."""

SECTIONS = ("sweep", "grid", "constraints")
MAX_POINTS = 100_000
"""Most points one sweep file may hold (the product of its grid's list lengths). At the example
sweep's two points a second on two cores, this many is half a day of work; a grid of millions
would spend minutes and gigabytes only listing its points."""
SWEEP_KEYS = {"output", "parquet"}
GRID_REQUIRED = ("model", "cluster", "gpus")
GRID_DEFAULTS: dict[str, tuple] = {"method": ("nest",), "seq_len": (4096,),
                                   "global_batch": (1024,), "precision": ("bf16",)}
"""Defaults of the optional grid keys: the same as ``nestplan plan``'s."""
SCENARIO_KEYS = {
    "mtp_layers": lambda v: isinstance(v, int) and not isinstance(v, bool)
    and 0 <= v <= MAX_MTP_LAYERS,
    "memory_headroom_pct": lambda v: not isinstance(v, bool) and valid_headroom(
        v / 100 if isinstance(v, (int, float)) else v)}
"""Optional grid keys that set the scenario rather than the workload, as plan's --mtp-layers and
--memory-headroom do (a stack without multi-token prediction needs mtp_layers = [0] for a model
that has depths)."""
SCENARIO_RULES = {"mtp_layers": f"must be a whole number of depths in [0, {MAX_MTP_LAYERS}]",
                  "memory_headroom_pct": f"must be a percent of HBM in [0, {MAX_HEADROOM * 100:g})"}
CORE = GRID_REQUIRED + tuple(GRID_DEFAULTS)
"""Grid parameters every sweep has, in column order."""
LEVEL_KEYS = ("bandwidth_GBps", "bandwidth_GiBps", "latency_us", "oversubscription", "efficiency",
              "size")

TIME_PARTS = ("compute", "recompute", "host", "tp", "cp", "ep", "zero", "pp", "bubble", "dp",
              "embedding", "optimizer", "step_host")
"""The parts of a step (``result.TimeBreakdown``), each a ``time_<part>_s`` column: what a
network design changes shows in them."""
RESULT_TYPES = {"status": str, "error": str, "step_time_s": float, "tokens_per_s": float,
                "tokens_per_s_per_gpu": float, "mfu": float, "hfu": float,
                "model_tflops_per_gpu": float, "peak_memory_gib": float, "margin_gib": float,
                "fits": bool, "tp": int, "pp": int, "dp": int, "cp": int, "ep": int, "etp": int,
                "vp": int, "schedule": str, "sp": bool, "zero": int, "recompute": str,
                "mbs": int, "rank_order": str, "stage_layers": str,
                **{f"time_{part}_s": float for part in TIME_PARTS},
                "slowest_stage": int, "last_stage": int, "search_seconds": float,
                "straddles_domains": bool, "mfu_peak_tflops": float,
                "measured_runs": int, "measured_mean_abs_error": float, "constraints": str,
                "nestplan_build": str}
"""CSV columns after ``id`` and the grid parameters, in order, with their types (Parquet's)."""
RESULT_COLUMNS = tuple(RESULT_TYPES)


def _training_extra_keys() -> tuple[str, ...]:
    from ..loaders import TRAINING_KEYS

    return tuple(sorted(TRAINING_KEYS - set(CORE)))


# ----------------------------------------------------------------------------- specs


@dataclass(frozen=True, kw_only=True)
class Parameter:
    """One axis of the grid."""

    key: str
    """Column name: ``model``, ``gpus``, ``seq_len``, ``network.spine.oversubscription``, ..."""
    values: tuple
    """Distinct values in file order (enum names lowercase; numbers int, or all float)."""

    @property
    def kind(self) -> type:
        """bool, int, float or str: the type of every value."""
        return type(self.values[0])


@dataclass(frozen=True, kw_only=True)
class Point:
    """One grid point: a search to run."""

    id: str
    """Short hash of the parameters and constraints (10 characters of base32)."""
    values: tuple[tuple[str, Any], ...]
    """(column, value) per grid parameter, in column order."""

    def __getitem__(self, key: str) -> Any:
        for k, v in self.values:
            if k == key:
                return v
        raise KeyError(key)

    def network(self) -> dict[str, dict[str, Any]]:
        """Level overrides: ``{level name: {key: value}}``."""
        out: dict[str, dict[str, Any]] = {}
        for k, v in self.values:
            if (split := level_key(k)) is not None and v is not None:
                out.setdefault(split[0], {})[split[1]] = v
        return out


def level_key(column: str) -> tuple[str, str] | None:
    """(level, key) of a network column ``network.LEVEL.KEY`` (a level's name may hold dots, a
    key does not); None for any other column."""
    if not column.startswith("network."):
        return None
    level, key = column.removeprefix("network.").rsplit(".", 1)
    return level, key


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """A validated sweep file."""

    path: Path
    """The sweep file."""
    output: Path
    """The results CSV."""
    parquet: bool
    """Also write ``<output stem>.parquet`` at the end."""
    parameters: tuple[Parameter, ...]
    """Grid axes in column order: the core ones, other training keys (alphabetically), network
    overrides (by level name, then key)."""
    constraints: Constraints
    """Knobs fixed for every search."""
    constraints_key: str
    """Canonical JSON of the constraints, part of every point's id."""
    networks: tuple[tuple[str, tuple], ...] = ()
    """Named networks of ``[grid.networks]``: (name, ((level, ((key, value), ...)), ...)), the
    ``network`` column's values."""
    contents: tuple[tuple[str, str, str], ...] = ()
    """(grid key, value, digest of what it loads) for every model, cluster and stack the grid names,
    a file or a catalog entry, and for each named network: part of the ids of the points that use
    it, so that a re-run after the file (or a base it names) was edited, or after a release changed
    the entry, runs those points again instead of keeping rows of the old one."""
    default_stack: str = ""
    """The digest of the default stack, which every point's id holds when the grid names none."""

    @property
    def columns(self) -> tuple[str, ...]:
        """The CSV header."""
        return ("id",) + tuple(p.key for p in self.parameters) + RESULT_COLUMNS

    @property
    def constraints_text(self) -> str:
        """The ``[constraints]`` as the ``constraints`` column holds them: ``key=value`` pairs in
        key order, ``;``-separated (a list's values ``,``-separated; blank for none), so that rows
        of a results file searched under other constraints tell apart in a table (a datacenter
        trial's file had held one grid's rows with and without ``tp = 8``, alike but for the
        results)."""
        def text(v) -> str:
            if isinstance(v, bool):
                return "true" if v else "false"
            return ",".join(map(str, v)) if isinstance(v, list) else str(v)

        return ";".join(f"{k}={text(v)}" for k, v in json.loads(self.constraints_key).items())

    def varied(self) -> tuple[Parameter, ...]:
        """Parameters with more than one value."""
        return tuple(p for p in self.parameters if len(p.values) > 1)

    def points(self) -> list[Point]:
        """Every point, the first parameter varying slowest. A level the grid varies
        (``network.LEVEL.KEY``) that a point's cluster lacks is blank (None) in that point, so
        its cluster runs once for all the level's values."""
        keys = [p.key for p in self.parameters]
        digest = {(k, v): d for k, v, d in self.contents}
        always = (self.default_stack,) if self.default_stack else ()
        at = {k: i for i, k in enumerate(keys)}
        varied = [(at[k], split[0]) for k in keys if (split := level_key(k)) is not None]
        levels = {c: {lv.name for lv in _cluster(_resolve(c, self.path.parent)).levels}
                  for c in self.values_of("cluster")} if varied else {}
        out: dict[str, Point] = {}
        for combo in itertools.product(*(p.values for p in self.parameters)):
            if varied:
                have = levels[combo[at["cluster"]]]
                combo = tuple(None if any(i == j and level not in have for j, level in varied)
                              else v for i, v in enumerate(combo))
            pid = point_id(dict(zip(keys, combo)), self.constraints_key,
                           tuple(digest[k, v] for k, v in zip(keys, combo)
                                 if (k, v) in digest) + always)
            out.setdefault(pid, Point(id=pid, values=tuple(zip(keys, combo))))
        return list(out.values())

    def values_of(self, key: str) -> tuple:
        """The values of grid parameter ``key``."""
        return next(p.values for p in self.parameters if p.key == key)

    def model(self, ref: str):
        """The ModelSpec a grid's ``model`` value names (a catalog name, or a path relative to
        the sweep file)."""
        return _model(_resolve(ref, self.path.parent))

    def cluster(self, point: Point):
        """The point's cluster, its network as the point sets it (SpecError when invalid)."""
        net = point.network()
        for level, pairs in dict(self.networks).get(dict(point.values).get("network"), ()):
            net.setdefault(level, {}).update(pairs)  # (no key is both named and varied: _grid)
        return _cluster(_resolve(point["cluster"], self.path.parent),
                        tuple(sorted((lv, tuple(sorted(kv.items()))) for lv, kv in net.items())))

    def scenario(self, point: Point):
        """The point's Scenario (SpecError when this combination of values is invalid)."""
        from ..loaders import training_from_table
        from ..specs import Scenario

        base = self.path.parent
        cluster = self.cluster(point)
        training = {k: v for k, v in point.values if k not in ("model", "cluster", "gpus", "method",
                                                                 "stack", "network", *SCENARIO_KEYS)
                    and not k.startswith("network.")}
        given = dict(point.values)
        stack = given.get("stack")
        model = self.model(point["model"])
        if "mtp_layers" in given:
            model = replace(model, mtp_layers=given["mtp_layers"])
        extra = ({"memory_headroom": given["memory_headroom_pct"] / 100}
                 if "memory_headroom_pct" in given else {})
        return Scenario(model=model, cluster=cluster, gpus=point["gpus"],
                        training=training_from_table(training, "grid"),
                        stack=_stack(_resolve(stack, base) if stack else None), **extra)


def point_id(values: dict[str, Any], constraints_key: str, files: tuple[str, ...] = ()) -> str:
    """A short, stable hash of a point's parameters (numbers hashed as floats: 2 == 2.0) and of
    the contents of the models, clusters, stacks and networks it uses (``SweepSpec.contents``,
    ``SweepSpec.default_stack``), and of the nestplan that runs it (``build.fingerprint``: a
    point searched by another cost model is another point)."""
    from ..build import fingerprint

    canon = {k: _number_alike(v) for k, v in values.items()}
    data = {"v": FORMAT_VERSION, "grid": canon, "constraints": json.loads(constraints_key),
            "build": fingerprint()}
    if files:
        data["files"] = list(files)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).digest()
    # base32 (letters and 2-7) rather than hex, so no id reads as a number in a CSV reader
    return base64.b32encode(digest).decode()[:10].lower()


# ----------------------------------------------------------------------------- catalog access


def _resolve(ref: str, base: Path) -> str:
    """A catalog name stays a name; a path (has a '/' or a .toml/.json suffix) is made relative
    to the sweep file."""
    if "/" in ref or ref.endswith((".toml", ".json")):
        p = Path(ref).expanduser()
        return str(p if p.is_absolute() else base / p)
    return ref


def _model(ref: str):
    from ..catalog import get_model

    return get_model(ref)  # (the catalog reads a file again once it changes)


def _stack(ref: str | None):
    from ..catalog import get_stack

    return get_stack(ref) if ref else get_stack()


def _cluster(ref: str, overrides: tuple = ()):
    """The cluster with level overrides applied through the loaders (so they validate them)."""
    from ..catalog import get_cluster

    cluster = get_cluster(ref)  # (the catalog reads a file again once it changes)
    return _overridden(cluster, overrides) if overrides else cluster


@cached(maxsize=256)
def _overridden(cluster, overrides: tuple):
    from ..catalog import get_accelerator
    from ..loaders import cluster_from_table, cluster_to_table

    table = cluster_to_table(cluster)
    changes = dict(overrides)
    for level in table["levels"]:
        for key, value in changes.get(level["name"], ()):
            if key.startswith("bandwidth_"):
                level.pop("bandwidth_GBps", None)
                level.pop("bandwidth_GiBps", None)
            level[key] = value
    return cluster_from_table(table, get_accelerator)


# ----------------------------------------------------------------------------- loading


def load(path: str | Path, *, output: str | Path | None = None) -> SweepSpec:
    """Read and validate a sweep file; ``output`` (relative to the working directory) overrides
    the file's ``[sweep] output``."""
    from ..loaders import check_keys, read_toml

    table = read_toml(path, "sweep file")  # (as typed: a blank path is refused, not read as the folder)
    path = Path(path)
    for key in table:
        if key not in SECTIONS:
            raise SpecError(key, table[key], f"unknown section or key; valid: {', '.join(SECTIONS)}")
    sweep = table.get("sweep", {})
    check_keys(sweep, "sweep", required=set(), optional=SWEEP_KEYS)
    if "output" in sweep and not (isinstance(sweep["output"], str) and sweep["output"].strip()):
        raise SpecError("sweep.output", sweep["output"], "must be a file path, e.g. 'results.csv'")
    if "parquet" in sweep and not isinstance(sweep["parquet"], bool):
        raise SpecError("sweep.parquet", sweep["parquet"], "must be true or false")
    if output is not None:
        if not str(output).strip():
            raise SpecError("output", str(output), "must be a file path ending in .csv")
        out = Path(output)
    elif "output" in sweep:
        out = Path(sweep["output"]).expanduser()
        out = out if out.is_absolute() else path.parent / out
    else:
        out = path.with_suffix(".csv")
    if out.suffix.lower() != ".csv":
        raise SpecError("output", str(out), "must end in .csv (the Parquet and SVG files are "
                        "written beside it)")
    constraints, constraints_key = _constraints(table.get("constraints", {}))
    parameters, networks = _grid(table.get("grid"), path.parent)
    count = math.prod(len(p.values) for p in parameters)
    if count > MAX_POINTS:
        sizes = " x ".join(str(len(p.values)) for p in parameters if len(p.values) > 1)
        raise SpecError("grid", f"{count:,} points ({sizes})",
                        f"at most {MAX_POINTS:,} points in one sweep file; split the grid over "
                        "several files")
    return SweepSpec(path=path, output=out, parquet=bool(sweep.get("parquet", False)),
                     parameters=parameters, constraints=constraints,
                     constraints_key=constraints_key, networks=networks,
                     contents=_contents(parameters, path.parent) + tuple(
                         ("network", name, _digest(_numbers_alike(levels))) for name, levels in networks),
                     default_stack="" if any(p.key == "stack" for p in parameters)
                     else _default_stack_digest())


def _default_stack_digest() -> str:
    from ..loaders import stack_to_table

    return _digest(stack_to_table(_stack(None)))


REFERENCES = ("model", "cluster", "stack")
"""Grid keys whose values name catalog entries or files."""


def _contents(parameters, base: Path) -> tuple[tuple[str, str, str], ...]:
    """(key, value, digest) of each model, cluster and stack the grid names, a file or a catalog
    entry: the digest of the spec it loads, as its canonical table (so a base file's edits count
    too, and a catalog entry that a new release of nestplan changes)."""
    from ..loaders import cluster_to_table, model_to_table, stack_to_table

    table = {"model": (_model, model_to_table), "cluster": (_cluster, cluster_to_table),
             "stack": (_stack, stack_to_table)}
    out = []
    for p in parameters:
        if p.key not in REFERENCES:
            continue
        load, as_table = table[p.key]
        for v in p.values:
            out.append((p.key, v, _digest(as_table(load(_resolve(v, base))))))
    return tuple(out)


def _number_alike(value):
    """A number as a float, so that 2 and 2.0 hash alike (booleans and text as they are)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _numbers_alike(levels: tuple) -> tuple:
    """A named network's ((level, ((key, value), ...)), ...) with each number a float: 800 and
    800.0 are one value, and give one id."""
    return tuple((level, tuple((k, _number_alike(v)) for k, v in pairs)) for level, pairs in levels)


def _digest(data) -> str:
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _as_field(where: str, value, fn, *args):
    """``fn(*args)``, with a SpecError renamed to the sweep file's field (inner field kept)."""
    try:
        return fn(*args)
    except SpecError as e:
        # (the inner error as it reads, its value spelt as SpecError spells it: a missing key's
        # had read "got None")
        rule = (e.allowed if e.field in ("model", "cluster", "stack") else
                f"{e.value}: {e.allowed}" if e.field == "file" else str(e))
        raise SpecError(where, value, rule) from None


def _values(table: dict, key: str, where: str) -> list:
    raw = table[key]
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise SpecError(where, raw, "empty list; give at least one value")
    from ..specs import finite

    for v in values:
        if isinstance(v, (dict, list)) or not isinstance(v, (bool, int, float, str)):
            raise SpecError(where, v, "values must be numbers, strings or booleans")
        if isinstance(v, int) and not isinstance(v, bool) and not finite(v):  # ids hash floats
            raise SpecError(where, v, "must be a number a float can hold")
    return values


def _distinct(values: list, where: str, given: list | None = None) -> tuple:
    """Numbers all int, or all float if any is; duplicates rejected, showing the values as
    ``given`` (before a name was lower-cased: "got ['nest', 'nest']" had answered
    ``["nest", "NEST"]``)."""
    given = values if given is None else given
    if any(isinstance(v, float) for v in values) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        values = [float(v) for v in values]
    seen = set()
    for v in values:
        k = (type(v), v)
        if k in seen:
            read = "" if list(values) == list(given) else f" as read ({values!r})"
            raise SpecError(where, given, f"{v!r} appears twice{read}; values must be distinct")
        seen.add(k)
    if len({type(v) for v in values}) > 1:
        raise SpecError(where, values, "values must all have one type")
    return tuple(values)


def _positive_ints(values: list, where: str) -> list:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise SpecError(where, v, "must be an integer > 0")
    return values


def _grid(grid: Any, base: Path) -> tuple[tuple[Parameter, ...], tuple]:
    """The grid's axes, and its named networks (``SweepSpec.networks``)."""
    from ..loaders import check_keys, training_from_table
    from ..search.constraints import METHODS

    example = "e.g. model = [\"llama3-8b\"], cluster = [\"dgx-h100-ndr\"], gpus = [64, 128]"
    if grid is None or grid == {}:
        raise SpecError("grid", grid, f"empty; give at least model, cluster and gpus ({example})")
    extras = _training_extra_keys()
    check_keys(grid, "grid", required=set(GRID_REQUIRED),
               optional=set(GRID_DEFAULTS) | set(extras) | {"network", "networks", "stack"}
               | set(SCENARIO_KEYS))
    params: list[Parameter] = []

    def add(key: str, values: list, given: list | None = None):
        params.append(Parameter(key=key, values=_distinct(values, f"grid.{key}", given)))

    def references(key: str, load) -> list:
        """A grid key of catalog names or paths, each loaded once to check it."""
        values = _values(grid, key, f"grid.{key}")
        for v in values:
            if not isinstance(v, str):
                raise SpecError(f"grid.{key}", v, "must be a catalog name or a path")
            path = _resolve(v, base)
            try:
                _as_field(f"grid.{key}", v, load, path)
            except SpecError as e:  # (a fuzzing trial's path, right from where it ran, was
                # told "no such file" without where it had been looked for; a file found that
                # names a missing one is that file's error, as it was)
                if path == v or Path(path).exists():
                    raise
                raise SpecError(e.field, e.value, f"{e.allowed} (a path is taken relative to "
                                f"the sweep file: {path})") from None
        return values

    add("model", references("model", _model))
    clusters = references("cluster", _cluster)
    add("cluster", clusters)
    add("gpus", _positive_ints(_values(grid, "gpus", "grid.gpus"), "grid.gpus"))
    given = _values(grid, "method", "grid.method") if "method" in grid else GRID_DEFAULTS["method"]
    methods = [str(m).lower() for m in given]
    for m in methods:
        if m not in METHODS:
            raise SpecError("grid.method", m, f"allowed: {', '.join(METHODS)}")
    add("method", methods, given)
    if "stack" in grid:  # (else every point's id holds the default stack: SweepSpec.default_stack)
        add("stack", references("stack", _stack))
    for key, check in SCENARIO_KEYS.items():  # (also only when named)
        if key in grid:
            values = _values(grid, key, f"grid.{key}")
            for v in values:
                if not check(v):
                    raise SpecError(f"grid.{key}", v, SCENARIO_RULES[key])
            add(key, values)

    # training keys: each value checked by the training loader, with the other keys at defaults
    defaults = {"seq_len": GRID_DEFAULTS["seq_len"][0], "global_batch": GRID_DEFAULTS["global_batch"][0]}
    for key in ("seq_len", "global_batch", "precision") + extras:
        if key not in grid and key not in GRID_DEFAULTS:
            continue
        given = _values(grid, key, f"grid.{key}") if key in grid else list(GRID_DEFAULTS[key])
        values = [v.lower() if isinstance(v, str) else v for v in given]
        for v in values:
            try:
                training_from_table({**defaults, key: v}, "grid")
            except SpecError as e:
                raise SpecError(f"grid.{key}", v, e.allowed) from None
        add(key, values, given)

    def level_table(table, where: str, lists: bool):
        """A level's overrides: known keys, one bandwidth, numbers (lists of them if ``lists``)."""
        if not isinstance(table, dict) or not table:
            raise SpecError(where, table, "must be a non-empty table of " + (
                "lists" if lists else "numbers") + "; keys: " + ", ".join(LEVEL_KEYS))
        check_keys(table, where, required=set(), optional=set(LEVEL_KEYS))
        if "bandwidth_GBps" in table and "bandwidth_GiBps" in table:
            raise SpecError(f"{where}.bandwidth_GiBps", table["bandwidth_GiBps"],
                            "give bandwidth_GBps or bandwidth_GiBps, not both")
        out = {}
        for key in sorted(table, key=LEVEL_KEYS.index):
            if lists:
                values = _values(table, key, f"{where}.{key}")
            elif isinstance(table[key], (list, dict)):
                raise SpecError(f"{where}.{key}", table[key], "must be one number (a named network "
                                "sets one value; vary a level with [grid.network.LEVEL])")
            else:
                values = [table[key]]
            for v in values:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise SpecError(f"{where}.{key}", v, "must be a number")
            out[key] = values
        return out

    levels = {c: [lv.name for lv in _cluster(_resolve(c, base)).levels] for c in clusters}

    def levels_of(tables: dict, where: str, every: bool):
        """Every level named is a level of every cluster of the grid (``every``), or of one."""
        for level in tables:
            lacking = [c for c in clusters if level not in levels[c]]
            if lacking and (every or len(lacking) == len(clusters)):
                c = lacking[0]
                raise SpecError(where, level, f"not a level of cluster {c} (its levels: "
                                f"{', '.join(levels[c])})" + (
                                    "; a named network sets levels every cluster has, and "
                                    "[grid.network.LEVEL] one some have" if every else ""))

    def applies(overrides: tuple, where: str, value):
        """The cluster loader accepts these overrides on every cluster of the grid that has
        their levels."""
        for c in clusters:
            if all(level in levels[c] for level, _ in overrides):
                try:
                    _cluster(_resolve(c, base), overrides)
                except SpecError as e:
                    raise SpecError(where, value, e.allowed) from None

    network = grid.get("network", {})
    if not isinstance(network, dict):
        raise SpecError("grid.network", network, "must hold one table per level, e.g. "
                        "[grid.network.spine] with oversubscription = [1, 2]")
    levels_of(network, "grid.network", every=False)
    varied = {}  # (level, slot) -> the key varied there (the two bandwidth keys are one slot)
    axes = []
    for level in sorted(network):
        where = f"grid.network.{level}"
        for key, values in level_table(network[level], where, lists=True).items():
            for v in values:
                applies(((level, ((key, v),)),), f"{where}.{key}", v)
            varied[level, _slot(key)] = key
            axes.append((f"network.{level}.{key}", values))

    named = grid.get("networks", {})
    if not isinstance(named, dict) or "networks" in grid and not named:
        raise SpecError("grid.networks", named, "must hold one table per named network, e.g. "
                        "[grid.networks.nic800] with spine = { bandwidth_GBps = 100 }")
    networks = []
    for name in named:  # (file order: the network column's order)
        where = f"grid.networks.{name}"
        if not name.strip() or name != name.strip() or not name.isprintable():
            raise SpecError("grid.networks", name, "a network's name must be printable text "
                            "without leading or trailing spaces")
        tables = named[name]
        if not isinstance(tables, dict) or not tables:
            raise SpecError(where, tables, "must be a non-empty table of levels, e.g. "
                            "spine = { bandwidth_GBps = 100 }")
        levels_of(tables, where, every=True)
        overrides = []
        for level in sorted(tables):
            pairs = level_table(tables[level], f"{where}.{level}", lists=False)
            for key in pairs:
                applies(((level, ((key, pairs[key][0]),)),), f"{where}.{level}.{key}",
                        pairs[key][0])
                if (level, _slot(key)) in varied:
                    raise SpecError(f"{where}.{level}.{key}", pairs[key][0],
                                    f"also varied in grid.network.{level}."
                                    f"{varied[level, _slot(key)]}; set it in one place")
            overrides.append((level, tuple((k, v[0]) for k, v in pairs.items())))
        applies(tuple(overrides), where, name)  # (each alone above; here all of them at once)
        networks.append((name, tuple(overrides)))
    if networks:
        add("network", [name for name, _ in networks])
    for key, values in axes:
        add(key, values)
    return tuple(params), tuple(networks)


def _slot(key: str) -> str:
    """What a level key sets: bandwidth_GBps and bandwidth_GiBps set one thing."""
    return "bandwidth" if key.startswith("bandwidth_") else key


def _constraints(table: Any):
    """``[constraints]`` to a search ``Constraints`` (``search.constraints.constraints_from``, the parser of
    ``plan``'s flags too) and its canonical JSON."""
    from ..loaders import check_keys
    from ..search.constraints import KNOBS, SWITCHES, constraints_from

    check_keys(table, "constraints", required=set(), optional={*KNOBS, *SWITCHES})
    con = constraints_from(table, lambda key: f"constraints.{key}")
    canon: dict[str, Any] = {}
    for key in table:
        value = getattr(con, key)
        canon[key] = (list(value) if key == "recompute" else
                      order_text(value) if key == "rank_order" else value)
    return con, json.dumps(canon, sort_keys=True, separators=(",", ":"))
