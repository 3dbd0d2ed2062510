"""In-process placement (the default): every role lives in the driver process.

The rollout role samples with the policy's own module, so weight sync copies nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from posttrain.config import ConfigError
from posttrain.placement.roles import (
    ObjectiveBuilder,
    PolicyRole,
    RewardRole,
    RolloutRole,
    resolve,
)


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
    ranks = resolve(config_path, opts).placement.policy_ranks
    if ranks != 1:
        raise ConfigError(
            f"placement.policy_ranks={ranks} needs placement.backend=ray (in-process placement "
            "runs one policy rank)"
        )
    policy = PolicyRole(config_path, opts, build_objective_fn, run_dir)
    rollout = RolloutRole(config_path, opts, model=policy.model)
    return LocalRoles(policy, rollout, RewardRole(config_path, opts))
