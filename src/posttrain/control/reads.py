"""Rules derived from the objectives' declared reads: no per-objective ``if`` lives here.

Each objective builder declares the knobs it reads (``posttrain.algorithm.primitives.reads``);
the built-ins declare theirs beside their builders, a custom builder the same way, and an
undeclared one reads what the built-in of its entry reads. From that one declaration:

- every objective knob the selected objective does not read must be at its default (a resolved
  config is provenance, it must not claim a setting the loss ignores);
- the loss scores at ``rl.temperature`` when it reads it, else at temperature 1, and the
  responses must have been sampled at that temperature (:mod:`posttrain.control.temperature`);
- the sequence-level warnings apply where the objective reads the sequence level
  (:mod:`posttrain.control.inert`).
"""

from __future__ import annotations

from posttrain.algorithm.primitives.reads import Reads
from posttrain.config.build import OBJECTIVE_KNOBS, objective_reads, user_builder
from posttrain.config.errors import ConfigError
from posttrain.config.schema import PosttrainConfig, all_keys
from posttrain.control.rules import are, error, reset_hint

_ORDER = {key: i for i, key in enumerate(all_keys())}


def reads_or_none(cfg: PosttrainConfig) -> Reads | None:
    """The run objective's reads; None for DPO and for a builder that does not load (which
    :func:`objective_builder_loads` reports)."""
    try:
        return objective_reads(cfg)
    except ConfigError:
        return None


@error("rl.objective_builder")
def objective_builder_loads(cfg: PosttrainConfig) -> str | None:
    """rl.objective_builder (``--objective``) imports from the working directory and names a
    module-level function callable as build(rl, context), before any model is built."""
    try:
        user_builder(cfg)
    except ConfigError as e:
        return str(e)
    return None


def _unread_changed(cfg: PosttrainConfig, reads: Reads) -> dict[str, list[str]]:
    """Reason -> the knobs of that reason the objective never reads that differ from default."""
    groups: dict[str, list[str]] = {}
    for key in sorted((OBJECTIVE_KNOBS - reads.keys), key=_ORDER.__getitem__):
        section, name = key.split(".")
        if not getattr(cfg, section).is_default(name):
            groups.setdefault(reads.unread.get(key, ""), []).append(key)
    return groups


@error("job.algorithm", "rl.objective_builder", *sorted(OBJECTIVE_KNOBS, key=_ORDER.__getitem__))
def objective_reads_its_knobs(cfg: PosttrainConfig) -> str | None:
    """A knob the selected objective never reads (by its builder's declaration) must keep its
    default: a resolved config is provenance and must not claim a setting the loss ignores."""
    reads = reads_or_none(cfg)
    if reads is None:
        return None
    parts = []
    for reason, keys in _unread_changed(cfg, reads).items():
        sections: dict[str, list[str]] = {}
        for key in keys:
            sections.setdefault(key.split(".")[0], []).append(key.split(".")[1])
        shown = [f"{k}={getattr(getattr(cfg, k.split('.')[0]), k.split('.')[1])}" for k in keys]
        hints = [reset_hint(getattr(cfg, s), *names) for s, names in sections.items()]
        hint = ", ".join([hints[0], *(h.removeprefix("reset with ") for h in hints[1:])])
        why = f" ({reason})" if reason else ""
        parts.append(f"{are(shown)} never read by {reads.by}{why}; {hint}")
    return "; ".join(parts) or None


RULES = (objective_builder_loads, objective_reads_its_knobs)
