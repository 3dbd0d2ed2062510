"""docs/guides/objectives.md: its from-scratch objective, copied from the guide, passes the
conformance kit and trains through the CLI; the builder is part of the run's record (config.yaml,
resume, ``config show --objective``); a builder returning a non-Objective is one line."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cli_here import posttrain_here
from conftest import tiny_llama

from posttrain.config import RLConfig
from posttrain.model.tiny import build_tiny_model
from posttrain.testing import check_objective, synthetic_batch

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs/guides/objectives.md"


def scratch_source() -> str:
    """The first python block after the guide's from-scratch heading."""
    text = GUIDE.read_text()
    section = text[text.index("## Example: an objective from scratch") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "scratch_objective.py").write_text(scratch_source())
    (tmp_path / "none_objective.py").write_text("def build(rl, context):\n    return None\n")
    return tmp_path


def _posttrain(args, cwd):
    return posttrain_here(args, cwd)  # the user's folder importable, as from their shell


def _opts(tmp: Path, model: Path, steps: int) -> list[str]:
    return [
        f"job.output_root={tmp / 'out'}", f"model.name_or_path={model}", "rl.kl_beta=0",
        "data.prompts_per_step=4", "rollout.n=4", f"rl.max_steps={steps}", "rl.save_every=1",
        "rl.eval_every=0", "rl.micro_batch_size=8", "logging.progress=false",
    ]  # fmt: skip


def test_the_guides_scratch_objective_passes_the_conformance_kit(user_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(user_dir))
    namespace: dict = {}
    exec(compile(scratch_source(), "scratch_objective.py", "exec"), namespace)
    objective = namespace["build"](RLConfig(), SimpleNamespace(max_response_length=6))
    check_objective(objective, lambda: tiny_llama(0), synthetic_batch(16, 6, dtype=torch.float64))


def test_scratch_objective_trains_and_is_recorded_and_resume_names_the_flag(user_dir, tiny_dir):
    objective = ["--objective", "scratch_objective:build"]
    run = ["grpo", *objective, "--config", "arithmetic_clipped", "--"]
    out = _posttrain([*run, *_opts(user_dir, tiny_dir, 2)], user_dir)
    assert out.returncode == 0, out.stderr
    run_dir = user_dir / "out" / "grpo" / "arithmetic_clipped"
    assert "objective_builder: scratch_objective:build" in (run_dir / "config.yaml").read_text()
    assert "train/scratch/is_weight_max" in (run_dir / "metrics.jsonl").read_text()

    again = ["grpo", "--config", "arithmetic_clipped", "--", *_opts(user_dir, tiny_dir, 3)]
    resumed = _posttrain(again, user_dir)
    assert resumed.returncode == 1, resumed.stderr  # a resume error, after placement started
    line = resumed.stderr.strip().splitlines()[-1]
    assert line.startswith("posttrain: error: ResumeError") and "Traceback" not in resumed.stderr
    assert "rl.objective_builder='scratch_objective:build'" in line
    assert "pass --objective scratch_objective:build to resume it" in line


def test_config_show_takes_the_objective_and_checks_its_reads(user_dir):
    show = ["config", "show", "--config", "arithmetic_clipped", "--objective"]
    out = _posttrain([*show, "scratch_objective:build", "--", "rl.kl_beta=0"], user_dir)
    assert out.returncode == 0, out.stderr
    assert "objective_builder: scratch_objective:build" in out.stdout
    refused = _posttrain([*show, "scratch_objective:build", "--", "rl.kl_beta=0.05"], user_dir)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "posttrain: error: preflight: rl.kl_beta=0.05 is never read by the objective builder "
        "scratch_objective:build; reset with rl.kl_beta=@default (-> 0.0)"
    )


def test_a_builder_returning_none_is_one_line_naming_it(user_dir, tiny_dir):
    args = ["grpo", "--objective", "none_objective:build", "--config", "arithmetic_clipped", "--"]
    out = _posttrain([*args, *_opts(user_dir, tiny_dir, 1)], user_dir)
    assert out.returncode == 2, out.stderr
    line = out.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "the objective builder none_objective:build returned NoneType, not an Objective" in line


def test_a_recipe_can_name_the_builder(user_dir, tiny_dir):
    recipe = user_dir / "my_recipe.py"
    recipe.write_text(
        "from posttrain.configs.arithmetic_clipped import build_config as base\n\n\n"
        "def build_config():\n"
        "    cfg = base()\n"
        "    cfg.rl.objective_builder = 'scratch_objective:build'\n"
        "    return cfg\n"
    )
    out = _posttrain(["config", "show", "--config", str(recipe), "--", "rl.kl_beta=0.05"], user_dir)
    assert out.returncode == 2 and "objective builder scratch_objective:build" in out.stderr
