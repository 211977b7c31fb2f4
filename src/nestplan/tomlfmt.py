"""Writing TOML (stack files from ``nestplan calibrate``, specs shown by ``nestplan list KIND
NAME``); reading is ``tomllib``'s."""

from __future__ import annotations

import json
import math


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"TOML has no place for {v}")
        return repr(v)
    if isinstance(v, str):
        # a JSON string is a TOML basic string, but for DEL, which JSON leaves and TOML refuses
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps(table: dict) -> str:
    """``key = value`` lines of a flat table (values: bool, int, float, str, lists of them).

    >>> dumps({"name": "mine", "matmul_scale": 0.9, "axes": ["tp", "pp"]})
    'name = "mine"\\nmatmul_scale = 0.9\\naxes = ["tp", "pp"]\\n'
    """
    return "".join(f"{k} = {_value(v)}\n" for k, v in table.items())


def _tables(v) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, dict) for x in v)


def document(table: dict, prefix: str = "") -> str:
    """A nested table as a TOML document: its plain keys, then each sub-table as ``[name]`` and
    each list of tables as ``[[name]]`` entries (nested to any depth).

    >>> print(document({"name": "c", "levels": [{"size": 8}], "moe": {"experts": 8}}), end="")
    name = "c"
    <BLANKLINE>
    [[levels]]
    size = 8
    <BLANKLINE>
    [moe]
    experts = 8
    """
    out = dumps({k: v for k, v in table.items() if not isinstance(v, dict) and not _tables(v)})
    for k, v in table.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out += f"\n[{name}]\n" + document(v, name + ".")
        elif _tables(v):
            for item in v:
                out += f"\n[[{name}]]\n" + document(item, name + ".")
    return out
