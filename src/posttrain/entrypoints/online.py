"""The online loop every RL entry shares: resolved config -> roles -> steps.

One step::

    prompts -> rollout (n samples each) -> reward scores [-> more rounds while dynamic sampling
    lacks informative groups] -> [teacher scoring] -> reward stage (group advantages, before
    dispatch) -> policy update(s) -> weight sync
            -> periodic held-out evaluation, checkpoint, metrics

An entry (``grpo.py``, ``opd.py``) is a composition: it names its objective builder, the
settings it pins, and whether its roles include a teacher; this file holds the loop once, and no
loss math.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.config import ConfigError, PosttrainConfig, load_config, to_dict
from posttrain.config.user_code import check_builder
from posttrain.control import run_preflight
from posttrain.control.input_checks import check_inputs
from posttrain.data.tasks import TaskItem, TaskSource, make_task_source
from posttrain.metrics import open_sinks
from posttrain.model.loading import load_tokenizer
from posttrain.model.tiny import ensure_tiny_model
from posttrain.reward.dynamic_sampling import sample_step
from posttrain.run.lock import RunLock, prepare_run_dir
from posttrain.run.records import (
    encode_prompts,
    refuse_driver_edits,
    write_resolved_config,
    write_samples,
)
from posttrain.run.signals import GracefulStop

log = logging.getLogger("posttrain")


def run(
    config: PosttrainConfig,
    config_path: str,
    opts: Sequence[str],
    out_dir: str | Path,
    build_objective_fn,
    *,
    pinned_opts: Sequence[str] = (),
    teacher: bool = False,
) -> dict[str, Any]:
    """Train with the objective from ``build_objective_fn`` (required: no fallback to GRPO).

    ``config`` is the driver's resolved copy; roles in other processes re-resolve
    ``config_path`` + ``opts`` + ``pinned_opts`` (the entry's invariants, after the user's), so
    the driver copy must not carry edits they can't see.
    """
    check_builder(build_objective_fn)
    opts = [*opts, *pinned_opts]
    resolved = load_config(config_path, ["--", *opts])
    refuse_driver_edits(config, resolved)
    for message in run_preflight(resolved):
        log.warning("preflight: %s", message)
    tasks = build_tasks(resolved)  # data errors surface before any model loads
    run_dir = prepare_run_dir(out_dir)
    with RunLock(run_dir):  # one writer per run directory
        ensure_model(resolved)
        tasks = check_inputs(resolved, tasks)
        roles = _place(resolved, config_path, opts, build_objective_fn, run_dir, teacher)
        try:
            return loop(resolved, roles, tasks, run_dir)
        finally:
            roles.close()


def build_tasks(config: PosttrainConfig) -> TaskSource:
    d = config.data
    return make_task_source(
        d.task, seed=config.job.seed, digits=d.digits, operators=d.operators,
        train_size=d.train_size, val_size=d.val_size, train_path=d.train_path,
        val_path=d.val_path, reasoning_gym_dataset=d.reasoning_gym_dataset,
        reasoning_gym_options=d.reasoning_gym_options,
    )  # fmt: skip


def ensure_model(config: PosttrainConfig) -> None:
    """Build the from-scratch tiny model the recipe asks for, once, before any role loads it."""
    path = Path(config.model.name_or_path)
    if not (path / "config.json").exists() and not config.model.init_preset:
        raise ConfigError(
            f"model.name_or_path={str(path)!r} is not a Hugging Face model directory (no "
            "config.json); point it at a local model, or set model.init_preset=tiny to build one"
        )
    if config.model.init_preset:
        ensure_tiny_model(config.model.init_preset, path, seed=config.job.seed)


def _place(config, config_path: str, opts, build_objective_fn, run_dir: Path, teacher: bool):
    if config.placement.backend == "ray":
        from posttrain.placement.ray import place_ray

        return place_ray(config, config_path, opts, build_objective_fn, str(run_dir), teacher)
    from posttrain.placement.local import place_local

    return place_local(config, build_objective_fn, str(run_dir), teacher)


def rollout_seed(seed: int, step: int) -> int:
    """Sampling seed of a step: a pure function of (seed, step), so resume needs no RNG state."""
    return (seed * 1_000_003 + step) % (2**63)


def collect(config: PosttrainConfig, roles, tokenizer, tasks: TaskSource, cursor: int, step: int):
    """Sample from the data ``cursor`` (one round, or dynamic sampling's rounds), score (teacher
    first, if any) and annotate one step's batch: the data edge.

    Returns what was sampled (rollout, items, cursor after it, ``sampling/*`` metrics), the
    reward stage's result and each phase's seconds. Round ``r`` of step ``s`` samples with seed
    and ids of index ``s * rounds + r`` (pure, so resume needs no RNG state).
    """
    p, n, rl = config.data.prompts_per_step, config.rollout.n, config.rl
    rounds = rl.max_sampling_rounds if rl.dynamic_sampling else 1
    times = {"time/rollout_s": 0.0, "time/reward_s": 0.0}

    def generate(items: Sequence[TaskItem], rnd: int):
        t, k = time.perf_counter(), step * rounds + rnd
        prompts = encode_prompts(items, config.data, tokenizer)
        rollout = roles.rollout.generate(
            prompts, n=n, temperature=config.rollout.temperature,
            seed=rollout_seed(config.job.seed, k), group_id_offset=k * p,
            sample_id_offset=k * p * n,
        )  # fmt: skip
        times["time/rollout_s"] += time.perf_counter() - t
        return rollout

    def score(rollout, items: Sequence[TaskItem]):
        t = time.perf_counter()
        scores = roles.reward.rollout_scores(rollout, items)
        times["time/reward_s"] += time.perf_counter() - t
        return scores

    sampled = sample_step(
        cursor, prompts=p, take=lambda c, k: tasks.take(config.job.seed, c, k),
        generate=generate, score=score, dynamic=rl.dynamic_sampling, max_rounds=rounds,
    )  # fmt: skip
    rollout = sampled.rollout
    if roles.teacher is not None:
        t = time.perf_counter()
        rollout = roles.teacher.score(rollout)
        times["time/teacher_s"] = time.perf_counter() - t
    t = time.perf_counter()
    result = roles.reward.score(rollout, sampled.items, sampled.scores)
    times["time/reward_s"] += time.perf_counter() - t
    return dataclasses.replace(sampled, rollout=rollout), result, times


def evaluate(config, roles, tokenizer, items: Sequence[TaskItem], run_dir: Path, step: int):
    """Greedy held-out accuracy; writes the samples of this evaluation."""
    prompts = encode_prompts(items, config.data, tokenizer)
    rollout = roles.rollout.generate(prompts, n=1, temperature=0.0, seed=0)
    metrics, scores = roles.reward.evaluate(rollout.texts, items)
    write_samples(run_dir / "samples" / f"step_{step:06d}.jsonl", items, rollout.texts, scores)
    return {f"val/{k}": v for k, v in metrics.items()}


def keep_train_samples(config, run_dir: Path, step: int, items, rollout, result) -> None:
    """The first rows of a step's batch, next to the held-out samples."""
    k = min(config.logging.train_samples_per_step, len(rollout.texts))
    if not k:
        return
    rows = [items[i] for i in rollout.prompt_index[:k].tolist()]
    path = run_dir / "samples" / "train" / f"step_{step:06d}.jsonl"
    write_samples(path, rows, rollout.texts[:k], result.scores, advantages=result.batch.advantages)


def loop(config: PosttrainConfig, roles, tasks: TaskSource, run_dir: Path) -> dict[str, Any]:
    job, rl = config.job, config.rl
    tokenizer = load_tokenizer(config.model.tokenizer_path or config.model.name_or_path)
    # rl.eval_every=0 turns held-out evaluation off entirely (also before and after training).
    val_items = tasks.val_items() if rl.eval_every else []
    state = roles.policy.resume()
    # Written only once resume has accepted this config: a refused run leaves the old one intact.
    write_resolved_config(config, run_dir)
    start, cursor = (state.step, state.data_state["cursor"]) if state else (0, 0)
    if state:
        roles.sync_weights()  # a rollout engine with its own weights starts from the checkpoint
    sink = open_sinks(
        run_dir, resume_step=start if state else None, tensorboard=config.logging.tensorboard,
        wandb=config.logging.wandb, wandb_project=config.logging.wandb_project,
        wandb_mode=config.logging.wandb_mode, run_name=job.name, config=to_dict(config),
    )  # fmt: skip
    summary: dict[str, Any] = {
        "run_dir": str(run_dir), "start_step": start, "val_problems": len(val_items),
    }  # fmt: skip
    if val_items and start == 0:
        first = evaluate(config, roles, tokenizer, val_items, run_dir, 0)
        sink.write(0, first)
        summary["initial_val_accuracy"] = first["val/accuracy"]
    bar = _progress(config, start)
    began = time.perf_counter()
    stop = GracefulStop(
        config.checkpoint.save_on_signal,
        state.path if state else None,
        grace_s=config.checkpoint.signal_grace_s,
    ).install()
    try:
        for step in range(start + 1, rl.max_steps + 1):
            t0 = time.perf_counter()
            sampled, result, times = collect(config, roles, tokenizer, tasks, cursor, step)
            items, rollout, cursor = sampled.items, sampled.rollout, sampled.cursor
            t1 = time.perf_counter()
            train_metrics = roles.policy.train(result.batch)
            t2 = time.perf_counter()
            roles.sync_weights()
            t3 = time.perf_counter()
            keep_train_samples(config, run_dir, step, items, rollout, result)
            record = {f"train/{k.replace('reward/', 'reward_')}": v
                      for k, v in result.metrics.items()}  # fmt: skip
            record.update({f"train/{k}": v for k, v in sampled.metrics.items()})
            record.update(train_metrics)
            record.update(times)
            record.update({
                "time/train_s": t2 - t1, "time/sync_s": t3 - t2, "time/step_s": t3 - t0,
                "perf/rollout_tokens_per_s":
                    sampled.generated_tokens / max(times["time/rollout_s"], 1e-9),
                "perf/train_tokens_per_s": train_metrics["train/tokens"] / max(t2 - t1, 1e-9),
            })  # fmt: skip
            if val_items and (step % rl.eval_every == 0 or step == rl.max_steps):
                record.update(evaluate(config, roles, tokenizer, val_items, run_dir, step))
                summary["final_val_accuracy"] = record["val/accuracy"]
            sink.write(step, record)
            save = functools.partial(roles.policy.save, step, {"cursor": cursor})
            due = (rl.save_every and step % rl.save_every == 0) or step == rl.max_steps
            saved = save() if due else None
            _advance(bar, record)
            stop.after_step(step, saved, save)  # a signal stops here, after a checkpoint
    finally:
        stop.uninstall()
        sink.close()
        if bar is not None:
            bar.close()
    summary["steps"] = rl.max_steps
    summary["wall_s"] = time.perf_counter() - began
    return summary


def _progress(config: PosttrainConfig, start: int):
    if not config.logging.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=config.rl.max_steps, initial=start, desc=config.job.name, unit="step",
                dynamic_ncols=True, file=sys.stderr)  # fmt: skip


def _advance(bar, record: dict[str, Any]) -> None:
    if bar is None:
        return
    post = {"reward": f"{record.get('train/reward_mean', float('nan')):.3f}",
            "step_s": f"{record['time/step_s']:.2f}"}  # fmt: skip
    if "val/accuracy" in record:
        post["val_acc"] = f"{record['val/accuracy']:.3f}"
    bar.set_postfix(post, refresh=False)
    bar.update(1)


def report(summary: dict[str, Any]) -> None:
    """What a finished run prints: where it wrote, how long, held-out accuracy before/after."""
    before, after = summary.get("initial_val_accuracy"), summary.get("final_val_accuracy")
    print(f"run directory: {summary['run_dir']}")
    done = summary["steps"] - summary["start_step"]
    print(f"trained {done} steps in {summary['wall_s']:.0f} s")
    if before is not None or after is not None:
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        n = summary["val_problems"]
        print(f"held-out accuracy: {fmt(before)} -> {fmt(after)} ({n} problems, greedy)")
