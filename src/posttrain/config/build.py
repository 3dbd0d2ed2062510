"""Config -> objective: which builder a run uses, what it reads, and the context it receives.

The builder is part of the run's record: ``rl.objective_builder`` names a user's builder by import
path (``--objective`` sets it, a recipe may too), else the entry's built-in for ``job.algorithm``
serves. Either way it is a module-level function (or a ``functools.partial`` of one over plain
values), so it pickles by reference into Ray workers. What it reads is its declaration
(:mod:`posttrain.algorithm.primitives.reads`): preflight refuses the knobs it does not read, and
the placement builds a reference model only when it reads ``rl.kl_beta``.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from posttrain.algorithm.primitives.reads import Reads, declared_reads
from posttrain.config.schema import PosttrainConfig, objective_family
from posttrain.config.user_code import BuilderError, check_builder, import_callable
from posttrain.entrypoints.registry import ENTRIES, entry, load

if TYPE_CHECKING:
    from torch import nn

    from posttrain.algorithm.primitives.objective import Objective

#: What each entry's built-in objective reads (the registry's torch-free ``reads``, beside the
#: builders in ``algorithm/knobs.py``: the builders themselves are imported only to build one),
#: and what an undeclared custom builder is taken to read.
BUILTIN_READS = {e.name: load(e.reads) for e in ENTRIES if e.reads}

#: Every knob a built-in objective may read (the registry's ``knobs``): the universe preflight
#: checks for reads.
OBJECTIVE_KNOBS = frozenset().union(*(load(e.knobs) for e in ENTRIES if e.knobs))


def builtin_builder(family: str) -> Any:
    """The built-in objective builder of ``family``'s entry, imported now."""
    return load(entry(family).builder)


def objective_context(config: PosttrainConfig, reference_model: nn.Module | None = None) -> Any:
    """What a builder may know beyond ``rl``: the policy identity and the rollout bound.

    ``rollout.max_tokens`` stays the single owner of the response bound; builders read it here.
    """
    return SimpleNamespace(
        name_or_path=config.model.name_or_path,
        max_response_length=config.rollout.max_tokens,
        reference_model=reference_model,
        teacher_top_k=config.teacher.top_k if config.rl.distillation_mode == "direct" else None,
    )


def build_objective(rl: Any, context: Any) -> Objective:
    """The GRPO-family objective selected by ``rl.grpo_surrogate``."""
    return builtin_builder("grpo")(rl, context)


def build_named(spec: str, rl: Any, context: Any) -> Objective:
    """Call the builder ``spec`` names; anything but an :class:`Objective` is a one-line error."""
    from posttrain.algorithm.primitives.objective import Objective

    builder = import_callable(spec, "rl.objective_builder")
    objective = builder(rl, context)
    if not isinstance(objective, Objective):
        raise BuilderError(
            f"the objective builder {spec} returned {type(objective).__name__}, not an Objective; "
            "return posttrain.algorithm.primitives.objective.Objective(fn, ...)"
        )
    return objective


def user_builder(config: PosttrainConfig) -> Any | None:
    """The user's builder function ``rl.objective_builder`` names (checked), or None."""
    spec = config.rl.objective_builder
    if spec is None:
        return None
    fn = import_callable(spec, "rl.objective_builder")
    check_builder(fn)
    return fn


def objective_builder(config: PosttrainConfig) -> Any:
    """The builder a run of ``config`` uses: the one ``rl.objective_builder`` names (wrapped so
    its result is checked), else the built-in of ``job.algorithm``'s family."""
    if user_builder(config) is not None:
        return functools.partial(build_named, config.rl.objective_builder)
    family = objective_family(config)
    if family not in BUILTIN_READS:
        raise BuilderError(f"job.algorithm={config.job.algorithm} has no online objective builder")
    return builtin_builder(family)


def objective_reads(config: PosttrainConfig) -> Reads | None:
    """What the run's objective reads (None for an entry that builds its own objective, DPO)."""
    family = objective_family(config)
    if family not in BUILTIN_READS:
        return None
    declared = declared_reads(user_builder(config)) or BUILTIN_READS[family]
    return declared(config)


def needs_reference(config: PosttrainConfig) -> bool:
    """Whether the run needs a frozen reference: its objective reads ``rl.kl_beta`` and it is > 0."""
    reads = objective_reads(config)
    return reads is not None and reads.reads("rl.kl_beta") and config.rl.kl_beta > 0


def reference_on_data(config: PosttrainConfig) -> bool:
    """Whether the run's frozen reference scores on the data side: it has one, and
    ``placement.reference_on`` is ``data``, or ``auto`` under ``rl.off_policy_lag >= 1`` without
    ``rl.reference_reset_every`` (a reset copies the policy's weights: the policy side)."""
    where = config.placement.reference_on
    if where == "auto":
        lagged = config.rl.off_policy_lag >= 1 and not config.rl.reference_reset_every
        where = "data" if lagged else "policy"
    return where == "data" and needs_reference(config)
