"""Configuration errors: one class family, each message a single line naming the key.

Every user mistake in a config (bad value, unknown key, retired key, preflight violation) raises a
:class:`ConfigError`. The CLI prints ``str(error)`` and exits 2, so the message must stand alone.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem the user must fix; ``str()`` is one line that names the key."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class UnknownKeyError(ConfigError):
    """A key that is not in the schema (the message suggests the nearest valid key)."""


class RetiredKeyError(ConfigError):
    """A key that used to exist; the message gives its exact replacement."""


class ConfigValueError(ConfigError):
    """A value that fails its field's type or range."""


class RecipeError(ConfigError):
    """A recipe file that is missing, does not load, or has no builder."""
