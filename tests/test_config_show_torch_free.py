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


REFUSED = """
import contextlib, io, sys
from posttrain.entrypoints.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(sys.argv[1:])
line = err.getvalue().strip()
assert code == 2 and "\\n" not in line, (code, line)
print(line)
loaded = sorted(m for m in ("torch", "transformers.modeling_utils") if m in sys.modules)
assert not loaded, loaded
"""


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["grpo", "--config", "arithmetic", "--", "rl.epsilon_lo=0.1"],
         "did you mean rl.epsilon_low"),
        (["opd", "--config", "opd_arithmetic", "--", "rl.kl_beta=0.1"],
         "rl.kl_beta=0.1 is never read by OPD"),
        (["grpo", "--config", "opd_arithmetic"], "posttrain opd"),
    ],
    ids=["grpo-unknown-key", "opd-preflight", "grpo-another-entry"],
)  # fmt: skip
def test_a_training_entry_refuses_a_config_before_it_imports_torch(tmp_path, argv, fragment):
    """The entries resolve and check the config before the loop's imports: a refusal is one line
    in well under a second, not after seconds of loading torch and transformers."""
    proc = subprocess.run([sys.executable, "-c", REFUSED, *argv], capture_output=True, text=True,
                          cwd=tmp_path, env={"PYTHONPATH": str(SRC)}, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert fragment in proc.stdout, proc.stdout
    assert not (tmp_path / "outputs").exists()
