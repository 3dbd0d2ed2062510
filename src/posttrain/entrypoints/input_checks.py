"""Bounds on what a run feeds the model, checked once before any model is built.

A tokenizer with more ids than the model's embedding indexes past it; a prompt longer than the
model's context minus ``rollout.max_tokens`` cannot be completed (and a multi-megabyte one makes
the rollout try to allocate terabytes); a prompt the tokenizer reads as unknown tokens is not
what the data says. Each is refused here with the key or the data row named.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from transformers import AutoConfig

from posttrain.config import ConfigError, PosttrainConfig
from posttrain.data.tasks import TaskDataError, TaskSource
from posttrain.data.tasks.base import clip
from posttrain.entrypoints.common import encode_prompts
from posttrain.model.loading import check_model_folder, load_tokenizer

log = logging.getLogger("posttrain")

#: Prompts are measured on at most this many characters per token of budget: a token longer than
#: that is unheard of, and a multi-megabyte row is then refused without tokenizing all of it.
CHARS_PER_TOKEN_BOUND = 64


def check_inputs(config: PosttrainConfig, tasks: TaskSource) -> None:
    """Refuse a tokenizer that does not fit the model and prompts the model cannot take."""
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
    items = [tasks.item_at(config.job.seed, c) for c in range(len(tasks))] + tasks.val_items()
    unk = tokenizer.unk_token_id
    cap = None if budget is None else CHARS_PER_TOKEN_BOUND * (budget + 1)
    for item in items:
        cut = cap is not None and len(item.prompt) > cap
        head = dataclasses.replace(item, prompt=item.prompt[:cap]) if cut else item
        ids = encode_prompts([head], config.data.prompt_template, tokenizer)[0]
        if budget is not None and len(ids) > budget:
            size = f"over {len(ids)}" if cut else f"{len(ids)}"
            raise TaskDataError(
                f"row {item.item_id}: the prompt is {size} tokens, but the model's context "
                f"of {context} minus rollout.max_tokens={config.rollout.max_tokens} leaves "
                f"{budget}; shorten or drop that row (or lower rollout.max_tokens)"
            )
        if unk is not None and unk in ids:
            raise TaskDataError(
                f"row {item.item_id}: the tokenizer reads part of the prompt {clip(item.prompt)} "
                f"as its unknown token {tokenizer.unk_token!r}; the model cannot see that text. "
                f"Drop the row or use a model whose tokenizer covers it ({key})"
            )
