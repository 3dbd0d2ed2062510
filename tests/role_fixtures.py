"""Reward functions and environments that test runs name by reference
(``reward.functions=[role_fixtures:digit_reward]``, ``env.name=role_fixtures:chatty``).

A role imports the module a reference names, and under Ray that is a fresh actor process each
run: a test module there would bring pytest, its helpers and transformers' modeling into every
reward actor (~2 s of CPU per start, some twenty starts a suite). This module imports the
standard library and posttrain's environment types only (``test_role_imports`` checks it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from posttrain.env import EnvStep


def digit_reward(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """Varies across an untrained model's samples, so every step has non-zero advantages."""
    return float(sum(c.isdigit() for c in completion))


def slow_digit_reward(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """:func:`digit_reward`, slow enough with ``LAG_TEST_SLOW_REWARD`` set (in the driver a test
    kills) that a step lasts ~0.5 s, so the kill lands mid-run; the value never depends on it."""
    if os.environ.get("LAG_TEST_SLOW_REWARD"):
        time.sleep(0.03)
    return digit_reward(prompt, completion, answer, meta)


def length_reward(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """A reward that varies within a group (so advantages, and the loss, are not zero)."""
    return float(len(completion) % 3)


def some_groups_reward(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """:func:`length_reward` on about half the prompts, 0 on the rest: uninformative groups, so
    dynamic sampling samples more rounds."""
    return length_reward(prompt, completion, answer, meta) if len(answer) % 2 else 0.0


class Chatty:
    """Answers every assistant turn with a short user turn until ``env.max_turns`` cuts it:
    every trajectory is multi-turn, whatever a random policy samples. It counts its nudges, a
    custom info key (published as ``env/nudges_mean``)."""

    info_keys = ("nudges",)

    def reset(self, item):
        return [{"role": "user", "content": item["prompt"]}]

    def step(self, messages):
        return EnvStep([{"role": "user", "content": "more"}], info={"nudges": 1})


def chatty() -> Chatty:
    return Chatty()


class PidChatty(Chatty):
    """:class:`Chatty` that notes the process it answers turns in, at each step, in the folder
    ``mt_pids`` of its working directory when there is one (a Ray actor works in its driver's
    directory, whichever Ray instance it joined). Steps, not resets: preflight resets an
    environment in the driver to measure its opening prompt, but never steps one."""

    def step(self, messages):
        where = Path("mt_pids")
        if where.is_dir():
            (where / f"{os.getpid()}").write_text("env")
        return super().step(messages)


def pid_chatty() -> PidChatty:
    return PidChatty()


class ReservedInfo(Chatty):
    """Declares an info key the driver reserves (preflight refuses it)."""

    info_keys = ("nudges", "turns")


def reserved_info() -> ReservedInfo:
    return ReservedInfo()
