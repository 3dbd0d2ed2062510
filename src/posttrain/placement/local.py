"""In-process placement (the default): every role lives in the driver process.

The config is resolved once and shared by every role; the rollout role samples with the policy's
own module, so weight sync copies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config import ConfigError, PosttrainConfig
from posttrain.placement.roles import ObjectiveBuilder, PolicyRole, RewardRole, RolloutRole
from posttrain.placement.teacher import TeacherRole


@dataclass
class LocalRoles:
    policy: PolicyRole
    rollout: RolloutRole
    reward: RewardRole
    teacher: TeacherRole | None = None

    def sync_weights(self) -> int:
        """After an update: the engine holds the policy module itself, nothing travels."""
        return self.rollout.sync(self.policy.model)

    def close(self) -> None:
        pass


def place_local(
    config: PosttrainConfig,
    build_objective_fn: ObjectiveBuilder,
    run_dir: str,
    teacher: bool = False,
) -> LocalRoles:
    ranks = config.placement.policy_ranks
    if ranks != 1:
        raise ConfigError(
            f"placement.policy_ranks={ranks} needs placement.backend=ray (in-process placement "
            "runs one policy rank)"
        )
    policy = PolicyRole(config, build_objective_fn, run_dir)
    rollout = RolloutRole(config, model=policy.model)
    return LocalRoles(policy, rollout, RewardRole(config), TeacherRole(config) if teacher else None)
