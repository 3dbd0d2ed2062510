"""The SFT entry: chat demonstrations -> the language-model policy role -> the offline loop.

    posttrain sft --config RECIPE -- section.key=value ...

SFT is offline: no rollout, no reward. Every row of ``sft.train_path`` (and ``sft.val_path``)
is read, checked and rendered before the run directory is touched (``data/sft.py``). Each step
draws ``sft.rows_per_step`` rows in a seeded order (a pure function of job.seed and the step, so
resume needs no data cursor) and takes one optimizer step with the cross-entropy objective
(``algorithm/sft.py``) through the same policy role and trainer GRPO uses: LoRA, gradient
checkpointing, ``model.dtype``, ``rl.micro_batch_tokens`` token-budget micro-batches. Every
``rl.eval_every`` steps it reports the held-out loss and token accuracy. The run session owns
the lock, admission, resume, signals, records and the final export, as for every entry.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.algorithm.sft import (
    HELD_OUT_SUMS,
    held_out_metrics,
    held_out_sums,
    make_objective,
)
from posttrain.config import PosttrainConfig
from posttrain.control.entries import refuse_unread_overrides
from posttrain.data.order import step_indices
from posttrain.data.sft import SFTData, collate, collate_packed, load_sft, pack
from posttrain.placement.policy_only import place_policy_only
from posttrain.placement.roles import PolicyRole
from posttrain.run.records import default_out_dir, quiet_libraries
from posttrain.run.session import RunSession, entry_spec, report_lines
from posttrain.trainer.errors import ResumeError

__all__ = ["SPEC", "SFTPolicyRole", "check_data", "default_out_dir", "run", "train_from_cli"]

log = logging.getLogger("posttrain")

#: The entry as the run session sees it (its registry row).
SPEC = entry_spec("sft")
#: Progress shows these metrics (label -> metric) besides the step time.
SHOWN = {"loss": "train/loss", "val_loss": "val/loss", "val_acc": "val/token_accuracy"}


class SFTPolicyRole(PolicyRole):
    """The policy role of every online entry, plus the held-out loss and token accuracy (the
    role holds the weights, so it scores them; a Ray actor hosts the same class). On several
    ranks each scores its share of the held-out rows and the sums are taken over ranks."""

    def evaluate(self, batch) -> dict[str, float]:
        score = functools.partial(held_out_sums, self.model)
        rows = self.config.rl.micro_batch_size
        # The float32 master weights, without the update's bf16 autocast (docs/guides/sft.md).
        sums = self.trainer.held_out_sums(batch, rows, score, HELD_OUT_SUMS, contextlib.nullcontext)
        return held_out_metrics(sums)


def _tokenizer(config: PosttrainConfig):
    """The run's tokenizer; a preset's own before its model folder is built."""
    from posttrain.model.loading import load_tokenizer
    from posttrain.model.tiny import preset_tokenizer

    m = config.model
    path = Path(m.tokenizer_path or m.name_or_path)
    if m.init_preset and not (path / "config.json").exists() and not m.tokenizer_path:
        return preset_tokenizer(m.init_preset)
    return load_tokenizer(path)


def load_data(config: PosttrainConfig) -> tuple[SFTData, SFTData | None]:
    """Every row of both files, checked and rendered (one line naming ``file:line`` if not)."""
    from posttrain.control.data_checks import check_data_files, held_out_covers_ranks

    check_data_files(config)
    s = config.sft
    tokenizer = _tokenizer(config)
    train = load_sft(s.train_path, tokenizer, s.max_tokens, s.truncation)
    val = load_sft(s.val_path, tokenizer, s.max_tokens, s.truncation) if s.val_path else None
    if val is not None:
        held_out_covers_ranks(config, len(val.rows), s.val_path, "row")
    return train, val


def check_data(config: PosttrainConfig) -> None:
    """What ``posttrain config show`` checks: both files read, check and render whole."""
    load_data(config)


def run(
    config: PosttrainConfig | None,
    config_path: str,
    opts: Sequence[str],
    out_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Fine-tune on ``sft.train_path``; returns a summary with the first and last evaluation.
    ``config`` is the caller's resolved copy (checked against ``config_path`` + ``opts``) or
    None; ``out_dir`` None is the config's own run directory."""
    from posttrain.run.online import check_model_source, ensure_model

    session = RunSession(SPEC, config_path, opts, config)
    cfg = session.config
    refuse_unread_overrides(opts, cfg)  # what preflight cannot see (default values)
    check_model_source(cfg)
    train, val = load_data(cfg)  # data errors surface before any model loads
    for data in (train, val):
        if data is not None and data.fallback:
            log.warning("sft: %s", data.fallback)
        if data is not None and data.dropped:
            log.info("sft: %d over-long rows dropped (sft.truncation=drop)", data.dropped)
    ensure_model(cfg)
    builder = functools.partial(make_objective, reduction=cfg.sft.loss_reduction)

    def place(run_dir: Path):
        kwargs = {"build_objective_fn": builder}
        return place_policy_only(cfg, config_path, session.opts, SFTPolicyRole, kwargs,
                                 str(run_dir))  # fmt: skip

    def body(placed, state, run_dir: Path):
        return SFTBody(cfg, placed.policy, train, val, state)

    summary = session.run(out_dir or session.default_out_dir(), place, body)
    summary["rows"] = len(train.rows)
    return summary


class SFTBody:
    """One SFT step (the step's rows -> one optimizer step) and the held-out evaluation."""

    shown = SHOWN

    def __init__(self, config, policy, train: SFTData, val: SFTData | None, state) -> None:
        n = len(train.rows)
        if state is not None and state.data_state.get("rows") != n:
            raise ResumeError(
                f"{state.path} was trained on {state.data_state.get('rows')} rows, "
                f"{config.sft.train_path} has {n}; resume with the same file"
            )
        self.config, self.policy, self.train = config, policy, train
        self.pad = 0
        self.val = collate(val.rows, self.pad) if val is not None else None
        self.evaluates = self.val is not None
        self.evaluation = f"{len(val.rows) if val is not None else 0} held-out rows (loss)"

    def data_state(self) -> dict[str, Any]:
        return {"rows": len(self.train.rows)}

    def evaluate(self, step: int) -> dict[str, float]:
        return self.policy.evaluate(self.val)

    def step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        c = self.config
        rows = step_indices(len(self.train.rows), c.job.seed, step, c.sft.rows_per_step)
        chosen = [self.train.rows[i] for i in rows.tolist()]
        if c.sft.packing:
            bins = pack(chosen, c.sft.max_tokens, c.placement.policy_ranks)  # one a rank
            batch = collate_packed(chosen, bins, self.pad)
        else:
            batch = collate(chosen, self.pad)
        record = dict(self.policy.train(batch))
        record["time/step_s"] = time.perf_counter() - t0
        return record


def train_from_cli(config_path: str, opts: Sequence[str]) -> int:
    """``posttrain sft``: resolve, train, print where the run went and held-out loss."""
    quiet_libraries()
    summary = run(None, config_path, opts)
    print("\n".join(report_lines(summary)))
    before, after = summary.get("initial"), summary.get("final")
    if before or after:
        fmt = lambda m, k: "-" if m is None else f"{m[k]:.4f}"  # noqa: E731
        print(f"held-out loss: {fmt(before, 'val/loss')} -> {fmt(after, 'val/loss')}, token "
              f"accuracy: {fmt(before, 'val/token_accuracy')} -> "
              f"{fmt(after, 'val/token_accuracy')}")  # fmt: skip
    return 0


if __name__ == "__main__":
    from posttrain.entrypoints.cli import main

    raise SystemExit(main(["sft", *sys.argv[1:]]))
