"""TRL 1.16's DPOTrainer as the oracle of the LM DPO objective (benchmarks/lmdpo_vs_trl.py):
loss, TRL's metrics and every gradient on the same batch, where TRL imports. The suite's venv
never has TRL, so this skips there and tests/test_lmdpo_objective.py's hand computation stands;
the bench venv runs it (``make lmdpo-vs-trl``, or pytest under ``.venv-bench``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "lmdpo_vs_trl.py"


def test_loss_metrics_and_gradients_equal_trls_dpo_trainer():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    verdicts = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
    verdicts = [v for v in verdicts if v in ("ok", "FAIL", "info")]
    assert verdicts == ["ok", "ok", "info", "ok", "ok", "info", "ok", "info", "ok", "info"], (
        out.stdout
    )
