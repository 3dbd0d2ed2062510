"""Ray placement: the same role classes as ``placement.local``, each in its own Ray actor.

Actors: ``placement.policy_ranks`` policy ranks (one ``torch.distributed`` group, gloo on CPU,
nccl on GPU), one rollout actor with its own copy of the weights, one reward actor, and one actor
per declared role (``placement/specs.py``: the OPD teacher, the data-side reference of
``placement/reference.py``), built from its spec. Every actor
rebuilds the config from ``config_path`` + the override list; the driver checks that each one
resolved exactly the driver's config. The objective builder travels by reference (module and
name), so it must be a module-level function or a ``functools.partial`` of one.

Weight sync: bucket by bucket (``placement/weight_sync.py``), policy rank 0 puts a bucket into
the object store and hands the driver a reference; the rollout actor copies the weights from that
reference into its model. The bulk never passes through the driver.

Failures: every wait on actors returns at the first error; a dead actor or an unexpected error
raises :class:`RoleFailedError` naming the role, after which ``close`` ends the other actors (a
rank blocked in a collective included). A posttrain error raised inside a role (a bad data row, a
failing reward function, non-finite training) is re-raised as itself, as in a local run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.config import ConfigError, PosttrainConfig, to_dict

try:
    import ray
except ImportError as e:  # an optional extra
    raise ConfigError(
        f"placement.backend=ray needs Ray ({e}); install it with pip install 'posttrain[ray]'"
    ) from e

from posttrain.config.build import needs_reference, reference_on_data
from posttrain.config.user_code import BuilderError, check_builder
from posttrain.placement.device import rollout_dtype
from posttrain.placement.dispatch import shard_batch
from posttrain.placement.ray_actors import ActorGroup, RemoteRole
from posttrain.placement.ray_host import (
    DeclaredRoleHost,
    GroupSpec,
    PolicyHost,
    RewardHost,
    RolloutHost,
    worker_pythonpath,
)
from posttrain.placement.roles import ObjectiveBuilder, PolicyRole, RewardRole, RolloutRole
from posttrain.placement.specs import PlacedRole, RoleSpec, check_specs
from posttrain.placement.threads import node_load, oversubscription
from posttrain.trainer.compat import differing_keys

log = logging.getLogger("posttrain")

#: Seconds all actors get to be scheduled and build their role (loading models included).
START_TIMEOUT_S = 600.0
#: torch.distributed timeout of the policy group; the driver's own failure checks come first.
GROUP_TIMEOUT_S = 1800.0


class RayPolicy:
    """The policy's data-parallel ranks behind the interface of one ``PolicyRole``."""

    def __init__(
        self,
        actors: ActorGroup,
        ranks: int,
        mini_batches: int,
        sharded: bool,
        whole_groups: bool = False,
    ) -> None:
        self._actors = actors
        self.sharded = sharded
        self.names = [f"policy rank {r}" for r in range(ranks)]
        self.mini_batches = mini_batches
        #: Shared-prefix dispatch: each rank's part of a mini-batch holds whole groups.
        self.keep_groups: bool | None = None
        #: The role's groups are units no rank may cut (DPO's pairs: ``PolicyRole`` subclasses
        #: that say ``whole_groups = True``).
        self.whole_groups = whole_groups

    def _all(self, method: str, per_rank_args: Sequence[tuple] | None = None) -> list:
        per_rank_args = per_rank_args or [()] * len(self.names)
        calls = [
            (name, self._actors.handles[name].call.remote(method, *args))
            for name, args in zip(self.names, per_rank_args, strict=True)
        ]
        return self._actors.gather(calls)

    def resume(self):
        return self._all("resume")[0]

    def train(self, batch) -> dict[str, float]:
        if len(self.names) > 1 and self.keep_groups is None:  # the ranks' trainer decides
            self.keep_groups = self.whole_groups or self._all("keeps_groups")[0]
        n, keep, whole = len(self.names), bool(self.keep_groups), self.whole_groups
        shards = shard_batch(batch, n, self.mini_batches, keep, whole)
        # The trainer makes every metric global over ranks (as each declares): rank 0 speaks.
        return self._all("train", [(s,) for s in shards])[0]

    def save(self, step: int, data_state) -> str:
        return self._all("save", [(step, data_state)] * len(self.names))[0]


class PolicyOnlyRanks(RayPolicy):
    """The policy ranks of a policy-only entry (``placement/policy_only.py``): train, resume
    and save as above, plus the calls those entries make of their role."""

    def evaluate(self, batch) -> dict[str, float]:
        """Held-out scores: each rank scores its share of the rows (whole groups) and the role
        sums over ranks (``LLMTrainer.held_out_sums``); rank 0 speaks."""
        shards = shard_batch(batch, len(self.names), 1, whole_groups=True)
        return self._all("evaluate", [(s,) for s in shards])[0]

    def sample(self, *args: Any) -> Any:
        """Diffusion DPO's evaluation samples (its one rank)."""
        return self._all("sample", [args] * len(self.names))[0]


#: How long closing waits for the roles to end their own processes before the actors are killed.
_CLOSE_S = 30.0


@dataclass
class RayRoles:
    """The roles of a run placed as Ray actors (same interface as ``LocalRoles``)."""

    policy: RayPolicy
    rollout: RemoteRole
    reward: RemoteRole
    actors: ActorGroup
    worker_configs: dict[str, dict[str, Any]]
    owns_ray: bool
    #: What the last sync sent (``sync/bytes``, ``sync/tensors``, ``sync/buckets``), for metrics.
    last_sync: dict[str, int] = field(default_factory=dict)
    #: Declared roles; a role's batch travels to its actor and only its columns come back.
    declared: tuple[PlacedRole, ...] = ()
    _buckets: int = field(default=0, init=False)

    def sync_weights(self) -> int:
        """The policy's weights reach the rollout actor one bucket at a time.

        Each bucket goes into the object store once (policy rank 0 puts it; a sharded policy
        gathers it with every rank taking part) and the rollout actor copies it into its model.
        The next bucket is gathered while the rollout copies this one, so the store holds at
        most two buckets and each policy rank one beyond its weights or shards.
        """
        a = self.actors
        if not self._buckets:
            call = a.handles["policy rank 0"].call.remote("sync_buckets")
            self._buckets = a.gather([("policy rank 0", call)])[0]
        ranks = self.policy.names if self.policy.sharded else ["policy rank 0"]

        def put(k: int) -> list:
            return [(n, a.handles[n].put.remote("weight_bucket", k, True)) for n in ranks]

        count = self._buckets
        sent = {"sync/bytes": 0, "sync/tensors": 0, "sync/buckets": count}
        pending = put(0)
        for k in range(count):
            meta = a.gather(pending)[0]
            load = a.handles["rollout"].call.remote("sync", meta["ref"][0], k == count - 1)
            pending = put(k + 1) if k + 1 < count else []
            version = a.gather([("rollout", load)])[0]
            sent["sync/bytes"] += meta["bytes"]
            sent["sync/tensors"] += meta["tensors"]
            del meta  # the driver's reference: the store frees the bucket
        self.last_sync = sent
        return version

    def close(self) -> None:
        # The roles' own processes first (the reward's tools, the rollout's vLLM engine):
        # ray.kill ends an actor without its atexit, and a child in a session of its own
        # outlives it. Bounded, so a hung role cannot hold the exit (its vLLM worker also ends
        # its group once the killed actor's connection drops).
        calls = [
            self.actors.handles[name].call.remote(method)
            for name, method in (("reward", "close_tools"), ("rollout", "close"))
            if name in self.actors.handles
        ]
        try:
            if calls:
                ray.wait(calls, num_returns=len(calls), timeout=_CLOSE_S)
        except Exception as e:  # the actors are gone already (a failed run): nothing to end
            log.debug("closing the roles' processes: %s", e)
        release(self.actors, self.owns_ray)


def place_ray(
    config: PosttrainConfig,
    config_path: str,
    opts: Sequence[str],
    build_objective_fn: ObjectiveBuilder,
    run_dir: str,
    specs: Sequence[RoleSpec] = (),
) -> RayRoles:
    """Start (or join) Ray, place every role as an actor, and check what each one resolved."""
    check_builder(build_objective_fn)
    check_serialisable(build_objective_fn)
    specs = check_specs(specs)
    pc = config.placement
    ranks = pc.policy_ranks
    # Policy ranks, rollout, reward, the declared roles; all but the reward may hold a model.
    models = sum(s.holds_model for s in specs)
    owns_ray = connect(pc, actors=ranks + 2 + len(specs), model_actors=ranks + 1 + models)
    run_dir = str(Path(run_dir).resolve())
    gpu = pc.gpus_per_role > 0
    device = "cuda" if gpu else None
    actors = ActorGroup(checkpoints=str(Path(run_dir) / "checkpoints"),
                     call_timeout_s=pc.role_call_timeout_s)  # fmt: skip
    try:
        for r in range(ranks):
            actors.handles[f"policy rank {r}"] = host_actor(pc, PolicyHost, pc.gpus_per_role)
        actors.handles["rollout"] = host_actor(pc, RolloutHost, pc.gpus_per_role)
        actors.handles["reward"] = host_actor(pc, RewardHost, 0.0)
        for s in specs:
            gpus = pc.gpus_per_role if s.holds_model else 0.0
            actors.handles[s.name] = host_actor(pc, DeclaredRoleHost, gpus)
        starts = _start_roles(actors, config_path, list(opts), build_objective_fn, run_dir,
                              ranks, device, "nccl" if gpu else "gloo", specs,
                              pc.policy_sharding == "fsdp")  # fmt: skip
        configs = dict(zip(actors.handles, actors.gather(starts, START_TIMEOUT_S), strict=True))
        check_worker_configs(to_dict(config), configs)
    except BaseException:
        release(actors, owns_ray)
        raise
    log.info("%s", placement_line(config, specs))
    return RayRoles(
        policy=RayPolicy(
            actors, ranks, config.rl.mini_batch_per_replica, pc.policy_sharding == "fsdp"
        ),
        rollout=RemoteRole(actors, "rollout"),
        reward=RemoteRole(actors, "reward"),
        actors=actors,
        worker_configs=configs,
        owns_ray=owns_ray,
        declared=tuple(PlacedRole(s, RemoteRole(actors, s.name)) for s in specs),
    )


def placement_line(config: PosttrainConfig, specs: Sequence[RoleSpec] = ()) -> str:
    """What a Ray run placed where, in one line, as ``place_local`` says it for a local run."""
    pc, m = config.placement, config.model
    device = "cuda" if pc.gpus_per_role > 0 else "cpu"
    how = "FSDP-sharded" if pc.policy_sharding == "fsdp" else "replicated"
    inside = needs_reference(config) and not reference_on_data(config)
    where = "sharded over the policy actors" if how == "FSDP-sharded" else "in each policy actor"
    ref = f", reference {where} ({m.dtype})" if inside else ""
    others = "".join(f", {s.name} actor on {s.device(device) or 'cpu'}" for s in specs)
    return (
        f"placement: Ray, policy on {pc.policy_ranks} actor(s) on {device} ({how}, float32 "
        f"master, {m.dtype} compute){ref}, rollout actor on {device} "
        f"({rollout_dtype(config.rollout.dtype, device)}, own copy), reward actor on cpu"
        f"{others}; {pc.torch_threads_per_process} torch thread(s) per actor"
    )


def _start_roles(
    actors, config_path, opts, builder, run_dir, ranks, device, backend, specs, sharded
):
    h = actors.handles
    calls = []
    for r, spec in enumerate(policy_group(actors, ranks, backend, sharded)):
        name = f"policy rank {r}"
        kwargs = {"build_objective_fn": builder, "run_dir": run_dir, "device": device}
        calls.append((name, h[name].start.remote(PolicyRole, config_path, opts, kwargs, spec)))
    calls.append(("rollout", h["rollout"].start.remote(RolloutRole, config_path, opts,
                                                       {"device": device})))  # fmt: skip
    calls.append(("reward", h["reward"].start.remote(RewardRole, config_path, opts, {})))
    for s in specs:  # each declared role's actor builds it from the spec, as place_local does
        kwargs = {"device": s.device(device)}
        calls.append((s.name, h[s.name].start.remote(s.build, config_path, opts, kwargs)))
    return calls


def policy_group(actors: ActorGroup, ranks: int, backend: str, sharded: bool) -> list:
    """Each policy rank's ``torch.distributed`` group (``GroupSpec``; ``[None]`` for one
    unsharded rank, which needs none; FSDP needs a group even of one rank). Rank 0's actor
    picks the rendezvous address."""
    if ranks == 1 and not sharded:
        return [None]
    first = actors.handles["policy rank 0"]
    call = [("policy rank 0", first.rendezvous.remote())]
    address, port = actors.gather(call, START_TIMEOUT_S)[0]
    return [GroupSpec(backend, address, port, r, ranks, GROUP_TIMEOUT_S) for r in range(ranks)]


def check_serialisable(fn: ObjectiveBuilder) -> None:
    """A function an actor is given (an objective or trainer builder) travels by pickling: by
    module and name, so a lambda or a local function is refused here, before any actor starts."""
    import pickle

    try:
        pickle.dumps(fn)
    except Exception as e:
        raise BuilderError(
            f"build_objective_fn cannot travel to Ray workers ({type(e).__name__}: {e}); use a "
            "module-level function, or functools.partial over plain values"
        ) from None


def connect(pc, actors: int, model_actors: int) -> bool:
    """Join or start Ray (see :func:`_connect`) and check it has room for ``actors`` actors,
    ``model_actors`` of which take ``placement.gpus_per_role`` GPUs."""
    if not pc.ray_address and not ray.is_initialized():  # a local instance: every actor here
        contention = oversubscription(pc.torch_threads_per_process, node_load(), actors)
        if contention is not None:
            log.warning("%s", contention)
    owns_ray = _connect(pc.ray_address, cpus_needed=pc.cpus_per_role * actors)
    try:
        _check_capacity(pc, actors, model_actors)
    except BaseException:
        if owns_ray:
            ray.shutdown()
        raise
    return owns_ray


def release(actors: ActorGroup, owns_ray: bool) -> None:
    """End the actors, then Ray itself when this process connected it (see :func:`_connect`)."""
    actors.close()
    if owns_ray:
        ray.shutdown()


def host_actor(pc, cls: type, num_gpus: float):
    """A Ray actor hosting ``cls`` (a ``ray_host`` class): ``placement.cpus_per_role`` CPUs,
    one torch thread count, this working directory and import path."""
    env = {"PYTHONPATH": worker_pythonpath(), "OMP_NUM_THREADS": str(pc.torch_threads_per_process)}
    return (
        ray.remote(cls)
        .options(num_cpus=pc.cpus_per_role, num_gpus=num_gpus, runtime_env={"env_vars": env})
        .remote(pc.torch_threads_per_process, os.getcwd())
    )


def _connect(address: str, cpus_needed: float) -> bool:
    """Join ``address`` or start a local instance; True when this call connected (and so
    disconnects at the end: a joined cluster keeps running, a started instance stops)."""
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=True)
        return True
    # A local instance declares at least the CPUs the roles ask for: logical CPUs only gate
    # scheduling, and one torch thread per process keeps the real load at the core count.
    cpus = max(os.cpu_count() or 1, int(-(-cpus_needed // 1)))
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=True)
    return True


def _check_capacity(pc, actors: int, model_actors: int) -> None:
    """Room for every actor: each takes the role's CPUs, each model actor its GPUs."""
    total = ray.cluster_resources()
    cpus = pc.cpus_per_role * actors
    gpus = pc.gpus_per_role * model_actors
    if cpus > total.get("CPU", 0.0) + 1e-9:
        raise ConfigError(
            f"the roles ask for {cpus:g} CPUs (placement.cpus_per_role={pc.cpus_per_role:g} x "
            f"{actors} actors) but the Ray cluster has {total.get('CPU', 0.0):g}; lower "
            "placement.cpus_per_role or add nodes"
        )
    if gpus > total.get("GPU", 0.0) + 1e-9:
        raise ConfigError(
            f"the roles ask for {gpus:g} GPUs (placement.gpus_per_role={pc.gpus_per_role:g} x "
            f"{model_actors} model actors) but the Ray cluster has {total.get('GPU', 0.0):g}; "
            "lower placement.gpus_per_role or add GPU nodes"
        )


def check_worker_configs(driver: dict, workers: dict[str, dict]) -> None:
    """Every actor must have resolved the driver's config (same recipe file, same overrides)."""
    for name, cfg in workers.items():
        diff = differing_keys(driver, cfg)
        if diff:
            raise ConfigError(
                f"the {name} actor resolved a different config at {', '.join(diff[:5])}; every "
                "node must see the same recipe file and model folder at the same path"
            )
