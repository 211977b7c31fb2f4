"""The shipped catalog: one TOML file per accelerator, cluster and model, loaded lazily.

Names are lowercase with dashes (``h100-sxm-80gb``, ``dgx-h100-ndr``, ``llama3-70b``). Every
``get_*`` also accepts a path: a TOML file in the catalog's format, or (for models) a HuggingFace
``config.json``.

    >>> get_model("llama3-70b").kv_heads
    8
"""

from __future__ import annotations

import difflib

from functools import wraps
from pathlib import Path
from types import SimpleNamespace

from ..caching import cached, register
from ..errors import ABSENT, SpecError
from ..paths import real_path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded with the first entry: ``list``'s argument parser reads KINDS only
    from ..specs import AcceleratorSpec, ClusterSpec, ModelSpec, Scenario
    from ..stack import StackSpec

KINDS = ("models", "clusters", "accelerators", "stacks")
DEFAULT_STACK = "megatron-core"
"""The stack a plan is for when none is named: today's Megatron-Core."""


def _folder(kind: str):
    from importlib import resources  # (not at start-up: 10 ms of every command's)

    return resources.files(__name__).joinpath(kind)


def list_names(kind: str) -> list[str]:
    """Catalog names of one kind (``models``, ``clusters``, ``accelerators`` or ``stacks``), sorted."""
    if kind not in KINDS:
        raise SpecError("kind", kind, f"allowed: {', '.join(KINDS)}")
    return sorted(p.name[:-5] for p in _folder(kind).iterdir() if p.name.endswith(".toml"))


def looks_like_path(text: str) -> bool:
    """A name the ``get_*`` functions read as a file rather than a catalog name."""
    import os

    # os.path.exists: False, not an error, for a name no file system can hold (too long, a NUL)
    return "/" in text or text.endswith((".toml", ".json")) or (bool(text) and os.path.exists(text))


def hf_config_in(path: Path) -> Path:
    """``path``, or the ``config.json`` in it when it is a (HuggingFace model) folder."""
    return path / "config.json" if path.is_dir() and (path / "config.json").is_file() else path


def _stamp(path: str | Path):
    """What says a file changed: (modification time ns, size); None when it cannot be read."""
    try:
        st = Path(path).stat()
    except OSError:
        return None  # loading it says what is wrong
    return st.st_mtime_ns, st.st_size


_LOADING: list[dict[Path, tuple | None]] = []
"""The files each entry being loaded has read so far, with their stamps (innermost last)."""


def _read_from(files: dict[Path, tuple | None]) -> None:
    """Note that the entries being loaded read ``files`` (an entry loaded within another, a
    cluster's accelerator say, counts for both)."""
    for reading in _LOADING:
        reading.update(files)


def _reading(path: str | Path) -> str | Path:
    """``path``, noted as a file the entries being loaded read (kept as given: a message
    naming it echoes what the user typed, ``./model.toml`` and all)."""
    _read_from({real_path(path): _stamp(path)})
    return path


def _read_toml(path: str | Path, field: str) -> dict:
    """A user's TOML file, noted as read by the entries being loaded."""
    from ..loaders import read_toml

    return read_toml(_reading(path), field)


class _FileMemo:
    """``fn(name)`` cached; an entry is read again once any file it was read from (its own, its
    bases', a cluster's accelerator's) has changed, so that a long-lived process sees an edited
    file. Registered with ``caching.clear``."""

    def __init__(self, fn):
        self.fn = fn
        self.entries: dict[str, tuple[object, dict[Path, tuple | None]]] = {}
        register(self)

    def __call__(self, name: str):
        # a path is keyed as resolved: the same relative name from another directory is
        # another file
        key = str(real_path(name)) if looks_like_path(name) else name
        hit = self.entries.get(key)
        if hit is not None and all(_stamp(p) == s for p, s in hit[1].items()):
            _read_from(hit[1])
            return hit[0]
        _LOADING.append({})
        try:
            value = self.fn(name)
        finally:
            files = _LOADING.pop()
        self.entries[key] = value, files
        _read_from(files)
        return value

    def cache_clear(self) -> None:
        self.entries.clear()

    def cache_info(self):
        return SimpleNamespace(currsize=len(self.entries))


def _cached(fn):
    memo = _FileMemo(fn)

    @wraps(fn)
    def get(name: str = DEFAULT_STACK):
        return memo(name)
    return get


def close_name(kind: str, name: str) -> str | None:
    """The catalog name of ``kind`` that ``name`` is likely a slip for (case aside: a user pastes
    a HuggingFace id, "Qwen3-235B-A22B", for its catalog name), or None."""
    folded = {n.lower(): n for n in list_names(kind)}
    low = str(name).lower()
    if low in folded:  # (a DeepSpeed trial's "DeepSpeed" had been told "deepspeed-2021", the
        return folded[low]  # one name it begins)
    # the one name it begins (a hardware trial's "b200" had been told "gb200", the rack part,
    # for the HGX part b200-sxm-180gb)
    longer = [n for f, n in folded.items() if f.startswith(f"{low}-")]
    if len(longer) == 1:
        return longer[0]
    if longer:  # (several: no one of them picked, "llama3" for llama3-8b, a review's)
        return None
    close = difflib.get_close_matches(low, list(folded), n=1, cutoff=0.75)
    return folded[close[0]] if close else None


def _catalog_table(kind: str, name: str, field: str) -> dict:
    from ..loaders import read_toml

    names = list_names(kind)  # (a name is looked up among them: no file system asked about it)
    if name not in names:
        close = [c for c in [close_name(kind, name)] if c]
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        from pathlib import Path

        try:  # (only once the name is refused: a calibrating user gave the name of the stack
            # file they had written; a name no file can have is simply not one)
            here = not close and Path(f"{name}.toml").is_file()
        except (OSError, ValueError):
            here = False
        if here:
            hint = f" (a file {name}.toml is here: give that path)"
        raise SpecError(field, name, f"unknown {kind[:-1]}{hint}; catalog names: "
                        f"{', '.join(names)} (or give a path to a file)")
    from importlib import resources

    with resources.as_file(_folder(kind).joinpath(f"{name}.toml")) as path:
        return read_toml(path)


@_cached
def get_accelerator(name: str) -> AcceleratorSpec:
    """An accelerator by catalog name or TOML path; ``base = "..."`` chains are followed (a path
    ``base`` is relative to the file that names it). A file may not take a catalog accelerator's
    name unless it is that accelerator (``list accelerators FILE`` had printed one that ``plan``
    refused: an academic user's trial)."""
    acc = _resolve("accelerators", name, "accelerator", ())
    if looks_like_path(name):
        _refuse_a_lookalike("accelerators", acc)
    return acc


MAX_BASES = 32
"""Longest chain of ``base`` files a stack or accelerator may name."""


@_cached
def get_cluster(name: str) -> ClusterSpec:
    """A cluster by catalog name or TOML path; an accelerator (or an inline accelerator's
    ``base``) given as a relative path is read beside the cluster file."""
    from ..loaders import cluster_from_table

    if looks_like_path(name):
        table, ident = _read_toml(name, "cluster"), str(real_path(name))
    else:
        table, ident = _catalog_table("clusters", name, "cluster"), name
    cluster = cluster_from_table(table, lambda acc: get_accelerator(_base_beside(ident, acc)))
    if looks_like_path(name):
        _refuse_a_lookalike("clusters", cluster)
        _refuse_a_lookalike("accelerators", cluster.accelerator)
    return cluster


@_cached
def get_model(name: str) -> ModelSpec:
    """A model by catalog name, TOML path, or HuggingFace ``config.json`` path (or the folder
    that holds one, as a downloaded model's)."""
    from ..loaders import model_from_table

    if looks_like_path(name):
        from ..loaders import regular_file

        found = hf_config_in(Path(name))
        path = name if found == Path(name) else found  # (as typed, for the messages)
        if Path(path).is_dir():
            inside = "whose config.json is not a file" if (Path(path) / "config.json").exists() \
                else "without a config.json"
            raise SpecError("model", name, f"a folder {inside}; give a catalog name, a model "
                            "TOML, or a HuggingFace config.json or its folder")
        regular_file(path, "model", "model TOML or HuggingFace config.json")  # (named TOML only)
        if Path(path).suffix == ".json":
            from ..hf import model_from_hf_config

            return model_from_hf_config(_reading(path))
        model = model_from_table(_read_toml(path, "model"))
        _refuse_a_lookalike("models", model)
        return model
    return model_from_table(_catalog_table("models", name, "model"))


def _entry_table(kind: str, name: str, field: str) -> tuple[dict, str]:
    """The raw table of an entry of ``kind`` and its identity (catalog name or resolved path)."""
    if looks_like_path(name):
        return _read_toml(name, field), str(real_path(name))
    return _catalog_table(kind, name, field), name


@_cached
def get_stack(name: str = DEFAULT_STACK) -> StackSpec:
    """A stack by catalog name or TOML path; ``base = "..."`` chains are followed (a path
    ``base`` is relative to the file that names it)."""
    return _resolve("stacks", name, "stack", ())


def _resolve(kind: str, name: str, field: str, seen: tuple[str, ...]):
    """A stack or an accelerator (``kind``) named ``name`` in ``field``, over its chain of bases;
    the files ``seen`` name it as their base, in turn (a base file's fields are named as
    ``stack PATH.key`` or ``accelerator PATH.key``). Keys a file does not set are its base's,
    calibration included; a stack file without ``name`` is named for the file."""
    from ..loaders import accelerator_from_table, later_keys_filled, stack_from_table

    noun = kind[:-1]
    a_noun = f"{'an' if noun == 'accelerator' else 'a'} {noun}"
    table, ident = _entry_table(kind, name, field)
    if ident in seen or len(seen) > MAX_BASES:
        chain = " -> ".join((*seen, ident))
        raise SpecError(field, name, f"bases form a cycle or a chain of more than {MAX_BASES} "
                        f"({chain}); they must end at {a_noun} without base")
    build = stack_from_table if kind == "stacks" else accelerator_from_table
    where = noun if not seen else f"{noun} {ident}"
    given = "name" in table  # (else a stack file is named for the file, below)
    if kind == "stacks" and "base" not in table and "name" not in table:  # (had listed every key)
        raise SpecError(f"{where}.name", ABSENT, "missing; a stack file without base is a whole "
                        "stack and names itself; to change a catalog stack, give base = "
                        "\"megatron-core\" (or another) and the keys to change")
    if "base" not in table:  # (a whole stack file of the user's, maybe of an earlier release)
        built = build(later_keys_filled(table) if kind == "stacks" and looks_like_path(name)
                      else table, where)
    else:
        table = dict(table)
        base_name = table.pop("base")
        if not isinstance(base_name, str):
            raise SpecError(f"{where}.base", base_name, f"must be {a_noun} name or path")
        base = _resolve(kind, _base_beside(ident, base_name), f"{where}.base", (*seen, ident))
        if kind == "stacks" and "name" not in table:
            table["name"] = Path(name).stem if looks_like_path(name) else name
        built = build(table, where, base=base)
    if kind == "stacks" and looks_like_path(name):
        _refuse_a_catalog_name(built, given, where)
    return built


def _refuse_a_catalog_name(stack, given: bool, where: str) -> None:
    """A stack file may not take a catalog stack's name (outputs name a stack by it, and would
    say ``nemo`` of a file that only shares the name), from its ``name`` key (``given``) or its
    file's stem, unless it is that catalog stack (its own file, or what ``list stacks`` prints
    of it)."""
    name = stack.name
    if name in list_names("stacks") and not is_entry("stacks", stack):
        how = ("" if given else " (named for its file: set name = \"...\" in it, or rename "
               "the file)")
        raise SpecError(f"{where}.name", name, f"is a catalog stack's name; give the file's stack "
                        f"a name of its own{how}")


def is_entry(kind: str, spec) -> bool:
    """Whether ``spec`` is the catalog's entry of its name (what ``list KIND NAME`` prints of
    it), not only named so."""
    return spec.name in list_names(kind) and get(kind, spec.name) == spec


def _refuse_a_lookalike(kind: str, spec) -> None:
    """A model, cluster or accelerator file (or a cluster file's inline accelerator) may not take
    a catalog entry's name (outputs, plan files and sweep rows name it by it, and would say
    ``dgx-h100-ndr`` of a file that only shares the name), unless it is that entry (what
    ``list KIND NAME`` prints of it)."""
    if spec.name in list_names(kind) and not is_entry(kind, spec):
        noun = kind[:-1]
        raise SpecError(f"{noun}.name", spec.name, f"is a catalog {noun}'s name, and this file's "
                        f"{noun} differs from it; give it a name of its own")


def _base_beside(ident: str, base: str) -> str:
    """The ``base`` a file (``ident``: its resolved path, or a catalog name) names: a relative
    path is read beside that file."""
    if looks_like_path(ident) and looks_like_path(base) and not Path(base).is_absolute():
        return str(Path(ident).parent / base)
    return base


def _chain_files(kind: str, name: str, field: str) -> set[Path]:
    """The files of a stack or an accelerator (``kind``; ``field``: what its files are called)
    given by path and of its chain of bases, resolved (none for a catalog name; the chain as
    ``get_stack`` and ``get_accelerator`` follow it)."""
    files: set[Path] = set()
    while looks_like_path(name):
        table, ident = _entry_table(kind, name, field)
        if Path(ident) in files:
            break
        files.add(Path(ident))
        if not isinstance(table.get("base"), str):
            break
        name = _base_beside(ident, table["base"])
    return files


def catalog_files(kind: str, name: str) -> list[Path]:
    """The package files of catalog entry ``name`` of ``kind`` and of its catalog bases, in that
    order, whose comments give each figure's source (``list KIND NAME`` names them: a buyer's
    trial found the listing without its sources); none for a name that is no catalog entry."""
    out: list[Path] = []
    names = list_names(kind)
    while name in names and name not in (p.stem for p in out):  # (a cycle is refused on load)
        out.append(Path(str(_folder(kind).joinpath(f"{name}.toml"))))
        name = _catalog_table(kind, name, kind[:-1]).get("base")
    return out


def files_read(kind: str, name: str | None) -> set[Path]:
    """The files an entry of ``kind`` named by path is read from, resolved: a model's TOML or
    ``config.json`` (in its folder), a stack's or an accelerator's chain of bases, a cluster's
    file and those of the accelerator it names; none for a catalog name. What a command's output
    must not replace. A file that does not load counts alone (loading it says what is wrong)."""
    from ..loaders import cluster_from_table

    if not name or not looks_like_path(name):
        return set()
    if kind == "models":
        return {real_path(hf_config_in(Path(name)))}
    try:
        if kind in ("stacks", "accelerators"):
            return _chain_files(kind, name, kind[:-1])
        table, ident = _entry_table("clusters", name, "cluster")
        named: list[str] = []

        def accelerator(acc: str):
            named.append(_base_beside(ident, acc))
            return get_accelerator(named[-1])

        cluster_from_table(table, accelerator)
    except SpecError:
        return {real_path(name)}
    return {Path(ident)}.union(*(files_read("accelerators", a) for a in named))


def get(kind: str, name: str):
    """An entry of one of ``KINDS`` by catalog name or path: ``get("models", "llama3-70b")``."""
    getters = {"models": get_model, "clusters": get_cluster, "accelerators": get_accelerator,
               "stacks": get_stack}
    if kind not in getters:
        raise SpecError("kind", kind, f"allowed: {', '.join(KINDS)}")
    return getters[kind](name)


def as_table(kind: str, spec) -> dict:
    """``spec`` (an entry of ``kind``) as the table of a file of its kind, every field given."""
    from .. import loaders

    return {"models": loaders.model_to_table, "clusters": loaders.cluster_to_table,
            "accelerators": loaders.accelerator_to_table,
            "stacks": loaders.stack_to_table}[kind](spec)


@cached(maxsize=None)
def stack_sources() -> tuple[tuple[str, str], ...]:
    """(source text, stack name) of every catalog stack's ``runs_source`` entries: a runs-CSV row
    without a ``stack`` column is taken to have run on the stack whose entry is the longest one
    contained in its ``source`` and ``other_metrics`` columns."""
    out = []
    for name in list_names("stacks"):
        for entry in _catalog_table("stacks", name, "stack").get("runs_source", []):
            out.append((entry, name))
    return tuple(out)


def scenario_from_names(model: str, cluster: str, gpus: int, *, stack: str | None = None,
                        mtp_layers: int | None = None, **training) -> Scenario:
    """A Scenario from catalog names (or file paths), a stack name or path (default
    ``megatron-core``), the model's multi-token-prediction depths when not its own, and
    TrainingSpec keywords."""
    from dataclasses import replace

    from ..specs import Scenario, TrainingSpec

    m = get_model(model)
    if mtp_layers is not None:  # before the scenario checks the stack can train them
        m = replace(m, mtp_layers=mtp_layers)
    return Scenario(model=m, cluster=get_cluster(cluster), gpus=gpus,
                    training=TrainingSpec(**training),
                    stack=get_stack(DEFAULT_STACK if stack is None else stack))
