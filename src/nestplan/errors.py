"""Project errors. User mistakes raise these; the CLI turns them into exit codes."""


class NestplanError(Exception):
    """Base class of every error nestplan raises on purpose."""


class SpecError(NestplanError, ValueError):
    """Invalid user input: names the field, the value and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: got {value!r}; {allowed}")


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
    prints it on stderr as ``nestplan: note: ...``."""
