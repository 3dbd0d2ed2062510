"""Reward functions for tests/test_rft.py: a deterministic rule of the text, and one that fails."""

from __future__ import annotations


def digit_first(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """1 when the completion starts with a digit (about half a random arithmetic model's)."""
    return 1.0 if completion[:1].isdigit() else 0.0


def raises(prompt: str, completion: str, answer: str, meta: dict) -> float:
    raise ValueError("the scorer is broken")
