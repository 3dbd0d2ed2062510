"""Which config knobs an objective reads: declared beside its builder, checked by preflight.

A builder carries its declaration as an attribute, set by :func:`declare_reads`::

    @declare_reads("rl.temperature", "rl.loss_type")
    def build(rl, context) -> Objective: ...

Each item is a dotted key (``"rl.loss_type"``) or a function ``config -> Reads`` (a built-in's
own declaration, e.g. ``posttrain.algorithm.grpo.reads``, when the builder wraps it); the
declaration is their union. A builder that declares nothing reads exactly what the built-in
objective of its entry reads (the usual case: a wrapper around it).

Preflight refuses every objective knob (``config.build.OBJECTIVE_KNOBS``, plus any the builder
declares) that the selected objective does not read and that differs from its default, so a
resolved config never claims an algorithm setting the loss ignores; the placement builds a frozen
reference only when the declaration reads ``rl.kl_beta``. A declaration is an attribute of the
builder function, so it travels with the builder (by name) to every worker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

#: The attribute a builder's declaration lives in.
READS_ATTRIBUTE = "posttrain_reads"


@dataclass(frozen=True)
class Reads:
    """What the selected objective reads under one config.

    ``keys``: the dotted config keys it reads. ``by``: how messages name the selection
    (``"rl.grpo_surrogate=legacy_pg"``). ``unread``: key -> why it is not read here, for the
    knobs whose message deserves a reason (``"no KL anchor with rl.kl_beta=0"``).
    ``sampler_free``: the loss weighs no sampled token by its probability (a divergence over
    the whole next-token distribution at each sampled position, OPD's ``direct`` mode), so
    samples from older weights (``rl.off_policy_lag``) need no importance correction; a union
    is sampler-free only when every part is.
    """

    keys: frozenset[str]
    by: str
    unread: Mapping[str, str] = field(default_factory=dict)
    sampler_free: bool = False

    def __or__(self, other: Reads) -> Reads:
        keys = self.keys | other.keys
        unread = {k: v for k, v in {**other.unread, **self.unread}.items() if k not in keys}
        return Reads(keys, self.by, unread, self.sampler_free and other.sampler_free)

    def reads(self, key: str) -> bool:
        return key in self.keys


ReadsFn = Callable[[Any], Reads]
Builder = TypeVar("Builder", bound=Callable[..., Any])


def declare_reads(*items: str | ReadsFn) -> Callable[[Builder], Builder]:
    """Decorator: ``builder`` reads the keys and declarations in ``items`` (their union)."""
    keys = frozenset(i for i in items if isinstance(i, str))
    fns = tuple(i for i in items if not isinstance(i, str))
    bad = [k for k in keys if k.count(".") != 1]
    if bad:
        raise ValueError(f"declare_reads: {bad} are not dotted config keys (section.field)")

    def declare(builder: Builder) -> Builder:
        by = f"the objective builder {builder.__module__}:{builder.__name__}"
        setattr(builder, READS_ATTRIBUTE, _Declared(keys, fns, by))
        return builder

    return declare


@dataclass(frozen=True)
class _Declared:
    keys: frozenset[str]
    fns: tuple[ReadsFn, ...]
    by: str

    def __call__(self, config: Any) -> Reads:
        """The union; named after the builder, unless it only forwards other declarations (a
        built-in's own, whose name for the selection says more)."""
        parts = [fn(config) for fn in self.fns]
        out = Reads(self.keys, self.by) if self.keys or not parts else parts.pop(0)
        for part in parts:
            out = out | part
        return out


def declared_reads(builder: Any) -> ReadsFn | None:
    """The declaration on ``builder`` (through ``functools.partial``), or None if undeclared."""
    while isinstance(builder, functools.partial):
        builder = builder.func
    return getattr(builder, READS_ATTRIBUTE, None)


def reads_of(config: Any, builder: Any, builtin: Any) -> Reads:
    """What ``builder`` reads under ``config``; undeclared, what the entry's ``builtin`` reads."""
    fn = declared_reads(builder) or declared_reads(builtin)
    if fn is None:
        raise TypeError(f"the built-in builder {builtin!r} declares no reads")
    return fn(config)


def union(*names: Iterable[str]) -> frozenset[str]:
    return frozenset(k for group in names for k in group)
