"""In-process placement (the default): every role lives in the driver process.

The config is resolved once and shared by every role; the rollout role samples with the policy's
own module, so weight sync copies nothing, unless ``rollout.dtype`` asks for a low-precision copy
(``auto`` on hardware with native bf16 matmuls). ``placement.device`` puts the policy, the reference, the rollout and every
declared role that holds a model (``placement/specs.py``: the OPD teacher) on one device;
``placement.torch_threads_per_process`` sets this process's torch threads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from posttrain.config import ConfigError, PosttrainConfig
from posttrain.config.build import needs_reference, reference_on_data
from posttrain.placement.deadline import Deadlines
from posttrain.placement.device import resolve_device, rollout_dtype_and_why
from posttrain.placement.lora_base import policy_lora_base
from posttrain.placement.roles import (
    ObjectiveBuilder,
    PolicyRole,
    RewardRole,
    RolloutRole,
)
from posttrain.placement.specs import PlacedRole, RoleSpec, check_specs
from posttrain.placement.threads import set_torch_threads
from posttrain.placement.weight_sync import wire_bytes
from posttrain.rollout.registry import engine_capabilities

log = logging.getLogger("posttrain")


@dataclass
class LocalRoles:
    policy: PolicyRole
    rollout: RolloutRole
    reward: RewardRole
    declared: tuple[PlacedRole, ...] = ()
    deadlines: Deadlines | None = field(default=None, repr=False)
    #: What the last sync sent (``sync/bytes``, ``sync/tensors``, ``sync/buckets``), for metrics.
    last_sync: dict[str, int] = field(default_factory=dict)

    def sync_weights(self) -> int:
        """After an update: an engine sharing the policy module copies nothing; an own
        low-precision copy is refreshed from the float32 master weights, bucket by bucket (with
        LoRA: the adapters only), as a Ray rollout is."""
        if self.rollout.shares(self.policy.model):
            self.last_sync = {"sync/bytes": 0, "sync/tensors": 0, "sync/buckets": 0}
            return self.rollout.sync(self.policy.model)
        count = self.policy.sync_buckets()
        sent = {"sync/bytes": 0, "sync/tensors": 0, "sync/buckets": count}
        for k in range(count):
            bucket = self.policy.weight_bucket(k)
            sent["sync/bytes"] += sum(wire_bytes(t) for t in bucket.values())
            sent["sync/tensors"] += len(bucket)
            version = self.rollout.sync(bucket, k == count - 1)
        self.last_sync = sent
        return version

    def close(self) -> None:
        self.reward.close_tools()
        self.rollout.close()
        if self.deadlines is not None:
            self.deadlines.close()


def place_local(
    config: PosttrainConfig,
    build_objective_fn: ObjectiveBuilder,
    run_dir: str,
    specs: Sequence[RoleSpec] = (),
) -> LocalRoles:
    """Build the run's roles in this process: the built-in three, then ``specs`` in order."""
    cfg, specs = config, check_specs(specs)
    ranks = cfg.placement.policy_ranks
    if ranks != 1:
        raise ConfigError(
            f"placement.policy_ranks={ranks} needs placement.backend=ray (in-process placement "
            "runs one policy rank)"
        )
    set_torch_threads(cfg.placement.torch_threads_per_process)
    device = resolve_device(cfg.placement.device)
    policy = PolicyRole(cfg, build_objective_fn, run_dir, device=str(device))
    dtype, why = rollout_dtype_and_why(cfg.rollout.dtype, device)
    # float32 samples with the policy module itself; another dtype, or an engine in a process
    # of its own (vLLM), needs the engine's own copy.
    in_process = engine_capabilities(cfg.rollout.engine).in_process
    shared = policy.model if dtype == "float32" and in_process else None
    # An own copy under LoRA merges the adapters onto the policy's own frozen base (one process).
    base = policy_lora_base(policy.model) if shared is None and cfg.model.lora_rank else None
    rollout = RolloutRole(cfg, model=shared, device=str(device), lora_base=base)
    inside = needs_reference(cfg) and not reference_on_data(cfg)  # else a declared role
    ref = f", reference on {device} ({cfg.model.dtype})" if inside else ""
    others = "".join(f", {s.name} on {s.device(str(device)) or 'cpu'}" for s in specs)
    log.info(
        "placement: policy on %s (float32 master, %s compute)%s%s, rollout on %s (%s%s%s); "
        "%d torch thread(s)", device, cfg.model.dtype, ref, others, device, dtype,
        f", {why}" if why else "",
        ", shares the policy module" if shared is not None
        else ", own copy" if in_process else f", rollout.engine={cfg.rollout.engine}, own process",
        cfg.placement.torch_threads_per_process,
    )  # fmt: skip
    # Every role call runs under placement.role_call_timeout_s (a hung reward function fails
    # the run in one line, as a hung actor does under Ray).
    limit = Deadlines(cfg.placement.role_call_timeout_s, str(Path(run_dir) / "checkpoints"))
    declared = tuple(
        PlacedRole(s, limit.wrap(s.build(cfg, device=s.device(str(device))), s.name)) for s in specs
    )
    return LocalRoles(
        limit.wrap(policy, "policy"), limit.wrap(rollout, "rollout"),
        limit.wrap(RewardRole(cfg), "reward"), declared, limit,
    )  # fmt: skip
