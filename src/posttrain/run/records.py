"""Small pieces every entry shares: quiet libraries, the run directory, prompt encoding and
sample files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from posttrain.config import PosttrainConfig, to_yaml
from posttrain.config.sections import DataConfig
from posttrain.data.tasks import TaskItem, format_prompt
from posttrain.fileio import atomic_write_text


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


#: The Hugging Face folder a run exports its final policy to, inside the run directory.
FINAL_DIR = "final_model"


def default_out_dir(config: PosttrainConfig) -> Path:
    return Path(config.job.output_root) / config.job.algorithm / config.job.name


def final_model_dir(config: PosttrainConfig) -> Path:
    """Where a run of ``config`` in its default directory leaves its final model (torch-free,
    so a recipe can name another run's output)."""
    return default_out_dir(config) / FINAL_DIR


def encode_prompts(items: Sequence[TaskItem], data: DataConfig, tokenizer) -> list[list[int]]:
    """Token ids of each item's prompt as the ``data`` section renders it."""
    texts = [
        format_prompt(
            it,
            data.prompt_template,
            tokenizer,
            system_prompt=data.system_prompt,
            user_template=data.user_template,
        )  # fmt: skip
        for it in items
    ]
    # A chat template already carries its special tokens; a plain prompt gets the tokenizer's.
    add_special = data.prompt_template != "chat"
    return [tokenizer(t, add_special_tokens=add_special)["input_ids"] for t in texts]


def write_samples(path: Path, items, completions, scores, advantages=None, trajectories=None):
    """One JSON row per completion (row ``i`` scored as ``scores`` row ``i``)."""
    write_rows(path, sample_rows(items, completions, scores, advantages, trajectories))


def write_rows(path: Path, rows: Sequence[dict]) -> None:
    """Rows from :func:`sample_rows`, one JSON line each, written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def sample_rows(items, completions, scores, advantages=None, trajectories=None) -> list[dict]:
    """Plain rows of completions and their scores (a lagged run holds them until its step).

    A multi-turn row's ``completion`` is its last turn (what the verifiers score), and
    ``trajectory`` the whole trajectory (``posttrain.rollout.multiturn.trajectory_records``:
    every turn, tool calls and responses, token counts); single-turn rows have no
    ``trajectory``.
    """
    rows = []
    for i, (item, text) in enumerate(zip(items, completions, strict=True)):
        row = {
            "prompt": item.prompt,
            "answer": item.answer,
            "completion": text,
            "reward": float(scores.rewards[i]),
            "correct": bool(scores.correct[i]),
        }
        if scores.env is not None:  # multi-turn: the environment's part of the reward
            row["env_reward"] = float(scores.env[i])
        if advantages is not None and advantages.dim() == 1:  # per-token ones stay out
            row["advantage"] = float(advantages[i])
        if trajectories is not None:
            row["trajectory"] = trajectories[i]
        rows.append(row)
    return rows


def refuse_driver_edits(driver: PosttrainConfig, resolved: PosttrainConfig) -> None:
    """Roles rebuild the config from ``config_path`` + opts; a driver-side edit they can't see
    would make the run differ from its record, so it is refused with the keys named."""
    from posttrain.config import ConfigError, to_dict
    from posttrain.trainer.compat import differing_keys

    diff = differing_keys(to_dict(resolved), to_dict(driver))
    if diff:
        raise ConfigError(
            f"the driver's config differs from config_path + opts at {', '.join(diff)}; roles "
            "rebuild the config from config_path + opts, so pass the change as an override"
        )
