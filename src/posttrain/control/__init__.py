"""Preflight: cross-field rules checked on the resolved config before any model is built.

``run_preflight(config) -> list[str]`` returns warnings and raises :class:`PreflightError` (a
``ConfigError``) for violations. Each rule is a small function in ``reads`` (derived from the
objectives' declared reads), ``temperature``, ``inactive``, ``inert``, ``consistency``, ``opd``,
``dpo`` or ``external`` (user modules, tokenizer files); :data:`RULES` lists them all.
"""

from posttrain.control.preflight import RULES, run_preflight
from posttrain.control.rules import PreflightError, Rule, objective_family

__all__ = ["RULES", "PreflightError", "Rule", "objective_family", "run_preflight"]
