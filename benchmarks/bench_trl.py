"""TRL's side of ``vs_trl.py``: GRPOTrainer on the same model, prompts and hyper-parameters.

Only the benchmark venv (``make bench-trl``) has TRL; posttrain never imports this module.
TRL drives its own training loop, so ``vs_trl.py`` steps it through a ``TrainerCallback``: each
optimizer step waits for the benchmark's go-ahead and reports its phases when it ends (each side
runs in its own process). TRL phases come from the same forward hooks as posttrain's, plus a
timer around generation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_posttrain import PhaseClock, Workload
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that reports the wall time of generation (hooks are off while it samples)."""

    clock: PhaseClock

    def _generate_single_turn(self, *args, **kwargs):
        armed, self.clock.armed = self.clock.armed, False
        t0 = time.perf_counter()
        try:
            return super()._generate_single_turn(*args, **kwargs)
        finally:
            self.clock.totals["generate"] = self.clock.totals.get("generate", 0.0) + (
                time.perf_counter() - t0
            )
            self.clock.armed = armed


class StepTimer(TrainerCallback):
    """Runs ``before_step()`` before each TRL optimizer step (untimed), then times the step and
    hands its phases to ``after_step``."""

    def __init__(
        self,
        clock: PhaseClock,
        before_step: Callable[[], None],
        after_step: Callable[[dict[str, float]], None],
    ) -> None:
        self.clock = clock
        self.before_step = before_step
        self.after_step = after_step
        self._t0 = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.before_step()
        self.clock.take()
        self.clock.armed = True
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        total = time.perf_counter() - self._t0
        self.clock.armed = False
        phases = self.clock.take()
        phases["step"] = total
        phases["loss_backward_optim"] = total - sum(v for k, v in phases.items() if k != "step")
        self.after_step(phases)


def exact_reward(completions, answer, **_) -> list[float]:
    return [float(c.strip() == a) for c, a in zip(completions, answer, strict=True)]


def trl_trainer(
    w: Workload,
    model_dir: Path,
    out_dir: Path,
    rows: list[dict],
    steps: int,
    seed: int,
    bf16: bool = False,
    gradient_checkpointing: bool = False,
) -> TimedGRPOTrainer:
    """A GRPOTrainer whose step i sees prompts ``rows[i*P:(i+1)*P]`` (no shuffling), generated
    in one batch and trained in micro-batches of ``w.micro_batch`` rows, as posttrain does."""
    batch = w.prompts * w.n
    if batch % w.micro_batch:
        raise ValueError(f"micro-batch {w.micro_batch} does not divide the batch of {batch}")
    args = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=w.micro_batch,
        gradient_accumulation_steps=batch // w.micro_batch,
        generation_batch_size=batch,
        num_generations=w.n,
        num_iterations=1,
        max_completion_length=w.max_tokens,
        temperature=1.0,
        top_p=1.0,
        beta=w.kl_beta,
        epsilon=0.2,
        loss_type="dapo",  # = posttrain's TOKEN_SUM: token mean over the whole batch
        scale_rewards="group",
        learning_rate=w.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        optim="adamw_torch",
        max_grad_norm=1.0,
        max_steps=steps,
        shuffle_dataset=False,
        use_cpu=True,
        bf16=bf16,
        seed=seed,
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        disable_dropout=True,
        # TRL's default is True (its memory-best setting); False does posttrain's work.
        gradient_checkpointing=gradient_checkpointing,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32},
    )
    from posttrain.model.loading import load_tokenizer

    peft_config = None
    if w.lora_rank:
        from peft import LoraConfig

        peft_config = LoraConfig(r=w.lora_rank, lora_alpha=2.0 * w.lora_rank, lora_dropout=0.0,
                                 target_modules=w.lora_targets, bias="none")  # fmt: skip
    trainer = TimedGRPOTrainer(
        model=str(model_dir),
        reward_funcs=[exact_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(str(model_dir)),
        peft_config=peft_config,
    )
    trainer.clock = PhaseClock()
    # One generation per optimizer step means TRL never scores π_old: with LoRA (no separate
    # reference module) the policy's no-grad forwards are the adapter-free reference's.
    no_grad = "reference_fwd" if trainer.ref_model is None else "pi_old_fwd"
    trainer.clock.watch(trainer.model, lambda: "policy_fwd" if torch.is_grad_enabled() else no_grad)
    if trainer.ref_model is not None:
        trainer.clock.watch(trainer.ref_model, lambda: "reference_fwd")
    return trainer
