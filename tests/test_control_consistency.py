"""Preflight rules of control/consistency.py: data, batch shape, placement, logging, LoRA."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import CERTIFIED, JSONL, Case, check_case, covered  # noqa: E402

from posttrain.config import PosttrainConfig, RolloutConfig  # noqa: E402
from posttrain.control import PreflightError, consistency, run_preflight  # noqa: E402

CASES: list[Case] = [
    ("shared_prefix_on_needs_unsharded",
     ["rl.shared_prefix=on", "placement.backend=ray", "placement.policy_sharding=fsdp"],
     "rl.shared_prefix=on with placement.policy_sharding=fsdp: sharded ranks run their forwards "
     "in step", ["rl.shared_prefix=auto", "placement.backend=ray", "placement.policy_sharding=fsdp"]),
    ("overlong_buffer_fits", ["reward.overlong_buffer=300"],
     "reward.overlong_buffer=300 exceeds rollout.max_tokens=256",
     ["reward.overlong_buffer=300", "rollout.max_tokens=300"]),
    ("anneal_needs_functions", ["reward.functions_anneal_steps=100"],
     "reward.functions_anneal_steps=100 fades the reward functions, and reward.functions is "
     "empty; set reward.functions or reset with reward.functions_anneal_steps=@default",
     ["reward.functions_anneal_steps=100",
      "reward.functions=[posttrain.reward.shaping:numeric_closeness]"]),
    ("lora_knobs_need_rank", ["model.lora_alpha=32", "model.lora_target_modules=[q_proj]"],
     "model.lora_alpha=32.0, model.lora_target_modules=['q_proj'] are never read with "
     "model.lora_rank=0", ["model.lora_alpha=32", "model.lora_rank=8"]),
    ("jsonl_needs_train_path", ["data.task=jsonl", "rl.eval_every=0"], "needs data.train_path",
     ["data.task=jsonl", "rl.eval_every=0", "data.train_path=t.jsonl"]),
    ("data_paths_need_jsonl", ["data.val_path=v.jsonl"], "data.val_path=v.jsonl is never read",
     JSONL),
    ("reasoning_gym_dataset_needs_task", ["data.reasoning_gym_dataset=chain_sum"],
     "data.reasoning_gym_dataset=chain_sum is never read by data.task=arithmetic",
     ["data.task=reasoning_gym", "data.reasoning_gym_dataset=chain_sum"]),
    ("reasoning_gym_dataset_needs_task", ["data.reasoning_gym_options={max_digits: 2}"],
     "data.reasoning_gym_options={'max_digits': 2} is never read by data.task=arithmetic",
     ["data.task=reasoning_gym", "data.reasoning_gym_options={max_digits: 2}"]),
    ("system_prompt_needs_chat", ["data.system_prompt=Be brief."],
     "data.system_prompt is never read by data.prompt_template=plain",
     ["data.system_prompt=@default", "data.user_template=Q: {prompt}"]),
    ("reasoning_gym_verifier_needs_task", ["reward.verifier=reasoning_gym"],
     "needs data.task=reasoning_gym", ["reward.verifier=math"]),
    ("arithmetic_sizes_fit", ["data.digits=1", "data.train_size=90", "data.val_size=20"],
     "exceeds the 100 distinct problems", ["data.digits=1", "data.train_size=80", "data.val_size=20"]),
    ("arithmetic_knobs_need_task", [*JSONL, "data.digits=3", "data.operators=+-"],
     "data.digits=3, data.operators=+- are never read by data.task=jsonl", ["data.digits=3"]),
    ("eval_needs_validation_data", ["data.val_size=0"], "rl.eval_every=25 needs data.val_size",
     ["data.val_size=0", "rl.eval_every=0"]),
    ("eval_needs_validation_data", JSONL[:2], "needs data.val_path", JSONL),
    ("batch_covers_updates",
     ["data.prompts_per_step=1", "rollout.n=2", "placement.policy_ranks=2",
      "rl.mini_batch_per_replica=2"],
     "2 responses, fewer than placement.policy_ranks*rl.mini_batch_per_replica=4",
     ["data.prompts_per_step=2", "rollout.n=2", "placement.policy_ranks=2",
      "rl.mini_batch_per_replica=2"]),
    ("deterministic_minis_fill_micro_batches",
     [*CERTIFIED, "data.prompts_per_step=3", "rollout.n=4", "rl.mini_batch_per_replica=2"],
     "rl.micro_batch_size=4, but data.prompts_per_step*rollout.n=12 rows over "
     "placement.policy_ranks=1 x rl.mini_batch_per_replica=2 give mini-batches of [6] rows; "
     "set rl.micro_batch_size=6",
     [*CERTIFIED, "data.prompts_per_step=3", "rollout.n=4", "rl.mini_batch_per_replica=2",
      "rl.micro_batch_size=3"]),
    ("deterministic_minis_fill_micro_batches",
     [*CERTIFIED, "data.prompts_per_step=5", "rollout.n=2", "placement.backend=ray",
      "placement.policy_ranks=2", "rl.micro_batch_size=10"],  # 10 rows, but 5 per rank
     "give mini-batches of [5] rows; set rl.micro_batch_size=5",
     [*CERTIFIED, "data.prompts_per_step=5", "rollout.n=2", "placement.backend=ray",
      "placement.policy_ranks=2", "rl.micro_batch_size=5"]),
    ("deterministic_minis_fill_micro_batches",
     [*CERTIFIED, "data.prompts_per_step=5", "rollout.n=3", "placement.backend=ray",
      "placement.policy_ranks=2", "rl.micro_batch_size=4"],
     "give mini-batches of [7, 8] rows; set rl.micro_batch_size=1",
     [*CERTIFIED, "data.prompts_per_step=4", "rollout.n=4", "placement.backend=ray",
      "placement.policy_ranks=2", "rl.micro_batch_size=4"]),
    ("token_micro_batches_need_uncertified", [*CERTIFIED, "rl.micro_batch_tokens=512"],
     "rl.micro_batch_tokens=512 regroups rows by length", ["rl.micro_batch_tokens=512"]),
    ("ray_knobs_need_ray", ["placement.gpus_per_role=1"], "placement.gpus_per_role=1.0 is never",
     ["placement.gpus_per_role=1", "placement.backend=ray"]),
    ("ray_knobs_need_ray", ["placement.policy_ranks=2"], "placement.policy_ranks=2 is never",
     ["placement.policy_ranks=2", "placement.backend=ray"]),
    ("ray_knobs_need_ray", ["placement.ray_address=head:6379"], "placement.ray_address=head:6379",
     ["placement.ray_address=head:6379", "placement.backend=ray"]),
    ("device_needs_local", ["placement.backend=ray", "placement.device=cpu"],
     "placement.device=cpu is never read by placement.backend=ray", ["placement.device=cpu"]),
    ("jsonl_reads_whole_files", [*JSONL, "data.train_size=10"],
     "data.train_size=10 is never read by data.task=jsonl", JSONL),
    ("warmup_fits_the_run", ["rl.lr_schedule=cosine", "rl.warmup_steps=300", "rl.max_steps=200"],
     "leaves no steps to decay over", ["rl.lr_schedule=cosine", "rl.warmup_steps=100", "rl.max_steps=200"]),
    ("adam_betas_need_adamw", ["rl.optimizer=sgd", "rl.adam_beta2=0.99"],
     "rl.adam_beta2=0.99 is never read by rl.optimizer=sgd", ["rl.adam_beta2=0.99"]),
    ("wandb_knobs_need_wandb", ["logging.wandb_mode=online"], "logging.wandb_mode=online is never",
     ["logging.wandb_mode=online", "logging.wandb=true"]),
]  # fmt: skip


def test_every_rule_of_the_module_has_a_case():
    # max_tokens_positive_int needs an unvalidated config; it has its own tests below.
    backstop = [("max_tokens_positive_int", [], "", [])]
    assert covered([*CASES, *backstop], consistency)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    check_case(name, bad, fragment, good)


@pytest.mark.parametrize("value", [True, 2.5, 0, -1])
def test_max_tokens_backstop_catches_unvalidated_values(value):
    config = PosttrainConfig()
    config.rollout = RolloutConfig.model_construct(max_tokens=value)
    with pytest.raises(PreflightError, match="rollout.max_tokens must be a positive integer"):
        run_preflight(config)


def test_max_tokens_backstop_passes_valid_value():
    assert consistency.max_tokens_positive_int.check(PosttrainConfig()) is None
