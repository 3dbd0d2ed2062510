"""rl.off_policy_lag without Ray: the key, its preflight, the schedule and what a checkpoint holds.

The schedule is checked on fakes: a batch records the weights version the fake rollout held when
it was collected, so a pipeline that sampled with other weights than the schedule says, or that
ran the collect after the update instead of during it, fails here.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from posttrain.config import ConfigError, load_config
from posttrain.config.build import objective_reads
from posttrain.control import PreflightError, run_preflight
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.run.pipeline import Collected, Pipeline, sampled_with


def cfg(*opts: str, recipe: str = "arithmetic"):
    return load_config(recipe, ["--", *opts])


# -- the key -----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["-1", "1.5", "true", "one"])
def test_bad_lag_is_one_line_naming_the_key(bad):
    with pytest.raises(ConfigError) as e:
        cfg(f"rl.off_policy_lag={bad}")
    assert str(e.value).startswith("invalid config value rl.off_policy_lag:")
    assert "\n" not in str(e.value)


def test_the_is_correction_is_on_by_default_under_a_lag_and_a_set_value_is_kept():
    assert cfg().rl.rollout_is_cap == 0.0
    assert cfg("rl.off_policy_lag=1").rl.rollout_is_cap == 2.0
    assert cfg("rl.off_policy_lag=2", "rl.rollout_is_cap=0").rl.rollout_is_cap == 0.0
    assert cfg("rl.rollout_is_cap=0", "rl.off_policy_lag=2").rl.rollout_is_cap == 0.0
    assert cfg("rl.off_policy_lag=1", "rl.rollout_is_cap=3").rl.rollout_is_cap == 3.0
    assert cfg("rl.off_policy_lag=1").rl.is_default("rollout_is_cap")
    assert not cfg("rl.off_policy_lag=1", "rl.rollout_is_cap=3").rl.is_default("rollout_is_cap")
    assert not cfg("rl.rollout_is_cap=2").rl.is_default("rollout_is_cap")


# -- preflight ---------------------------------------------------------------------------------


def test_local_placement_refuses_a_lag_in_one_line_naming_ray():
    with pytest.raises(PreflightError) as e:
        run_preflight(cfg("rl.off_policy_lag=1"))
    assert e.value.violations == [
        "rl.off_policy_lag=1 needs placement.backend=ray (the rollout samples the next batches "
        "with its own weight copy while the policy trains); set placement.backend=ray or "
        "rl.off_policy_lag=0"
    ]
    clipped = "rl.grpo_surrogate=clipped"
    assert run_preflight(cfg("rl.off_policy_lag=1", "placement.backend=ray", clipped)) == []


def test_turning_the_correction_off_under_a_lag_warns_where_the_loss_reads_it():
    ray = ("placement.backend=ray", "rl.off_policy_lag=2", "rl.rollout_is_cap=0")
    warnings = run_preflight(cfg(*ray, "rl.grpo_surrogate=clipped"))
    assert any(w.startswith("rl.rollout_is_cap=0 with rl.off_policy_lag=2:") for w in warnings)
    # legacy_pg reads no correction: not this warning (the one below), whatever the cap says.
    assert not any(w.startswith("rl.rollout_is_cap=0") for w in run_preflight(cfg(*ray)))
    clipped = ("placement.backend=ray", "rl.off_policy_lag=2", "rl.grpo_surrogate=clipped")
    assert run_preflight(cfg(*clipped)) == []


@pytest.mark.parametrize("opts", [(), ("rl.rollout_is_cap=0",)])
def test_a_lag_with_a_loss_that_reads_no_correction_warns_in_one_line(opts):
    warnings = run_preflight(cfg("placement.backend=ray", "rl.off_policy_lag=1", *opts))
    lag = [w for w in warnings if w.startswith("rl.off_policy_lag=")]
    assert lag == [
        "rl.off_policy_lag=1 with a loss that applies no behaviour-policy correction (it reads "
        "no rl.rollout_is_cap): samples from older weights train uncorrected (see "
        "docs/guides/async.md); with GRPO set rl.grpo_surrogate=clipped or cispo, otherwise "
        "rl.off_policy_lag=0"
    ]
    for surrogate in ("clipped", "cispo"):
        extra = (f"rl.grpo_surrogate={surrogate}",)
        assert run_preflight(cfg("placement.backend=ray", "rl.off_policy_lag=1", *extra)) == []
    # OPD's advantage mode weights its clipped term like GRPO's.
    lagged_opd = cfg("placement.backend=ray", "rl.off_policy_lag=1",
                     "rl.distillation_mode=advantage", recipe="opd_arithmetic")  # fmt: skip
    assert lagged_opd.rl.rollout_is_cap == 2.0 and run_preflight(lagged_opd) == []


def test_opd_direct_under_a_lag_needs_no_correction_and_gets_no_warning():
    """The direct mode's divergence covers the whole next-token distribution at each sampled
    position (no sampled token weighed by its probability): it reached 0.9 held-out under
    rl.off_policy_lag=1 on 3 of 3 seeds (docs/guides/async.md), so preflight stays quiet."""
    lag = ("placement.backend=ray", "rl.off_policy_lag=1")
    direct = cfg(*lag, "rl.distillation_mode=direct", recipe="opd_arithmetic")
    assert objective_reads(direct).sampler_free
    assert not [w for w in run_preflight(direct) if "rl.off_policy_lag" in w]
    advantage = cfg(*lag, "rl.distillation_mode=advantage", recipe="opd_arithmetic")
    assert not objective_reads(advantage).sampler_free
    assert not objective_reads(cfg(*lag, "rl.grpo_surrogate=legacy_pg")).sampler_free


def test_dpo_reads_no_lag():
    with pytest.raises(PreflightError, match=r"rl.off_policy_lag=1 is never read by job.algo"):
        run_preflight(cfg("rl.off_policy_lag=1", "placement.backend=ray", recipe="dpo_shapes"))


# -- the schedule ------------------------------------------------------------------------------


def test_sampled_with_is_the_weights_after_step_s_minus_1_minus_k():
    assert [sampled_with(s, 0) for s in range(1, 6)] == [0, 1, 2, 3, 4]
    assert [sampled_with(s, 1) for s in range(1, 6)] == [0, 0, 1, 2, 3]
    assert [sampled_with(s, 2) for s in range(1, 7)] == [0, 0, 0, 1, 2, 3]


def batch_of(value: int) -> TrajectoryBatch:
    b = 2
    return TrajectoryBatch(
        input_ids=torch.full((b, 3), value), attention_mask=torch.ones(b, 3, dtype=torch.int64),
        response_mask=torch.ones(b, 2, dtype=torch.bool), group_ids=torch.arange(b),
        sample_ids=torch.arange(b), advantages=torch.tensor([0.5, -0.5]),
        rollout_logprobs=torch.full((b, 2), -1.0), columns={"extra": torch.ones(b)},
    )  # fmt: skip


class FakeRun:
    """A rollout whose weights are the number of syncs it received, a policy counting updates.
    With ``overlap`` every collect after the first ``lag`` must run while an update does: the
    update waits (bounded) until the collect beside it has started, and the collect until an
    update is running."""

    def __init__(self, lag: int, synced: int = 0, overlap: bool = True) -> None:
        self.lag, self.weights, self.updates, self.overlap = lag, synced, synced, overlap
        self.training, self.seen = threading.Event(), threading.Event()
        self.collected: list[tuple[int, int]] = []  # (step, rollout weights when sampled)
        self.trained: list[int] = []

    def collect(self, cursor: int, step: int, version: int) -> Collected:
        if self.overlap and step > self.lag:
            assert self.training.wait(5), f"collect({step}) did not overlap an update"
            self.seen.set()
        assert version == self.weights, (step, version, self.weights)
        self.collected.append((step, self.weights))
        return Collected(step, version, cursor + 3, batch_of(step), {"train/m": 1.0},
                         {"time/rollout_s": 0.1}, 6, [{"row": step}])  # fmt: skip

    def train(self, batch: TrajectoryBatch) -> dict:
        self.trained.append(int(batch.input_ids[0, 0]))
        if self.overlap:
            self.training.set()
            assert self.seen.wait(5), "the update ran without a collect beside it"
            self.training.clear()
            self.seen.clear()
        self.updates += 1
        return {"train/tokens": 4.0}

    def sync(self) -> None:
        self.weights = self.updates


def test_the_pipeline_trains_step_s_on_weights_after_s_minus_1_minus_k_and_overlaps():
    for lag in (1, 2, 3):
        run = FakeRun(lag)
        pipe = Pipeline(lag, run.collect, run.sync)
        stale = []
        for step in range(1, 8):
            batch, metrics = pipe.step(step, run.train)
            assert batch.version == sampled_with(step, lag)
            stale.append(metrics["train/offpolicy/staleness"])
        assert run.trained == list(range(1, 8))
        assert run.collected == [(t, sampled_with(t, lag)) for t in range(1, 8 + lag)]
        assert stale == [float(min(s - 1, lag)) for s in range(1, 8)]
        pipe.close()


def test_a_checkpoint_holds_the_batches_in_flight_and_resume_continues_the_schedule(tmp_path):
    lag = 2
    straight = FakeRun(lag, overlap=False)
    pipe = Pipeline(lag, straight.collect, straight.sync)
    for step in range(1, 7):
        pipe.step(step, straight.train)
        if step == 3:
            path = tmp_path / "data_state.pt"
            torch.save(pipe.state(), path)
    # A new process: the checkpoint after step 3 and a rollout synced to its weights.
    state = SimpleNamespace(path=tmp_path, step=3, data_state=torch.load(path, weights_only=True))
    resumed = FakeRun(lag, synced=3, overlap=False)
    again = Pipeline(lag, resumed.collect, resumed.sync, state)
    assert [c.step for c in again.queue] == [4, 5]
    assert again.cursor == 3 * (3 + lag)
    for step in range(4, 7):
        batch, _ = again.step(step, resumed.train)
        assert batch.version == sampled_with(step, lag)
    assert resumed.trained == straight.trained[3:]
    assert resumed.collected == straight.collected[3 + lag :]
    first = Collected.from_state(state.data_state["in_flight"][0])
    assert torch.equal(first.batch.input_ids, batch_of(4).input_ids)
    assert torch.equal(first.batch.columns["extra"], torch.ones(2))
    assert first.samples == [{"row": 4}] and first.version == 1


def test_a_checkpoint_of_another_lag_is_refused_in_one_line(tmp_path):
    state = SimpleNamespace(path=tmp_path / "step_00000002", step=2, data_state={"cursor": 8})
    run = FakeRun(1)
    with pytest.raises(ConfigError) as e:
        Pipeline(1, run.collect, run.sync, state)
    assert "holds no batches in flight for rl.off_policy_lag=1" in str(e.value)
    assert "rl.off_policy_lag=0" in str(e.value) and "\n" not in str(e.value)


def test_an_error_on_either_side_surfaces_as_itself_without_waiting_forever():
    run = FakeRun(1, overlap=False)
    pipe = Pipeline(1, run.collect, run.sync)
    pipe.step(1, run.train)

    def failing_train(batch):
        raise ValueError("non-finite loss at step 2")

    with pytest.raises(ValueError, match="non-finite loss at step 2"):
        pipe.step(2, failing_train)
    pipe.close()

    def failing_collect(cursor, step, version):
        if step > 1:
            raise ConfigError(f"data row {cursor} is malformed")
        return run.collect(cursor, step, version)

    run = FakeRun(1, overlap=False)
    pipe = Pipeline(1, failing_collect, run.sync)
    with pytest.raises(ConfigError, match="data row 3 is malformed"):
        pipe.step(1, run.train)
    pipe.close()
