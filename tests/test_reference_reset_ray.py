"""``rl.reference_reset_every`` on Ray under ``rl.off_policy_lag=1``: the reference resets on the
policy actor (``auto`` keeps it there), and a run stopped after a reset resumes bit for bit:
the run again from its step-3 checkpoint, the later ones removed (as a run killed before its
step-4 save would leave it).

The session's Ray instance (tests/conftest.py); tests/test_reference_reset.py has the rest."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("ray")

from test_reference_reset import opts_for, rows, same, train, weights  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.config.build import build_objective  # noqa: E402
from posttrain.entrypoints import grpo  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


RAY = {"placement.backend": "ray", "placement.cpus_per_role": 0.5, "rl.off_policy_lag": 1}


def test_a_lagged_ray_run_stopped_after_a_reset_resumes_bit_identically(
    ray_cluster, tiny_dir, tmp_path: Path
):
    straight = train(opts_for(tmp_path / "straight", tiny_dir, 5, **RAY))
    got = rows(straight)
    assert [r["train/reference/resets"] for r in got] == [0, 1, 1, 2, 2]
    raw = (straight / "metrics.jsonl").read_text()
    assert "time/reference_s" not in raw  # scored on the policy side, by no data-side role
    final = weights(straight, 5)
    for step in (4, 5):
        shutil.rmtree(straight / "checkpoints" / f"step_{step:08d}")
    opts = opts_for(tmp_path / "straight", tiny_dir, 5, **RAY)
    config = load_config("arithmetic", ["--", *opts])
    resumed = grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), build_objective)
    assert resumed["start_step"] == 3 and Path(resumed["run_dir"]) == straight
    assert same(final, weights(straight, 5))
    assert rows(straight)[-2:] == got[-2:]
