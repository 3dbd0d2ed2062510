"""Reading the final answer out of a completion, and the answer-format check.

Completions are the decoded response text with special tokens skipped, so the text ends where the
policy emitted EOS (or hit the length bound).

:func:`extract_answer` looks, in order, for the last ``\\boxed{...}`` (the format the chat system
prompt asks for), the last ``<answer>...</answer>`` (reasoning-gym's convention), the last
``#### N`` line (GSM8K's), and otherwise takes the completion's first line -- what a tiny model
prompted with ``"12+7="`` writes before its newline or EOS.
"""

from __future__ import annotations

import re

_BOXED = "\\boxed{"
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def boxed_contents(text: str) -> tuple[list[str], int]:
    """Contents of every complete ``\\boxed{...}`` (braces balanced), and how many were opened.

    An opened-but-unclosed box (a truncated completion) counts as opened, not as content.
    """
    found: list[str] = []
    opened = 0
    start = text.find(_BOXED)
    while start != -1:
        opened += 1
        i = start + len(_BOXED)
        depth = 1
        j = i
        while j < len(text) and depth:
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
            j += 1
        if depth == 0:
            found.append(text[i : j - 1])
        start = text.find(_BOXED, j)
    return found, opened


def marked_answer(completion: str) -> str | None:
    """The answer the completion marks (box, answer tag or ``####``), stripped; None if none."""
    boxed, _ = boxed_contents(completion)
    if boxed:
        return boxed[-1].strip()
    tags = _ANSWER_TAG.findall(completion)
    if tags:
        return tags[-1].strip()
    if "####" in completion:
        return completion.rsplit("####", 1)[1].split("\n", 1)[0].strip()
    return None


def extract_answer(completion: str) -> str:
    """The completion's final answer text, stripped (see the module docstring for the order)."""
    marked = marked_answer(completion)
    return marked if marked is not None else completion.split("\n", 1)[0].strip()


def last_number(text: str) -> str | None:
    """The last integer or decimal written in ``text``, sign kept and thousands commas dropped
    (``1,234`` -> ``1234``), or None if there is none."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def follows_format(completion: str) -> bool:
    """True when the completion gives exactly one complete, non-empty ``\\boxed{}`` answer."""
    boxed, opened = boxed_contents(completion)
    return opened == 1 and len(boxed) == 1 and bool(boxed[0].strip())
