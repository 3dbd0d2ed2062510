"""Roles as declared specs: a role beyond the three every online run has (rollout, reward,
policy) is a :class:`RoleSpec` an entry passes to the loop, not a flag threaded through files.

The loop applies the declared roles to each rollout, in the order declared, between sampling and
the reward stage (OPD: rollout -> teacher scoring -> reward stage -> policy). Both placements
build a role from the same spec: ``placement.local`` calls ``spec.build(config, device=...)`` in
the driver; ``placement.ray`` calls it inside the role's own actor, after that actor resolved the
config itself. ``build`` therefore travels by reference: a module-level function or class.

The built role answers one method, ``annotations(batch) -> {column: tensor}``: CPU tensors
row-aligned with ``batch``, only the columns the spec declares in ``adds``. It receives the
sampled ids, never text: a role that needs text (a reward model with its own tokenizer) decodes
``batch.response_ids`` itself, so what it judges is exactly what the policy sampled. A column
named like a :class:`TrajectoryBatch` field (``teacher_logprobs``) sets that field; any other
name lands in ``batch.columns``, where the reward stage or an objective reads it by name.

How the next roles fit, without new fields here:

- a reward model: ``adds=("rm_score",)``, ``holds_model=True``, declared before the reward stage
  that reads the column;
- the multi-turn environment: ``adds=()`` (it annotates no finished rollout: the multi-turn
  rollout calls it between turns, finding it by name in ``placed``), ``holds_model=False``: in
  the driver beside the reward role under local placement, its own CPU-only actor under Ray.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from posttrain.data.trajectory import TrajectoryBatch
from posttrain.rollout import Rollout

#: What every rollout carries before any declared role has run.
ROLLOUT_COLUMNS = (
    "input_ids", "attention_mask", "response_mask", "group_ids", "sample_ids", "rollout_logprobs",
)  # fmt: skip
#: What the reward stage writes after every declared role has run (it owns them).
STAGE_COLUMNS = ("rewards", "advantages")
#: Names of the roles every online run places; a declared role takes another name.
BUILT_IN_ROLES = ("policy", "rollout", "reward")


@dataclass(frozen=True)
class RoleSpec:
    """A declared role: its name, how to build it, what it reads and adds, what it asks for.

    ``build(config, device=None)`` returns the role (see the module docstring for its method).
    ``consumes``: the batch columns it reads, each one a rollout carries or an earlier declared
    role adds. ``adds``: the columns it may add (the OPD teacher adds its top-k only in the
    direct mode). ``holds_model``: placed on ``placement.device`` (local) and given
    ``placement.gpus_per_role`` GPUs (Ray); every Ray actor takes ``placement.cpus_per_role``.
    """

    name: str
    build: Callable[..., Any]
    adds: tuple[str, ...] = ()
    consumes: tuple[str, ...] = ("input_ids", "attention_mask", "response_mask")
    holds_model: bool = True

    def __post_init__(self) -> None:
        inner = self.build
        while isinstance(inner, functools.partial):
            inner = inner.func
        qual = getattr(inner, "__qualname__", "")
        if not callable(inner) or not qual or "<locals>" in qual or "<lambda>" in qual:
            raise ValueError(
                f"role {self.name!r}: build={inner!r} must be a module-level function or class "
                "(optionally a functools.partial of one); Ray actors import it by name"
            )

    def device(self, device: str | None) -> str | None:
        """The device this role is built on, given the model-bearing roles' device."""
        return device if self.holds_model else None


@dataclass(frozen=True)
class PlacedRole:
    """A declared role as built by a placement: ``role`` is the object itself (local) or a
    facade whose methods run in the role's actor and wait (Ray)."""

    spec: RoleSpec
    role: Any


def check_specs(specs: Sequence[RoleSpec]) -> tuple[RoleSpec, ...]:
    """``specs`` as a tuple, refused with the offending role named when two share a name, a
    role takes a built-in's name, reads a column nothing before it adds, or re-adds one."""
    available = set(ROLLOUT_COLUMNS)
    names: set[str] = set()
    for spec in specs:
        if spec.name in names or spec.name in BUILT_IN_ROLES or not spec.name:
            raise ValueError(
                f"role {spec.name!r} is declared twice or takes a built-in role's name "
                f"({', '.join(BUILT_IN_ROLES)}); give each declared role its own name"
            )
        names.add(spec.name)
        missing = [c for c in spec.consumes if c not in available]
        if missing:
            raise ValueError(
                f"role {spec.name!r} consumes {', '.join(missing)}, which neither a rollout nor "
                "a role declared before it adds; declare the producing role first"
            )
        again = [c for c in spec.adds if c in available or c in STAGE_COLUMNS]
        if again:
            raise ValueError(
                f"role {spec.name!r} adds {', '.join(again)}, which the rollout, an earlier role "
                "or the reward stage already produces; a column has one producer"
            )
        available.update(spec.adds)
    return tuple(specs)


def annotate(rollout: Rollout, placed: Sequence[PlacedRole]) -> tuple[Rollout, dict[str, float]]:
    """``rollout`` with every annotating role's columns attached, in the order declared, and
    each role's seconds as ``time/<name>_s``."""
    times: dict[str, float] = {}
    for p in placed:
        if not p.spec.adds:
            continue  # a service role (the multi-turn environment): its caller finds it by name
        t = time.perf_counter()
        rollout = with_annotations(rollout, _declared(p.spec, p.role.annotations(rollout.batch)))
        times[f"time/{p.spec.name}_s"] = time.perf_counter() - t
    return rollout, times


def with_annotations(rollout: Rollout, annotations: Mapping[str, Tensor]) -> Rollout:
    """``rollout`` whose batch carries ``annotations``: batch fields by name, others as columns."""
    return dataclasses.replace(rollout, batch=attach(rollout.batch, annotations))


def attach(batch: TrajectoryBatch, annotations: Mapping[str, Tensor]) -> TrajectoryBatch:
    fields = {f.name for f in dataclasses.fields(TrajectoryBatch)}
    typed = {k: v for k, v in annotations.items() if k in fields}
    columns = {k: v for k, v in annotations.items() if k not in fields}
    if columns:
        typed["columns"] = {**batch.columns, **columns}
    return batch.replace(**typed)


def _declared(spec: RoleSpec, annotations: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
    extra = sorted(set(annotations) - set(spec.adds))
    if extra:
        raise ValueError(
            f"role {spec.name!r} returned {', '.join(extra)}, which its spec does not declare "
            f"(adds={list(spec.adds)}); declare every column the role adds"
        )
    return annotations
