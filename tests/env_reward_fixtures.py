"""An environment for tests/test_env_reward.py: it pays by the length of the first turn."""

from __future__ import annotations

from posttrain.env import EnvStep


class LengthPaid:
    """Ends after the first turn with a reward of 0.1 per character (varies within a group)."""

    def reset(self, item):
        return [{"role": "user", "content": item["prompt"]}]

    def step(self, messages):
        return EnvStep(done=True, reward=0.1 * (1 + len(messages[-1]["content"])))


def length_paid() -> LengthPaid:
    return LengthPaid()
