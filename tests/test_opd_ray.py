"""OPD with the teacher as a Ray actor equals the in-process run for three steps, bit for bit;
under rl.off_policy_lag=1 the teacher, a declared role, scores on the data side of the pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402
from test_entry_opd import RECIPE, opd_opts, rows_of  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.entrypoints import opd  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402
from posttrain.run.records import default_out_dir  # noqa: E402
from posttrain.testing import run_numbers  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("opd_ray")
    return {
        "student": build_tiny_model("arith", root / "student", seed=0),
        "teacher": build_tiny_model("arith", root / "teacher", seed=1),
    }


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory, models):
    out = {}
    root = tmp_path_factory.mktemp("opd_ray_runs")
    for name, extra in (("local", {}), ("ray", {"placement.backend": "ray",
                                                 "placement.cpus_per_role": 0.5})):  # fmt: skip
        opts = opd_opts(root / name, models, **{"rl.distillation_mode": "direct", **extra})
        config = load_config(RECIPE, ["--", *opts])
        out[name] = opd.run(config, RECIPE, opts, default_out_dir(config))
    return out


def _params(summary) -> dict[str, torch.Tensor]:
    path = Path(summary["run_dir"]) / "checkpoints" / f"step_{STEPS:08d}" / "model"
    return load_file(str(path / "model.safetensors"))


def test_teacher_actor_gives_the_in_process_numbers(runs):
    a, b = rows_of(runs["local"]["run_dir"]), rows_of(runs["ray"]["run_dir"])
    assert [r["step"] for r in a] == list(range(STEPS + 1))
    assert all(r["train/opd/divergence"] > 0 for r in a[1:])
    assert run_numbers(a) == run_numbers(b)  # rewards, losses, divergences: bit-identical
    pa, pb = _params(runs["local"]), _params(runs["ray"])
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def test_the_teacher_scores_on_the_data_side_under_a_lag(runs, models, tmp_path):
    """k=1 against the module's Ray run (k=0, the same run but for the lag)."""
    opts = opd_opts(tmp_path / "k1", models, **{
        "rl.distillation_mode": "direct", "placement.backend": "ray",
        "placement.cpus_per_role": 0.4, "rl.off_policy_lag": 1,
    })  # fmt: skip
    config = load_config(RECIPE, ["--", *opts])
    lagged = run_numbers(rows_of(opd.run(config, RECIPE, opts, default_out_dir(config))["run_dir"]))
    straight = run_numbers(rows_of(runs["ray"]["run_dir"]))
    assert [r["train/offpolicy/staleness"] for r in lagged[1:]] == [0.0, 1.0, 1.0]
    del lagged[1]["train/offpolicy/staleness"]
    assert lagged[1] == straight[1]  # step 1: the same batch, teacher columns included
    assert lagged[3] != straight[3]
