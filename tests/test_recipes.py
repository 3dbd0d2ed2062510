"""Built-in recipes load, pass preflight, and select what their names promise."""

from __future__ import annotations

import pytest

from posttrain.config import PosttrainConfig, RLConfig, builtin_recipes, load_config
from posttrain.configs.grpo_base import build_grpo_config
from posttrain.configs.gspo_qwen3b_gsm8k import apply_gspo_knobs
from posttrain.control import run_preflight
from posttrain.run.records import default_out_dir

EXPECTED_WARNINGS = {
    "arithmetic": [],
    "grpo_base": [],
    "dr_grpo_qwen3b_gsm8k": [],
    "gspo_qwen3b_gsm8k": ["model.dtype=bfloat16 at rl.importance_sampling_level=sequence"],
    "smollm2_reasoning_gym": [],
    "smollm2_calculator": [],
    "tools_addition": [],
    "tools_addition_notool": [],
    "tools_addition_stage2": [],
    "tools_addition_notool_stage2": [],
    "tools_addition_reset": [],
    "tools_addition_notool_reset": [],
    "arithmetic_clipped": [],
    "opd_arithmetic": ["rl.distillation_mode=direct: task reward and group advantage"],
    "dpo_shapes": [],
    "sft_tools_tiny": [],
    "sft_smollm2_calculator": [],
    "lmdpo_tools_tiny": [],
    "rft_arithmetic": [],
    "rft_arithmetic_sft": [],
    "rft_arithmetic_lmdpo": [],
    "rft_smollm2": [],
    "rft_smollm2_sft": [],
    "rft_smollm2_lmdpo": [],
}


def test_the_expected_recipes_ship():
    assert set(builtin_recipes()) == set(EXPECTED_WARNINGS)


@pytest.mark.parametrize("name", sorted(EXPECTED_WARNINGS))
def test_recipe_loads_and_passes_preflight(name):
    warnings = run_preflight(load_config(name))
    assert len(warnings) == len(EXPECTED_WARNINGS[name])
    for warning, prefix in zip(warnings, EXPECTED_WARNINGS[name], strict=True):
        assert warning.startswith(prefix)


@pytest.mark.parametrize("name", sorted(EXPECTED_WARNINGS))
def test_recipe_accepts_the_smoke_overrides(name):
    cfg = load_config(name, ["--", "rl.max_steps=1", "rl.save_every=0", "rl.resume=off"])
    assert (cfg.rl.max_steps, cfg.rl.save_every, cfg.rl.resume) == (1, 0, "off")


def test_arithmetic_root_pins_legacy_pg_on_a_tiny_cpu_problem():
    cfg = load_config("arithmetic")
    assert cfg.rl.grpo_surrogate == "legacy_pg"
    assert cfg.rollout.temperature == 1.0 and cfg.rl.is_default("temperature")
    assert cfg.model.name_or_path == "outputs/models/tiny-arith"
    assert cfg.model.dtype == "float32" and cfg.placement.backend == "local"
    assert (cfg.data.task, cfg.data.digits, cfg.data.operators) == ("arithmetic", 1, "+")
    assert cfg.rollout.n == 8 and cfg.rollout.max_tokens <= 8
    assert cfg.rl.lr == 1e-3 and cfg.rl.max_steps == 150


def test_grpo_base_is_clipped_on_gsm8k_jsonl():
    cfg = build_grpo_config()
    assert cfg == load_config("grpo_base")
    assert cfg.rl.grpo_surrogate == "clipped" and cfg.rl.temperature == cfg.rollout.temperature
    assert cfg.data.task == "jsonl" and cfg.data.train_path and cfg.data.val_path
    assert "Qwen2.5-3B" in cfg.model.name_or_path


def test_dr_grpo_recipe():
    cfg = load_config("dr_grpo_qwen3b_gsm8k")
    base = build_grpo_config()
    assert (cfg.job.algorithm, cfg.job.name) == ("dr_grpo", "qwen3b_bf16_dr_grpo_seed42")
    assert cfg.rl.grpo_surrogate == "clipped" and cfg.rl.advantage_estimator == "dr_grpo"
    assert cfg.rl.loss_type == "seq-mean-token-sum-fixed"
    # Only the algorithm, name and the two Dr-GRPO choices differ from the base.
    base.job.algorithm, base.job.name = cfg.job.algorithm, cfg.job.name
    base.rl.advantage_estimator, base.rl.loss_type = "dr_grpo", "seq-mean-token-sum-fixed"
    assert cfg == base


def test_gspo_recipe():
    cfg = load_config("gspo_qwen3b_gsm8k")
    assert (cfg.job.algorithm, cfg.job.name) == ("gspo", "qwen3b_bf16_gspo_seed42")
    rl = cfg.rl
    assert (rl.grpo_surrogate, rl.importance_sampling_level) == ("clipped", "sequence")
    assert (rl.lower_bound_ratio, rl.epsilon_low, rl.epsilon_high) == (0.0, 3e-4, 4e-4)
    assert rl.loss_type == "seq-mean-token-mean" and rl.mini_batch_per_replica == 32
    assert cfg.model.certified_deterministic_forward


def test_apply_gspo_knobs_overrides_a_legacy_section():
    rl = RLConfig(grpo_surrogate="legacy_pg", lower_bound_ratio=3.0)
    assert apply_gspo_knobs(rl, mini_batch_per_replica=4) is rl
    assert rl.grpo_surrogate == "clipped" and rl.lower_bound_ratio == 0.0
    assert rl.mini_batch_per_replica == 4
    cfg = PosttrainConfig()
    apply_gspo_knobs(cfg.rl, mini_batch_per_replica=2, model=cfg.model)
    assert cfg.model.certified_deterministic_forward and run_preflight(cfg) == []


def test_recipes_keep_runs_apart():
    names = [load_config(n) for n in builtin_recipes()]
    dirs = {str(default_out_dir(c)) for c in names}
    assert len(dirs) == len(names)


def test_opd_arithmetic_distils_into_grpo_s_own_starting_point():
    opd, grpo = load_config("opd_arithmetic"), load_config("arithmetic_clipped")
    assert opd.job.algorithm == "opd" and opd.rl.distillation_mode == "direct"
    assert (opd.model.name_or_path, opd.model.init_preset, opd.job.seed) == (
        grpo.model.name_or_path, grpo.model.init_preset, grpo.job.seed,
    )  # fmt: skip
    assert opd.teacher.name_or_path.startswith(str(default_out_dir(grpo)))
