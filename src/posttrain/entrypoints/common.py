"""Pieces every online entry shares: builder checks, the run directory, prompt encoding,
held-out evaluation and the user-error boundary."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posttrain.config import ConfigError, PosttrainConfig, to_yaml
from posttrain.data.tasks import TaskItem, format_prompt
from posttrain.fileio import atomic_write_text


class BuilderError(ConfigError):
    """The objective builder cannot travel to workers (nested, lambda, not callable)."""


def check_builder(fn: Callable[..., Any]) -> None:
    """Refuse builders that would not reach a worker process intact.

    Workers import the builder by module and name; a lambda, a function defined inside another
    function, or a bound method of a driver object does not survive that trip.
    """
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    if not callable(inner):
        raise BuilderError(f"build_objective_fn must be callable, got {type(inner).__name__}")
    if not inspect.isfunction(inner):
        raise BuilderError(
            f"build_objective_fn must be a module-level function (optionally a functools.partial "
            f"of one), got {type(inner).__name__}"
        )
    qual = inner.__qualname__
    if "<lambda>" in qual or "<locals>" in qual:
        raise BuilderError(
            f"build_objective_fn {inner.__module__}.{qual} is a lambda or nested function; "
            "workers rebuild the objective by importing the builder, so define it at module scope"
        )


def quiet_libraries() -> None:
    """Our progress bar and run log are the output; silence per-file loading bars."""
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def write_resolved_config(config: PosttrainConfig, run_dir: Path) -> None:
    """The resolved config of the run (what every role rebuilt), written atomically."""
    atomic_write_text(run_dir / "config.yaml", to_yaml(config))


def default_out_dir(config: PosttrainConfig) -> Path:
    return Path(config.job.output_root) / config.job.algorithm / config.job.name


def encode_prompts(items: Sequence[TaskItem], template: str, tokenizer) -> list[list[int]]:
    texts = [format_prompt(it, template, tokenizer) for it in items]
    # A chat template already carries its special tokens; a plain prompt gets the tokenizer's.
    add_special = template != "chat"
    return [tokenizer(t, add_special_tokens=add_special)["input_ids"] for t in texts]


def write_samples(path: Path, items, completions, scores) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "prompt": item.prompt,
            "answer": item.answer,
            "completion": text,
            "reward": float(scores.rewards[i]),
            "correct": bool(scores.correct[i]),
        }
        for i, (item, text) in enumerate(zip(items, completions, strict=True))
    ]
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
