"""Errors a user fixes by pointing at a different (or repaired) model or tokenizer folder."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A model or tokenizer folder is missing, incomplete or damaged; the message names it."""
