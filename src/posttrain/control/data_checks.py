"""The data stage of preflight: the files a run reads exist, the task source builds, and a step
does not ask for more distinct prompts than the train split holds.

Runs in ``posttrain config show`` and before a run places any role, and reads no model: a missing
file, a JSONL row without its ``#### N`` answer line or ``data.prompts_per_step=1000`` on 80
prompts costs a second, not a model load. (Checks that need the tokenizer or the model's context
are in :mod:`posttrain.control.input_checks`.)
"""

from __future__ import annotations

from pathlib import Path

from posttrain.config import ConfigError, PosttrainConfig
from posttrain.control.rules import objective_family
from posttrain.data.tasks import TaskSource, make_task_source
from posttrain.entrypoints.registry import Entry, entry, load


def _policy_only(config: PosttrainConfig) -> Entry | None:
    """The config's entry when it trains on its own data files (no prompts, no rollout)."""
    e = entry(objective_family(config))
    return e if e.placement == "policy_only" else None


def data_files(config: PosttrainConfig) -> list[tuple[str, str]]:
    """``(key, path)`` of every data file the run reads."""
    e = _policy_only(config)
    if e is not None:
        values = [(key, getattr(getattr(config, key.split(".")[0]), key.split(".")[1]))
                  for key in e.data_keys]  # fmt: skip
        return [(key, path) for key, path in values if path]
    d = config.data
    if d.task != "jsonl":
        return []
    return [(k, p) for k, p in (("data.train_path", d.train_path), ("data.val_path", d.val_path))
            if p]  # fmt: skip


def check_data_files(config: PosttrainConfig) -> None:
    """Refuse, in one line naming each key, data paths that are not files."""
    missing = [
        f"{key}={path!r}: " + ("a directory, not a file" if Path(path).is_dir() else "no such file")
        for key, path in data_files(config)
        if not Path(path).is_file()
    ]
    if not missing:
        return
    e = _policy_only(config)
    fix = (
        e.data_fix
        if e is not None
        else "point it at a JSONL file of question/answer rows "
        "(docs/guides/config.md#your-own-data-a-jsonl-task)"
    )
    raise ConfigError(f"{'; '.join(missing)} (relative paths are read from {Path.cwd()}); {fix}")


def held_out_covers_ranks(config: PosttrainConfig, count: int, path: str, unit: str) -> None:
    """A policy-only entry's policy ranks each score a share of the held-out set (rows, whole
    pairs: ``unit``), so an evaluating run needs one for each."""
    ranks = config.placement.policy_ranks
    if not config.rl.eval_every or count >= ranks:
        return
    raise ConfigError(
        f"{path} has {count} held-out {unit}{'' if count == 1 else 's'}, fewer than "
        f"placement.policy_ranks={ranks}; add {unit}s, lower policy_ranks or set rl.eval_every=0"
    )


def build_tasks(config: PosttrainConfig) -> TaskSource:
    """The run's task source, from the config's data section (every JSONL row is parsed)."""
    d = config.data
    return make_task_source(
        d.task, seed=config.job.seed, digits=d.digits, operators=d.operators,
        exact_digits=d.exact_digits, train_size=d.train_size, val_size=d.val_size, train_path=d.train_path,
        val_path=d.val_path, reasoning_gym_dataset=d.reasoning_gym_dataset,
        reasoning_gym_options=d.reasoning_gym_options,
    )  # fmt: skip


def check_repeats(config: PosttrainConfig, distinct: int) -> None:
    """Refuse ``data.prompts_per_step`` above the ``distinct`` train prompts unless
    ``data.allow_repeats``: every step would then sample the same prompts several times."""
    per_step = config.data.prompts_per_step
    if per_step <= distinct or config.data.allow_repeats:
        return
    raise ConfigError(
        f"data.prompts_per_step={per_step} exceeds the {distinct} distinct train prompts of "
        f"data.task={config.data.task}, so each step would repeat prompts "
        f"(~{per_step / distinct:.1f}x each); lower data.prompts_per_step to at most {distinct}, "
        "or set data.allow_repeats=true to repeat them"
    )


def load_tasks(config: PosttrainConfig) -> TaskSource:
    """The checked task source of an online run: its files exist, it builds, it is big enough."""
    check_data_files(config)
    tasks = build_tasks(config)
    check_repeats(config, tasks.distinct_prompts())
    return tasks


def check_data(config: PosttrainConfig) -> None:
    """What ``config show`` checks of the data: the files exist and, for an online run, the
    task source builds (JSONL rows parse) and holds at least a step's prompts. A reasoning_gym
    source is counted, not generated (``data.train_size`` entries; generating takes seconds)."""
    check_data_files(config)
    e = _policy_only(config)
    if e is not None:  # its entry reads its own files (DPO its pairs' images, with the model)
        if e.data_check:
            load(e.data_check)(config)
        return
    if config.data.task == "reasoning_gym":
        from posttrain.data.tasks.reasoning_gym import import_reasoning_gym

        import_reasoning_gym()
        check_repeats(config, config.data.train_size)
        return
    check_repeats(config, build_tasks(config).distinct_prompts())
