"""``posttrain rft``: a policy's own samples, scored, as SFT rows and preference pairs.

    posttrain rft --config RECIPE [--out DIR] [--per-prompt K] [--threshold T]
                  [--keep-duplicates] [--prompts P] -- section.key=value ...

Rejection sampling ("RFT") over an online recipe (GRPO, OPD): its model, its train prompts
rendered as its rollout renders them (``data``), ``rollout.n`` samples each from its rollout
engine at ``rollout.temperature`` (``rollout``), every sample scored by its reward stage
(``reward``: verifier, format reward, reward functions). Correct means the verifier's 1.0, or
with ``--threshold T`` a total reward of at least ``T``. The folder (``--out``, default
``{job.output_root}/rft/{job.name}``) receives ``sft.jsonl`` (rows ``posttrain sft`` reads),
``pairs.jsonl`` (pairs ``posttrain lmdpo`` reads), ``samples.jsonl`` (every sample and its
scores), ``val_samples.jsonl`` (the held-out split, greedy, as GRPO evaluates), the resolved
``config.yaml`` and ``summary.json``; which samples become rows and pairs is ``data/rft.py``'s
rule. Everything is sampled and scored before anything is written, into a temporary folder
renamed into place, so a failing reward function or a kill leaves no half-written folder.

Sampling is a pure function of the recipe, the overrides and ``job.seed``: the prompts are the
first ``--prompts`` of the train split's seeded order (all by default), taken in chunks of
``data.prompts_per_step``; chunk ``k`` samples with the rollout seed GRPO's step ``k`` uses.
Single-turn only: a recipe with ``env.name`` is refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.config import ConfigError, PosttrainConfig, load_config, to_yaml
from posttrain.data.rft import Sample, pair_row, pass_at, prompt_fields, select, sft_row
from posttrain.fileio import write_files_as_folder

log = logging.getLogger("posttrain")

#: The files the command writes; a folder holding anything else is not replaced.
OUTPUTS = ("sft.jsonl", "pairs.jsonl", "samples.jsonl", "val_samples.jsonl", "config.yaml",
           "summary.json")  # fmt: skip
#: What the command reads of a config: an override of any other key claims a setting that
#: nothing here reads (the objective, the optimiser, the schedule: it trains nothing) and is
#: refused. ``None``: every key of the section.
READS: dict[str, tuple[str, ...] | None] = {
    "job": ("name", "algorithm", "seed", "output_root"),
    "model": ("name_or_path", "tokenizer_path", "init_preset"),
    "data": ("task", "train_path", "val_path", "reasoning_gym_dataset", "reasoning_gym_options",
             "digits", "exact_digits", "operators", "train_size", "val_size", "prompts_per_step",
             "prompt_template", "system_prompt", "user_template", "prompt_truncation"),
    "rollout": None,
    "reward": ("verifier", "format_weight", "functions", "overlong_buffer", "overlong_penalty"),
    "env": ("name",),
    "placement": ("device", "torch_threads_per_process"),
}  # fmt: skip


class RFTError(ConfigError):
    """Nothing to write, or nowhere to write it; one line saying what to change."""


@dataclass(frozen=True)
class Settings:
    """The command's own knobs (its flags): where to write, how many rows and pairs a prompt
    gives at most (None: no cap), what counts as correct (None: the verifier's 1.0), whether
    equal texts of a prompt count once, how many train prompts (None: all)."""

    out: str | None = None
    per_prompt: int | None = None
    threshold: float | None = None
    dedup: bool = True
    prompts: int | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``posttrain rft``'s flags (argparse only: the heavy modules load when it runs)."""
    parser.add_argument("--config", required=True, metavar="RECIPE",
                        help="an online recipe (GRPO, OPD): built-in name, .py file or saved "
                        "config; its model, data, rollout and reward sections are used")  # fmt: skip
    parser.add_argument("--out", metavar="DIR",
                        help="folder to write (default {job.output_root}/rft/{job.name}); "
                        "an existing one is replaced only if it holds this command's files")  # fmt: skip
    parser.add_argument("--per-prompt", type=int, metavar="K",
                        help="at most K SFT rows and K pairs per prompt (default: no cap)")  # fmt: skip
    parser.add_argument("--threshold", type=float, metavar="T",
                        help="a sample is correct when its total reward is >= T (default: when "
                        "the verifier gives exactly 1.0)")  # fmt: skip
    parser.add_argument("--keep-duplicates", action="store_true",
                        help="keep equal texts of one prompt (default: each distinct text once)")  # fmt: skip
    parser.add_argument("--prompts", type=int, metavar="P",
                        help="sample the first P train prompts of the seeded order (default: all)")  # fmt: skip


def dispatch(args: argparse.Namespace, overrides: list[str]) -> int:
    """The CLI handler: run, print the summary's lines."""
    from posttrain.run.records import quiet_libraries

    quiet_libraries()
    settings = Settings(args.out, args.per_prompt, args.threshold, not args.keep_duplicates,
                        args.prompts)  # fmt: skip
    summary = run(args.config, overrides, settings)
    print("\n".join(report_lines(summary)))
    return 0


def resolve(config_path: str, opts: Sequence[str], settings: Settings) -> PosttrainConfig:
    """The config to sample with, refused in one line if this command cannot honour it."""
    from posttrain.control.rules import objective_family
    from posttrain.entrypoints.registry import entry

    _check_settings(settings)
    config = load_config(config_path, ["--", *opts])
    unread = [o for o in opts if not _is_read(o.partition("=")[0].strip())]
    if unread:
        them = "it" if len(unread) == 1 else "them"
        raise RFTError(
            f"{', '.join(unread)}: posttrain rft never reads {them} (it samples and scores, "
            "training nothing: it reads job.seed, the model it samples, the data, rollout and "
            f"reward settings and placement.device); remove {them}"
        )
    e = entry(objective_family(config))
    if e.placement != "online":
        raise RFTError(
            f"job.algorithm={config.job.algorithm} is {e.kind}, with no prompts to sample; "
            "posttrain rft samples from an online recipe's train prompts (a GRPO or OPD recipe)"
        )
    if config.env.name:
        raise RFTError(
            f"env.name={config.env.name}: posttrain rft samples single-turn answers; a "
            "multi-turn environment's trajectories (tool calls and results) are not written as "
            "rows; use a recipe without env.name"
        )
    _preflight(config)
    return config


def _preflight(config: PosttrainConfig) -> None:
    """Preflight's error rules over what this command reads alone (the data source, the chat
    template, the reward functions, ...); rules about training are the training entry's."""
    from posttrain.control.preflight import RULES
    from posttrain.control.rules import PreflightError

    ours = [r for r in RULES if r.severity == "error" and r.reads and all(map(_is_read, r.reads))]
    errors = [m for r in ours if (m := r.check(config)) is not None]
    if errors:
        raise PreflightError(errors)


def _check_settings(s: Settings) -> None:
    for flag, value in (("--per-prompt", s.per_prompt), ("--prompts", s.prompts)):
        if value is not None and value < 1:
            raise RFTError(f"{flag} {value}: must be at least 1 (leave it out for no cap)")
    if s.threshold is not None and not math.isfinite(s.threshold):
        raise RFTError(f"--threshold {s.threshold}: must be a finite number")


def _is_read(key: str) -> bool:
    section, _, name = key.partition(".")
    names = READS.get(section, ())
    return names is None or name in names


def out_dir(config: PosttrainConfig, settings: Settings = Settings()) -> Path:
    """Where the folder goes: ``--out``, else ``{job.output_root}/rft/{job.name}``."""
    return Path(settings.out or Path(config.job.output_root) / "rft" / config.job.name)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise RFTError(f"--out {str(out)!r} is a file; choose a folder")
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if p.name not in OUTPUTS)
        if other:
            raise RFTError(
                f"--out {str(out)!r} holds files posttrain rft did not write ({', '.join(other[:3])}"
                f"{', ...' if len(other) > 3 else ''}); it replaces only its own folder, so "
                "choose a new or empty one"
            )


@dataclass
class Sampler:
    """The recipe's rollout and reward roles, in this process (what ``online.evaluate``
    needs of a run's roles)."""

    rollout: Any
    reward: Any


def place_sampler(config: PosttrainConfig) -> Sampler:
    """The rollout role (its own copy of the model, ``rollout.dtype``) and the reward role, on
    ``placement.device`` with ``placement.torch_threads_per_process`` threads."""
    from posttrain.placement.device import resolve_device
    from posttrain.placement.roles import RewardRole, RolloutRole
    from posttrain.placement.threads import set_torch_threads

    set_torch_threads(config.placement.torch_threads_per_process)
    device = str(resolve_device(config.placement.device))
    return Sampler(RolloutRole(config, device=device), RewardRole(config))


def run(config_path: str, opts: Sequence[str], settings: Settings = Settings()) -> dict[str, Any]:
    """Sample, score, select, write; returns the summary (also ``summary.json``)."""
    from posttrain.control.data_checks import build_tasks, check_data_files
    from posttrain.control.input_checks import check_inputs
    from posttrain.model.loading import load_tokenizer
    from posttrain.run.online import check_model_source, ensure_model

    config = resolve(config_path, opts, settings)
    out = out_dir(config, settings)
    _check_out(out)
    check_data_files(config)
    tasks = build_tasks(config)
    count = len(tasks) if settings.prompts is None else settings.prompts
    if count > len(tasks):
        raise RFTError(f"--prompts {count}: the train split holds {len(tasks)} prompts")
    check_model_source(config)
    ensure_model(config)
    m = config.model
    tokenizer = load_tokenizer(m.tokenizer_path or m.name_or_path)
    _check_template(config, tokenizer)
    tasks = check_inputs(config, tasks)  # the tokenizer fits the model, the prompts the context
    items, _ = tasks.take(config.job.seed, 0, count)
    sampler = place_sampler(config)
    groups = sample_and_score(config, sampler, tokenizer, items, settings.threshold)
    files, summary = build_outputs(config, tokenizer, items, groups, settings)
    summary.update(recipe=config_path, overrides=list(opts), out=str(out))
    with tempfile.TemporaryDirectory(prefix=".tmp-rft-val-") as scratch:
        summary["val"] = _held_out(config, sampler, tokenizer, tasks.val_items(), Path(scratch))
        if summary["val"]:
            files["val_samples.jsonl"] = (Path(scratch) / "val.jsonl").read_text()
    files["config.yaml"] = to_yaml(config)
    files["summary.json"] = json.dumps(summary, indent=2) + "\n"
    write_folder(out, files)
    return summary


def _check_template(config: PosttrainConfig, tokenizer) -> None:
    """A ``plain`` prompt under a tokenizer with a chat template: the SFT and LM DPO readers
    would render the rows with the template, another prompt than the one sampled."""
    if config.data.prompt_template == "plain" and getattr(tokenizer, "chat_template", None):
        raise RFTError(
            "data.prompt_template=plain, but the tokenizer has a chat template, with which "
            "posttrain sft and lmdpo render rows: they would train on other prompts than the "
            "ones sampled; set data.prompt_template=chat"
        )


@dataclass(frozen=True)
class Group:
    """One prompt's samples: scored, their row in the rollout and the ids sampled."""

    samples: list[Sample]
    records: list[dict[str, Any]]
    ids: list[list[int]]


def sample_and_score(config, sampler: Sampler, tokenizer, items, threshold) -> list[Group]:
    """``rollout.n`` samples of each item, scored by the reward stage, in item order."""
    from posttrain.run.online import rollout_seed
    from posttrain.run.records import encode_prompts, sample_rows

    n, step = config.rollout.n, min(config.data.prompts_per_step, len(items))
    groups: list[Group] = []
    for k, start in enumerate(range(0, len(items), step)):
        chunk = items[start : start + step]
        prompts = encode_prompts(chunk, config.data, tokenizer)
        rollout = sampler.rollout.generate(
            prompts, n=n, temperature=config.rollout.temperature,
            seed=rollout_seed(config.job.seed, k), group_id_offset=start,
            sample_id_offset=start * n,
        )  # fmt: skip
        scores = sampler.reward.rollout_scores(rollout, chunk, 0)  # as before any training step
        rows = [chunk[i] for i in rollout.prompt_index.tolist()]
        records = sample_rows(rows, rollout.texts, scores)
        b = rollout.batch
        good = scores.correct if threshold is None else scores.rewards >= threshold
        for g in range(len(chunk)):
            at = range(g * n, (g + 1) * n)
            for r in at:
                records[r]["correct"] = bool(good[r])
                records[r]["verifier"] = float(scores.verifier[r])
                records[r]["truncated"] = bool(rollout.truncated[r])
                records[r]["tokens"] = int(b.response_mask[r].sum())
            groups.append(Group(
                [Sample(rollout.texts[r], bool(good[r]), float(scores.rewards[r])) for r in at],
                [records[r] for r in at],
                [prompts[g] + b.response_ids[r][b.response_mask[r]].tolist() for r in at],
            ))  # fmt: skip
        log.info("rft: %d/%d prompts sampled", start + len(chunk), len(items))
    return groups


def build_outputs(config, tokenizer, items, groups: Sequence[Group], settings: Settings):
    """The files' texts (rows, pairs, samples) and the summary, from the scored groups."""
    from posttrain.data.sft import _messages, render_checked

    sft, pairs, samples, per_prompt = [], [], [], []
    duplicates = as_sampled = 0
    for item, group in zip(items, groups, strict=True):
        chosen = select(group.samples, settings.per_prompt, settings.dedup)
        prompt = prompt_fields(item, config.data)
        for text in chosen.rows:
            row = sft_row(prompt, text)
            messages, _ = _messages(row, f"the row of item {item.item_id}")
            ids, _, _ = render_checked(tokenizer, messages, [], f"the row of item {item.item_id}")
            sampled = group.ids[[s.text for s in group.samples].index(text)]
            as_sampled += ids == sampled
            sft.append(row)
        pairs += [pair_row(prompt, c, w) for c, w in chosen.pairs]
        samples += group.records
        duplicates += chosen.duplicates
        correct = sum(s.correct for s in group.samples)
        per_prompt.append({"item": item.item_id, "prompt": item.prompt, "answer": item.answer,
                           "correct": correct, "sft_rows": len(chosen.rows),
                           "pairs": len(chosen.pairs)})  # fmt: skip
    n = config.rollout.n
    total = sum(p["correct"] for p in per_prompt)
    if not total:
        rule = (
            "the verifier's 1.0"
            if settings.threshold is None
            else f"--threshold {settings.threshold}"
        )
        raise RFTError(
            f"no sample of the {len(items) * n} was correct ({rule}), so there is no row to "
            "write; sample from a better policy (model.name_or_path), raise rollout.n, or "
            "lower --threshold"
        )
    summary = {
        "prompts": len(items), "n": n, "samples": len(items) * n, "correct": total,
        "correct_rate": total / (len(items) * n),
        "correct_means": "verifier == 1" if settings.threshold is None
        else f"reward >= {settings.threshold}",
        "pass_at_k": pass_at(n, [p["correct"] for p in per_prompt]),
        "prompts_all_correct": sum(p["correct"] == n for p in per_prompt),
        "prompts_none_correct": sum(p["correct"] == 0 for p in per_prompt),
        "truncated": sum(r["truncated"] for r in samples),
        "sft_rows": len(sft), "sft_rows_as_sampled": as_sampled, "pairs": len(pairs),
        "duplicates_dropped": duplicates, "per_prompt_cap": settings.per_prompt,
        "deduplicate": settings.dedup, "seed": config.job.seed,
        "model": config.model.name_or_path, "per_prompt": per_prompt,
    }  # fmt: skip
    files = {name: "".join(json.dumps(r) + "\n" for r in rows)
             for name, rows in (("sft.jsonl", sft), ("pairs.jsonl", pairs),
                                ("samples.jsonl", samples))}  # fmt: skip
    return files, summary


def _held_out(config, sampler: Sampler, tokenizer, items, scratch: Path) -> dict[str, float]:
    """The sampling policy's greedy held-out metrics, by GRPO's own evaluation ({} without a
    held-out split); its samples go to ``scratch/val.jsonl``."""
    from posttrain.run.online import evaluate

    if not items:
        return {}
    metrics = evaluate(config, sampler, tokenizer, items, scratch, 0, scratch / "val.jsonl")
    return {"problems": len(items), **{k.removeprefix("val/"): v for k, v in metrics.items()}}


def write_folder(out: Path, files: dict[str, str]) -> None:
    """``files`` as the folder ``out``, all at once (``fileio.write_files_as_folder``); ``out`` is
    checked again just before it is replaced (a folder made meanwhile is not clobbered)."""
    write_files_as_folder(out, files, before_replace=lambda: _check_out(out))


def report_lines(summary: dict[str, Any]) -> list[str]:
    """What the command prints: the sampling, the held-out accuracy, where rows and pairs went."""
    s, out = summary, summary["out"]
    k = str(s["n"])
    lines = [
        f"rft: {s['prompts']} prompts x {s['n']} samples, {s['correct_rate']:.1%} correct "
        f"({s['correct_means']}), pass@{k} {s['pass_at_k'][k]:.3f}",
        f"sft rows: {s['sft_rows']} -> {out}/sft.jsonl",
        f"pairs: {s['pairs']} -> {out}/pairs.jsonl"
        + ("" if s["pairs"] else " (no prompt had both a correct and an incorrect sample)"),
    ]
    if s["val"]:
        lines.append(f"held-out accuracy: {s['val']['accuracy']:.3f} ({s['val']['problems']} "
                     "problems, greedy)")  # fmt: skip
    return lines


__all__ = ["OUTPUTS", "READS", "RFTError", "Settings", "add_arguments", "dispatch",
           "place_sampler", "resolve", "run", "write_folder"]  # fmt: skip
