"""The LM DPO entry: preference pairs -> the language-model policy role -> the offline loop.

    posttrain lmdpo --config RECIPE -- section.key=value ...

Named ``lmdpo``, not ``dpo``: ``posttrain dpo`` is Diffusion DPO (its own data, model and loss),
and a ``job.algorithm`` belongs to the entry whose name it starts with, so ``lmdpo`` labels
never reach it. Offline like SFT (``entrypoints/sft.py``, which this entry follows): every pair
of ``lmdpo.train_path`` (and ``lmdpo.val_path``) is read, checked and rendered before the run
directory is touched (``data/lmdpo.py``); each step draws ``lmdpo.pairs_per_step`` pairs in a
seeded order (``data/order.py``), the policy role scores them once under the frozen reference
(no_grad; for LoRA the policy with its adapters off, as GRPO's KL does, else a second copy of
the base) and takes one optimizer step with the preference objective (``algorithm/lmdpo.py``).
Every ``rl.eval_every`` steps it reports the held-out loss, rewards and reward accuracy. The run
session owns the lock, admission, resume, signals, records and the final export.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from posttrain.algorithm.lmdpo import (
    HELD_OUT_SUMS,
    held_out_metrics,
    held_out_sums,
    make_objective,
)
from posttrain.algorithm.primitives.objective import REFERENCE_COLUMN
from posttrain.config import ConfigError, PosttrainConfig
from posttrain.control.entries import refuse_unread_overrides
from posttrain.data.lmdpo import PairData, collate_pairs, load_pairs
from posttrain.data.logprobs import masked_response_logprobs
from posttrain.data.order import step_indices
from posttrain.entrypoints.sft import _tokenizer
from posttrain.placement.policy_only import place_policy_only
from posttrain.placement.roles import PolicyRole
from posttrain.run.records import quiet_libraries
from posttrain.run.session import RunSession, entry_spec, report_lines
from posttrain.trainer.errors import ResumeError

__all__ = ["SPEC", "LMDPOPolicyRole", "check_data", "run", "train_from_cli"]

log = logging.getLogger("posttrain")

#: The entry as the run session sees it (its registry row).
SPEC = entry_spec("lmdpo")
#: Progress shows these metrics (label -> metric) besides the step time.
SHOWN = {"loss": "train/loss", "acc": "train/rewards/accuracies",
         "val_acc": "val/rewards/accuracies"}  # fmt: skip


class LMDPOPolicyRole(PolicyRole):
    """The policy role of every online entry, plus the frozen reference DPO scores against:
    each batch gets its per-token log-probs (:data:`REFERENCE_COLUMN`) before the update, and
    the held-out pairs are scored under both (the role holds the weights). On several ranks
    each takes whole pairs of a step and of the held-out set (:attr:`whole_groups`)."""

    #: A pair is a group no rank may cut (``placement/dispatch.py``).
    whole_groups = True

    def __init__(self, config: PosttrainConfig, build_objective_fn, run_dir: str,
                 device: str | None = None) -> None:  # fmt: skip
        from posttrain.model.loading import load_policy
        from posttrain.model.lora import AdapterFreeReference, is_lora

        super().__init__(config, build_objective_fn, run_dir, device)
        if is_lora(self.model):  # the frozen base itself, adapters off: no second copy
            self.reference = AdapterFreeReference(self.model)
        else:
            # float32 as the policy's master weights: under the same autocast the two score
            # alike, so a policy still equal to its base has Δ = 0 exactly
            path = config.model.name_or_path
            self.reference, _ = load_policy(path, None, "float32", self.trainer.device)
            self.reference.eval().requires_grad_(False)

    @torch.no_grad()
    def reference_logprobs(self, batch) -> torch.Tensor:
        """``[B, R]`` log-probs of ``batch``'s answer tokens (0 elsewhere) under the reference,
        ``rl.micro_batch_size`` rows a forward, in the trainer's precision."""

        def score(part):
            return masked_response_logprobs(self.reference, part).float().cpu()

        return torch.cat(self.trainer.score_chunks(batch, self.config.rl.micro_batch_size, score))

    def train(self, batch) -> dict[str, float]:
        columns = {**batch.columns, REFERENCE_COLUMN: self.reference_logprobs(batch)}
        return super().train(batch.replace(columns=columns))

    def evaluate(self, batch) -> dict[str, float]:
        d = self.config.lmdpo
        rows = 2 * max(1, self.config.rl.micro_batch_size // 2)  # whole pairs a forward
        score = functools.partial(held_out_sums, self.model, self.reference, loss=d.loss,
                                  beta=d.beta, smoothing=d.label_smoothing,
                                  rpo_alpha=d.rpo_alpha)  # fmt: skip
        return held_out_metrics(self.trainer.held_out_sums(batch, rows, score, HELD_OUT_SUMS))


def load_data(config: PosttrainConfig) -> tuple[PairData, PairData | None]:
    """Every pair of both files, checked and rendered (one line naming ``file:line`` if not)."""
    from posttrain.control.data_checks import check_data_files, held_out_covers_ranks

    check_data_files(config)
    d = config.lmdpo
    tokenizer = _tokenizer(config)
    train = load_pairs(d.train_path, tokenizer, d.max_tokens, d.truncation)
    val = load_pairs(d.val_path, tokenizer, d.max_tokens, d.truncation) if d.val_path else None
    if val is not None:
        held_out_covers_ranks(config, len(val.pairs), d.val_path, "pair")
    return train, val


def check_budget(config: PosttrainConfig, train: PairData) -> None:
    """Refuse an ``rl.micro_batch_tokens`` below the longest pair (two rows of the longer
    answer's width), which the trainer would split across micro-batches."""
    budget = config.rl.micro_batch_tokens
    if budget is None:
        return
    need, where = max((2 * max(len(c.ids), len(r.ids)), c.where) for c, r in train.pairs)
    if need > budget:
        raise ConfigError(
            f"rl.micro_batch_tokens={budget}: the pair at {where} takes {need} tokens (chosen "
            f"and rejected, which share a micro-batch); set rl.micro_batch_tokens >= {need}"
        )


def check_data(config: PosttrainConfig) -> None:
    """What ``posttrain config show`` checks: both files read, check and render whole, and a
    token budget holds every pair."""
    train, _ = load_data(config)
    check_budget(config, train)


def run(
    config: PosttrainConfig | None,
    config_path: str,
    opts: Sequence[str],
    out_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Train on ``lmdpo.train_path``; returns a summary with the first and last evaluation.
    ``config`` is the caller's resolved copy (checked against ``config_path`` + ``opts``) or
    None; ``out_dir`` None is the config's own run directory."""
    from posttrain.run.online import check_model_source, ensure_model

    session = RunSession(SPEC, config_path, opts, config)
    cfg = session.config
    refuse_unread_overrides(opts, cfg)  # what preflight cannot see (default values)
    check_model_source(cfg)
    train, val = load_data(cfg)  # data errors surface before any model loads
    check_budget(cfg, train)
    for data in (train, val):
        if data is not None and data.dropped:
            log.info("lmdpo: %d over-long pairs dropped (lmdpo.truncation=drop)", data.dropped)
    ensure_model(cfg)
    d = cfg.lmdpo
    builder = functools.partial(make_objective, loss=d.loss, beta=d.beta,
                                label_smoothing=d.label_smoothing,
                                rpo_alpha=d.rpo_alpha)  # fmt: skip

    def place(run_dir: Path):
        kwargs = {"build_objective_fn": builder}
        return place_policy_only(cfg, config_path, session.opts, LMDPOPolicyRole, kwargs,
                                 str(run_dir))  # fmt: skip

    def body(placed, state, run_dir: Path):
        return LMDPOBody(cfg, placed.policy, train, val, state)

    summary = session.run(out_dir or session.default_out_dir(), place, body)
    summary["pairs"] = len(train.pairs)
    return summary


class LMDPOBody:
    """One DPO step (the step's pairs -> one optimizer step) and the held-out evaluation."""

    shown = SHOWN

    def __init__(self, config, policy, train: PairData, val: PairData | None, state) -> None:
        n = len(train.pairs)
        if state is not None and state.data_state.get("pairs") != n:
            raise ResumeError(
                f"{state.path} was trained on {state.data_state.get('pairs')} pairs, "
                f"{config.lmdpo.train_path} has {n}; resume with the same file"
            )
        self.config, self.policy, self.train = config, policy, train
        self.pad = 0
        self.val = collate_pairs(val.pairs, self.pad) if val is not None else None
        self.evaluates = self.val is not None
        self.evaluation = (
            f"{len(val.pairs) if val is not None else 0} held-out pairs (reward accuracy)"
        )

    def data_state(self) -> dict[str, Any]:
        return {"pairs": len(self.train.pairs)}

    def evaluate(self, step: int) -> dict[str, float]:
        return self.policy.evaluate(self.val)

    def step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        c = self.config
        picked = step_indices(len(self.train.pairs), c.job.seed, step, c.lmdpo.pairs_per_step)
        batch = collate_pairs([self.train.pairs[i] for i in picked.tolist()], self.pad)
        record = dict(self.policy.train(batch))
        record["time/step_s"] = time.perf_counter() - t0
        return record


def train_from_cli(config_path: str, opts: Sequence[str]) -> int:
    """``posttrain lmdpo``: resolve, train, print where the run went and held-out accuracy."""
    quiet_libraries()
    summary = run(None, config_path, opts)
    print("\n".join(report_lines(summary)))
    before, after = summary.get("initial"), summary.get("final")
    if before or after:
        fmt = lambda m, k: "-" if m is None else f"{m[k]:.4f}"  # noqa: E731
        print(f"held-out loss: {fmt(before, 'val/loss')} -> {fmt(after, 'val/loss')}, reward "
              f"accuracy: {fmt(before, 'val/rewards/accuracies')} -> "
              f"{fmt(after, 'val/rewards/accuracies')}")  # fmt: skip
    return 0


if __name__ == "__main__":
    from posttrain.entrypoints.cli import main

    raise SystemExit(main(["lmdpo", *sys.argv[1:]]))
