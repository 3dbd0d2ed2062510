"""Roles as declared specs: the checks on a declaration, columns on the batch, and a test-only
role ("length", which adds each response's length) that the loop applies under local and Ray
placement alike, with no source file touched.

Everything a worker imports (the role's builder, the objective builder) sits at module scope, so
Ray actors import it by name (this directory is on the PYTHONPATH the placement hands them).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.config import load_config
from posttrain.config.build import build_objective
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.entrypoints import grpo
from posttrain.model.tiny import build_tiny_model
from posttrain.placement.deadline import unwrap
from posttrain.placement.local import place_local
from posttrain.placement.specs import PlacedRole, RoleSpec, annotate, check_specs
from posttrain.placement.teacher import TEACHER
from posttrain.rollout import Rollout
from posttrain.rollout.concat import concat_rollouts
from posttrain.run import online
from posttrain.run.records import default_out_dir
from posttrain.run.session import RunSession
from posttrain.testing import run_numbers, synthetic_batch

STEPS = 2


class LengthScorer:
    """A trivial annotating role: each response's length (its loss tokens), as a float."""

    def __init__(self, config, device=None) -> None:
        self.pid = os.getpid()

    def annotations(self, batch: TrajectoryBatch) -> dict[str, torch.Tensor]:
        return {"response_length": batch.response_mask.sum(-1).float()}


class Counter:
    """A service role (no columns): placed and built, never applied to a rollout."""

    def __init__(self, config, device=None) -> None:
        self.device = device

    def annotations(self, batch):  # pragma: no cover - the loop must never call it
        raise AssertionError("a role that adds nothing is not applied")


LENGTH = RoleSpec("length", LengthScorer, adds=("response_length",), holds_model=False)


def checking_builder(record_dir: str, rl, ctx):
    """The built-in objective, which first checks, inside the policy's process, that every
    micro-batch carries the length column, equal to its own response lengths."""
    inner = build_objective(rl, ctx)

    def fn(model, batch):
        got = batch.columns["response_length"]
        assert torch.equal(got, batch.response_mask.sum(-1).float())
        with (Path(record_dir) / f"{os.getpid()}.txt").open("a") as f:
            f.write(f"{len(got)}\n")
        return inner.fn(model, batch)

    return dataclasses.replace(inner, fn=fn)


# --- declarations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ((LENGTH, LENGTH), "declared twice"),
        ((RoleSpec("reward", LengthScorer, adds=("x",)),), "built-in role's name"),
        ((RoleSpec("rm", LengthScorer, adds=("s",), consumes=("response_length",)),),
         "consumes response_length, which neither a rollout nor a role declared before it"),
        ((LENGTH, RoleSpec("again", LengthScorer, adds=("response_length",))),
         "adds response_length, which the rollout, an earlier role or the reward stage"),
        ((RoleSpec("log", LengthScorer, adds=("rollout_logprobs",)),), "a column has one producer"),
        ((RoleSpec("adv", LengthScorer, adds=("advantages",)),), "adds advantages, which the"),
    ],
)  # fmt: skip
def test_a_bad_declaration_is_refused_in_one_line_naming_the_role(specs, message):
    with pytest.raises(ValueError, match=message) as info:
        check_specs(specs)
    assert "\n" not in str(info.value)


def test_a_role_may_consume_what_an_earlier_role_adds():
    rm = RoleSpec("rm", LengthScorer, adds=("rm_score",), consumes=("response_length",))
    assert check_specs([LENGTH, rm]) == (LENGTH, rm)
    assert check_specs([TEACHER]) == (TEACHER,)


# --- columns on the batch --------------------------------------------------------------------


def _rollout(batch: TrajectoryBatch) -> Rollout:
    return Rollout(batch, torch.zeros(len(batch), dtype=torch.bool), None, 1)


class Both:
    """Adds a batch field and a column of its own."""

    def __init__(self, config=None, device=None) -> None:
        pass

    def annotations(self, batch):
        lp = torch.full(batch.response_mask.shape, -1.0)
        return {"teacher_logprobs": lp, "response_length": torch.arange(float(len(batch)))}


def test_a_nested_builder_is_refused_when_declared():
    def build(config, device=None):
        return LengthScorer(config)

    for bad in (build, functools.partial(build), lambda c, device=None: None):
        with pytest.raises(ValueError, match="must be a module-level function or class"):
            RoleSpec("length", bad, adds=("response_length",))


def test_annotate_sets_fields_by_name_and_other_columns_beside_them():
    batch = synthetic_batch(22, 4, seed=0)
    spec = RoleSpec("both", Both, adds=("teacher_logprobs", "response_length"))
    out, times = annotate(_rollout(batch), [PlacedRole(spec, Both())])
    assert out.batch.teacher_logprobs.eq(-1).all()
    assert set(out.batch.columns) == {"response_length"}
    assert set(times) == {"time/both_s"}
    # the columns follow row selection and device moves, like every field
    picked = out.batch[[3, 1]]
    assert picked.columns["response_length"].tolist() == [3.0, 1.0]
    assert out.batch.to("cpu").columns["response_length"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_role_returning_an_undeclared_column_is_refused_by_name():
    batch = synthetic_batch(22, 2, seed=1)
    spec = RoleSpec("length", LengthScorer, adds=("other",))
    with pytest.raises(
        ValueError, match=r"role 'length' returned response_length.*adds=\['other'\]"
    ):
        annotate(_rollout(batch), [PlacedRole(spec, LengthScorer(None))])


def test_a_service_role_is_not_applied():
    batch = synthetic_batch(22, 2, seed=1)
    spec = RoleSpec("env", Counter, holds_model=False)
    out, times = annotate(_rollout(batch), [PlacedRole(spec, Counter(None))])
    assert out.batch is batch and times == {}


def test_columns_are_checked_and_re_padded_when_rounds_are_joined():
    a = synthetic_batch(22, 2, seed=2)
    wide = synthetic_batch(22, 2, seed=3, prompt_width=4, response_width=8)
    with pytest.raises(ValueError, match=r"columns\['x'\]: must be \[B=2\]"):
        a.replace(columns={"x": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"columns\['rewards'\]: is a field of the batch"):
        a.replace(columns={"rewards": torch.zeros(2)})
    parts = []
    for batch in (a, wide):
        r = batch.response_width
        cols = {"len": torch.ones(2), "tok": torch.ones(2, r)}
        parts.append(_rollout(batch.replace(columns=cols)))
    joined = concat_rollouts(parts).batch
    assert joined.columns["len"].shape == (4,)
    tok = joined.columns["tok"]
    assert tok.shape == (4, joined.response_width)
    assert tok[:2, a.response_width :].eq(0).all() and tok[2:].eq(1).all()  # padded with 0
    with pytest.raises(ValueError, match="different columns"):
        concat_rollouts([parts[0], _rollout(a)])


# --- the length role through both placements -------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def _opts(root: Path, model: Path, **extra) -> list[str]:
    opts = {
        "reward.functions": "[role_fixtures:digit_reward]",
        "job.output_root": str(root), "model.name_or_path": str(model), "data.train_size": 40,
        "data.val_size": 4, "data.prompts_per_step": 2, "rollout.n": 2, "rollout.max_tokens": 3,
        "rl.max_steps": STEPS, "rl.save_every": STEPS, "rl.eval_every": 0,
        "rl.micro_batch_size": 4, "logging.progress": False, **extra,
    }  # fmt: skip
    return [f"{k}={v}" for k, v in opts.items()]


def _run(tmp: Path, model: Path, specs, **extra) -> tuple[list[dict], list[int], Path]:
    record = tmp / "record"
    record.mkdir(parents=True, exist_ok=True)
    opts = _opts(tmp / "out", model, **extra)
    config = load_config("arithmetic", ["--", *opts])
    builder = functools.partial(checking_builder, str(record))
    if not specs:
        builder = build_objective
    session = RunSession(grpo.SPEC, "arithmetic", opts, config)
    summary = online.run(session, default_out_dir(config), builder, role_specs=specs)
    rows = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    seen = [int(n) for p in record.glob("*.txt") for n in p.read_text().split()]
    final = Path(summary["run_dir"]) / "checkpoints" / f"step_{STEPS:08d}" / "model"
    return [json.loads(r) for r in rows], seen, final / "model.safetensors"


def test_local_placement_builds_declared_roles_in_order_on_their_devices(tmp_path, tiny_dir):
    config = load_config("arithmetic", ["--", *_opts(tmp_path, tiny_dir)])
    env = RoleSpec("env", Counter, holds_model=False)
    placed = place_local(config, build_objective, str(tmp_path), [LENGTH, env]).declared
    assert [p.spec.name for p in placed] == ["length", "env"]
    assert isinstance(unwrap(placed[0].role), LengthScorer) and placed[1].role.device is None


@pytest.fixture(scope="module")
def with_length(tiny_dir, tmp_path_factory) -> tuple[list[dict], list[int], Path]:
    """A local run with the length role: its rows, the row counts the role saw, its weights."""
    return _run(tmp_path_factory.mktemp("with"), tiny_dir, (LENGTH,))


def test_the_length_role_reaches_the_policy_and_changes_no_number(tmp_path, tiny_dir, with_length):
    rows, seen, _ = with_length
    assert all("time/length_s" in r for r in rows[1:])
    assert sum(seen) == STEPS * 4  # every row of every step's batch, as micro-batches
    plain, _, _ = _run(tmp_path / "without", tiny_dir, ())
    assert run_numbers(rows) == run_numbers(plain)  # a column nobody reads leaves the math alone


def test_the_length_role_under_ray_gives_the_local_numbers(
    tmp_path, tiny_dir, ray_cluster, with_length
):
    from posttrain.config import ConfigError
    from posttrain.placement.ray import place_ray

    # Each declared role is one more actor; only one that holds a model asks for GPUs.
    scorer = RoleSpec("scorer", LengthScorer, adds=("score",))
    for ask, message in (({"placement.cpus_per_role": 0.5}, r"2.5 CPUs .*x 5 actors"),
                         ({"placement.cpus_per_role": 0.4, "placement.gpus_per_role": 1},
                          r"3 GPUs .*x 3 model actors")):  # fmt: skip
        opts = _opts(tmp_path, tiny_dir, **ask)
        config = load_config("arithmetic", ["--", *opts])
        with pytest.raises(ConfigError, match=message):
            place_ray(config, "arithmetic", opts, build_objective, "run", (LENGTH, scorer))
    remote, seen, remote_weights = _run(tmp_path / "ray", tiny_dir, (LENGTH,), **{
        "placement.backend": "ray", "placement.cpus_per_role": 0.5})  # fmt: skip
    local, _, local_weights = with_length
    assert sum(seen) == STEPS * 4 and all("time/length_s" in r for r in remote[1:])
    assert run_numbers(remote) == run_numbers(local)
    # One Ray policy rank makes the in-process run's weights bit for bit, weights that moved.
    assert all(r["train/reward_std"] > 0 for r in local[1:])
    a, b = load_file(str(remote_weights)), load_file(str(local_weights))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    initial = load_file(str(tiny_dir / "model.safetensors"))
    assert max(float((a[k] - initial[k]).abs().max()) for k in a) > 1e-3
