"""Strict loaders: TOML tables (units in the keys) to specs (SI inside).

Unknown keys are errors that list the valid ones; missing required keys name themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Callable

from . import units
from .errors import ABSENT, SpecError
from .options import MLPKind, Norm, Position
from .specs import (DEFAULT_NORM_EPS, DEFAULT_ROPE_THETA, AcceleratorSpec, ClusterSpec, Level,
                    MLASpec, ModelSpec, MoESpec, RopeScaling, YarnSpec, finite, layer_indices,
                    UNMASKED_ATTENTION_GAIN, sliding_window_cost)


MAX_FILE_BYTES = 64 * 2**20
"""Largest input file read (plans, models, clusters and stacks are kilobytes)."""


def regular_file(path: str | Path, field: str, kind: str) -> None:
    """Refuse anything but an existing regular file of sane size before it is opened (a FIFO
    or a device would block or never end), and a blank path (given as the text typed:
    ``Path("")`` is the working directory); SpecError naming ``field``."""
    import stat

    if not str(path).strip():
        raise SpecError(field, str(path), f"must be a {kind} file path")
    try:
        info = Path(path).stat()
    except FileNotFoundError:
        raise SpecError(field, str(path), "no such file") from None
    except OSError as e:
        raise SpecError(field, str(path), f"cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        what = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise SpecError(field, str(path), f"{what}; give a {kind} file")
    if info.st_size > MAX_FILE_BYTES:
        raise SpecError(field, str(path), f"{info.st_size:,} bytes; a {kind} input file of "
                        f"nestplan is at most {MAX_FILE_BYTES // 2**20} MiB")


def draft_beside(target: Path) -> Path:
    """A new empty file beside ``target``, of a name no other process can have chosen (created
    exclusively: ``tempfile.mkstemp``), to write ``target``'s new content into and ``settle``
    over it."""
    import tempfile

    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    return Path(name)


def settle(draft: Path, target: Path) -> None:
    """Rename ``draft`` over ``target`` with the mode ``target`` has, or the one a file written in
    place would have (``mkstemp``'s draft is its owner's alone)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(draft, target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~umask)
    os.replace(draft, target)


@contextlib.contextmanager
def replacing(target: Path):
    """A draft beside ``target`` (``draft_beside``) to write its new content into: settled over
    ``target`` when the block ends without error, removed in any case (the one sequence of
    ``write_text_atomic``, calibrate's stack file and the sweep's CSV rewrite)."""
    draft = draft_beside(target)
    try:
        yield draft
        settle(draft, target)
    finally:
        draft.unlink(missing_ok=True)


def write_text_atomic(path, text: str) -> None:
    """Write ``text`` to ``path`` at once: into a file beside it, then renamed over it, so that a
    command killed while writing leaves the old file or the new, never half of one (a pipeline
    engineer's trial found plan files and exports written in place). A link is followed: the
    file it names is replaced, the link kept. What is no regular file (a device, a pipe,
    /dev/stdout) is written in place, as is a file whose folder takes no new file. Raises
    OSError."""
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():  # (a review: /dev/null had been replaced)
        with open(target, "w") as f:
            f.write(text)
        return
    if target.exists() and not os.access(target.parent, os.W_OK):
        target.write_text(text)  # (a writable file in a folder that takes no new one)
        return
    with replacing(target) as draft:
        draft.write_text(text)


def writable(path, field: str, kind: str, *, makes_folder: bool = False,
             reads: tuple = (), what: str = "a file being read", results: bool = False) -> None:
    """Refuse an output path that cannot be written before any work is done: blank, a
    directory, a file in a directory that does not exist unless the writer ``makes_folder``, one
    of the files the command ``reads`` (``what`` they are; writing would replace them), or one
    the system will not let us write (no permission, a read-only or special file system: tried
    by opening it to append, or creating it and removing it again) (SpecError naming
    ``field``); with ``results`` (the command prints its results on standard output) also
    standard output or error by any name."""
    if not str(path).strip():
        raise SpecError(field, str(path), f"must be a {kind} file path")
    if str(path) == "-":  # (a pipeline engineer's trial got a file named "-")
        raise SpecError(field, "-", f"must be a {kind} file path; standard output is not one "
                        "here (give ./- for a file of that name)")
    stream = results and _standard_stream(path)
    if stream:  # (a fuzzing trial's --save /dev/stdout > out.txt: the file, renamed over the
        # one the results had gone to, took their place; on a pipe it was "no such file")
        raise SpecError(field, str(path), f"is {stream}, where the results go; give a {kind} "
                        "file path")
    try:
        _writable(Path(path), field, kind, makes_folder, reads, what)
    except RuntimeError as e:  # Path.resolve on a loop of links (Python 3.11, 3.12)
        raise SpecError(field, str(path), f"cannot write ({e})") from None
    except OSError as e:  # a name too long for the file system, a loop, ...
        raise SpecError(field, str(path), f"cannot write ({e.strerror or e})") from None


def _standard_stream(path) -> str | None:
    """"standard output" or "standard error" where ``path`` is that stream's file, pipe or
    device (``/dev/stdout``, ``/proc/self/fd/1``, the file stdout is redirected to), else None."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if os.path.realpath(path) == os.devnull:  # (nothing is lost there, results or not)
        return None
    for fd, name in ((1, "standard output"), (2, "standard error")):
        try:
            own = os.fstat(fd)
        except OSError:  # (a closed stream)
            continue
        if (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino):
            return name
    return None


def writable_beside(path, suffixes, field: str, *, reads: tuple = (),
                    what: str = "a file being read") -> None:
    """Refuse an output whose writer also writes a file beside it for each of ``suffixes``
    (``PATH`` + suffix): an existing output that is not a regular file (a device, a pipe: the
    files beside it would be ``/dev/null.x``), and each of those files as ``writable`` does;
    ``path`` itself is checked by ``writable``."""
    if not suffixes:
        return
    beside = ", ".join(f"PATH{s}" for s in suffixes)
    p = Path(path)
    if p.exists() and not p.is_file():
        raise SpecError(field, str(path), f"not a regular file, and the export also writes "
                        f"{beside} beside it: give a file path")
    folder = p.absolute().parent  # /dev/stdout to a file had had them written into /dev
    if folder in (Path("/dev"), Path("/dev/fd")) or folder.parts[1:2] in (("proc",), ("sys",)):
        raise SpecError(field, str(path), f"the export also writes {beside} beside it, in "
                        f"{folder}: give a file path in a folder of your own")
    for suffix in suffixes:  # every file is checked before the first is written
        writable(str(p) + suffix, field, f"'{suffix}'", reads=reads, what=what)


def not_read(path, field: str, reads: tuple, what: str) -> None:
    """Refuse an output path that is one of the files the command ``reads`` (``what`` they are;
    writing would replace them) by any name: a link's (resolve also raises on a loop of links),
    a hard link's (samefile: only a file that exists can be read)."""
    path = Path(path)
    if path.resolve() in {Path(r).resolve() for r in reads} or path.exists() and any(
            Path(r).exists() and os.path.samefile(path, r) for r in reads):
        raise SpecError(field, str(path), f"is {what}; write to a new file")


def _writable(path: Path, field: str, kind: str, makes_folder: bool, reads: tuple,
              what: str) -> None:
    not_read(path, field, reads, what)
    if path.is_dir():
        raise SpecError(field, str(path), f"a directory; give a {kind} file path")
    if not path.parent.is_dir():
        if makes_folder:  # its folders can be made if the nearest existing one is a folder
            above = next((p for p in path.parents if p.exists()), None)
            if above is not None and not above.is_dir():
                raise SpecError(field, str(path), f"{above} is a file, not a directory")
            return
        raise SpecError(field, str(path), f"no such directory: {path.parent}")
    if path.is_file():  # appending nothing leaves it as it is
        with open(path, "ab"):
            pass
    elif not path.exists():  # (a dangling link: where it points) a file can be made there
        import tempfile

        target = Path(os.path.realpath(path))
        if not target.parent.is_dir():
            raise SpecError(field, str(path), f"no such directory: {target.parent}")
        fd, probe = tempfile.mkstemp(dir=target.parent, prefix=".nestplan-probe-")
        os.close(fd)
        os.unlink(probe)
    # anything else (a device, a pipe) is tried only when written: opening a pipe waits


def _once(pairs: list, field: str, path: Path) -> dict:
    """A JSON object whose keys are all different (TOML refuses a repeated key itself; JSON
    would keep the last value without a word)."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise SpecError(field, str(path), f"not valid JSON for nestplan: key '{key}' is "
                            "given twice in one object")
        seen.add(key)
    return dict(pairs)


def read_document(path: str | Path, field: str = "file", kind: str = "TOML") -> Any:
    """Parse a TOML or JSON file: the one reader of nestplan's input files, with one mapping of
    what can go wrong to a SpecError naming ``field``. Anything but a regular file (a directory,
    a FIFO, a device) is refused before it is read; a UTF-8 byte-order mark is accepted."""
    import json
    import tomllib

    try:
        regular_file(path, field, kind)
        text = Path(path).read_bytes().decode("utf-8-sig")
        return tomllib.loads(text) if kind == "TOML" else json.loads(
            text, object_pairs_hook=lambda pairs: _once(pairs, field, path))
    except FileNotFoundError:
        raise SpecError(field, str(path), "no such file") from None
    except OSError as e:  # no permission, ...
        raise SpecError(field, str(path), f"cannot read it ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise SpecError(field, str(path), f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at "
                        f"offset {e.start}); give a {kind} file") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise SpecError(field, str(path), f"not valid {kind} ({e})") from None
    except RecursionError:
        raise SpecError(field, str(path), f"its {kind} nests too deeply to read") from None
    except SpecError:  # a ValueError too: not a regular file, ...
        raise
    except ValueError as e:  # an integer of more digits than Python converts (4,300)
        why = "a number in it has too many digits" if "digits" in str(e) else str(e)
        raise SpecError(field, str(path), f"not readable {kind}: {why}") from None


def read_toml(path: str | Path, field: str = "file") -> dict:
    """Parse a TOML file; errors become a SpecError naming ``field`` (the flag or key that
    named the file)."""
    return read_document(path, field, "TOML")


def check_keys(table: dict, where: str, *, required: set[str], optional: set[str]) -> None:
    """Reject unknown keys and report missing ones, listing the valid keys."""
    if not isinstance(table, dict):
        raise SpecError(where, table, "must be a table")
    valid = sorted(required | optional)
    for key in table:
        if key not in required and key not in optional:
            raise SpecError(key_of(where, key), table[key],
                            f"unknown key{_case_hint(key, table[key], valid)}; valid keys: "
                            f"{', '.join(valid)}")
    missing = [key for key in sorted(required) if key not in table]
    if missing:  # all of them at once (a user trial fixed a file's three one run at a time)
        more = f" (so are {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise SpecError(key_of(where, missing[0]), ABSENT,
                        f"missing required key{more}; valid keys: {', '.join(valid)}")


def _case_hint(key: str, value, valid: list[str]) -> str:
    """A valid key that ``key`` spells in other case, named, with the unit it takes where the two
    differ as bits from bytes (a user trial's ``bandwidth_Gbps = 400``: 400 Gb/s is 50 GB/s); else
    one it misspells, named."""
    near = next((v for v in valid if v.lower() == key.lower()), None)
    if near is None:  # a misspelling (a user trial's matmul_scal)
        import difflib

        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.8)
        return f" (did you mean {close[0]}?)" if close else ""
    if key.endswith("Gbps") and near.endswith("GBps"):
        per = (f": {value:g} Gb/s is {value / 8:g} GB/s"
               if isinstance(value, (int, float)) and not isinstance(value, bool) else "")
        return f" (did you mean {near}? it takes gigabytes per second{per})"
    return f" (did you mean {near}?)"


def name_of(table: dict, where: str) -> str:
    """``table["name"]``: a string, not blank, on one line (it heads exports and reports)."""
    return checked_name(_typed(table, "name", where, str), f"{where}.name")


def checked_name(name: str, field: str) -> str:
    """``name`` (of ``field``) if it is not blank and on one line (no control characters or
    line breaks, which would break the comment lines of exports, nor invisible format characters
    such as bidirectional overrides, which would show it as another name), without white space
    at either end (which would print as another name), and text that can be written (no lone
    surrogates: the bytes of a file name that are not UTF-8), else a SpecError."""
    import unicodedata

    if not name.strip() or any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name):
        raise SpecError(field, name, "must be a name on one line, not blank (no control or "
                        "invisible format characters)")
    if any(unicodedata.category(c) == "Cs" for c in name):
        raise SpecError(field, name, "must be UTF-8 text (it holds a lone surrogate, e.g. a byte "
                        "of a file name that is not UTF-8: rename the file)")
    if name != name.strip():  # (a stack file's "megatron-core " had passed as the catalog's)
        raise SpecError(field, name, "must not begin or end with white space")
    return name


def key_of(where: str, key: str) -> str:
    """The name of ``key`` in the table ``where`` names (``plan.tp``; the key itself at the top
    of a document, ``where`` empty)."""
    return f"{where}.{key}" if where else key


def _typed(table: dict, key: str, where: str, kind: type | tuple, default: Any = None,
           advice: Callable[[Any], str] | None = None) -> Any:
    if key not in table:
        return default
    value = table[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in (
        kind if isinstance(kind, tuple) else (kind,)))
    if not ok:
        raise SpecError(f"{where}.{key}", value, f"must be {kind_words(kind)}",
                        advice(value) if advice else "")
    if kind == _NUM and isinstance(value, int) and not finite(value):
        raise SpecError(f"{where}.{key}", value, "must be a number a float can hold")
    return value


def _ratio_advice(value: Any) -> str:
    """What to write for a ratio given as text, "2:1" (a datacenter trial's oversubscription),
    or "" for any other value."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*:\s*(\d+(?:\.\d+)?)\s*", value) \
        if isinstance(value, str) else None
    if m is None or float(m[2]) == 0:
        return ""
    return f"write the ratio as one number, {float(m[1]) / float(m[2]):g}"


_NUM = (int, float)
"""A number read as a float (an integer too large for one is refused)."""

_WORDS = {int: ("an integer", "integers"), float: ("a number", "numbers"),
          str: ("a string", "strings"), bool: ("true or false", "true or false values"),
          dict: ("a table", "tables"), list: ("a list", "lists")}


def kind_words(kind: type | tuple, plural: bool = False) -> str:
    """What a TOML value of Python type(s) ``kind`` is, in a user's words ("an integer", "a
    number" for int or float), for the messages that refuse another (they had said "int")."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if set(kinds) == {int, float}:
        return "numbers" if plural else "a number"
    return " or ".join(_WORDS[k][plural] if k in _WORDS else k.__name__ for k in kinds)


# ----------------------------------------------------------------------------- accelerator

_ACCEL_REQUIRED = {"name", "peak_tflops_bf16", "hbm_GiB", "hbm_GBps",
                   "matmul_efficiency_bf16_by_GFLOP", "attention_efficiency", "memory_efficiency"}
"""Every efficiency is a measured or stated figure of the file (no defaults in code; the
optional ``unmasked_attention_gain`` is a ratio with a sourced default,
``specs.UNMASKED_ATTENTION_GAIN``)."""
_ACCEL_OPTIONAL = {"peak_tflops_fp8", "matmul_efficiency_fp8_by_GFLOP", "kernel_overhead_us",
                   "sustained_share", "compute_capability", "unmasked_attention_gain",
                   "fitted_on", "base"}


_ACCEL_EFFICIENCIES = {"matmul_efficiency_bf16_by_GFLOP", "matmul_efficiency_fp8_by_GFLOP",
                       "attention_efficiency", "memory_efficiency", "unmasked_attention_gain"}
"""An accelerator's efficiencies: a file that gives its own keeps none of its base's runs
(``AcceleratorSpec.fitted_on``) unless it names them."""


def _points(value, where: str) -> tuple[tuple[float, float], ...]:
    if not isinstance(value, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, _NUM) and not isinstance(
                x, bool) and (finite(x) or isinstance(x, float)) for x in p) for p in value):
        raise SpecError(where, value, "must be a list of [GFLOP, efficiency] pairs")
    for g, _ in value:  # echoed as given: in FLOP it would read inf
        if isinstance(g, float) and math.isfinite(g) and not math.isfinite(g * 1e9):
            raise SpecError(where, value, f"GFLOP {g:g} is more FLOP than a float holds")
    return tuple((float(g) * 1e9, float(e)) for g, e in value)


MIN_PEAK_TFLOPS = 10.0
"""Least dense peak, TFLOP/s, an accelerator file may give: a V100's tensor cores give 125 and a
T4's 65 (NVIDIA's Tesla V100 and T4 datasheets), so below 10 is no training accelerator (an
academic's A100 at 0.312, PFLOP/s, had been costed 1,000 times slower without a word)."""


def accelerator_from_table(table: dict, where: str = "accelerator",
                           base: AcceleratorSpec | None = None) -> AcceleratorSpec:
    """Build an accelerator; with ``base``, keys missing from ``table`` keep the base's values."""
    required = set() if base else _ACCEL_REQUIRED
    check_keys(table, where, required=required, optional=(_ACCEL_REQUIRED | _ACCEL_OPTIONAL))
    kw: dict[str, Any] = {}
    if "name" in table:
        kw["name"] = name_of(table, where)
    # physically meaningful ranges in the file's units, checked before conversion
    for precision in ("bf16", "fp8"):
        if f"peak_tflops_{precision}" in table:
            kw[f"peak_flops_{precision}"] = _ranged(
                table, f"peak_tflops_{precision}", where, MIN_PEAK_TFLOPS, 1e5,
                "dense TFLOP/s: PFLOP/s times 1,000") * units.TFLOPS
    if "hbm_GiB" in table:
        kw["hbm_bytes"] = _ranged(table, "hbm_GiB", where, 1.0, 1e5,
                                  "GiB: a TB is 931 GiB") * units.GiB  # (a trial's 0.141 was TB)
    if "hbm_GBps" in table:  # (a user trial's 3.35, TB/s, had been taken as 3.35 GB/s)
        kw["hbm_bandwidth"] = units.gbps(_ranged(table, "hbm_GBps", where, 50.0, 1e6,
                                                 "GB/s: TB/s times 1,000"))
    if "matmul_efficiency_bf16_by_GFLOP" in table:
        kw["matmul_efficiency_bf16"] = _points(table["matmul_efficiency_bf16_by_GFLOP"],
                                               f"{where}.matmul_efficiency_bf16_by_GFLOP")
    if "matmul_efficiency_fp8_by_GFLOP" in table:
        kw["matmul_efficiency_fp8"] = _points(table["matmul_efficiency_fp8_by_GFLOP"],
                                              f"{where}.matmul_efficiency_fp8_by_GFLOP")
    if "sustained_share" in table:
        kw["sustained_share"] = float(_typed(table, "sustained_share", where, _NUM))
    if "attention_efficiency" in table:
        att = table["attention_efficiency"]
        if not (isinstance(att, list) and len(att) == 2 and all(
                isinstance(x, _NUM) and not isinstance(x, bool) for x in att)):
            raise SpecError(f"{where}.attention_efficiency", att, "must be [forward, backward]")
        kw["attention_efficiency"] = (float(att[0]), float(att[1]))
    if "memory_efficiency" in table:
        kw["memory_efficiency"] = float(_typed(table, "memory_efficiency", where, _NUM))
    if "unmasked_attention_gain" in table:
        kw["unmasked_attention_gain"] = float(_typed(table, "unmasked_attention_gain", where, _NUM))
    if "kernel_overhead_us" in table:
        kw["kernel_overhead"] = _typed(table, "kernel_overhead_us", where, _NUM) * units.US
    if "fitted_on" in table:
        kw["fitted_on"] = tuple(_list(table["fitted_on"], f"{where}.fitted_on"))
    if "compute_capability" in table:
        kw["compute_capability"] = _ranged(table, "compute_capability", where, 1.0, 20.0,
                                           "NVIDIA's CUDA compute capability, e.g. 9.0")
    bf16 = kw.get("peak_flops_bf16", base.peak_flops_bf16 if base else None)
    fp8 = kw.get("peak_flops_fp8", base.peak_flops_fp8 if base else None)
    if bf16 is not None and fp8 is not None and fp8 < bf16:  # (a user trial's 500 below 989)
        key = "peak_tflops_fp8" if "peak_tflops_fp8" in table else "peak_tflops_bf16"
        raise SpecError(f"{where}.{key}", table[key], f"fp8's dense peak "
                        f"({fp8 / units.TFLOPS:g} TFLOP/s) is below bf16's "
                        f"({bf16 / units.TFLOPS:g}): give both dense, fp8 at least bf16's")
    if base is not None:
        from dataclasses import replace

        if "fitted_on" not in table and _ACCEL_EFFICIENCIES & table.keys():
            kw["fitted_on"] = ()  # (new efficiencies: the base's runs are not behind them)
        return replace(base, **kw)
    return AcceleratorSpec(**kw)


# ----------------------------------------------------------------------------- cluster

_LEVEL_KEYS = {"name", "size", "bandwidth_GBps", "bandwidth_GiBps", "latency_us", "oversubscription",
               "efficiency"}


def _ranged(table: dict, key: str, where: str, low: float, high: float, what: str) -> float:
    """A number of the file in [low, high] (finite), as written; SpecError naming the key."""
    import math

    value = _typed(table, key, where, _NUM)
    if not (math.isfinite(value) and low <= value <= high):
        raise SpecError(f"{where}.{key}", value, f"must be in [{low:g}, {high:g}] ({what})")
    return float(value)


def level_from_table(table: dict, where: str) -> Level:
    check_keys(table, where, required={"name", "latency_us"}, optional=_LEVEL_KEYS)
    has_gb, has_gib = "bandwidth_GBps" in table, "bandwidth_GiBps" in table
    if has_gb and has_gib:
        raise SpecError(f"{where}.bandwidth_GiBps", table["bandwidth_GiBps"],
                        "give bandwidth_GBps or bandwidth_GiBps, not both")
    if not has_gb and not has_gib:
        raise SpecError(f"{where}.bandwidth_GBps", ABSENT,
                        "missing: give one of bandwidth_GBps (10^9 B/s) or bandwidth_GiBps "
                        "(2^30 B/s)")
    key = "bandwidth_GBps" if has_gb else "bandwidth_GiBps"
    # physically meaningful ranges, in the file's units (per device and direction)
    gb = _ranged(table, key, where, 1e-3, 1e5, "per device and direction")
    # (a user trial's 0 and a latency in seconds, 1.4e-5, had been taken: no link is that fast)
    latency = _ranged(table, "latency_us", where, 0.01, 1e6, "microseconds")
    name = name_of(table, where)
    return Level(
        name=name,
        size=_typed(table, "size", where, int),
        bandwidth=units.gbps(gb) if has_gb else units.gibps(gb),
        latency=latency * units.US,
        oversubscription=float(_typed(table, "oversubscription", where, _NUM, 1.0,
                                      advice=_ratio_advice)),
        efficiency=float(_typed(table, "efficiency", where, _NUM, 1.0)),
        efficiency_stated="efficiency" in table,
    )


def _level_where(table, i: int, where: str) -> str:
    """How errors name a [[levels]] table: by its name when it has a plain one, else its index."""
    name = table.get("name") if isinstance(table, dict) else None
    plain = isinstance(name, str) and name.isprintable() and 0 < len(name) <= 40
    return f"{where}.levels[{name if plain else i}]"


def cluster_from_table(table: dict, get_accelerator: Callable[[str], AcceleratorSpec],
                       where: str = "cluster") -> ClusterSpec:
    """Build a cluster; ``accelerator`` is a catalog name, an accelerator file's path (which
    ``get_accelerator`` resolves; the catalog reads it beside the cluster file) or an inline
    table (``base`` optional)."""
    if not table:
        raise SpecError(where, "an empty file", "a cluster file needs name, accelerator and "
                        "[[levels]] (see src/nestplan/catalog/clusters/*.toml)")
    check_keys(table, where, required={"name", "accelerator", "levels"},
               optional={"description", "devices_per_host"})
    acc = table["accelerator"]
    if isinstance(acc, str):
        accel = get_accelerator(acc)
    elif isinstance(acc, dict):
        base = get_accelerator(_typed(acc, "base", f"{where}.accelerator", str)) if "base" in acc else None
        inline = {k: v for k, v in acc.items() if k != "base"}
        if base is not None and inline and "name" not in inline:  # (a changed part is not the base)
            inline["name"] = f"{base.name} with " + ", ".join(
                f"{k} {v}" if isinstance(v, (int, float, str)) else f"its {k}"
                for k, v in sorted(inline.items()))
        accel = accelerator_from_table(inline, f"{where}.accelerator", base=base)
    else:
        raise SpecError(f"{where}.accelerator", acc, "must be a catalog name, a file path or an "
                        "[accelerator] table")
    levels = table["levels"]
    if not isinstance(levels, list) or not levels:
        raise SpecError(f"{where}.levels", levels, "must be a non-empty array of [[levels]] tables")
    _typed(table, "description", where, str)
    try:
        built = tuple(level_from_table(t, _level_where(t, i, where)) for i, t in enumerate(levels))
        return ClusterSpec(name=name_of(table, where), accelerator=accel, levels=built,
                           devices_per_host=_typed(table, "devices_per_host", where, int))
    except SpecError as e:  # the specs name levels[NAME]: say where the file holds it
        if e.field.startswith("levels["):
            raise SpecError(f"{where}.{e.field}", e.value, e.allowed) from None
        raise


# ----------------------------------------------------------------------------- model

_MODEL_REQUIRED = {"name", "layers", "hidden", "heads", "ffn_hidden", "vocab"}
_MODEL_OPTIONAL = {"kv_heads", "head_dim", "mlp", "norm", "bias", "qkv_bias", "dropout",
                   "tied_embeddings", "position", "max_positions", "causal", "qk_norm", "qk_l2_norm",
                   "attention_sinks", "moe", "mla", "local_span", "local_share", "mtp_layers",
                   "rope_mscale", "rope_theta", "rope_fraction", "glu_clamp", "yarn", "norm_eps",
                   "rope_scaling", "sliding_window", "local_layers", "trained_context"}
_MOE_KEYS = {"experts", "top_k", "ffn_hidden", "shared_experts", "shared_ffn_hidden",
             "shared_expert_gate", "first_dense_layers", "layer_freq", "layers", "expert_bias",
             "router_score", "router_pre_softmax", "router_expert_bias", "router_groups",
             "router_group_top_k", "router_scale", "scores_on_input", "aux_loss",
             "aux_loss_per_sequence"}
_MOE_TYPES = {"shared_expert_gate": bool, "expert_bias": bool, "router_pre_softmax": bool,
              "router_expert_bias": bool, "router_score": str, "router_scale": _NUM,
              "scores_on_input": bool, "aux_loss": _NUM, "aux_loss_per_sequence": bool}
"""Types of the [moe] keys that are not integers."""
_MLA_KEYS = {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"}
_YARN_KEYS = {f.name for f in dataclasses.fields(YarnSpec)}
_YARN_TYPES = {"original_max_positions": int, "round_to_int": bool}
"""Types of the [yarn] keys that are not numbers read as floats."""
_ROPE_SCALING_KEYS = {f.name for f in dataclasses.fields(RopeScaling)}
_SUB_TABLE_OF = {k: "moe" for k in _MOE_KEYS} | {k: "mla" for k in _MLA_KEYS} | {
    k: "yarn" for k in _YARN_KEYS - _MOE_KEYS - _MLA_KEYS} | {
    k: "rope_scaling" for k in _ROPE_SCALING_KEYS - _YARN_KEYS}
"""A key of a model's [moe], [mla], [yarn] or [rope_scaling] table -> that table."""


def _layer_list(table: dict, key: str, where: str, layers: int) -> tuple[int, ...]:
    """A list of layer indices of ``layers`` blocks (empty when absent)."""
    return layer_indices(f"{where}.{key}", _typed(table, key, where, list, []), layers)


def model_from_table(table: dict, where: str = "model") -> ModelSpec:
    misplaced = sorted(_SUB_TABLE_OF.keys() & table.keys() - _MODEL_REQUIRED - _MODEL_OPTIONAL) \
        if isinstance(table, dict) else []  # check_keys below refuses a non-table
    if misplaced:  # a sub-table's key at the top
        key = misplaced[0]
        raise SpecError(f"{where}.{key}", table[key], f"belongs in the [{_SUB_TABLE_OF[key]}] table")
    check_keys(table, where, required=_MODEL_REQUIRED, optional=_MODEL_OPTIONAL)
    ints = {k: _typed(table, k, where, int) for k in ("layers", "hidden", "heads", "ffn_hidden", "vocab")}
    heads = ints["heads"]
    moe = mla = yarn = None
    if "moe" in table:
        t = table["moe"]
        check_keys(t, f"{where}.moe", required={"experts", "top_k", "ffn_hidden"}, optional=_MOE_KEYS)
        if t.get("layers") == []:  # (it had read as every block MoE, the pattern's default)
            raise SpecError(f"{where}.moe.layers", [], "lists no MoE block: leave it out for "
                            "first_dense_layers and layer_freq's pattern, or drop [moe] for a "
                            "dense model")
        moe = MoESpec(**{k: _layer_list(t, k, f"{where}.moe", ints["layers"]) if k == "layers" else
                         _typed(t, k, f"{where}.moe", _MOE_TYPES.get(k, int)) for k in t})
    if "mla" in table:
        t = table["mla"]
        check_keys(t, f"{where}.mla", required=_MLA_KEYS, optional=set())
        mla = MLASpec(**{k: _typed(t, k, f"{where}.mla", int) for k in t})
    if "yarn" in table:
        t = table["yarn"]
        check_keys(t, f"{where}.yarn", required={"factor"}, optional=_YARN_KEYS)
        yarn = YarnSpec(**{k: _typed(t, k, f"{where}.yarn", _YARN_TYPES[k]) if k in _YARN_TYPES
                           else float(_typed(t, k, f"{where}.yarn", _NUM)) for k in t})
    scaling = None
    if "rope_scaling" in table:
        t = table["rope_scaling"]
        check_keys(t, f"{where}.rope_scaling", required={"kind", "factor"},
                   optional=_ROPE_SCALING_KEYS)
        scaling = RopeScaling(**{k: _typed(t, k, f"{where}.rope_scaling", str) if k == "kind" else
                                 _typed(t, k, f"{where}.rope_scaling", int)
                                 if k == "original_max_positions" else
                                 float(_typed(t, k, f"{where}.rope_scaling", _NUM)) for k in t})
    # a sliding window's cost follows from it and its layers (a file need not restate them)
    local = _layer_list(table, "local_layers", where, ints["layers"])  # (chunked attention's too)
    window = sliding_window_cost(_typed(table, "sliding_window", where, int, 0), local,
                                 ints["layers"])
    hidden = ints["hidden"]
    if "head_dim" not in table and heads > 0 and hidden > 0 and hidden % heads:
        raise SpecError(f"{where}.hidden", hidden, f"must be a multiple of heads = {heads} when "
                        "the file gives no head_dim (give head_dim for heads of another width)")
    return ModelSpec(
        name=name_of(table, where),
        **ints,
        kv_heads=_typed(table, "kv_heads", where, int, heads),
        head_dim=_typed(table, "head_dim", where, int, hidden // heads if heads else 0),
        mlp=MLPKind.parse(f"{where}.mlp", table.get("mlp", "gelu")),
        norm=Norm.parse(f"{where}.norm", table.get("norm", "layernorm")),
        bias=_typed(table, "bias", where, bool, True),
        qkv_bias=_typed(table, "qkv_bias", where, bool, False),
        dropout=_typed(table, "dropout", where, bool, False),
        tied_embeddings=_typed(table, "tied_embeddings", where, bool, False),
        position=Position.parse(f"{where}.position", table.get("position", "rope")),
        max_positions=_typed(table, "max_positions", where, int, 0),
        trained_context=_typed(table, "trained_context", where, int, 0),
        causal=_typed(table, "causal", where, bool, True),
        qk_norm=_typed(table, "qk_norm", where, bool, False),
        qk_l2_norm=_typed(table, "qk_l2_norm", where, bool, False),
        attention_sinks=_typed(table, "attention_sinks", where, bool, False),
        moe=moe,
        mla=mla,
        yarn=yarn,
        rope_scaling=scaling,
        local_span=_typed(table, "local_span", where, int, window["local_span"]),
        local_share=float(_typed(table, "local_share", where, _NUM, window["local_share"])),
        sliding_window=window["sliding_window"],
        local_layers=local,
        mtp_layers=_typed(table, "mtp_layers", where, int, 0),
        rope_mscale=float(_typed(table, "rope_mscale", where, _NUM,
                                 yarn.attention_factor if yarn and mla is None else 1.0)),
        rope_theta=float(_typed(table, "rope_theta", where, _NUM, DEFAULT_ROPE_THETA)),
        rope_fraction=float(_typed(table, "rope_fraction", where, _NUM, 1.0)),
        glu_clamp=float(_typed(table, "glu_clamp", where, _NUM, 0.0)),
        norm_eps=float(_typed(table, "norm_eps", where, _NUM, DEFAULT_NORM_EPS)),
    )


# ----------------------------------------------------------------------------- back to tables
# The inverse of the loaders above: specs to tables in the same file format (units in the keys),
# for plan files. ``x_from_table(x_to_table(spec)) == spec``.


def _clean(value: float) -> float:
    """Round away the last bits of a unit conversion (e.g. 80 GiB -> 80.00000000000001)."""
    return float(f"{value:.12g}")


def accelerator_to_table(acc: AcceleratorSpec) -> dict:
    table = {
        "name": acc.name,
        "peak_tflops_bf16": _clean(acc.peak_flops_bf16 / units.TFLOPS),
        "hbm_GiB": _clean(acc.hbm_bytes / units.GiB),
        "hbm_GBps": _clean(acc.hbm_bandwidth / units.GB),
        "matmul_efficiency_bf16_by_GFLOP": [[_clean(f / 1e9), e] for f, e in acc.matmul_efficiency_bf16],
        "attention_efficiency": list(acc.attention_efficiency),
        "memory_efficiency": acc.memory_efficiency,
        "kernel_overhead_us": _clean(acc.kernel_overhead / units.US),
    }
    if acc.sustained_share != 1.0:
        table["sustained_share"] = acc.sustained_share
    if acc.unmasked_attention_gain != UNMASKED_ATTENTION_GAIN:
        table["unmasked_attention_gain"] = acc.unmasked_attention_gain
    if acc.compute_capability is not None:
        table["compute_capability"] = acc.compute_capability
    if acc.fitted_on:
        table["fitted_on"] = list(acc.fitted_on)
    if acc.peak_flops_fp8 is not None:
        table["peak_tflops_fp8"] = _clean(acc.peak_flops_fp8 / units.TFLOPS)
        table["matmul_efficiency_fp8_by_GFLOP"] = [[_clean(f / 1e9), e]
                                                   for f, e in acc.matmul_efficiency_fp8]
    return table


def cluster_to_table(cluster: ClusterSpec) -> dict:
    levels = []
    for lv in cluster.levels:
        t = {"name": lv.name, "bandwidth_GBps": _clean(lv.bandwidth / units.GB),
             "latency_us": _clean(lv.latency / units.US), "oversubscription": lv.oversubscription,
             "efficiency": lv.efficiency}
        if lv.size is not None:
            t["size"] = lv.size
        levels.append(t)
    return {"name": cluster.name, "accelerator": accelerator_to_table(cluster.accelerator),
            "levels": levels, **({"devices_per_host": cluster.devices_per_host}
                                 if cluster.devices_per_host is not None else {})}


def model_to_table(model: ModelSpec) -> dict:
    table = {f: getattr(model, f) for f in (
        "name", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab", "bias",
        "dropout", "tied_embeddings", "max_positions", "causal")}
    for kind in ("qkv_bias", "qk_norm", "qk_l2_norm", "attention_sinks"):
        if getattr(model, kind):  # (only where set, as files of before them were)
            table[kind] = True
    if model.trained_context:  # (likewise)
        table["trained_context"] = model.trained_context
    table.update(mlp=model.mlp.value, norm=model.norm.value, position=model.position.value)
    if model.moe is not None:
        table["moe"] = {f: getattr(model.moe, f) for f in sorted(_MOE_KEYS - {"layers"})}
        if model.moe.layers:  # (only where set, as files of before it were)
            table["moe"]["layers"] = list(model.moe.layers)
    if model.mla is not None:
        table["mla"] = {f: getattr(model.mla, f) for f in sorted(_MLA_KEYS)}
    if model.local_span:
        table.update(local_span=model.local_span, local_share=model.local_share)
    if model.sliding_window:
        table["sliding_window"] = model.sliding_window
    if model.local_layers:
        table["local_layers"] = list(model.local_layers)
    if model.mtp_layers:
        table["mtp_layers"] = model.mtp_layers
    if model.rope_mscale != 1.0:
        table["rope_mscale"] = model.rope_mscale
    if model.yarn is not None:
        table["yarn"] = {f: getattr(model.yarn, f) for f in sorted(_YARN_KEYS)}
    if model.rope_scaling is not None:  # (every field, so that the table reads back the same)
        table["rope_scaling"] = {f.name: getattr(model.rope_scaling, f.name)
                                 for f in dataclasses.fields(RopeScaling)}
    if model.position is Position.ROPE:  # its base, the default 10,000 too
        table["rope_theta"] = model.rope_theta
    if model.rope_fraction != 1.0:
        table["rope_fraction"] = model.rope_fraction
    if model.glu_clamp:
        table["glu_clamp"] = model.glu_clamp
    table["norm_eps"] = model.norm_eps  # the default too (an auditor's model file, begun from
    # list's output, could not see the epsilon it would train with)
    return table


TRAINING_KEYS = {"seq_len", "global_batch", "precision", "attention_span", "moe_imbalance",
                 "moe_capacity"}
"""Keys of a training (workload) table; how a framework runs it is the stack's."""


def training_to_table(tr) -> dict:
    table = {"seq_len": tr.seq_len, "global_batch": tr.global_batch,
             "precision": tr.precision.value}
    if tr.attention_span is not None:
        table["attention_span"] = tr.attention_span
    if tr.moe_imbalance != 1.0:
        table["moe_imbalance"] = tr.moe_imbalance
    if tr.moe_capacity is not None:
        table["moe_capacity"] = tr.moe_capacity
    return table


def training_from_table(table: dict, where: str = "training"):
    from .options import Precision
    from .specs import TrainingSpec

    check_keys(table, where, required={"seq_len", "global_batch"}, optional=TRAINING_KEYS)
    kw: dict[str, Any] = {k: _typed(table, k, where, int) for k in ("seq_len", "global_batch")}
    if "attention_span" in table:
        kw["attention_span"] = _typed(table, "attention_span", where, int)
    for key in ("moe_imbalance", "moe_capacity"):
        if key in table:
            kw[key] = float(_typed(table, key, where, _NUM))
    if "precision" in table:
        kw["precision"] = Precision.parse(f"{where}.precision", table["precision"])
    try:
        return TrainingSpec(**kw)
    except SpecError as e:  # named by the file's key under its table
        raise SpecError(f"{where}.{e.field}", e.value, e.allowed) from None


# ----------------------------------------------------------------------------- stack

def _list(value, where: str, kind: type | tuple = str) -> list:
    if not isinstance(value, list) or not all(
            isinstance(x, kind) and not isinstance(x, bool) for x in value):
        raise SpecError(where, value, f"must be a list of {kind_words(kind, plural=True)}")
    return value


def _as_float(value, where: str) -> float:
    """A list item read as a float (an integer too large for one is refused)."""
    if not finite(value) and isinstance(value, int):
        raise SpecError(where, value, "must be a number a float can hold")
    return float(value)


_STACK_FIELD_OF = {"reserved_GiB": "reserved_bytes", "step_overhead_s": "step_overhead",
                   "kernel_overhead_us": "kernel_overhead", "moe_layer_host_ms": "moe_layer_host"}
"""File keys that carry a unit, and the StackSpec field (SI) each sets; other keys are fields."""


def _stack_fields() -> dict:
    """File key -> (StackSpec field, type(s) in the file, file to spec, spec to file). Loading and
    saving both read this one table, so the file format is written out once."""
    from .options import AttentionImpl, TPOverlap

    def plain(kind):
        return kind, lambda v, where: v, lambda v: v

    def number(unit: float = 1.0):
        if unit == 1.0:
            return _NUM, lambda v, where: float(v), lambda v: v
        return _NUM, lambda v, where: v * unit, lambda v: _clean(v / unit)

    def choice(enum):
        return str, lambda v, where: enum.parse(where, v), lambda v: v.value

    def listed(kind=str, item=lambda x, where: x, back=lambda x: x):
        return (list, lambda v, where: tuple(item(x, where) for x in _list(v, where, kind)),
                lambda v: [back(x) for x in v])

    keys = {
        "name": (str, checked_name, lambda v: v),
        **{k: plain(str) for k in ("description", "export_format",
                                  "default_recompute", "cp_exchange", "moe_dispatcher",
                                  "interleaved_rounds", "moe_overlap", "cuda_graphs")},
        **{k: plain(bool) for k in ("fused_norm", "fused_gated_mlp", "norm_in_linear",
                                    "cp_gathers_windows", "cp_shards_weights",
                                    "overlap_grad_reduce", "delay_wgrad",
                                    "overlap_param_gather", "optimizer_gather_waits", "zero_grad_allreduce",
                                    "overlap_p2p", "p2p_overlap_needs_interleaving",
                                    "flat_dp_collectives",
                                    "gather_whole_block", "recompute_per_stage", "default_sp",
                                    "fp8_param_gather", "fp8_tp_gather", "gpt_tied_embeddings",
                                    "fp8_primary_weights",
                                    "moe_pad_to_capacity", "multi_token_prediction", "mixture_of_experts",
                                    "experts_over_sharded_ranks", "expert_tp_with_ep",
                                    "expert_layer_injected", "expert_tp_with_bias", "qkv_views",
                                    "tp_keeps_gathered_input", "scores_in_activation",
                                    "pipeline_defers_grad_sync", "pipeline_bf16_optimizer",
                                    "moe_syncs_without_ep", "tp_beyond_kv_heads",
                                    "pipeline_tied_embeddings", "per_op_saves_all_to_all")},
        **{k: plain(int) for k in ("weight_bytes", "master_bytes", "grad_bytes",
                                   "loss_saved_bytes", "loss_transient_bytes", "max_zero_with_pp",
                                   "expert_combine_bytes", "default_zero", "loss_chunks")},
        "default_zero_with_pp": plain(int),
        **{k: number() for k in ("allocator_overhead", "matmul_scale", "attention_scale",
                                 "memory_scale", "overlap_efficiency", "step_overhead_s",
                                 "attention_host_share", "fp8_weight_cache_bytes")},
        "reserved_GiB": number(units.GiB),
        "kernel_overhead_us": number(units.US),
        "moe_layer_host_ms": number(units.MS),
        "attention": choice(AttentionImpl),
        "tp_overlap": choice(TPOverlap),
        "tp_overlap_beyond_domain": choice(TPOverlap),
        "recompute": ((list, dict), _recompute_from_file, _recompute_to_file),
        "schedules": listed(),
        "schedules_min_pp_micro": listed(),
        "cuda_graph_modules": listed(),
        "mtp_without": listed(),
        "eager_ops": listed(),
        "zero_stages": listed(int),
        "axes": listed(),
        "network_scale": listed(_NUM, item=_as_float),
        "fitted_on": listed(),
        "fitted_seq_len": listed(int),
        "fitted_accelerators": listed(),
        "fitted_gpus": listed(int),
        "fitted_kinds": listed(),
    }
    return {key: (_STACK_FIELD_OF.get(key, key), *spec) for key, spec in keys.items()}


def _recompute_from_file(value, where: str):
    """``recompute``: a list of standard policy names, or a table of name = rule."""
    from .recompute import Policy, parse_rule, standard

    if isinstance(value, list):
        return standard(where, _list(value, where, str))
    if not value:
        raise SpecError(where, {}, "name at least the policy none")
    return tuple(Policy(str(name), parse_rule(f"{where}.{name}", rule))
                 for name, rule in value.items())


def _recompute_to_file(policies):
    from .recompute import STANDARD

    if all(STANDARD.get(p.name) == p.rule for p in policies):
        return [p.name for p in policies]
    return {p.name: p.rule for p in policies}


STACK_ONLY_KEYS = {"base", "runs_source"}
"""Keys of a stack file that are not fields: its base, and which runs-CSV sources it ran."""


def stack_from_table(table: dict, where: str = "stack", base=None):
    """Build a stack; with ``base`` (a StackSpec), keys missing from ``table`` keep its values.
    ``base`` and ``runs_source`` are read by the catalog, not here."""
    from dataclasses import replace

    from .stack import StackSpec

    if not isinstance(table, dict):
        raise SpecError(where, table, "must be a table")
    fields = _stack_fields()
    table = renamed_stack_keys(table, where)
    check_keys(table, where, required=set() if base is not None else {"name"},
               optional=set(fields) | STACK_ONLY_KEYS)
    if "runs_source" in table:  # read by the catalog; checked here for every file
        _list(table["runs_source"], f"{where}.runs_source", str)
    from .stack import CHOICES

    kw: dict[str, Any] = {}
    for key, (field, kind, load, _) in fields.items():
        if key in table:
            if key in CHOICES and not isinstance(table[key], str):
                raise SpecError(f"{where}.{key}", table[key],
                                "must be one of " + ", ".join(CHOICES[key]))
            kw[field] = load(_typed(table, key, where, kind), f"{where}.{key}")
    if base is not None and "default_zero" in kw and "default_zero_with_pp" not in kw:
        kw["default_zero_with_pp"] = None  # (a file's own default holds under PP too)
    try:
        return replace(base, **kw) if base is not None else StackSpec(**kw)
    except SpecError as e:  # name the file's key, not the field
        key = e.field.removeprefix("stack.")
        raise SpecError(f"{where}.{key}", e.value, e.allowed) from None


LATER_STACK_KEYS = ("tp_overlap_beyond_domain", "tp_keeps_gathered_input", "interleaved_rounds",
                    "expert_layer_injected", "fp8_weight_cache_bytes", "fp8_primary_weights",
                    "norm_in_linear", "cp_gathers_windows", "cp_shards_weights",
                    "moe_syncs_without_ep", "tp_beyond_kv_heads", "pipeline_tied_embeddings",
                    "mtp_without", "per_op_saves_all_to_all", "optimizer_gather_waits",
                    "zero_grad_allreduce", "p2p_overlap_needs_interleaving")
"""Stack keys added after whole stack tables (plan files' stacks, stack files without a base)
were first written. One that lacks them is read by ``later_keys_filled``. (Not the keys a stack
may leave unset, which a table then lacks: ``default_zero_with_pp``.)"""
TORCHTITAN_LATER_KEYS = ("tp_overlap_beyond_domain", "tp_keeps_gathered_input",
                         "cp_shards_weights", "moe_syncs_without_ep", "default_zero_with_pp",
                         "tp_beyond_kv_heads", "pipeline_tied_embeddings", "mtp_without",
                         "per_op_saves_all_to_all")
"""The later keys whose absence a torchtitan stack of the user's own name reads as torchtitan
does: async TP only within one NVLink domain, the sequence-parallel linears' gathered input
kept, weights sharded over CP ranks, no MoE host wait at EP 1, ZeRO-2 by default under PP, TP
within the KV heads, no pipeline for tied embeddings. Its interleaving keeps the default,
rounds of pp, which every stack ran then."""


FRAMEWORK_LATER_KEYS = {
    "torchtitan": TORCHTITAN_LATER_KEYS,
    "megatron": ("p2p_overlap_needs_interleaving",),
    "deepspeed": ("optimizer_gather_waits", "zero_grad_allreduce")}
"""Per export format, the later keys whose absence a stack of the user's own name of that format
reads as the format's catalog stack (``stack.FORMAT_STACKS``) has them: torchtitan's (above),
megatron-core's sends without interleaving, DeepSpeed's ZeRO-1/2 step (found in the frameworks'
code on 2026-12-06)."""


LATER_ACCELERATOR_KEYS = ("compute_capability", "fitted_on")
"""Accelerator keys added after accelerator tables (plan files' inline ones) were first written."""


def accelerator_later_keys_filled(table):
    """An accelerator ``table`` written before keys of ``LATER_ACCELERATOR_KEYS`` existed, named as
    a catalog accelerator (a plan file's), with that accelerator's values for them (a file saved
    before had been called "not this nestplan's catalog" for the key alone); else ``table``."""
    from .catalog import get_accelerator, list_names

    if not isinstance(table, dict) or table.get("name") not in list_names("accelerators"):
        return table
    known = accelerator_to_table(get_accelerator(table["name"]))
    filled = {k: known[k] for k in LATER_ACCELERATOR_KEYS if k not in table and k in known}
    return {**table, **filled} if filled else table


def later_keys_filled(table):
    """A whole stack ``table`` (no base) written before keys of ``LATER_STACK_KEYS`` existed, with
    them filled in: named as a catalog stack (a plan file's), that stack's values (its plan runs
    as it did, and the stack is the catalog's); exported as torchtitan's, torchtitan's values of
    ``TORCHTITAN_LATER_KEYS``; exported as Megatron-LM's or DeepSpeed's, ``FRAMEWORK_LATER_KEYS``
    as that framework runs, and for DeepSpeed's ``expert_layer_injected`` as its export then read
    it (no TP axis); any other keeps the defaults, which every stack had then (no fp8 weight
    copies counted, none asked for in an export)."""
    if not isinstance(table, dict) or "base" in table or set(LATER_STACK_KEYS) <= table.keys():
        return table
    from .catalog import get_stack, list_names
    from .stack import FORMAT_STACKS

    if table.get("name") in list_names("stacks"):
        source, keys = get_stack(table["name"]), LATER_STACK_KEYS
    elif (fmt := table.get("export_format")) in FRAMEWORK_LATER_KEYS:  # (a review: a copy of
        # megatron-core saved before had hidden its vp-1 sends)
        if fmt == "deepspeed" and "expert_layer_injected" not in table:
            # its export had written AutoEP's section for a stack without a TP axis
            table = {**table, "expert_layer_injected": "tp" not in table.get("axes", ["tp"])}
        source, keys = get_stack(FORMAT_STACKS[fmt]), FRAMEWORK_LATER_KEYS[fmt]
    else:
        return table
    fill = stack_to_table(source)
    return {**{k: fill[k] for k in keys if k in fill and k not in table}, **table}


def renamed_stack_keys(table: dict, where: str) -> dict:
    """Stack tables written before ``cuda_graphs`` replaced ``full_iteration_cuda_graph``, read
    as they were meant (keys added later: ``later_keys_filled``)."""
    if "full_iteration_cuda_graph" not in table:
        return table
    table = dict(table)
    old = _typed(table, "full_iteration_cuda_graph", where, bool)
    del table["full_iteration_cuda_graph"]
    if "cuda_graphs" in table:
        raise SpecError(f"{where}.full_iteration_cuda_graph", old,
                        "give cuda_graphs only (it replaced full_iteration_cuda_graph)")
    table["cuda_graphs"] = "full_iteration" if old else "none"
    return table


def stack_to_table(stack) -> dict:
    """A stack as a complete file table (no base): ``stack_from_table`` gives it back."""
    out = {}
    for key, (field, _, _, save) in _stack_fields().items():
        value = getattr(stack, field)
        if value is not None:
            out[key] = save(value)
    return out
