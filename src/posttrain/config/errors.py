"""Configuration errors: one class family, each message a single line naming the key.

Every user mistake in a config (bad value, unknown key, retired key, preflight violation) raises a
:class:`ConfigError`. The CLI prints ``str(error)`` and exits 2, so the message must stand alone.
"""

from __future__ import annotations

from collections.abc import Iterable


def listing(message: str, label: str, choices: Iterable[str]) -> tuple[str, str]:
    """``(message + "; label: a, b, c", "label: a, b, c")``: a message that ends with the valid
    choices, and that closing list, which the one-line report keeps whole however long
    (``run.guard.one_line`` cuts only the text before it). An error stores the list as its
    ``choices`` attribute."""
    tail = f"{label}: " + ", ".join(choices)
    return f"{message}; {tail}", tail


class ConfigError(ValueError):
    """A configuration problem the user must fix; ``str()`` is one line that names the key.

    ``choices`` (with ``label``) ends the message with the valid values, kept whole in reports.
    """

    def __init__(
        self, message: str, choices: Iterable[str] | None = None, label: str = "choose one of"
    ) -> None:
        self.choices = ""
        if choices is not None:
            message, self.choices = listing(message, label, choices)
        super().__init__(" ".join(message.split()))


class UnknownKeyError(ConfigError):
    """A key that is not in the schema (the message suggests the nearest valid key)."""


class RetiredKeyError(ConfigError):
    """A key that used to exist; the message gives its exact replacement."""


class ConfigValueError(ConfigError):
    """A value that fails its field's type or range."""


class RecipeError(ConfigError):
    """A recipe file that is missing, does not load, or has no builder."""
