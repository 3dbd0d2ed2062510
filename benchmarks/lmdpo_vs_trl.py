"""posttrain lmdpo's loss, TRL's metrics and every parameter's gradient against TRL 1.16's
``DPOTrainer`` on the same batch: the oracle of algorithm/lmdpo.py (TRL only in the bench venv).

    make lmdpo-vs-trl                                # builds .venv-bench (TRL), runs this
    .venv-bench/bin/python benchmarks/lmdpo_vs_trl.py

A seeded ``tiny_tools`` model (the chat-templated char-level tokenizer) scores a handful of
pairs, in our ``prompt`` and ``messages`` forms (a system turn, earlier turns, tools). Our side is
the entry's path: ``load_pairs`` renders the JSONL, ``collate_pairs`` lays it out, the reference's
log-probs fill ``REFERENCE_COLUMN`` and ``make_objective`` gives the loss and metrics. TRL's side
is a ``DPOTrainer`` over the same pairs in its conversational form, with a separate frozen copy
as ``ref_model``; its ``compute_loss`` runs on its own collator's batch of *our* token ids (its
tokenisation adds one token to each answer, checked and printed below) and its ``_metrics`` are
read back. Cases: the sigmoid loss with the policy equal to its reference (Δ = 0) and, on a
perturbed policy (Δ ≠ 0), sigmoid, cDPO's label smoothing and IPO.

Two conventions differ from TRL 1.16 (read in its ``dpo_trainer.py``), so those rows compare
against TRL's own building blocks and the raw difference is printed as an ``info`` row:

- TRL's ``sigmoid`` ignores ``label_smoothing`` (only ``robust``, ``exo_pair`` and ``aot*`` read
  it). Ours is cDPO, ``(1-ε) s(βΔ) + ε s(-βΔ)`` with ``s = -log σ``; TRL's ``robust`` is
  ``((1-ε) s(βΔ) - ε s(-βΔ)) / (1-2ε)``, so ours equals TRL's ``loss_type=[sigmoid, robust]``
  with ``loss_weights=[2(1-ε), -(1-2ε)]``.
- TRL's ``ipo`` divides each log-ratio by its answer's token count; ours keeps sums. Ours on
  per-token means (our ``pair_losses`` on ``logp / length``) equals TRL's IPO.
- RPO: TRL's ``loss_type=[sigmoid, sft]`` averages the NLL over every chosen token of the batch;
  ``lmdpo.rpo_alpha``'s term is each pair's NLL per chosen token. TRL run on one pair at a time
  (loss, metrics and gradients averaged over the pairs) is checked against ours.

Exits 1 when a checked row is off by more than :data:`RTOL` (float32 rounding), relative to the
largest value of its kind.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer

from posttrain.algorithm.lmdpo import (
    NAMES,
    answer_lengths,
    make_objective,
    pair_losses,
    sequence_logps,
)
from posttrain.algorithm.primitives.objective import REFERENCE_COLUMN
from posttrain.data.lmdpo import collate_pairs, load_pairs
from posttrain.data.logprobs import response_logprobs
from posttrain.model.tiny import build_tiny_model

#: The metrics TRL logs under our names (``nll_loss`` is ours alone).
TRL_NAMES = [v for k, v in NAMES.items() if k != "nll_loss"]

#: Relative tolerance: |ours - TRL| <= RTOL * max(1, |TRL|) for the loss and each metric, and
#: max |grad ours - grad TRL| <= RTOL * max |grad TRL| over every parameter.
RTOL = 1e-5
PRESET, SEED, PERTURB = "tiny_tools", 0, 0.05

TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b"}}]
PAIRS: list[dict[str, Any]] = [
    {"prompt": "12+7=", "chosen": "19", "rejected": "21"},
    {"prompt": "What is 3*4?", "chosen": "12", "rejected": "I think it is 7, or 8."},
    {
        "messages": [
            {"role": "system", "content": "Answer with a number."},
            {"role": "user", "content": "1+2="},
            {"role": "assistant", "content": "3"},
            {"role": "user", "content": "4+5="},
        ],
        "chosen": {"role": "assistant", "content": "9"},
        "rejected": "45",
    },
    {
        "messages": [{"role": "user", "content": "964+494="}],
        "tools": TOOLS,
        "chosen": {"role": "assistant", "content": '<tool_call>{"name": "add"}</tool_call>'},
        "rejected": {"role": "assistant", "content": "1358"},
    },
]


def trl_row(pair: dict) -> dict:
    """A pair in TRL's conversational form (a string prompt is one user turn, as ours)."""
    prompt = pair.get("messages") or [{"role": "user", "content": pair["prompt"]}]
    answer = {s: pair[s] if isinstance(pair[s], dict) else {"role": "assistant", "content": pair[s]}
              for s in ("chosen", "rejected")}  # fmt: skip
    return {"prompt": prompt, **{s: [a] for s, a in answer.items()}, "tools": pair.get("tools")}


def answer_start(row) -> int:
    """Where a rendered row's answer starts; refuses a mask that is not one run to the end
    (TRL's layout: prompt ids, then completion ids, all trained)."""
    s = row.mask.index(True)
    assert row.mask == [False] * s + [True] * (len(row.ids) - s), "the answer is not a suffix"
    return s


def ours(policy, reference, data, pad_id: int, loss: str, beta: float, eps: float, norm: bool,
         rpo: float = 0.0):  # fmt: skip
    """Our loss, metrics (TRL's names) and ``{name: grad}``; ``norm``: IPO on per-token means;
    ``rpo``: ``lmdpo.rpo_alpha``."""
    batch = collate_pairs(data, pad_id)
    with torch.no_grad():
        batch = batch.replace(
            columns={**batch.columns, REFERENCE_COLUMN: response_logprobs(reference, batch)}
        )
    objective = make_objective(None, None, loss=loss, beta=beta, label_smoothing=eps, rpo_alpha=rpo)
    value, metrics = objective(policy, batch)
    if norm:  # the same blocks, each sequence log-prob divided by its answer's token count
        lengths = answer_lengths(batch)
        pol = sequence_logps(response_logprobs(policy, batch), batch) / lengths
        ref = sequence_logps(batch.columns[REFERENCE_COLUMN], batch) / lengths
        value = pair_losses(pol, ref, loss, beta, eps, lengths)[0].mean()
    names = dict(policy.named_parameters())
    grads = torch.autograd.grad(value, list(names.values()))
    return (
        value.item(),
        {NAMES[k]: metrics[k].item() for k in NAMES},
        dict(zip(names, grads, strict=True)),
    )


def trainer_for(policy, reference, tokenizer, out: str, **config: Any) -> DPOTrainer:
    args = DPOConfig(output_dir=out, bf16=False, use_cpu=True, report_to="none",
                     max_length=None, save_strategy="no", **config)  # fmt: skip
    dataset = Dataset.from_list([trl_row(p) for p in PAIRS])
    return DPOTrainer(model=policy, ref_model=reference, args=args, processing_class=tokenizer,
                      train_dataset=dataset)  # fmt: skip


def trl(trainer: DPOTrainer, examples: list[dict]):
    """TRL's loss, metrics and ``{name: grad}`` on ``examples`` (prompt/chosen/rejected ids)."""
    model = trainer.model.train()
    trainer._metrics["train"].clear()
    value = trainer.compute_loss(model, trainer.data_collator(examples))
    names = dict(model.named_parameters())
    grads = torch.autograd.grad(value, list(names.values()))
    metrics = {k: trainer._metrics["train"][k][-1] for k in TRL_NAMES}
    return value.item(), metrics, dict(zip(names, grads, strict=True))


def trl_one_pair_at_a_time(trainer: DPOTrainer, examples: list[dict]):
    """:func:`trl` on each pair alone, loss, metrics and gradients averaged over the pairs: TRL's
    ``sft`` term is then each pair's own NLL per chosen token, as ``lmdpo.rpo_alpha``'s."""
    runs = [trl(trainer, [e]) for e in examples]
    n = len(runs)
    value = sum(r[0] for r in runs) / n
    metrics = {k: sum(r[1][k] for r in runs) / n for k in runs[0][1]}
    grads = {k: sum(r[2][k] for r in runs) / n for k in runs[0][2]}
    return value, metrics, grads


def tokenisation(trainer: DPOTrainer, data, tokenizer) -> tuple[list[dict], list[dict], str]:
    """Our ids as TRL's examples, TRL's own examples, and how TRL's ids differ from ours:
    asserted to be exactly the template's newline after each answer's ``<eos>``."""
    newline = tokenizer.convert_tokens_to_ids("\n")
    same, own = [], []
    for (c, r), t in zip(data, trainer.train_dataset, strict=True):
        s = answer_start(c)
        assert answer_start(r) == s and c.ids[:s] == r.ids[:s]
        same.append({"prompt_ids": c.ids[:s], "chosen_ids": c.ids[s:], "rejected_ids": r.ids[s:]})
        own.append({k: t[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")})
        assert t["prompt_ids"] == c.ids[:s], "TRL's prompt ids differ from ours"
        for side, row in (("chosen", c), ("rejected", r)):
            assert row.ids[-1] == tokenizer.eos_token_id
            assert t[f"{side}_ids"] == row.ids[s:] + [newline], (side, t[f"{side}_ids"], row.ids)
    how = ("TRL's prompt ids equal ours; its completion is ours plus the template's newline "
           f"after <eos> (id {newline}), trained (ours ends at <eos>, the stop token)")  # fmt: skip
    return same, own, how


def string_form(tokenizer, work: Path) -> str:
    """TRL's tokenisation of a plain-string pair (not conversational), asserted: no chat
    template, the tokenizer's BOS before the prompt and an EOS after each answer."""
    rows = [{k: p[k] for k in ("prompt", "chosen", "rejected")} for p in PAIRS if "prompt" in p]
    args = DPOConfig(output_dir=str(work / "trl"), bf16=False, use_cpu=True, report_to="none")
    trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(work / "model"), args=args,
                         processing_class=tokenizer, train_dataset=Dataset.from_list(rows))  # fmt: skip

    def chars(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    for row, t in zip(rows, trainer.train_dataset, strict=True):
        assert t["prompt_ids"] == [tokenizer.bos_token_id, *chars(row["prompt"])]
        for side in ("chosen", "rejected"):
            assert t[f"{side}_ids"] == [*chars(row[side]), tokenizer.eos_token_id]
    return (
        "a plain-string pair TRL does not template: <bos> prompt, then answer <eos> (ours "
        "renders the prompt as a user turn: TRL's conversational form is its equivalent)"
    )


def perturbed(model, scale: float):
    """A copy of ``model`` with seeded noise on every weight: a policy that is not its reference."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


def compare(a, b) -> tuple[float, float, float, str]:
    """(loss, max grad, max metric) differences, each relative as :data:`RTOL` says, and the
    metric that differs most."""
    (la, ma, ga), (lb, mb, gb) = a, b
    assert ga.keys() == gb.keys()
    scale = max(float(g.abs().max()) for g in gb.values())
    grad = max(float((ga[k] - gb[k]).abs().max()) for k in ga) / scale
    metric, worst = max((abs(ma[k] - mb[k]) / max(1.0, abs(mb[k])), k) for k in mb)
    return abs(la - lb) / max(1.0, abs(lb)), grad, metric, worst


def main() -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="lmdpo-vs-trl-") as tmp:
        return run(Path(tmp))


def run(work: Path) -> int:
    """Every case in ``work``: prints the table, returns 1 if a checked row is off."""
    folder = build_tiny_model(PRESET, work / "model", seed=SEED)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    (work / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    data = load_pairs(str(work / "pairs.jsonl"), tokenizer, 512, "error").pairs
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    reference = copy.deepcopy(base).eval().requires_grad_(False)
    moved = perturbed(base, PERTURB)
    pad = tokenizer.pad_token_id

    # (case, ours: loss beta eps norm [rpo_alpha], TRL's config, policy moved, checked)
    e = 0.2
    cases = [
        ("sigmoid b=0.1, policy = ref", ("sigmoid", 0.1, 0.0, False), {}, False, True),
        ("sigmoid b=0.1", ("sigmoid", 0.1, 0.0, False), {}, True, True),
        ("sigmoid b=0.5 eps=0.2 vs [sigmoid,robust]", ("sigmoid", 0.5, e, False),
         {"loss_type": ["sigmoid", "robust"], "loss_weights": [2 * (1 - e), -(1 - 2 * e)],
          "label_smoothing": e}, True, True),
        ("sigmoid b=0.5 eps=0 vs TRL sigmoid eps=0.2", ("sigmoid", 0.5, 0.0, False),
         {"label_smoothing": e}, True, True),
        ("sigmoid b=0.5 eps=0.2 vs TRL sigmoid eps=0.2", ("sigmoid", 0.5, e, False),
         {"label_smoothing": e}, True, False),
        ("ipo b=0.3, ours on per-token means", ("ipo", 0.3, 0.0, True),
         {"loss_type": ["ipo"]}, True, True),
        ("ipo b=0.3, ours as is (sums)", ("ipo", 0.3, 0.0, False),
         {"loss_type": ["ipo"]}, True, False),
        ("sigmoid b=0.1 rpo=1 vs [sigmoid,sft], per pair", ("sigmoid", 0.1, 0.0, False, 1.0),
         {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 1.0]}, True, True),
        ("sigmoid b=0.1 rpo=1 vs [sigmoid,sft], batch", ("sigmoid", 0.1, 0.0, False, 1.0),
         {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 1.0]}, True, False),
    ]  # fmt: skip
    rows, failed, how = [], False, ""
    for name, (loss, beta, eps, norm, *rpo), config, moved_policy, checked in cases:
        start = moved if moved_policy else base
        mine = ours(copy.deepcopy(start).train(), reference, data, pad, loss, beta, eps, norm, *rpo)
        config.setdefault("loss_type", ["sigmoid"])
        trainer = trainer_for(copy.deepcopy(start), copy.deepcopy(reference), tokenizer,
                              str(work / "trl"), beta=beta, **config)  # fmt: skip
        same, own, how = tokenisation(trainer, data, tokenizer)
        theirs = (trl_one_pair_at_a_time if name.endswith("per pair") else trl)(trainer, same)
        diffs = compare(mine, theirs)
        bad = checked and max(diffs[:3]) > RTOL
        failed |= bad
        verdict = "FAIL" if bad else "ok" if checked else "info"
        rows.append((name, mine[0], theirs[0], *diffs, verdict))
        if name == "sigmoid b=0.1":  # TRL on its own ids: the extra newline's share, shown
            theirs = trl(trainer, own)
            rows.append(("sigmoid b=0.1, TRL on its own ids", mine[0], theirs[0],
                         *compare(mine, theirs), "info"))  # fmt: skip
    print(f"TRL 1.16 DPOTrainer vs posttrain lmdpo, {PRESET} seed {SEED}, {len(PAIRS)} pairs, "
          f"float32; relative differences, tolerance {RTOL:g}")  # fmt: skip
    print(f"tokenisation: {how}; {string_form(tokenizer, work)}")
    print(f"{'case':46} {'ours':>8} {'TRL':>8} {'loss diff':>9} {'grad diff':>9} "
          f"{'metric diff':>11} {'(worst metric)':18}")  # fmt: skip
    for name, a, b, dl, dg, dm, worst, verdict in rows:
        print(f"{name:46} {a:8.5f} {b:8.5f} {dl:9.2e} {dg:9.2e} {dm:11.2e} {worst:18} {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
