"""Rows and pairs from a policy's own scored samples (rejection sampling, "RFT"): torch-free.

One prompt's ``n`` samples, each scored correct or not (``posttrain rft``: the verifier's 1.0,
or a total reward at least a threshold), become:

- **SFT rows**: its correct samples, in sample order, each distinct text once (unless
  duplicates are kept), at most ``per_prompt`` of them;
- **preference pairs**: the ``i``-th correct sample against the ``i``-th incorrect one (both
  lists in sample order, each distinct text once unless duplicates are kept), for ``i`` below
  ``min(correct, incorrect, per_prompt)``; so every sample enters at most one pair, a prompt
  whose samples are all correct or all incorrect gives none, and a pair never holds one text
  twice.

Rows are written in the formats the readers take (``data/sft.py``, ``data/lmdpo.py``): with
``data.prompt_template=plain`` a ``prompt``/``completion`` row and a ``prompt`` pair (the reader
renders ``BOS + prompt``, as the rollout encoded it); with ``chat`` the template's conversation
before the answer (``chat_messages``: the system message and the question) as ``messages``, so
either reader renders the very prompt the policy was sampled with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.config.sections import DataConfig
from posttrain.data.tasks.base import TaskItem
from posttrain.data.tasks.prompts import chat_messages, question_text


@dataclass(frozen=True)
class Sample:
    """One scored sample of a prompt: its text, whether it counts as correct, its reward."""

    text: str
    correct: bool
    reward: float


@dataclass(frozen=True)
class Selection:
    """What one prompt's samples give: SFT completions and (chosen, rejected) texts, and how
    many correct samples the deduplication left out."""

    rows: list[str]
    pairs: list[tuple[str, str]]
    duplicates: int


def select(samples: Sequence[Sample], per_prompt: int | None, dedup: bool) -> Selection:
    """The rows and pairs of one prompt's ``samples`` by the module's rule (``per_prompt``
    None: no cap)."""
    correct = [s.text for s in samples if s.correct]
    wrong = [s.text for s in samples if not s.correct]
    duplicates = 0
    if dedup:
        distinct = list(dict.fromkeys(correct))
        duplicates = len(correct) - len(distinct)
        correct, wrong = distinct, list(dict.fromkeys(wrong))
    cap = len(samples) if per_prompt is None else per_prompt
    pairs = [(c, w) for c, w in zip(correct, wrong, strict=False) if c != w][:cap]
    return Selection(correct[:cap], pairs, duplicates)


def prompt_fields(item: TaskItem, data: DataConfig) -> dict[str, Any]:
    """The prompt part of a row or pair for ``item``: what the rollout was prompted with, in the
    form the SFT and LM DPO readers render back to it (module doc)."""
    if data.prompt_template == "plain":
        return {"prompt": question_text(item, data.user_template)}
    messages = chat_messages(item, system_prompt=data.system_prompt,
                             user_template=data.user_template)  # fmt: skip
    return {"messages": messages}


def sft_row(prompt: dict[str, Any], completion: str) -> dict[str, Any]:
    """One SFT row (``posttrain sft``'s format) from :func:`prompt_fields` and an answer."""
    if "prompt" in prompt:
        return {"prompt": prompt["prompt"], "completion": completion}
    return {"messages": [*prompt["messages"], {"role": "assistant", "content": completion}]}


def pair_row(prompt: dict[str, Any], chosen: str, rejected: str) -> dict[str, Any]:
    """One preference pair (``posttrain lmdpo``'s format)."""
    return {**prompt, "chosen": chosen, "rejected": rejected}


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate that at least one of ``k`` of the ``n`` samples is correct when
    ``c`` are (Chen et al., 2021): ``1 - C(n - c, k) / C(n, k)``."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def pass_at(n: int, correct_counts: Sequence[int]) -> dict[str, float]:
    """``pass@k`` over prompts for ``k`` = 1, 2, 4, ... up to ``n`` and ``n`` itself."""
    ks = sorted({*(2**j for j in range(n.bit_length()) if 2**j <= n), n})
    m = max(len(correct_counts), 1)
    return {str(k): sum(pass_at_k(n, c, k) for c in correct_counts) / m for k in ks}


__all__ = [
    "Sample",
    "Selection",
    "pair_row",
    "pass_at",
    "pass_at_k",
    "prompt_fields",
    "select",
    "sft_row",
]
