"""The DPO entry's policy as one Ray actor gives the in-process run's numbers."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("ray")

from test_entry_dpo import base, opts_for, rows, train, weights  # noqa: E402, F401 (base: fixture)


def test_ray_placement_matches_local(base, ray_cluster):  # noqa: F811
    """The policy as one Ray actor: same losses, evaluation and weights as in-process, where the
    run takes placement.torch_threads_per_process threads whatever this process had."""
    steps = {"rl.max_steps": 2, "rl.eval_every": 2}
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        local = train(opts_for(base, "local", **steps))
        assert torch.get_num_threads() == 1  # the key's default, as in the Ray actor
    finally:
        torch.set_num_threads(before)
    remote = train(opts_for(base, "ray", **steps, **{"placement.backend": "ray",
                                                     "placement.cpus_per_role": 0.5}))  # fmt: skip
    a, b = rows(local), rows(remote)
    for step in (1, 2):
        assert a[step]["train/loss"] == b[step]["train/loss"]
    assert a[2]["val/scorer_mean"] == b[2]["val/scorer_mean"]
    wa, wb = weights(local, 2), weights(remote, 2)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
