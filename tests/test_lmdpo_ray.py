"""The LM DPO entry's policy (with its reference) as one Ray actor gives the in-process run's
numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("ray")

from test_entry_lmdpo import opts_for, rows_in, train  # noqa: E402


def test_ray_placement_matches_local(tmp_path, ray_cluster):
    steps = {"rl.max_steps": 2, "rl.eval_every": 2}
    local = train(opts_for(tmp_path, "local", **steps))
    remote = train(opts_for(tmp_path, "ray", **steps, **{"placement.backend": "ray",
                                                         "placement.cpus_per_role": 0.5}))  # fmt: skip
    a, b = rows_in(Path(local["run_dir"])), rows_in(Path(remote["run_dir"]))
    for step in (1, 2):
        assert a[step]["train/loss"] == b[step]["train/loss"]
        assert a[step]["train/rewards/margins"] == b[step]["train/rewards/margins"]
    assert a[2]["val/rewards/accuracies"] == b[2]["val/rewards/accuracies"]
    wa, wb = (load_file(str(Path(s["final_model"]) / "model.safetensors")) for s in (local, remote))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
