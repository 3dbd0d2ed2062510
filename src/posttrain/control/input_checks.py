"""Bounds on what a run feeds the model, checked once before any model is built.

A tokenizer with more ids than the model's embedding indexes past it; a prompt longer than the
model's context minus ``rollout.max_tokens`` cannot be completed (and a multi-megabyte one makes
the rollout try to allocate terabytes); a prompt the tokenizer reads as unknown tokens is not
what the data says. Each is refused here with the key or the data row named, except that
``data.prompt_truncation=left|right`` cuts over-long prompts to fit instead.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from transformers import AutoConfig

from posttrain.config import ConfigError, PosttrainConfig
from posttrain.data.tasks import TaskDataError, TaskItem, TaskSource
from posttrain.data.tasks.base import clip
from posttrain.model.loading import check_model_folder, load_tokenizer
from posttrain.run.records import encode_prompts

log = logging.getLogger("posttrain")

#: A cut prompt keeps at most this many characters per token of budget: a token longer than that
#: is unheard of, so the search for the longest part that fits starts from a bounded length.
CHARS_PER_TOKEN_BOUND = 64


def check_inputs(config: PosttrainConfig, tasks: TaskSource) -> TaskSource:
    """Refuse a tokenizer that does not fit the model and prompts the model cannot take;
    returns ``tasks``, with long prompts cut if ``data.prompt_truncation`` says so."""
    m = config.model
    key = "model.tokenizer_path" if m.tokenizer_path else "model.name_or_path"
    check_model_folder(m.name_or_path)
    tokenizer = load_tokenizer(m.tokenizer_path or m.name_or_path)
    model_cfg = AutoConfig.from_pretrained(Path(m.name_or_path), local_files_only=True)
    text_cfg = model_cfg.get_text_config()
    n_tok, n_model = len(tokenizer), int(text_cfg.vocab_size)
    if n_tok > n_model:
        raise ConfigError(
            f"{key}: the tokenizer has {n_tok} tokens but the model at {m.name_or_path} embeds "
            f"only {n_model}; ids from {n_model} up would index past its embedding. Use the "
            "model's own tokenizer or a model with a matching vocabulary"
        )
    if n_model > n_tok:
        log.warning(
            "the model embeds %d token ids, the tokenizer has %d: sampled ids past the tokenizer "
            "decode to nothing (normal for a padded vocabulary; otherwise check %s)",
            n_model, n_tok, key,
        )  # fmt: skip
    context = getattr(text_cfg, "max_position_embeddings", None)
    budget = None if context is None else int(context) - config.rollout.max_tokens
    if budget is not None and budget < 1:
        raise ConfigError(
            f"rollout.max_tokens={config.rollout.max_tokens} fills the model's whole context of "
            f"{context} tokens; lower rollout.max_tokens"
        )
    fit = _PromptFit(config, tokenizer, budget, context, key)
    tasks = tasks.map_items(fit)
    if fit.truncated:
        log.warning(
            "%d prompts were longer than the %d tokens the context leaves (first: row %s); "
            "data.prompt_truncation=%s cut them", len(fit.truncated), budget, fit.truncated[0],
            config.data.prompt_truncation,
        )  # fmt: skip
    return tasks


class _PromptFit:
    """Checks one item's prompt against the budget; cuts it when the config says so."""

    def __init__(self, config, tokenizer, budget, context, key) -> None:
        self.config, self.tokenizer, self.budget, self.context, self.key = (
            config, tokenizer, budget, context, key,
        )  # fmt: skip
        self.truncated: list[str] = []

    def length(self, item: TaskItem) -> int:
        return len(encode_prompts([item], self.config.data, self.tokenizer)[0])

    def __call__(self, item: TaskItem) -> TaskItem:
        cap = None if self.budget is None else CHARS_PER_TOKEN_BOUND * (self.budget + 1)
        capped = cap is not None and len(item.prompt) > cap  # too long: no need to read it all
        probe = dataclasses.replace(item, prompt=item.prompt[:cap]) if capped else item
        ids = encode_prompts([probe], self.config.data, self.tokenizer)[0]
        unk = self.tokenizer.unk_token_id
        if unk is not None and unk in ids:
            raise TaskDataError(
                f"row {item.item_id}: the tokenizer reads part of the prompt {clip(item.prompt)} "
                f"as its unknown token {self.tokenizer.unk_token!r}; the model cannot see that "
                f"text. Drop the row or use a model whose tokenizer covers it ({self.key})"
            )
        if self.budget is None or (not capped and len(ids) <= self.budget):
            return item
        mode = self.config.data.prompt_truncation
        if mode == "error":
            size = f"more than {self.budget}" if capped else str(len(ids))
            raise TaskDataError(
                f"row {item.item_id}: the prompt is {size} tokens, but the model's context "
                f"of {self.context} minus rollout.max_tokens={self.config.rollout.max_tokens} "
                f"leaves {self.budget}; shorten or drop that row, lower rollout.max_tokens, or "
                "set data.prompt_truncation=left|right"
            )
        self.truncated.append(item.item_id)
        return self._cut(item, left=mode == "left")

    def _cut(self, item: TaskItem, left: bool) -> TaskItem:
        """The longest part of the question (its end if ``left``) whose prompt fits."""
        text = item.prompt

        def part(n: int) -> TaskItem:
            return dataclasses.replace(item, prompt=text[len(text) - n :] if left else text[:n])

        lo, hi = 0, min(len(text), CHARS_PER_TOKEN_BOUND * (self.budget + 1))
        while lo < hi:  # the longest n whose prompt fits (prompt length grows with n)
            mid = (lo + hi + 1) // 2
            if self.length(part(mid)) <= self.budget:
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            raise TaskDataError(
                f"row {item.item_id}: even with the question cut away, the prompt template "
                f"takes more than the {self.budget} tokens the context leaves; lower "
                "rollout.max_tokens"
            )
        return part(lo)
