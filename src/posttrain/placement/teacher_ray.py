"""The OPD teacher as a Ray actor, behind the interface of an in-process ``TeacherRole``.

The teacher holds a model, so it gets its own actor with ``placement.cpus_per_role`` CPUs and
``placement.gpus_per_role`` GPUs, next to the actors ``placement.ray`` starts for the policy
ranks, the rollout and the reward. It is placed first: when no cluster is joined, this module
starts the local Ray instance with room for every actor, teacher included, and ends it last.
The batch reaches the actor through the object store; only the teacher's annotations return.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from posttrain.config import ConfigError, PosttrainConfig, to_dict
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.placement.ray import (
    START_TIMEOUT_S,
    RemoteRole,
    _Actors,
    _check_worker_configs,
    _connect,
)
from posttrain.placement.ray_host import RoleHost, worker_pythonpath
from posttrain.placement.teacher import TeacherRole


class TeacherHost(RoleHost):
    """Hosts the OPD teacher role."""


class RayTeacher:
    """``score`` runs in the teacher actor; ``close`` ends it (and Ray, if this placed it)."""

    def __init__(self, actors: _Actors, owns_ray: bool, worker_config: dict[str, Any]) -> None:
        self._actors, self._owns_ray = actors, owns_ray
        self._remote = RemoteRole(actors, "teacher")
        self.worker_config = worker_config

    def score(self, batch: TrajectoryBatch):
        return self._remote.score(batch)

    def close(self) -> None:
        self._actors.close()
        if self._owns_ray:
            ray.shutdown()


def place_ray_teacher(
    config: PosttrainConfig, config_path: str, opts: Sequence[str], run_dir: str
) -> RayTeacher:
    """Start (or join) Ray with room for all actors and place the teacher in its own actor."""
    pc = config.placement
    actors_total = pc.policy_ranks + 3  # policy ranks, rollout, reward, teacher
    owns_ray = _connect(pc.ray_address, cpus_needed=pc.cpus_per_role * actors_total)
    actors = _Actors(checkpoints=str(Path(run_dir).resolve() / "checkpoints"))
    try:
        _check_teacher_capacity(pc, actors_total)
        env = {"PYTHONPATH": worker_pythonpath(),
               "OMP_NUM_THREADS": str(pc.torch_threads_per_process)}  # fmt: skip
        handle = (
            ray.remote(TeacherHost)
            .options(
                num_cpus=pc.cpus_per_role, num_gpus=pc.gpus_per_role, runtime_env={"env_vars": env}
            )  # fmt: skip
            .remote(pc.torch_threads_per_process, os.getcwd())
        )
        actors.handles["teacher"] = handle
        device = "cuda" if pc.gpus_per_role > 0 else None
        start = handle.start.remote(TeacherRole, (config_path, list(opts)), {"device": device})
        (worker,) = actors.gather([("teacher", start)], START_TIMEOUT_S)
        _check_worker_configs(to_dict(config), {"teacher": worker})
    except BaseException:
        actors.close()
        if owns_ray:
            ray.shutdown()
        raise
    return RayTeacher(actors, owns_ray, worker)


def _check_teacher_capacity(pc, actors_total: int) -> None:
    total = ray.cluster_resources()
    cpus = pc.cpus_per_role * actors_total
    if cpus > total.get("CPU", 0.0) + 1e-9:
        raise ConfigError(
            f"the roles ask for {cpus:g} CPUs (placement.cpus_per_role={pc.cpus_per_role:g} x "
            f"{actors_total} actors, the OPD teacher included) but the Ray cluster has "
            f"{total.get('CPU', 0.0):g}; lower placement.cpus_per_role or add nodes"
        )
    gpus = pc.gpus_per_role * (pc.policy_ranks + 2)
    if gpus > total.get("GPU", 0.0) + 1e-9:
        raise ConfigError(
            f"the model actors (policy ranks, rollout, OPD teacher) ask for {gpus:g} GPUs but "
            f"the Ray cluster has {total.get('GPU', 0.0):g}; lower placement.gpus_per_role"
        )
