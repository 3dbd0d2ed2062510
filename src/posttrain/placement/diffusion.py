"""The diffusion policy role of the DPO entry, placed in-process or as one Ray actor.

The role owns the UNet, its trainer (built by the entry's ``build_trainer``, which travels by
module and name like an objective builder) and the run's checkpoints; it also samples, because
it holds the weights. ``placement.backend=ray`` hosts the very same class in a Ray actor, so both
placements compute the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from posttrain.config import PosttrainConfig, to_dict
from posttrain.data.images import PairBatch
from posttrain.model.diffusion import load_pipeline, sample
from posttrain.placement.threads import set_torch_threads
from posttrain.trainer import CheckpointManager, ResumeState

TrainerBuilder = Callable[..., Any]


class DiffusionPolicyRole:
    """One diffusion policy: model, trainer, checkpoints, sampling."""

    def __init__(
        self,
        config: PosttrainConfig,
        build_trainer_fn: TrainerBuilder,
        run_dir: str,
        device: str | None = None,
    ) -> None:
        self.config = cfg = config
        unet, self.scheduler = load_pipeline(cfg.model.name_or_path, device or "cpu")
        self.trainer = build_trainer_fn(cfg, unet, self.scheduler, device)
        self.model = self.trainer.model
        self.checkpoints = CheckpointManager(
            Path(run_dir) / "checkpoints", keep_last=cfg.checkpoint.keep_last
        )

    def resume(self) -> ResumeState | None:
        return self.checkpoints.resume(
            self.trainer, mode=self.config.rl.resume, config=to_dict(self.config)
        )

    def train(self, batch: PairBatch) -> dict[str, float]:
        return self.trainer.train_on_batch(batch, mini_batches=1)[0]

    def save(self, step: int, data_state: Mapping[str, Any]) -> str:
        path = self.checkpoints.save(
            step, self.trainer, config=to_dict(self.config), data_state=dict(data_state)
        )
        return str(path)

    def sample(self, labels: Tensor, seeds: Sequence[int], steps: int, eta: float) -> Tensor:
        return sample(self.model, self.scheduler, labels, seeds, steps, eta)


class LocalDiffusion:
    """The role in this process."""

    def __init__(self, policy: DiffusionPolicyRole) -> None:
        self.policy = policy

    def close(self) -> None:
        pass


class RayDiffusion:
    """The role in one Ray actor, behind the same methods."""

    def __init__(self, actors, policy, owns_ray: bool) -> None:
        self.actors, self.policy, self.owns_ray = actors, policy, owns_ray

    def close(self) -> None:
        from posttrain.placement.ray import release

        release(self.actors, self.owns_ray)


def place_diffusion(
    config: PosttrainConfig,
    config_path: str,
    opts: Sequence[str],
    build_trainer_fn: TrainerBuilder,
    run_dir: str,
):
    """The policy role where ``placement.backend`` says (``.policy``, ``.close()``)."""
    if config.placement.backend == "local":
        set_torch_threads(config.placement.torch_threads_per_process)  # as place_local does
        return LocalDiffusion(DiffusionPolicyRole(config, build_trainer_fn, run_dir))
    return _place_ray(config, config_path, opts, build_trainer_fn, run_dir)


def _place_ray(config, config_path, opts, build_trainer_fn, run_dir) -> RayDiffusion:
    from posttrain.placement.ray import (
        START_TIMEOUT_S,
        _check_serialisable,
        _check_worker_configs,
        connect,
        host_actor,
        release,
    )
    from posttrain.placement.ray_actors import ActorGroup, RemoteRole
    from posttrain.placement.ray_host import PolicyHost

    _check_serialisable(build_trainer_fn)
    pc = config.placement
    owns_ray = connect(pc, actors=1, model_actors=1)
    run_dir = str(Path(run_dir).resolve())
    device = "cuda" if pc.gpus_per_role > 0 else None
    actors = ActorGroup(checkpoints=str(Path(run_dir) / "checkpoints"),
                     call_timeout_s=pc.role_call_timeout_s)  # fmt: skip
    name = "policy rank 0"
    try:
        actors.handles[name] = host_actor(pc, PolicyHost, pc.gpus_per_role)
        kwargs = {"build_trainer_fn": build_trainer_fn, "run_dir": run_dir, "device": device}
        start = actors.handles[name].start.remote(
            DiffusionPolicyRole, config_path, list(opts), kwargs
        )
        resolved = actors.gather([(name, start)], START_TIMEOUT_S)[0]
        _check_worker_configs(to_dict(config), {name: resolved})
    except BaseException:
        release(actors, owns_ray)
        raise
    return RayDiffusion(actors, RemoteRole(actors, name), owns_ray)
