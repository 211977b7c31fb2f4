"""Project errors. User mistakes raise these; the CLI turns them into exit codes."""


class NestplanError(Exception):
    """Base class of every error nestplan raises on purpose."""


class SpecError(NestplanError, ValueError):
    """Invalid user input: names the field, the value and what is allowed, and may add advice
    (what to give instead), which the message ends with."""

    def __init__(self, field: str, value: object, allowed: str, advice: str = ""):
        self.field = field
        self.value = value
        self.rule = allowed
        """What is allowed, without the advice (a reason that holds where the advice does not:
        a measured run that another stack cannot run)."""
        self.advice = advice
        self.allowed = f"{allowed}; {advice}" if advice else allowed
        if value is ABSENT:  # (no value to show: "got null" had read as if the user wrote one)
            super().__init__(f"{field}: {self.allowed}")
            return
        shown = _shown(value)
        if len(shown) > MAX_SHOWN:  # a pasted file or a 400-digit number: its two ends
            shown = f"{shown[:MAX_SHOWN // 2]}…{shown[-MAX_SHOWN // 2:]} ({len(shown)} characters)"
        super().__init__(f"{field}: got {shown}; {self.allowed}")


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()
"""The value of a field that was not given at all: its SpecError shows no value, only the rule
(which says it is missing)."""


MAX_SHOWN = 100
"""Characters of a bad value an error shows."""


def _shown(value: object) -> str:
    """A bad value as the user wrote it: Python's repr, but a TOML date or time as TOML spells
    it (repr had shown ``datetime.date(1979, 5, 27)``), and true, false and null as TOML and JSON
    spell them (repr had shown Python's ``True`` and ``None``)."""
    import datetime
    import json

    if isinstance(value, (datetime.date, datetime.time)):
        return f"{value.isoformat()} (a TOML date or time)"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return repr(value)


class InfeasibleError(NestplanError):
    """No plan satisfies the constraints (for example, nothing fits in memory)."""

    def __init__(self, reason: str, details: dict | None = None):
        super().__init__(reason)
        self.details = details or {}
        """What ``--json`` prints beside the reason (e.g. ``compare``'s error per method)."""


class UsageError(NestplanError):
    """A command given without what it needs (exit code 2, like SpecError)."""


class Note(UserWarning):
    """Something the user should know about how the input was read (not an error); the CLI
    prints it on stderr as ``nestplan: note: ...`` once the command has run (``flush_notes``),
    and not at all when the command then fails on bad input (its error stays one line)."""


def note(message: str | None) -> None:
    """Raise ``message`` as a :class:`Note` (printed once the command has run); None, as the
    ``*_text`` functions give where they have nothing to say, raises nothing."""
    import warnings

    if message:
        warnings.warn(message, Note, stacklevel=3)


def note_no_experts(stated: str, model: str) -> None:
    """Note that an expert load ``stated`` (flags, a row's entries, a plan file's keys) is ignored,
    ``model`` having no experts."""
    note(f"{stated}: {model} has no experts; ignored")


PENDING_NOTES: list[str] = []
"""Notes raised and not yet printed (the CLI's warning hook gathers them)."""


def flush_notes() -> None:
    """Print the pending notes on stderr, each once; a command that then works for long (a sweep)
    calls it once its input has been read."""
    for line in dict.fromkeys(PENDING_NOTES):
        say(line)
    PENDING_NOTES.clear()


def say(line: str, end: str = "\n") -> None:
    """Print ``line`` on stderr; where stderr is a closed pipe (its reader gone: ``2>&1 | head``)
    say nothing more, as a closed stdout ends a command's output, and leave the command's exit
    code as it is (a user trial's ``2>&1 >/dev/null | true`` had exited 1 on its notes). Every
    line a command writes on stderr goes through here: a line printed directly had raised the
    broken pipe that ends a command whose stdout is closed (a sweep's note before its summary's
    "wrote" line had ended it at exit 0 without that line; a search's progress line, before its
    result)."""
    import os
    import sys

    try:
        print(line, end=end, file=sys.stderr, flush=True)
    except BrokenPipeError:
        try:
            sys.stderr = open(os.devnull, "w")
        except OSError:
            pass
