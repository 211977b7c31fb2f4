"""The shipped catalog: one TOML file per accelerator, cluster and model, loaded lazily.

Names are lowercase with dashes (``h100-sxm-80gb``, ``dgx-h100-ndr``, ``llama3-70b``). Every
``get_*`` also accepts a path: a TOML file in the catalog's format, or (for models) a HuggingFace
``config.json``.

    >>> get_model("llama3-70b").kv_heads
    8
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

from ..errors import SpecError
from ..specs import AcceleratorSpec, ClusterSpec, ModelSpec

KINDS = ("models", "clusters", "accelerators")


def _folder(kind: str):
    return resources.files(__name__).joinpath(kind)


def list_names(kind: str) -> list[str]:
    """Catalog names of one kind (``models``, ``clusters`` or ``accelerators``), sorted."""
    if kind not in KINDS:
        raise SpecError("kind", kind, f"allowed: {', '.join(KINDS)}")
    return sorted(p.name[:-5] for p in _folder(kind).iterdir() if p.name.endswith(".toml"))


def _looks_like_path(text: str) -> bool:
    return "/" in text or text.endswith((".toml", ".json")) or (bool(text) and Path(text).exists())


def _catalog_table(kind: str, name: str, field: str) -> dict:
    from ..loaders import read_toml

    entry = _folder(kind).joinpath(f"{name}.toml")
    if not entry.is_file():
        names = list_names(kind)
        raise SpecError(field, name, f"unknown {kind[:-1]}; catalog names: {', '.join(names)} "
                        "(or give a path to a file)")
    with resources.as_file(entry) as path:
        return read_toml(path)


@lru_cache(maxsize=None)
def get_accelerator(name: str) -> AcceleratorSpec:
    """An accelerator by catalog name or TOML path."""
    from ..loaders import accelerator_from_table, read_toml

    table = read_toml(Path(name)) if _looks_like_path(name) else _catalog_table(
        "accelerators", name, "accelerator")
    if "base" in table:
        base = get_accelerator(table.pop("base"))
        return accelerator_from_table(table, base=base)
    return accelerator_from_table(table)


@lru_cache(maxsize=None)
def get_cluster(name: str) -> ClusterSpec:
    """A cluster by catalog name or TOML path."""
    from ..loaders import cluster_from_table, read_toml

    table = read_toml(Path(name)) if _looks_like_path(name) else _catalog_table(
        "clusters", name, "cluster")
    return cluster_from_table(table, get_accelerator)


@lru_cache(maxsize=None)
def get_model(name: str) -> ModelSpec:
    """A model by catalog name, TOML path, or HuggingFace ``config.json`` path."""
    from ..loaders import model_from_table, read_toml

    if _looks_like_path(name):
        if name.endswith(".json"):
            from ..hf import model_from_hf_config

            return model_from_hf_config(Path(name))
        return model_from_table(read_toml(Path(name)))
    return model_from_table(_catalog_table("models", name, "model"))
