"""Policy-only placement (no rollout, no reward): one policy role, in-process or as one Ray actor.

The offline entries (Diffusion DPO's UNet role, SFT's language-model role) train a policy on a
fixed data set; the role owns its model, trainer and checkpoints. ``placement.backend=ray``
hosts the very same class in a Ray actor (``ray_host.PolicyHost``), which resolves the config
from ``config_path`` + ``opts`` in its own process, so both placements compute the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posttrain.config import PosttrainConfig, to_dict
from posttrain.placement.threads import set_torch_threads


class LocalPolicy:
    """The role in this process."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def close(self) -> None:
        pass


class RayPolicy:
    """The role in one Ray actor, behind the same methods."""

    def __init__(self, actors, policy, owns_ray: bool) -> None:
        self.actors, self.policy, self.owns_ray = actors, policy, owns_ray

    def close(self) -> None:
        from posttrain.placement.ray import release

        release(self.actors, self.owns_ray)


def place_policy_only(
    config: PosttrainConfig,
    config_path: str,
    opts: Sequence[str],
    role_cls: type,
    kwargs: Mapping[str, Any],
    run_dir: str,
):
    """``role_cls(config, run_dir=..., **kwargs)`` where ``placement.backend`` says
    (``.policy``, ``.close()``); ``kwargs`` hold module-level functions (builders), which
    travel to an actor by name."""
    if config.placement.backend == "local":
        set_torch_threads(config.placement.torch_threads_per_process)  # as place_local does
        return LocalPolicy(role_cls(config, run_dir=run_dir, **kwargs))
    return _place_ray(config, config_path, opts, role_cls, kwargs, run_dir)


def _place_ray(config, config_path, opts, role_cls, kwargs, run_dir) -> RayPolicy:
    from posttrain.placement.ray import (
        START_TIMEOUT_S,
        check_serialisable,
        check_worker_configs,
        connect,
        host_actor,
        release,
    )
    from posttrain.placement.ray_actors import ActorGroup, RemoteRole
    from posttrain.placement.ray_host import PolicyHost

    for value in kwargs.values():
        if callable(value):
            check_serialisable(value)
    pc = config.placement
    owns_ray = connect(pc, actors=1, model_actors=1)
    run_dir = str(Path(run_dir).resolve())
    device = "cuda" if pc.gpus_per_role > 0 else None
    actors = ActorGroup(checkpoints=str(Path(run_dir) / "checkpoints"),
                        call_timeout_s=pc.role_call_timeout_s)  # fmt: skip
    name = "policy rank 0"
    try:
        actors.handles[name] = host_actor(pc, PolicyHost, pc.gpus_per_role)
        start = actors.handles[name].start.remote(
            role_cls, config_path, list(opts), {**kwargs, "run_dir": run_dir, "device": device}
        )
        resolved = actors.gather([(name, start)], START_TIMEOUT_S)[0]
        check_worker_configs(to_dict(config), {name: resolved})
    except BaseException:
        release(actors, owns_ray)
        raise
    return RayPolicy(actors, RemoteRole(actors, name), owns_ray)
