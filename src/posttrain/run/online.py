"""The online step every RL entry shares, on the run session (``run/session.py``).

One step::

    prompts -> rollout (n samples each) -> reward scores [-> more rounds while dynamic sampling
    lacks informative groups] -> [declared roles, e.g. teacher scoring] -> reward stage (group
    advantages, before dispatch) -> policy update(s) -> weight sync
            -> periodic held-out evaluation, checkpoint, metrics

An entry (``grpo.py``, ``opd.py``) is a composition: it names its objective builder, the
settings it pins, and the roles it declares (``placement/specs.py``: OPD's teacher); this file
holds the step once, the session the loop around it (resume, timing, signals, sinks), and
neither holds loss math.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posttrain.config import ConfigError, PosttrainConfig
from posttrain.config.build import reference_on_data
from posttrain.config.user_code import check_builder
from posttrain.control.data_checks import load_tasks
from posttrain.control.env_inputs import check_environment_inputs
from posttrain.control.input_checks import check_inputs
from posttrain.data.padding import row_lengths, trimmed_width
from posttrain.data.tasks import TaskItem, TaskSource
from posttrain.model.loading import load_tokenizer
from posttrain.model.tiny import ensure_tiny_model
from posttrain.placement.reference import REFERENCE
from posttrain.placement.specs import RoleSpec, annotate
from posttrain.reward.dynamic_sampling import sample_step
from posttrain.reward.stage import ENV_REWARD_COLUMN
from posttrain.rollout.multiturn import env_metrics, multiturn_rollout, trajectory_records
from posttrain.run.pipeline import Collected, Pipeline
from posttrain.run.records import encode_prompts, sample_rows, write_rows, write_samples
from posttrain.run.session import RunSession, report_lines

log = logging.getLogger("posttrain")

#: Progress shows these metrics (label -> metric) besides the step time.
SHOWN = {"reward": "train/reward_mean", "val_acc": "val/accuracy"}


def run(
    session: RunSession,
    out_dir: str | Path,
    build_objective_fn,
    *,
    role_specs: Sequence[RoleSpec] = (),
    prepare: Callable[[PosttrainConfig], None] | None = None,
) -> dict[str, Any]:
    """Train ``session``'s config with the objective from ``build_objective_fn`` (required: no
    fallback to GRPO), applying the declared ``role_specs`` to each rollout in order. ``prepare`` runs once the starting model exists, before the run directory
    is touched (the OPD entry checks its teacher's tokenizer there)."""
    check_builder(build_objective_fn)
    config = session.config
    tasks = load_tasks(config)  # data errors surface before any model loads
    check_model_source(config)
    check_environment_inputs(config, tasks)  # multi-turn: template and prompt, tokenizer only
    if prepare is not None:  # it reads the starting model's files: before the run directory
        ensure_model(config)
        prepare(config)
    made: dict[str, Any] = {}  # what place() and body() built, for the next phase

    def place(run_dir: Path):
        ensure_model(config)  # built above already when prepare needed it (then a no-op)
        made["tasks"] = check_inputs(config, tasks)
        return _place(config, session.config_path, session.opts, build_objective_fn, run_dir,
                      role_specs)  # fmt: skip

    def body(roles, state, run_dir: Path):
        made["body"] = OnlineBody(config, roles, made["tasks"], run_dir, state)
        return made["body"]

    try:
        summary = session.run(out_dir, place, body)
    finally:
        if "body" in made:
            made["body"].close()
    summary["val_problems"] = len(made["body"].val_items) if "body" in made else 0
    for key, name in (("initial", "initial_val_accuracy"), ("final", "final_val_accuracy")):
        if key in summary:
            summary[name] = summary[key]["val/accuracy"]
    return summary


def ensure_model(config: PosttrainConfig) -> None:
    """Build the from-scratch tiny model the recipe asks for, once, before any role loads it
    (``run`` has checked the model source with :func:`check_model_source`)."""
    if config.model.init_preset:
        path = Path(config.model.name_or_path)
        ensure_tiny_model(config.model.init_preset, path, seed=config.job.seed)


def check_model_source(config: PosttrainConfig) -> None:
    """A model folder to load, or a preset to build one: a config error before the run
    directory is touched otherwise."""
    path = Path(config.model.name_or_path)
    if not (path / "config.json").exists() and not config.model.init_preset:
        raise ConfigError(
            f"model.name_or_path={str(path)!r} is not a Hugging Face model directory (no "
            "config.json); point it at a local model, or set model.init_preset=tiny to build one"
        )


def _place(config, config_path: str, opts, build_objective_fn, run_dir: Path, specs):
    """Both placements build the declared roles from the same specs (and the reference's,
    when it scores on the data side: ``placement/reference.py``)."""
    if reference_on_data(config):
        specs = (*specs, REFERENCE)
    if config.placement.backend == "ray":
        from posttrain.placement.ray import place_ray

        return place_ray(config, config_path, opts, build_objective_fn, str(run_dir), specs)
    from posttrain.placement.local import place_local

    return place_local(config, build_objective_fn, str(run_dir), specs)


def rollout_seed(seed: int, step: int) -> int:
    """Sampling seed of a step: a pure function of (seed, step), so resume needs no RNG state."""
    return (seed * 1_000_003 + step) % (2**63)


def collect(config: PosttrainConfig, roles, tokenizer, tasks: TaskSource, cursor: int, step: int):
    """Sample from the data ``cursor`` (one round, or dynamic sampling's rounds), apply the
    declared roles (OPD's teacher) and the reward stage to one step's batch: the data edge.

    Returns what was sampled (rollout, items, cursor after it, ``sampling/*`` metrics), the
    reward stage's result and each phase's seconds. Round ``r`` of step ``s`` samples with seed
    and ids of index ``s * rounds + r`` (pure, so resume needs no RNG state).
    """
    p, n, rl = config.data.prompts_per_step, config.rollout.n, config.rl
    rounds = rl.max_sampling_rounds if rl.dynamic_sampling else 1
    times = {"time/rollout_s": 0.0, "time/reward_s": 0.0}

    def generate(items: Sequence[TaskItem], rnd: int):
        t, k = time.perf_counter(), step * rounds + rnd
        ids = dict(seed=rollout_seed(config.job.seed, k), group_id_offset=k * p,
                   sample_id_offset=k * p * n)  # fmt: skip
        if config.env.name:  # multi-turn: the environment runs in the reward role
            rollout = multiturn_rollout(roles, items, tokenizer, n=n, top_p=config.rollout.top_p,
                                        temperature=config.rollout.temperature, **ids)  # fmt: skip
        else:
            prompts = encode_prompts(items, config.data, tokenizer)
            rollout = roles.rollout.generate(prompts, n=n, temperature=config.rollout.temperature,
                                             **ids)  # fmt: skip
        times["time/rollout_s"] += time.perf_counter() - t
        return rollout

    def score(rollout, items: Sequence[TaskItem]):
        t = time.perf_counter()
        scores = roles.reward.rollout_scores(rollout, items, step)
        times["time/reward_s"] += time.perf_counter() - t
        return scores

    sampled = sample_step(
        cursor, prompts=p, take=lambda c, k: tasks.take(config.job.seed, c, k),
        generate=generate, score=score, dynamic=rl.dynamic_sampling, max_rounds=rounds,
    )  # fmt: skip
    rollout, role_times = annotate(sampled.rollout, roles.declared)
    times.update(role_times)
    t = time.perf_counter()
    result = roles.reward.score(rollout, sampled.items, sampled.scores)
    times["time/reward_s"] += time.perf_counter() - t
    return dataclasses.replace(sampled, rollout=rollout), result, times


def evaluate(config, roles, tokenizer, items: Sequence[TaskItem], run_dir: Path, step: int,
             samples_path: Path | None = None):  # fmt: skip
    """Greedy held-out accuracy; writes the samples of this evaluation (to ``samples_path``,
    default ``run_dir/samples/step_<step>.jsonl``). ``roles`` needs ``rollout`` and ``reward``
    (and for multi-turn what ``multiturn_rollout`` drives): ``posttrain rft`` evaluates with its
    own two."""
    if config.env.name:  # multi-turn, as in training; its tool use is measured too
        rollout = multiturn_rollout(roles, items, tokenizer, n=1, temperature=0.0, top_p=1.0,
                                    seed=0)  # fmt: skip
    else:
        prompts = encode_prompts(items, config.data, tokenizer)
        rollout = roles.rollout.generate(prompts, n=1, temperature=0.0, seed=0)
    env = rollout.batch.columns.get(ENV_REWARD_COLUMN)  # multi-turn: the environment's reward
    metrics, scores = roles.reward.evaluate(rollout.texts, items, step, env)
    metrics.update(env_metrics(rollout.batch))
    trajectories = trajectory_records(rollout.batch, tokenizer, len(items))  # None: one turn
    path = samples_path or run_dir / "samples" / f"step_{step:06d}.jsonl"
    write_samples(path, items, rollout.texts, scores, trajectories=trajectories)
    return {f"val/{k}": v for k, v in metrics.items()}


def collected(config, roles, tokenizer, tasks: TaskSource, cursor: int, step: int, version: int):
    """:func:`collect` for ``step`` as the pipeline holds it (plain values and the batch), with
    the first rows of the batch kept as samples; ``version``: the weights that sample it."""
    sampled, result, times = collect(config, roles, tokenizer, tasks, cursor, step)
    rollout = sampled.rollout
    keep = min(config.logging.train_samples_per_step, len(rollout.texts))
    rows = [sampled.items[i] for i in rollout.prompt_index[:keep].tolist()]
    samples = sample_rows(rows, rollout.texts[:keep], result.scores, result.batch.advantages,
                          trajectory_records(result.batch, tokenizer, keep))  # fmt: skip
    metrics = {f"train/{k.replace('reward/', 'reward_')}": v for k, v in result.metrics.items()}
    metrics.update({f"train/{k}": v for k, v in sampled.metrics.items()})
    return Collected(step, version, sampled.cursor, result.batch, metrics, times,
                     sampled.generated_tokens, samples)  # fmt: skip


class OnlineBody:
    """One online step (collect -> train -> sync) and the held-out evaluation, for the
    session's loop. With ``rl.off_policy_lag >= 1`` the step runs on a :class:`Pipeline`
    (``run/pipeline.py``): the rollout samples ahead while the policy trains."""

    shown = SHOWN

    def __init__(self, config: PosttrainConfig, roles, tasks: TaskSource, run_dir: Path, state):
        self.config, self.roles, self.tasks, self.run_dir = config, roles, tasks, run_dir
        self.tokenizer = load_tokenizer(config.model.tokenizer_path or config.model.name_or_path)
        # rl.eval_every=0 turns held-out evaluation off entirely (also before and after training).
        self.val_items = tasks.val_items() if config.rl.eval_every else []
        self.evaluates = bool(self.val_items)
        self.evaluation = f"{len(self.val_items)} held-out problems (greedy)"
        lag = config.rl.off_policy_lag
        self.pipeline = None
        if lag:
            self.pipeline = Pipeline(lag, self._collect, roles.sync_weights, state)
        else:
            self.cursor = state.data_state["cursor"] if state else 0
        if state:
            roles.sync_weights()  # a rollout engine with its own weights starts from the checkpoint
        self.budget_checked = False

    def _collect(self, cursor: int, step: int, version: int) -> Collected:
        return collected(self.config, self.roles, self.tokenizer, self.tasks, cursor, step,
                         version)  # fmt: skip

    def data_state(self) -> dict[str, Any]:
        return self.pipeline.state() if self.pipeline else {"cursor": self.cursor}

    def evaluate(self, step: int) -> dict[str, float]:
        return evaluate(self.config, self.roles, self.tokenizer, self.val_items, self.run_dir, step)

    def step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        if self.pipeline:
            batch, train_metrics = self.pipeline.step(step, self.roles.policy.train)
        else:
            batch, train_metrics = self._sequential_step(step)
        if not self.budget_checked:
            self.budget_checked = True
            message = token_budget_below_rows(self.config, batch.batch)
            if message:
                log.warning("%s", message)
        if batch.samples:
            write_rows(self.run_dir / "samples" / "train" / f"step_{step:06d}.jsonl", batch.samples)
        record = {**batch.metrics, **train_metrics, **batch.times, **self.roles.last_sync}
        record["time/step_s"] = time.perf_counter() - t0
        record["perf/rollout_tokens_per_s"] = batch.generated_tokens / max(
            batch.times["time/rollout_s"], 1e-9
        )
        record["perf/train_tokens_per_s"] = train_metrics["train/tokens"] / max(
            train_metrics["time/train_s"], 1e-9
        )
        return record

    def _sequential_step(self, step: int) -> tuple[Collected, dict]:
        """Collect, train, sync: lag 0, the batch sampled with the weights after step - 1."""
        batch = self._collect(self.cursor, step, step - 1)
        self.cursor = batch.cursor
        t1 = time.perf_counter()
        train_metrics = self.roles.policy.train(batch.batch)
        t2 = time.perf_counter()
        self.roles.sync_weights()
        t3 = time.perf_counter()
        return batch, {**train_metrics, "time/train_s": t2 - t1, "time/sync_s": t3 - t2}

    def close(self) -> None:
        if self.pipeline:
            self.pipeline.close()


def token_budget_below_rows(config: PosttrainConfig, batch) -> str | None:
    """``rl.micro_batch_tokens`` below the first batch's longest rows: each runs alone, one
    forward per row. Preflight warns already when the budget is below ``rollout.max_tokens``
    (``control/inert.py``); this names the smallest budget that fits every row of the batch."""
    budget = config.rl.micro_batch_tokens
    if budget is None or budget <= config.rollout.max_tokens:
        return None
    widths = [trimmed_width([p], [r]) for p, r in zip(*row_lengths(batch), strict=True)]
    over = sum(w > budget for w in widths)
    if not over:
        return None
    return (
        f"rl.micro_batch_tokens={budget} is below one row: {over} of the first batch's "
        f"{len(widths)} rows are longer (up to {max(widths)} tokens, prompt + response) and "
        f"each runs alone, one forward per row; set rl.micro_batch_tokens to at least "
        f"{max(widths)} (the smallest budget that fits every row of that batch)"
    )


def report(summary: dict[str, Any]) -> None:
    """What a finished run prints: where it wrote, how long, held-out accuracy before/after."""
    print("\n".join(report_lines(summary)))
    before, after = summary.get("initial_val_accuracy"), summary.get("final_val_accuracy")
    if before is not None or after is not None:
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        n = summary["val_problems"]
        print(f"held-out accuracy: {fmt(before)} -> {fmt(after)} ({n} problems, greedy)")
