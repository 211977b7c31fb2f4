"""Writing flat TOML tables (stack files from ``nestplan calibrate``); reading is ``tomllib``'s."""

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
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps(table: dict) -> str:
    """``key = value`` lines of a flat table (values: bool, int, float, str, lists of them).

    >>> dumps({"name": "mine", "matmul_scale": 0.9, "axes": ["tp", "pp"]})
    'name = "mine"\\nmatmul_scale = 0.9\\naxes = ["tp", "pp"]\\n'
    """
    return "".join(f"{k} = {_value(v)}\n" for k, v in table.items())
