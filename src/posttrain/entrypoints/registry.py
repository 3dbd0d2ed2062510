"""The entry registry: one explicit table of the training entries, from which the CLI, the
objective family of a config, the entry checks, preflight's entry rules and the recipe listing
are derived.

An entry is its module (``posttrain.entrypoints.<name>``: ``train_from_cli`` and the run
session's ``SPEC``) and one :class:`Entry` row below. The table names code by import path only
and imports nothing heavy, so ``posttrain grpo --help`` (which reads it) loads no torch; the
modules it names are imported when they are used (:func:`load`). No entry registers itself.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

Placement = Literal["online", "policy_only"]


@dataclass(frozen=True)
class Entry:
    """One training entry (``posttrain <name>``) and what the wiring needs to know of it.

    ``kind``: what its algorithms are, for the line that sends a config to its own entry;
    ``title``: its short name in messages. ``builder``: the built-in objective builder
    (``module:function``; None when the entry assembles its own objective, as Diffusion DPO
    does); ``reads`` / ``knobs``: its declaration of reads (``config -> Reads``) and every knob
    it may read, torch-free (``algorithm/knobs.py``), so preflight never imports the builder.
    ``placement``: ``online`` (rollout, reward, policy: ``run/online.py``) or
    ``policy_only`` (a policy role and a fixed data set: no rollout, no reward), which reads
    ``online_reads`` of the online knobs and refuses every other one changed
    (``refused_note`` says why). ``pinned_label``: the ``job.algorithm`` its runs record.
    ``sections``: config sections only this entry reads. ``rules``: its own preflight rule
    module. ``max_policy_ranks``: the policy ranks it places at most; ``shardable``: whether
    they may be FSDP-sharded. ``step_key``: the knob of how many of its ``unit`` (row, pair) a
    policy-only step draws, each rank taking whole ones. ``cli``: a module with
    ``add_arguments(parser)`` and ``dispatch(args, overrides)`` when the entry has more than
    ``--config`` (and ``--objective`` where ``objective_flag``). ``data_keys`` / ``data_fix``:
    the data files a policy-only entry reads and how to make them; ``data_check``: a
    ``module:function(config)`` that reads them whole (``posttrain config show`` runs it).
    ``memory_report``: whether ``config show`` prints the online memory estimate.
    """

    name: str
    title: str
    kind: str
    help: str
    description: str
    builder: str | None = None
    reads: str | None = None
    knobs: str | None = None
    placement: Placement = "online"
    online_reads: tuple[str, ...] = ()
    refused_note: str = ""
    pinned_label: str | None = None
    sections: tuple[str, ...] = ()
    rules: str | None = None
    max_policy_ranks: int | None = None
    shardable: bool = True
    step_key: str | None = None
    unit: str = "row"
    cli: str | None = None
    objective_flag: bool = True
    data_keys: tuple[str, ...] = ()
    data_fix: str = ""
    data_check: str | None = None

    @property
    def memory_report(self) -> bool:
        return self.placement == "online"

    @property
    def module(self) -> str:
        return f"posttrain.entrypoints.{self.name}"


#: Every entry, in the order ``posttrain --help`` lists them; the first is the default family
#: (a ``job.algorithm`` that starts with no other entry's name belongs to it).
ENTRIES: tuple[Entry, ...] = (
    Entry(
        "grpo", "GRPO", "a GRPO-family algorithm (online RL)",
        help="train with a GRPO-family objective",
        description="Online RL: sample, score, group advantages, update. The recipe and its "
        "overrides choose the surrogate (rl.grpo_surrogate) and everything else.",
        builder="posttrain.algorithm.grpo:make_objective",
        reads="posttrain.algorithm.knobs:grpo_reads", knobs="posttrain.algorithm.knobs:GRPO_KNOBS",
    ),
    Entry(
        "opd", "OPD", "on-policy distillation",
        help="on-policy distillation from a teacher model",
        description="Sample from the student, score every token with the frozen teacher "
        "(teacher.name_or_path), update toward it (rl.distillation_mode: advantage or direct).",
        builder="posttrain.algorithm.opd:make_objective", pinned_label="opd",
        reads="posttrain.algorithm.knobs:opd_reads", knobs="posttrain.algorithm.knobs:OPD_KNOBS",
        rules="posttrain.control.opd",
    ),
    Entry(
        "dpo", "Diffusion DPO", "Diffusion DPO (offline, on preference pairs)",
        help="Diffusion DPO on preference pairs; tools: pretrain, make-pairs",
        description="Offline Diffusion DPO on a pairs manifest (dpo.pairs_path), or one of its "
        "tools: pretrain a base model, make preference pairs from it.",
        placement="policy_only", refused_note="Diffusion DPO trains offline on dpo.pairs_path",
        sections=("dpo",), rules="posttrain.control.dpo", max_policy_ranks=1, shardable=False,
        cli="posttrain.entrypoints.dpo_cli", objective_flag=False, data_keys=("dpo.pairs_path",),
        data_fix="write the pairs with `posttrain dpo make-pairs` (docs/guides/dpo.md) or point "
        "dpo.pairs_path at a manifest",
    ),
    Entry(
        "sft", "SFT", "supervised fine-tuning (offline, on demonstrations)",
        help="supervised fine-tuning on chat demonstrations (JSONL)",
        description="Offline SFT: cross-entropy on the assistant tokens of chat rows "
        "(sft.train_path: messages with tools and tool calls, or prompt/completion), rendered "
        "with the model's chat template; held-out loss and token accuracy (sft.val_path).",
        builder="posttrain.algorithm.sft:make_objective", placement="policy_only",
        reads="posttrain.algorithm.knobs:sft_reads", knobs="posttrain.algorithm.knobs:SFT_KNOBS",
        online_reads=("model.tokenizer_path", "model.gradient_checkpointing",
                      "model.init_preset", "model.lora_rank", "model.lora_alpha",
                      "model.lora_target_modules", "rl.micro_batch_tokens"),
        refused_note="SFT trains offline on sft.train_path", sections=("sft",),
        rules="posttrain.control.sft", step_key="sft.rows_per_step", objective_flag=False,
        data_keys=("sft.train_path", "sft.val_path"),
        data_fix="point it at a JSONL file of chat rows (docs/guides/sft.md)",
        data_check="posttrain.entrypoints.sft:check_data",
    ),
    Entry(
        "lmdpo", "LM DPO", "DPO for language models (offline, on preference pairs)",
        help="DPO / IPO for language models on preference pairs (JSONL)",
        description="Offline DPO on preference pairs (lmdpo.train_path: prompt or messages, "
        "chosen, rejected), rendered with the model's chat template, against the frozen base "
        "(lmdpo.loss: sigmoid with label smoothing, or ipo); held-out rewards and reward "
        "accuracy (lmdpo.val_path).",
        builder="posttrain.algorithm.lmdpo:make_objective", placement="policy_only",
        reads="posttrain.algorithm.knobs:lmdpo_reads",
        knobs="posttrain.algorithm.knobs:LMDPO_KNOBS",
        online_reads=("model.tokenizer_path", "model.gradient_checkpointing",
                      "model.init_preset", "model.lora_rank", "model.lora_alpha",
                      "model.lora_target_modules", "rl.micro_batch_tokens"),
        refused_note="LM DPO trains offline on lmdpo.train_path", sections=("lmdpo",),
        rules="posttrain.control.lmdpo", step_key="lmdpo.pairs_per_step", unit="pair",
        objective_flag=False,
        data_keys=("lmdpo.train_path", "lmdpo.val_path"),
        data_fix="point it at a JSONL file of preference pairs (docs/guides/preference.md)",
        data_check="posttrain.entrypoints.lmdpo:check_data",
    ),
)  # fmt: skip

_BY_NAME = {e.name: e for e in ENTRIES}


def entry(name: str) -> Entry:
    """The entry called ``name``."""
    return _BY_NAME[name]


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def family_of(algorithm: str) -> str:
    """The entry that trains ``job.algorithm=algorithm``: the one whose name the label starts
    with, else the default (the first)."""
    for e in ENTRIES[1:]:
        if algorithm.startswith(e.name):
            return e.name
    return ENTRIES[0].name


def load(path: str) -> Any:
    """The object ``module:attribute`` (or the module ``module``) names, imported now."""
    module, _, attribute = path.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


def section_owner(section: str) -> Entry | None:
    """The entry that alone reads config section ``section`` (None: a shared section)."""
    return next((e for e in ENTRIES if section in e.sections), None)


__all__ = ["ENTRIES", "Entry", "entry", "family_of", "load", "names", "section_owner"]
