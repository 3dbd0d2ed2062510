"""Placement pieces that need no Ray: rank dispatch, metric merge, worker environment, checks."""

from __future__ import annotations

import dataclasses
import os
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import random_batch
from hypothesis import given
from hypothesis import strategies as st

from posttrain.config import ConfigError, load_config
from posttrain.config.build import build_objective
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.placement.dispatch import rank_rows, shard_batch
from posttrain.placement.local import place_local
from posttrain.placement.ray_host import worker_pythonpath
from posttrain.trainer.accumulate import split_evenly


@st.composite
def splits(draw):
    ranks = draw(st.integers(1, 5))
    minis = draw(st.integers(1, 5))
    rows = draw(st.integers(ranks * minis, ranks * minis + 40))
    return rows, ranks, minis


@given(splits())
def test_each_rank_trains_its_share_of_every_global_mini_batch(case):
    """Rank r's k-th mini-batch, as the trainer cuts r's shard, is exactly r's part of the
    k-th mini-batch one rank would take; together the ranks cover it without overlap."""
    rows, ranks, minis = case
    shards = rank_rows(rows, ranks, minis)
    assert sorted(i for s in shards for i in s) == list(range(rows))
    per_rank_minis = [[shard[sl] for sl in split_evenly(len(shard), minis)] for shard in shards]
    for k, mini in enumerate(split_evenly(rows, minis)):
        got = sorted(i for r in range(ranks) for i in per_rank_minis[r][k])
        assert got == list(range(mini.start, mini.stop))
        assert all(per_rank_minis[r][k] for r in range(ranks))  # every rank has rows in it


@given(st.integers(1, 4), st.lists(st.integers(0, 6), min_size=1, max_size=30))
def test_whole_groups_are_never_cut(ranks, ids):
    """``whole_groups``: every group lies on one rank, the ranks cover every row once, and
    their numbers of groups differ by at most one."""
    groups = len(set(ids))
    if groups < ranks:
        with pytest.raises(ValueError, match=f"cannot give each of {ranks}"):
            rank_rows(len(ids), ranks, 1, ids, whole_groups=True)
        return
    shards = rank_rows(len(ids), ranks, 1, ids, whole_groups=True)
    assert sorted(i for s in shards for i in s) == list(range(len(ids)))
    owner = {ids[i]: r for r, s in enumerate(shards) for i in s}
    assert all(owner[ids[i]] == r for r, s in enumerate(shards) for i in s)
    counts = [len({ids[i] for i in s}) for s in shards]
    assert max(counts) - min(counts) <= 1


def test_rank_rows_worked_example():
    # 10 rows, 2 mini-batches of 5, 2 ranks: rank 0 takes 3 of each, rank 1 takes 2.
    assert rank_rows(10, 2, 2) == [[0, 1, 2, 5, 6, 7], [3, 4, 8, 9]]
    with pytest.raises(ValueError, match="placement.policy_ranks"):
        rank_rows(3, 2, 2)


def test_shard_batch_keeps_whole_rows_and_their_annotations():
    batch = random_batch(b=8, group_size=4)
    shards = shard_batch(batch, 2, 2)
    assert [s.sample_ids.tolist() for s in shards] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    for s in shards:
        idx = s.sample_ids
        assert (s.input_ids == batch.input_ids[idx]).all()
        assert (s.advantages == batch.advantages[idx]).all()
        assert s.input_ids.shape[1] == batch.input_ids.shape[1]  # same P + R as the batch
    assert shard_batch(batch, 1, 3) == [batch]


def test_worker_pythonpath_reaches_project_and_test_code(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    dirs = worker_pythonpath().split(os.pathsep)
    src = os.path.dirname(os.path.dirname(sys.modules["posttrain"].__file__))
    assert dirs[0] == os.path.realpath(src)
    assert str(tmp_path) in dirs
    assert os.path.realpath(os.path.dirname(__file__)) in dirs  # pytest put tests/ on sys.path
    assert not any(d.startswith(os.path.realpath(sys.prefix) + os.sep) for d in dirs)


def test_local_placement_refuses_several_policy_ranks(tmp_path):
    opts = [f"job.output_root={tmp_path}", "placement.policy_ranks=2"]
    with pytest.raises(ConfigError, match="placement.policy_ranks=2 needs placement.backend=ray"):
        place_local(load_config("arithmetic", ["--", *opts]), build_objective, str(tmp_path))


def test_a_worker_that_resolved_another_config_is_refused():
    pytest.importorskip("ray")
    from posttrain.placement.ray import check_worker_configs

    driver = {"rl": {"lr": 0.01, "max_steps": 3}, "job": {"name": "a"}}
    check_worker_configs(
        driver, {"reward": {"rl": {"lr": 0.01, "max_steps": 3}, "job": {"name": "a"}}}
    )
    with pytest.raises(ConfigError, match="the rollout actor resolved a different config at rl.lr"):
        check_worker_configs(driver, {"rollout": {"rl": {"lr": 0.001, "max_steps": 3},
                                                   "job": {"name": "a"}}})  # fmt: skip


def test_ray_backend_without_ray_installed_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without the extra sees
    monkeypatch.delitem(sys.modules, "posttrain.placement.ray", raising=False)
    with pytest.raises(ConfigError, match=r"pip install 'posttrain\[ray\]'"):
        import posttrain.placement.ray  # noqa: F401


@given(splits(), st.integers(1, 4), st.randoms(use_true_random=False))
def test_keeping_groups_permutes_rows_within_each_mini_batch_only(case, n, rnd):
    rows, ranks, minis = case
    groups = [i // n for i in range(rows)]
    rnd.shuffle(groups)
    shards = rank_rows(rows, ranks, minis, groups)
    per_rank_minis = [[shard[sl] for sl in split_evenly(len(shard), minis)] for shard in shards]
    plain = [[shard[sl] for sl in split_evenly(len(shard), minis)]
             for shard in rank_rows(rows, ranks, minis)]  # fmt: skip
    for k, mini in enumerate(split_evenly(rows, minis)):
        got = sorted(i for r in range(ranks) for i in per_rank_minis[r][k])
        assert got == list(range(mini.start, mini.stop))
        assert [len(per_rank_minis[r][k]) for r in range(ranks)] == [
            len(plain[r][k]) for r in range(ranks)
        ]


def test_keeping_groups_worked_example():
    # one mini-batch of 8 rows whose groups interleave: each rank gets whole groups
    groups = [0, 1, 0, 1, 2, 3, 2, 3]
    assert rank_rows(8, 2, 1) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert rank_rows(8, 2, 1, groups) == [[0, 2, 1, 3], [4, 6, 5, 7]]
    batch = random_batch(b=8).replace(group_ids=torch.tensor(groups))
    shards = shard_batch(batch, 2, 1, keep_groups=True)
    assert [s.group_ids.tolist() for s in shards] == [[0, 0, 1, 1], [2, 2, 3, 3]]


class _LocalRanks:
    """Ray's actor group, in-process: ``call.remote`` runs at once; the trained shards and the
    methods asked are recorded."""

    def __init__(self, names: list[str], keeps_groups: bool) -> None:
        self.keeps_groups = keeps_groups
        self.asked: list[str] = []
        self.trained: dict[str, TrajectoryBatch] = {}

        def handle(name):
            def remote(method, *args):
                self.asked.append(method)
                if method == "keeps_groups":
                    return self.keeps_groups
                self.trained[name] = args[0]
                return {"loss": 0.0}

            return SimpleNamespace(call=SimpleNamespace(remote=remote))

        self.handles = {n: handle(n) for n in names}

    def gather(self, calls):
        return [ref for _, ref in calls]


@pytest.mark.parametrize("keeps", [True, False])
def test_ray_policy_dispatch_keeps_groups_when_the_trainer_does(keeps):
    """RayPolicy asks rank 0's trainer once whether groups may be brought together; then each
    rank's share of a mini-batch holds whole groups where the split allows (the exactness of
    that regrouping under TOKEN_SUM: test_shared_prefix.py's two-rank gradient test)."""
    from posttrain.placement.ray import RayPolicy

    ids = torch.tensor([0, 1, 2, 0, 1, 2, 3, 4, 3, 4, 5, 5])  # groups interleaved
    batch = random_batch(seed=1, b=len(ids))
    batch = dataclasses.replace(batch, group_ids=ids)
    policy = RayPolicy(None, ranks=2, mini_batches=2, sharded=False)
    policy._actors = ranks = _LocalRanks(policy.names, keeps)
    for _ in range(2):
        policy.train(batch)
    assert ranks.asked.count("keeps_groups") == 2  # once, of each rank
    got = [ranks.trained[n] for n in policy.names]
    want = shard_batch(batch, 2, 2, keep_groups=keeps)
    for shard, expected in zip(got, want, strict=True):
        assert torch.equal(shard.sample_ids, expected.sample_ids)
    if keeps:  # mini-batch 1 = rows 0-5 (groups 0,1,2 twice): rank 0 gets groups 0 and 1 whole
        assert got[0].group_ids.tolist() == [0, 0, 1, 3, 3, 4]
        assert got[1].group_ids.tolist() == [1, 2, 2, 4, 5, 5]
    else:
        assert got[0].group_ids.tolist() == [0, 1, 2, 3, 4, 3]


def test_one_policy_rank_is_never_asked_about_groups():
    from posttrain.placement.ray import RayPolicy

    policy = RayPolicy(None, ranks=1, mini_batches=1, sharded=False)
    policy._actors = ranks = _LocalRanks(policy.names, True)
    policy.train(random_batch(b=4))
    assert ranks.asked == ["train"]
