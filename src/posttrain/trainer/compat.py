"""Which differences between a checkpoint's run and the resuming run are allowed.

Configs are compared as flat dotted keys (``rl.max_steps``). A key may differ on resume only if it
matches one of the ``allowed`` glob patterns; the defaults cover how long the run goes, how often
it saves, evaluates and logs, what it does on a signal, the resume mode itself, and placement
(backend, rank count, sharding, devices: where the steps run, not what they compute; a checkpoint
reshards where its format allows, ``checkpoint.py``). None of these changes the math of the steps
already taken, and all but one leave the steps still to take alone, up to float rounding:
``rl.max_steps`` is also the horizon of a decaying ``rl.lr_schedule`` (linear, cosine), so with
such a schedule a new ``rl.max_steps`` re-shapes the remaining learning rates (resume warns,
see :func:`resume_notes`); with ``constant`` it only changes where the run stops. Anything else
(learning rate, loss type, model, seed, data) would continue a different experiment under the same
name, so it is refused. The objective identity must match exactly: it defines the algorithm.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

from posttrain.trainer.errors import ResumeError

#: Config keys that may change between a checkpoint and the run resuming from it.
RESUME_MUTABLE_KEYS: tuple[str, ...] = (
    "rl.max_steps",
    "rl.save_every",
    "rl.eval_every",
    "rl.resume",
    "checkpoint.keep_last",
    "checkpoint.save_on_signal",
    "checkpoint.signal_grace_s",
    "placement.role_call_timeout_s",
    "logging.*",
    # Where the steps run, not what they compute: on the CPU none of these changes a number;
    # a device change can change float rounding, so resume warns about it (resume_notes).
    "placement.torch_threads_per_process",
    "placement.device",
    "placement.backend",
    "placement.ray_address",
    "placement.cpus_per_role",
    "placement.gpus_per_role",
    "placement.sync_bucket_mb",
    # How the policy is spread over processes: the same update up to the order of float sums
    # (resume warns); a checkpoint reshards where its format allows (checkpoint.refuse_unloadable).
    "placement.policy_ranks",
    "placement.policy_sharding",
)

#: Config keys a command-line flag sets: a resume that differs in one names the flag.
FLAG_KEYS = {"rl.objective_builder": "--objective"}

_MISSING = object()


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"rl": {"lr": 1}} -> {"rl.lr": 1}``; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def differing_keys(
    saved: Mapping[str, Any], current: Mapping[str, Any], allowed: Iterable[str] = ()
) -> list[str]:
    """Dotted keys whose values differ (or exist on one side only), minus ``allowed`` patterns."""
    a, b = flatten(saved), flatten(current)
    patterns = tuple(allowed)
    keys = sorted(set(a) | set(b))
    return [
        k
        for k in keys
        if a.get(k, _MISSING) != b.get(k, _MISSING)
        and not any(fnmatch.fnmatchcase(k, p) for p in patterns)
    ]


def _describe(saved: Mapping[str, Any], current: Mapping[str, Any], keys: list[str]) -> str:
    a, b = flatten(saved), flatten(current)
    parts = []
    for k in keys[:10]:
        parts.append(f"{k}: checkpoint={a.get(k, '<absent>')!r} now={b.get(k, '<absent>')!r}")
    more = f" (+{len(keys) - 10} more)" if len(keys) > 10 else ""
    return "; ".join(parts) + more


def check_resume_compatible(
    where: str,
    saved_identity: Mapping[str, Any],
    identity: Mapping[str, Any],
    saved_config: Mapping[str, Any],
    config: Mapping[str, Any],
    allowed: Iterable[str] = RESUME_MUTABLE_KEYS,
) -> None:
    """Raise :class:`ResumeError` naming every differing identity or config key."""
    a, b = flatten(saved_config), flatten(config)
    for key, flag in FLAG_KEYS.items():
        was, now = a.get(key), b.get(key)  # absent (an older checkpoint) reads as unset
        if was != now:
            do = f"pass {flag} {was}" if was is not None else f"drop {flag}"
            raise ResumeError(
                f"refusing to resume from {where}: the run was trained with {key}={was!r}, "
                f"this command has {key}={now!r}; {do} to resume it, or start a new job.name"
            )
    ident = differing_keys(saved_identity, identity)
    if ident:
        raise ResumeError(
            f"refusing to resume from {where}: the objective identity differs in {ident} "
            f"({_describe(saved_identity, identity, ident)}); this is a different algorithm, "
            "so start it under a new job.name"
        )
    cfg = differing_keys(saved_config, config, allowed)
    if cfg:
        raise ResumeError(
            f"refusing to resume from {where}: the resolved config differs in {cfg} "
            f"({_describe(saved_config, config, cfg)}); restore those values or start a new "
            "job.name (only run length, save/eval/log cadence and placement may change on "
            "resume)"
        )


def resume_notes(saved_config: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """Allowed changes that still change the math of the remaining steps, as warnings."""
    a, b = flatten(saved_config), flatten(config)
    notes = []
    schedule = b.get("rl.lr_schedule", "constant")
    old, new = a.get("rl.max_steps"), b.get("rl.max_steps")
    if old != new and schedule != "constant":
        notes.append(
            f"rl.max_steps changed from {old} to {new} with rl.lr_schedule={schedule}: the "
            f"learning rate now decays over {new} steps, so the remaining steps' learning rates "
            f"differ from the original run's (keep rl.max_steps={old} to continue it exactly)"
        )
    for key, why in (
        ("placement.device", "another device can round floats differently"),
        ("placement.gpus_per_role", "another device can round floats differently"),
        ("placement.policy_ranks", "the gradient is summed over another number of ranks"),
        ("placement.policy_sharding", "sharded and replicated ranks sum in another order"),
    ):
        old, new = a.get(key), b.get(key)
        if old != new:
            notes.append(
                f"{key} changed from {old} to {new}: {why}, so the remaining steps may not "
                "match the original run bit for bit (float rounding)"
            )
    return notes
