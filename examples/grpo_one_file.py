"""GRPO in one file: sample, score, group advantages, clipped loss, exact token-sum update.

    python examples/grpo_one_file.py              # 3000 steps, about 5 CPU-minutes
    python examples/grpo_one_file.py --steps 200  # a quick look

A 34k-parameter Llama (the `arith` preset) learns one-digit addition from random weights, by RL
alone, on the CPU: the same task and settings as the `arithmetic_clipped` recipe that
`make demo` runs through the full framework. Everything the framework's GRPO entry does for one
step is written out below, in the order it happens; only the building blocks come from the
library (rollout engine, verifier, group-advantage annotator, policy-gradient and KL
primitives, response logprobs), so each line here can be checked against the framework's.
Measured with the defaults (seed 0, one CPU thread, 313 s of CPU time): held-out accuracy 0.00 at
step 0, 0.70 at step 1500, 0.95 at step 2000, 0.85 at step 3000.

What the framework adds on top: config and preflight, several ranks and Ray placement,
checkpoints and exact resume, metrics sinks, the Objective contract that lets you swap the loss.
"""

from __future__ import annotations

import argparse
import copy
import math
from dataclasses import dataclass

import torch
from transformers import LlamaForCausalLM

from posttrain.algorithm.annotators.advantage import group_advantages
from posttrain.algorithm.primitives.divergence import kl_penalty
from posttrain.algorithm.primitives.policy_gradient import (
    clipped_policy_gradient_loss,
    masked_mean,
    reduce_policy_gradient_loss,
)
from posttrain.data.logprobs import response_logprobs
from posttrain.data.tasks.arithmetic import make_arithmetic_source
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.model.tiny import PRESETS, tiny_config
from posttrain.model.tokenizer import build_char_tokenizer
from posttrain.reward.shaping import numeric_closeness
from posttrain.reward.verifiers import exact_match
from posttrain.rollout.torch_engine import TorchRolloutEngine


@dataclass
class Args:
    seed: int = 0
    steps: int = 3000
    prompts_per_step: int = 16  # prompts per step; each sampled `n` times (one group)
    n: int = 16
    max_tokens: int = 3  # "12" + EOS
    temperature: float = 1.0
    lr: float = 1e-3  # peak; cosine decay to 0 over the run
    weight_decay: float = 1.0
    adam_betas: tuple[float, float] = (0.9, 0.99)
    epsilon: float = 0.2  # clip range of the ratio pi/pi_old: [1 - eps, 1 + eps]
    kl_beta: float = 0.1  # KL anchor to the initial (random) model keeps the policy exploring
    updates_per_batch: int = 1  # mini-batches per collected batch; > 1 makes pi_old matter
    micro_batch_size: int = 64  # rows per forward/backward; changes memory, never the gradient
    grad_clip: float = 1.0
    eval_every: int = 250


# --- 1. model, tokenizer, task ------------------------------------------------------------------
def build(args: Args):
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(tiny_config("arith"))  # random weights
    tokenizer = build_char_tokenizer(PRESETS["arith"].characters)
    reference = copy.deepcopy(model).eval().requires_grad_(False)  # frozen KL anchor
    # 100 one-digit sums: 80 to train on, 20 held out (never trained on).
    tasks = make_arithmetic_source(
        seed=args.seed, digits=1, operators="+", train_size=80, val_size=20
    )
    return model, tokenizer, reference, tasks


# --- 2. sample: n responses per prompt, with the sampler's own logprobs ---------------------------
def sample(engine, tokenizer, items, n, temperature, max_tokens, seed):
    prompts = [tokenizer(item.prompt)["input_ids"] for item in items]  # "<bos>7+5="
    return engine.generate(prompts, n=n, temperature=temperature, max_tokens=max_tokens, seed=seed)


# --- 3. score: verifier (1 if exactly right) + a small reward for being close -------------------
def score(rollout, items) -> tuple[torch.Tensor, torch.Tensor]:
    rewards, correct = [], []
    for text, i in zip(rollout.texts, rollout.prompt_index.tolist(), strict=True):
        item = items[i]
        right = exact_match(text, item)
        correct.append(right)
        rewards.append(right + numeric_closeness(item.prompt, text, item.answer, item.meta))
    return torch.tensor(rewards, dtype=torch.float64), torch.tensor(correct)


# --- 4. group advantages: computed while each prompt's whole group is present -------------------
def advantages(rewards, batch: TrajectoryBatch, n: int) -> tuple[torch.Tensor, float]:
    # A = (r - mean(group)) / (std(group) + eps); 0 for a group whose rewards are all equal.
    adv, stats = group_advantages(rewards, batch.group_ids, group_size=n)
    return adv.float(), stats["zero_variance_group_frac"]


# --- 5. pi_old and the reference: frozen per-token logprobs, scored once per collected batch ----
@torch.no_grad()
def frozen_logprobs(model, batch: TrajectoryBatch, micro: int, temperature: float):
    was_training = model.training
    model.eval()
    chunks = [batch[i : i + micro] for i in range(0, len(batch), micro)]
    out = torch.cat([response_logprobs(model, chunk, temperature) for chunk in chunks])
    model.train(was_training)
    return out


# --- 6. the loss of one chunk as (numerator, weight): sums that combine exactly -----------------
def chunk_loss(model, chunk, adv, old_logp, ref_logp, args: Args):
    logp = response_logprobs(model, chunk, args.temperature)
    mask = chunk.response_mask
    per_token, stats = clipped_policy_gradient_loss(
        logp, old_logp, adv, mask, epsilon_low=args.epsilon, epsilon_high=args.epsilon
    )
    kl = kl_penalty(logp, ref_logp, mask, "k3")  # (r - 1) - log r, r = pi_ref / pi per token
    per_token = per_token + args.kl_beta * kl
    numerator, weight = reduce_policy_gradient_loss(per_token, mask, "token-mean")
    stats["kl_ref"] = masked_mean(kl.detach(), mask)
    return numerator, weight, stats


#: Diagnostics that are token means (so chunks combine weighted by their tokens).
MEAN_STATS = ("clip_frac_low", "clip_frac_high", "ratio_mean", "approx_kl", "kl_ref")


# --- 7. one optimizer step over a mini-batch, split into micro-batches --------------------------
def update(model, optimizer, batch, adv, old_logp, ref_logp, args: Args) -> dict[str, float]:
    """Token-mean loss over the whole mini-batch, whatever the micro-batch size.

    Each chunk backpropagates numerator / W, where W is the mini-batch's total token weight,
    known before any forward (the response mask). Summed over chunks the gradient is exactly
    that of sum(numerators) / W -- a mean of chunk means would weight short chunks wrongly.
    """
    total_weight = batch.response_mask.sum().clamp(min=1).float()
    optimizer.zero_grad(set_to_none=True)
    loss, stats_sum = 0.0, {}
    for i in range(0, len(batch), args.micro_batch_size):
        rows = slice(i, i + args.micro_batch_size)
        numerator, weight, stats = chunk_loss(
            model, batch[rows], adv[rows], old_logp[rows], ref_logp[rows], args
        )
        (numerator / total_weight).backward()
        loss += float(numerator.detach() / total_weight)
        for k in MEAN_STATS:  # per-chunk token means -> the mini-batch's token mean
            stats_sum[k] = stats_sum.get(k, 0.0) + float(stats[k]) * float(weight / total_weight)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    optimizer.step()
    return {"loss": loss, "grad_norm": float(grad_norm), **stats_sum}


def cosine_lr(step: int, args: Args) -> float:
    return args.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / args.steps))


# --- 8. held-out accuracy: greedy decoding on the 20 problems never trained on ------------------
def evaluate(engine, tokenizer, items, args: Args) -> float:
    rollout = sample(engine, tokenizer, items, 1, 0.0, args.max_tokens, seed=0)
    return sum(exact_match(t, it) for t, it in zip(rollout.texts, items, strict=True)) / len(items)


# --- the loop -----------------------------------------------------------------------------------
def train(args: Args, log=print) -> dict[str, float]:
    model, tokenizer, reference, tasks = build(args)
    engine = TorchRolloutEngine(model, tokenizer)  # samples with the policy module itself
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=args.adam_betas, weight_decay=args.weight_decay
    )
    val = tasks.val_items()
    first = evaluate(engine, tokenizer, val, args)
    log(f"step 0: held-out accuracy {first:.2f}")
    cursor, record = 0, {}
    for step in range(1, args.steps + 1):
        items, cursor = tasks.take(args.seed, cursor, args.prompts_per_step)
        rollout = sample(
            engine, tokenizer, items, args.n, args.temperature, args.max_tokens,
            seed=args.seed * 1_000_003 + step,
        )  # fmt: skip
        rewards, correct = score(rollout, items)
        adv, zero_var = advantages(rewards, rollout.batch, args.n)
        batch = rollout.batch
        micro, temp = args.micro_batch_size, args.temperature
        old_logp = frozen_logprobs(model, batch, micro, temp)  # pi_old: before any update
        ref_logp = frozen_logprobs(reference, batch, micro, temp)
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, args)
        size = math.ceil(len(batch) / args.updates_per_batch)
        for start in range(0, len(batch), size):
            rows = slice(start, start + size)
            record = update(
                model, optimizer, batch[rows], adv[rows], old_logp[rows], ref_logp[rows], args
            )
        # The engine samples with `model` itself, so the next step already sees the new weights.
        record.update(
            reward=float(rewards.mean()), accuracy=float(correct.mean()), zero_var=zero_var
        )
        if step % args.eval_every == 0 or step == args.steps:
            record["val_accuracy"] = evaluate(engine, tokenizer, val, args)
            clip = record["clip_frac_low"] + record["clip_frac_high"]
            log(
                f"step {step}: reward {record['reward']:.3f} loss {record['loss']:+.4f} "
                f"kl_ref {record['kl_ref']:.4f} clip {clip:.3f} "
                f"held-out accuracy {record['val_accuracy']:.2f}"
            )
    return {"initial_val_accuracy": first, **record}


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in vars(Args()).items():
        if not isinstance(default, tuple):
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    return train(Args(**vars(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
