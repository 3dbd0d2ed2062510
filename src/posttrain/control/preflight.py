"""``run_preflight``: every rule, run on the resolved config before placement or model build."""

from __future__ import annotations

from posttrain.config.schema import PosttrainConfig
from posttrain.control import (
    consistency,
    entries,
    external,
    inactive,
    inert,
    lag,
    reads,
    reset,
    temperature,
    vllm,
)
from posttrain.control.rules import PreflightError, Rule
from posttrain.entrypoints.registry import ENTRIES, load

#: Every preflight rule, in the order they run (and are documented): the shared modules, the
#: entries' rules derived from the registry, then each entry's own module (in registry order).
RULES: tuple[Rule, ...] = (
    *reads.RULES,
    *temperature.RULES,
    *inactive.RULES,
    *inert.RULES,
    *consistency.RULES,
    *lag.RULES,
    *reset.RULES,
    *external.RULES,
    *vllm.RULES,
    *entries.RULES,
    *(rule for e in ENTRIES if e.rules for rule in load(e.rules).RULES),
)


def run_preflight(config: PosttrainConfig) -> list[str]:
    """Check ``config``; return the warnings (each once), raise on any violation.

    Raises :class:`PreflightError` (a ``ConfigError``) whose one-line message lists every
    violated rule. The caller logs the returned warnings once, in the run log.
    """
    errors: list[str] = []
    warnings: list[str] = []
    for rule in RULES:
        message = rule.check(config)
        if message is None:
            continue
        target = errors if rule.severity == "error" else warnings
        if message not in target:
            target.append(message)
    if errors:
        raise PreflightError(errors)
    return warnings
