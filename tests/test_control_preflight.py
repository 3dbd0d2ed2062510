"""Preflight: every rule's failing and passing side, and run_preflight's aggregation."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from posttrain.config import ConfigError, PosttrainConfig, RolloutConfig, all_keys, apply_overrides
from posttrain.control import RULES, PreflightError, objective_family, run_preflight
from posttrain.control.inert import TOKEN_SCALE_EPSILON
from posttrain.control.opd import check_entry

LEGACY = ["rl.grpo_surrogate=legacy_pg"]
SEQ = ["rl.importance_sampling_level=sequence"]
GSPO = [
    *SEQ,
    "rl.epsilon_low=3e-4",
    "rl.epsilon_high=4e-4",
    "rl.loss_type=seq-mean-token-mean",
    "rl.mini_batch_per_replica=2",
]
OPD = ["job.algorithm=opd", "teacher.name_or_path=teacher"]
DIRECT = [*OPD, "rl.distillation_mode=direct"]
DPO = ["job.algorithm=dpo", "dpo.pairs_path=pairs.jsonl"]
SCHEDULE = f"model.name_or_path={Path(__file__).parent / 'fixtures' / 'dpo_schedule'}"
CERTIFIED = ["model.certified_deterministic_forward=true"]
JSONL = ["data.task=jsonl", "data.train_path=train.jsonl", "data.val_path=val.jsonl"]

# rule name -> (overrides that trip it, a fragment of its message, overrides one step away that
# satisfy it)
CASES: list[tuple[str, list[str], str, list[str]]] = [
    ("clipped_temperature_match", ["rollout.temperature=0.7"], "rl.temperature == rollout",
     ["rollout.temperature=0.7", "rl.temperature=0.7"]),
    ("clipped_temperature_match", ["rl.temperature=2"], "got 2.0 and 1.0", []),
    ("legacy_pg_rollout_temperature", [*LEGACY, "rollout.temperature=0.7"],
     "rollout.temperature must be 1.0 (got 0.7)", LEGACY),
    ("legacy_pg_rl_temperature", [*LEGACY, "rl.temperature=0.7"],
     "rl.temperature=0.7 is never read by rl.grpo_surrogate=legacy_pg", LEGACY),
    ("legacy_pg_clip_knobs", [*LEGACY, "rl.epsilon_low=0.1"], "rl.epsilon_low=0.1 is never",
     LEGACY),
    ("legacy_pg_clip_knobs", [*LEGACY, "rl.epsilon_high=0.28"], "rl.epsilon_high=0.28", LEGACY),
    ("legacy_pg_clip_knobs", [*LEGACY, "rl.lower_bound_ratio=3"], "rl.lower_bound_ratio=3.0",
     ["rl.lower_bound_ratio=3"]),
    ("legacy_pg_clip_knobs", [*LEGACY, "rl.loss_type=seq-mean-token-sum", "rl.epsilon_low=0.1"],
     "rl.epsilon_low=0.1, rl.loss_type=seq-mean-token-sum are never read",
     ["rl.loss_type=seq-mean-token-sum"]),
    ("kl_beta_without_kl_term", [*LEGACY, "rl.kl_beta=0.1"], "rl.kl_beta=0.1 is never read",
     ["rl.kl_beta=0.1"]),
    ("kl_estimator_without_kl_term", ["rl.kl_estimator=k1"],
     "rl.kl_estimator=k1 is never read with rl.kl_beta=0",
     ["rl.kl_estimator=k1", "rl.kl_beta=0.1"]),
    ("legacy_pg_sequence_level", [*LEGACY, *SEQ], "rl.importance_sampling_level=sequence is never",
     SEQ),
    ("sequence_level_dual_clip", [*GSPO, "rl.lower_bound_ratio=3"], "lower_bound_ratio=3.0 (dual",
     ["rl.lower_bound_ratio=3"]),
    ("sequence_level_per_token_advantages", [*OPD, *GSPO], "not supported by job.algorithm=opd",
     GSPO),
    ("sequence_level_per_token_advantages", ["job.algorithm=opd_direct", *SEQ],
     "its signal is per token", ["job.algorithm=opd_direct"]),
    ("advantage_eps_unread", ["rl.advantage_estimator=dr_grpo", "rl.advantage_eps=1e-4"],
     "rl.advantage_eps=0.0001 is never read", ["rl.advantage_eps=1e-4"]),
    ("advantage_eps_unread",
     ["rl.advantage_estimator=rloo", "rl.reward_scaling=none", "rl.advantage_eps=1e-4"],
     "never read with rl.advantage_estimator=rloo",
     ["rl.advantage_estimator=rloo", "rl.reward_scaling=batch", "rl.advantage_eps=1e-4"]),
    ("reward_scaling_fixed_by_estimator",
     ["rl.advantage_estimator=reinforce_pp", "rl.reward_scaling=batch"],
     "rl.reward_scaling=batch is never read by rl.advantage_estimator=reinforce_pp",
     ["rl.advantage_estimator=grpo", "rl.reward_scaling=batch"]),
    ("reward_scaling_fixed_by_estimator",
     ["rl.advantage_estimator=dr_grpo", "rl.reward_scaling=none"], "fixes its own scaling",
     ["rl.advantage_estimator=rloo", "rl.reward_scaling=none"]),
    ("grpo_unscaled_is_dr_grpo", ["rl.reward_scaling=none"], "write rl.advantage_estimator=dr_grpo",
     ["rl.advantage_estimator=dr_grpo"]),
    ("entropy_coef_needs_clipped", [*LEGACY, "rl.entropy_coef=0.01"],
     "rl.entropy_coef=0.01 is never read by rl.grpo_surrogate=legacy_pg", ["rl.entropy_coef=0.01"]),
    ("overlong_penalty_needs_buffer", ["reward.overlong_penalty=0.5"],
     "reward.overlong_penalty=0.5 is never read with reward.overlong_buffer=0",
     ["reward.overlong_penalty=0.5", "reward.overlong_buffer=64"]),
    ("overlong_buffer_fits", ["reward.overlong_buffer=300"],
     "reward.overlong_buffer=300 exceeds rollout.max_tokens=256",
     ["reward.overlong_buffer=300", "rollout.max_tokens=300"]),
    ("opd_ignores_overlong_punishment", [*OPD, "reward.overlong_buffer=8"],
     "reward.overlong_buffer=8 is never read by job.algorithm=opd (OPD)",
     ["reward.overlong_buffer=8"]),
    ("sampling_rounds_need_dynamic_sampling", ["rl.max_sampling_rounds=5"],
     "rl.max_sampling_rounds=5 is never read with rl.dynamic_sampling=false",
     ["rl.max_sampling_rounds=5", "rl.dynamic_sampling=true"]),
    ("lora_knobs_need_rank", ["model.lora_alpha=32", "model.lora_target_modules=[q_proj]"],
     "model.lora_alpha=32.0, model.lora_target_modules=['q_proj'] are never read with "
     "model.lora_rank=0", ["model.lora_alpha=32", "model.lora_rank=8"]),
    ("distillation_mode_without_opd", ["rl.distillation_mode=direct"],
     "rl.distillation_mode=direct is read only by OPD", [*OPD, "rl.distillation_mode=direct"]),
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
    ("reward_functions_load", ["reward.functions=[no_such_module_xyz:f]"],
     "reward.functions entry 'no_such_module_xyz:f': cannot import module",
     ["reward.functions=[posttrain.reward.shaping:numeric_closeness]"]),
    ("chat_template_available",
     ["data.prompt_template=chat", "model.name_or_path=/nonexistent/tiny",
      "model.init_preset=tiny"],
     "model.init_preset=tiny builds a character-level tokenizer without one",
     ["model.name_or_path=/nonexistent/tiny", "model.init_preset=tiny"]),
    ("ray_knobs_need_ray", ["placement.gpus_per_role=1"], "placement.gpus_per_role=1.0 is never",
     ["placement.gpus_per_role=1", "placement.backend=ray"]),
    ("ray_knobs_need_ray", ["placement.policy_ranks=2"], "placement.policy_ranks=2 is never",
     ["placement.policy_ranks=2", "placement.backend=ray"]),
    ("ray_knobs_need_ray", ["placement.ray_address=head:6379"], "placement.ray_address=head:6379",
     ["placement.ray_address=head:6379", "placement.backend=ray"]),
    ("rollout_is_cap_needs_clipped", [*LEGACY, "rl.rollout_is_cap=2"],
     "rl.rollout_is_cap=2.0 is never read by rl.grpo_surrogate=legacy_pg",
     ["rl.rollout_is_cap=2"]),
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
    ("dpo_reads_no_online_knobs", [*DPO, "rl.kl_beta=0.1", "rollout.n=4"],
     "rollout.n=4, rl.kl_beta=0.1 are never read by job.algorithm=dpo", DPO),
    ("dpo_knobs_without_dpo", ["dpo.beta=2"], "dpo.beta=2.0 is read only by Diffusion DPO",
     [*DPO, "dpo.beta=2"]),
    ("dpo_needs_pairs", ["job.algorithm=dpo"], "dpo.pairs_path is not set", DPO),
    ("beta_without_dpo_loss", [*DPO, "dpo.loss=sft_chosen", "dpo.beta=2"],
     "dpo.beta=2.0 is never read by dpo.loss=sft_chosen", [*DPO, "dpo.loss=sft_chosen"]),
    ("beta_without_dpo_loss", [*DPO, "dpo.loss=sft_chosen", "dpo.min_timestep=100"],
     "dpo.min_timestep=100 is never read", [*DPO, "dpo.min_timestep=100"]),
    ("dpo_single_policy_rank", [*DPO, "placement.backend=ray", "placement.policy_ranks=2"],
     "the DPO entry trains one policy rank", [*DPO, "placement.backend=ray"]),
    ("dpo_timesteps_within_schedule", [*DPO, SCHEDULE, "dpo.min_timestep=5000"],
     "dpo.min_timestep=5000 exceeds the model's schedule of 1000", [*DPO, SCHEDULE]),
    # warnings
    ("top_p_truncates_sampling", ["rollout.top_p=0.9"], "rollout.top_p=0.9: responses come from",
     ["rollout.top_p=1"]),
    ("sequence_level_on_policy_ratio", [*GSPO, "rl.mini_batch_per_replica=1"],
     "rl.mini_batch_per_replica=1: every update is on-policy", GSPO),
    ("sequence_level_token_scale_epsilons", [*GSPO, "rl.epsilon_high=0.28"],
     "rl.epsilon_low=0.0003, rl.epsilon_high=0.28 are token-scale", GSPO),
    ("sequence_level_token_scale_epsilons", [*GSPO, f"rl.epsilon_low={TOKEN_SCALE_EPSILON}"],
     "token-scale", [*GSPO, f"rl.epsilon_low={TOKEN_SCALE_EPSILON / 2}"]),
    ("sequence_level_bf16_logprobs", [*GSPO, "model.dtype=bfloat16"], "model.dtype=bfloat16 at",
     ["model.dtype=bfloat16"]),
    ("sequence_level_length_weighting", [*GSPO, "rl.loss_type=seq-mean-token-sum-fixed"],
     "rl.loss_type=seq-mean-token-sum-fixed at rl.importance_sampling_level=sequence",
     ["rl.loss_type=seq-mean-token-sum-fixed"]),
    ("sequence_level_length_weighting", [*GSPO, "rl.loss_type=seq-mean-token-sum"],
     "weights responses by length", [*GSPO, "rl.loss_type=token-mean"]),
    ("dynamic_sampling_batch_baseline",
     ["rl.dynamic_sampling=true", "rl.advantage_estimator=reinforce_pp"],
     "groups of equal rewards are dropped", ["rl.dynamic_sampling=true"]),
    ("dynamic_sampling_drops_teacher_signal", [*OPD, "rl.dynamic_sampling=true"],
     "job.algorithm=opd: groups of equal task rewards are dropped", ["rl.dynamic_sampling=true"]),
    ("opd_direct_ignores_reward", [*OPD, "rl.distillation_mode=direct"],
     "task reward and group advantage are not training signals", OPD),
    # on-policy distillation
    ("opd_needs_teacher", ["job.algorithm=opd"], "job.algorithm=opd needs teacher.name_or_path",
     OPD),
    ("teacher_needs_opd", ["teacher.name_or_path=t", "teacher.top_k=8"],
     "teacher.name_or_path=t, teacher.top_k=8 are never read by job.algorithm=grpo", OPD),
    ("opd_ignores_group_advantage_knobs", [*OPD, "rl.kl_beta=0.1", "rl.advantage_estimator=rloo"],
     "rl.kl_beta=0.1, rl.advantage_estimator=rloo are never read by OPD", ["rl.kl_beta=0.1"]),
    ("opd_ignores_group_advantage_knobs", [*OPD, "rl.entropy_coef=0.01"],
     "rl.entropy_coef=0.01 is never read by OPD", OPD),
    ("opd_ignores_group_advantage_knobs", [*OPD, "rl.grpo_surrogate=legacy_pg"],
     "rl.grpo_surrogate=legacy_pg is never read by OPD", OPD),
    ("opd_direct_clip_knobs", [*DIRECT, "rl.epsilon_high=0.28"],
     "rl.epsilon_high=0.28 is never read by rl.distillation_mode=direct",
     [*OPD, "rl.epsilon_high=0.28"]),
    ("divergence_knobs_need_direct", [*OPD, "rl.divergence=forward_kl", "teacher.top_k=8"],
     "rl.divergence=forward_kl, teacher.top_k=8 are read only by OPD with rl.distillation_mode=direct",
     [*DIRECT, "rl.divergence=forward_kl", "teacher.top_k=8"]),
    ("divergence_knobs_need_direct", ["rl.divergence=jsd"], "rl.divergence=jsd is read only by OPD",
     [*DIRECT, "rl.divergence=jsd"]),
    ("jsd_beta_needs_jsd", [*DIRECT, "rl.jsd_beta=0.1"], "rl.jsd_beta=0.1 is read only by rl.divergence=jsd",
     [*DIRECT, "rl.divergence=jsd", "rl.jsd_beta=0.1"]),
]  # fmt: skip

_RULES = {r.name: r for r in RULES}


def _cfg(opts: list[str]) -> PosttrainConfig:
    return apply_overrides(PosttrainConfig(), opts)


def test_every_rule_has_cases_and_reads_real_keys():
    # max_tokens_positive_int needs an unvalidated config; it has its own tests below.
    assert {c[0] for c in CASES} | {"max_tokens_positive_int"} == set(_RULES)
    assert len(_RULES) == len(RULES)
    keys = set(all_keys())
    for rule in RULES:
        assert rule.reads and set(rule.reads) <= keys, rule.name
        assert rule.doc and rule.severity in ("error", "warning")


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    rule = _RULES[name]
    message = rule.check(_cfg(bad))
    assert message is not None and fragment in message, message
    assert rule.check(_cfg(good)) is None
    if rule.severity == "error":
        with pytest.raises(PreflightError) as info:
            run_preflight(_cfg(bad))
        assert message in info.value.violations and "\n" not in str(info.value)
    else:
        assert message in run_preflight(_cfg(bad))


def test_defaults_and_clean_gspo_pass_without_warnings():
    assert run_preflight(PosttrainConfig()) == []
    assert run_preflight(_cfg(OPD)) == []
    assert run_preflight(_cfg(GSPO)) == []
    assert run_preflight(_cfg(JSONL)) == []


@pytest.mark.parametrize("value", [True, 2.5, 0, -1])
def test_max_tokens_backstop_catches_unvalidated_values(value):
    cfg = PosttrainConfig()
    cfg.rollout = RolloutConfig.model_construct(max_tokens=value)
    with pytest.raises(PreflightError, match="rollout.max_tokens must be a positive integer"):
        run_preflight(cfg)


def test_max_tokens_backstop_passes_valid_value():
    assert _RULES["max_tokens_positive_int"].check(PosttrainConfig()) is None


def test_all_violations_are_reported_in_one_line():
    cfg = _cfg([*LEGACY, "rl.epsilon_low=0.1", "rl.kl_beta=0.5", "rollout.temperature=0.5"])
    with pytest.raises(PreflightError) as info:
        run_preflight(cfg)
    assert len(info.value.violations) == 3
    assert isinstance(info.value, ConfigError)
    text = str(info.value)
    assert text.startswith("preflight: ") and "\n" not in text
    assert all(v in text for v in info.value.violations)


def test_preflight_error_pickles_with_its_violations():
    error = PreflightError(["a=1 is never read", "b=2 is never read"])
    copy = pickle.loads(pickle.dumps(error))
    assert copy.violations == error.violations and str(copy) == str(error)


def test_warnings_are_returned_once_in_rule_order():
    cfg = _cfg([*SEQ, "model.dtype=bfloat16"])
    warnings = run_preflight(cfg)
    assert len(warnings) == len(set(warnings)) == 3
    assert warnings[0].startswith("rl.importance_sampling_level=sequence with")
    assert run_preflight(cfg) == warnings


@pytest.mark.parametrize(
    ("algorithm", "family"), [("grpo", "grpo"), ("gspo", "grpo"), ("opd", "opd"), ("opd_x", "opd")]
)
def test_objective_family(algorithm, family):
    assert objective_family(_cfg([f"job.algorithm={algorithm}"])) == family


@pytest.mark.parametrize(
    ("entry", "algorithm", "fragment"),
    [("grpo", "opd", "run `posttrain opd"), ("grpo", "opd_x", "run `posttrain opd"),
     ("opd", "grpo", "train it with `posttrain grpo`"),
     ("opd", "gspo", "job.algorithm=gspo is a GRPO-family"),
     ("opd", "opd_direct", "records its runs as job.algorithm=opd")],
)  # fmt: skip
def test_each_entry_refuses_the_other_family_in_one_line(entry, algorithm, fragment):
    with pytest.raises(PreflightError, match=fragment) as info:
        check_entry(_cfg([f"job.algorithm={algorithm}"]), entry)
    assert "\n" not in str(info.value)
    check_entry(_cfg([f"job.algorithm={'opd' if entry == 'opd' else 'dr_grpo'}"]), entry)
