"""Policy-only placement (no rollout, no reward): one policy role, in-process or as Ray actors.

The offline entries (Diffusion DPO's UNet role, SFT's language-model role) train a policy on a
fixed data set; the role owns its model, trainer and checkpoints. ``placement.backend=ray``
hosts the very same class in a Ray actor (``ray_host.PolicyHost``) per policy rank, which
resolves the config from ``config_path`` + ``opts`` in its own process, so both placements compute
the same numbers; several ranks (``placement.policy_ranks``, replicated or FSDP-sharded) share
each batch out as the online entries' policy ranks do (``placement/dispatch.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posttrain.config import PosttrainConfig, to_dict
from posttrain.placement.threads import set_torch_threads

log = logging.getLogger("posttrain")


class LocalPolicy:
    """The role in this process."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def close(self) -> None:
        pass


class RayPolicyOnly:
    """The role's ranks as Ray actors (``placement.policy_ranks`` of them, one
    ``torch.distributed`` group when there are several or they are sharded), behind the
    methods of one role."""

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


def _place_ray(config, config_path, opts, role_cls, kwargs, run_dir) -> RayPolicyOnly:
    from posttrain.placement.ray import (
        START_TIMEOUT_S,
        PolicyOnlyRanks,
        check_serialisable,
        check_worker_configs,
        connect,
        host_actor,
        policy_group,
        release,
    )
    from posttrain.placement.ray_actors import ActorGroup
    from posttrain.placement.ray_host import PolicyHost

    for value in kwargs.values():
        if callable(value):
            check_serialisable(value)
    pc = config.placement
    ranks, sharded = pc.policy_ranks, pc.policy_sharding == "fsdp"
    owns_ray = connect(pc, actors=ranks, model_actors=ranks)
    run_dir = str(Path(run_dir).resolve())
    device = "cuda" if pc.gpus_per_role > 0 else None
    actors = ActorGroup(checkpoints=str(Path(run_dir) / "checkpoints"),
                        call_timeout_s=pc.role_call_timeout_s)  # fmt: skip
    names = [f"policy rank {r}" for r in range(ranks)]
    try:
        for name in names:
            actors.handles[name] = host_actor(pc, PolicyHost, pc.gpus_per_role)
        group = policy_group(actors, ranks, "nccl" if device else "gloo", sharded)
        kw = {**kwargs, "run_dir": run_dir, "device": device}
        starts = [
            (name, actors.handles[name].start.remote(role_cls, config_path, list(opts), kw, spec))
            for name, spec in zip(names, group, strict=True)
        ]
        resolved = actors.gather(starts, START_TIMEOUT_S)
        check_worker_configs(to_dict(config), dict(zip(names, resolved, strict=True)))
    except BaseException:
        release(actors, owns_ray)
        raise
    how = "FSDP-sharded" if sharded else "replicated"
    log.info("placement: Ray, policy on %d actor(s) (%s); %d torch thread(s) per actor",
             ranks, how, pc.torch_threads_per_process)  # fmt: skip
    whole = getattr(role_cls, "whole_groups", False)  # a role's groups no rank may cut
    policy = PolicyOnlyRanks(actors, ranks, config.rl.mini_batch_per_replica, sharded, whole)
    return RayPolicyOnly(actors, policy, owns_ray)
