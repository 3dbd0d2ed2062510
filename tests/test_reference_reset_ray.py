"""``rl.reference_reset_every`` on Ray under ``rl.off_policy_lag=1``: the reference resets on the
policy actor (``auto`` keeps it there), and a run stopped after a reset resumes bit for bit.

The session's Ray instance (tests/conftest.py); tests/test_reference_reset.py has the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")

from test_reference_reset import opts_for, rows, same, train, weights  # noqa: E402

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
    train(opts_for(tmp_path / "resumed", tiny_dir, 3, **RAY))
    resumed = train(opts_for(tmp_path / "resumed", tiny_dir, 5, **RAY))
    assert same(weights(straight, 5), weights(resumed, 5))
    assert rows(resumed)[-2:] == got[-2:]
