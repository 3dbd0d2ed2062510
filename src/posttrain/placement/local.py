"""In-process placement (the default): every role lives in the driver process.

The rollout role samples with the policy's own module, so weight sync copies nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from posttrain.placement.roles import ObjectiveBuilder, PolicyRole, RewardRole, RolloutRole


@dataclass
class LocalRoles:
    policy: PolicyRole
    rollout: RolloutRole
    reward: RewardRole

    def sync_weights(self) -> int:
        """After an update: the engine holds the policy module itself, nothing travels."""
        return self.rollout.sync(self.policy.model)

    def close(self) -> None:
        pass


def place_local(
    config_path: str, opts: Sequence[str], build_objective_fn: ObjectiveBuilder, run_dir: str
) -> LocalRoles:
    policy = PolicyRole(config_path, opts, build_objective_fn, run_dir)
    rollout = RolloutRole(config_path, opts, model=policy.model)
    return LocalRoles(policy, rollout, RewardRole(config_path, opts))
