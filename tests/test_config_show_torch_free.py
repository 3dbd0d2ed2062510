"""`posttrain config show` and preflight answer without importing torch where no model is needed
(a CPU build of torch; the tokenizer of a model folder is char-level or absent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

CODE = """
import contextlib, io, sys
from posttrain.entrypoints.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["config", "show", "--config", *sys.argv[1:]])
assert code == 0, code
assert "# memory estimate" in out.getvalue()  # the estimate ran, preflight before it
loaded = sorted(m for m in ("torch", "transformers.modeling_utils") if m in sys.modules)
assert not loaded, loaded
"""


def _show(cwd: Path, *args: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CODE, *args], capture_output=True, text=True,
                          cwd=cwd, env={"PYTHONPATH": str(SRC)}, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("recipe", ["arithmetic", "arithmetic_clipped", "opd_arithmetic"])
def test_config_show_of_a_tiny_recipe_loads_no_torch(tmp_path, recipe):
    _show(tmp_path, recipe)  # no model folder yet: the preset's shape


def test_config_show_with_a_model_folder_loads_no_torch(tmp_path):
    from posttrain.model.tiny import build_tiny_model

    folder = build_tiny_model("tiny", tmp_path / "m", seed=0)  # this process imports torch
    _show(tmp_path, "arithmetic", "--", f"model.name_or_path={folder}", "rl.kl_beta=0.1",
          "rl.grpo_surrogate=clipped", "placement.reference_on=data")  # fmt: skip
