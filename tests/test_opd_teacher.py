"""The teacher role: frozen scoring of the student's samples, and the shared-tokenizer check."""

from __future__ import annotations

import pytest
import torch

from posttrain.config import ConfigError, load_config
from posttrain.data.logprobs import response_logprobs
from posttrain.model.tiny import build_tiny_model
from posttrain.placement.teacher import (
    TeacherRole,
    annotation_bytes,
    check_teacher_tokenizer,
)
from posttrain.testing import synthetic_batch


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("opd_models")
    return {
        "student": build_tiny_model("arith", root / "student", seed=0),
        "teacher": build_tiny_model("arith", root / "teacher", seed=1),
        "other": build_tiny_model("tiny", root / "other", seed=0),
    }


def _opts(models, *extra):
    return [
        f"model.name_or_path={models['student']}", "model.init_preset=null",
        "job.algorithm=opd", f"teacher.name_or_path={models['teacher']}", *extra,
    ]  # fmt: skip


def test_teacher_scores_sampled_tokens_frozen_and_returns_top_k_in_direct_mode(models):
    opts = _opts(models, "rl.distillation_mode=direct", "teacher.top_k=5", "rl.micro_batch_size=4")
    role = TeacherRole(load_config("arithmetic", ["--", *opts]))
    assert not role.model.training
    assert not any(p.requires_grad for p in role.model.parameters())
    batch = synthetic_batch(22, 10, seed=0)
    out = role.annotations(batch)
    assert set(out) == {"teacher_logprobs", "teacher_topk_ids", "teacher_topk_logprobs"}
    m = batch.response_mask
    want = torch.where(m, response_logprobs(role.model, batch), 0)
    torch.testing.assert_close(out["teacher_logprobs"], want, rtol=1e-5, atol=1e-6)
    assert out["teacher_topk_ids"].shape == (10, batch.response_width, 5)
    assert out["teacher_topk_ids"].dtype == torch.int64
    # the top-k log-probs are sorted and the sampled token's log-prob never exceeds the best
    lp = out["teacher_topk_logprobs"]
    assert bool((lp[..., :-1] >= lp[..., 1:]).all())
    assert bool((out["teacher_logprobs"] <= lp[..., 0] + 1e-6).all())
    assert annotation_bytes(out) == 10 * batch.response_width * (4 + 5 * (8 + 4))
    annotated = batch.replace(**out)  # fits the batch contract
    assert annotated.teacher_topk_logprobs is not None


def test_advantage_mode_sends_back_only_per_token_logprobs(models):
    role = TeacherRole(load_config("arithmetic", ["--", *_opts(models)]))
    out = role.annotations(synthetic_batch(22, 4, seed=1))
    assert set(out) == {"teacher_logprobs"}


def test_top_k_above_the_vocabulary_keeps_every_id(models):
    opts = _opts(models, "rl.distillation_mode=direct", "teacher.top_k=1000")
    role = TeacherRole(load_config("arithmetic", ["--", *opts]))
    out = role.annotations(synthetic_batch(22, 3, seed=2))
    assert out["teacher_topk_ids"].shape[-1] == 22


def test_tokenizer_check_passes_for_a_shared_tokenizer_and_fails_in_one_line(models):
    check_teacher_tokenizer(load_config("arithmetic", ["--", *_opts(models)]))
    bad = _opts(models)[:-1] + [f"teacher.name_or_path={models['other']}"]
    with pytest.raises(ConfigError, match="different tokenizer than the student") as info:
        check_teacher_tokenizer(load_config("arithmetic", ["--", *bad]))
    assert "\n" not in str(info.value)
    missing = _opts(models)[:-1] + ["teacher.name_or_path=/nonexistent/teacher"]
    with pytest.raises(ConfigError, match="no config.json"):
        check_teacher_tokenizer(load_config("arithmetic", ["--", *missing]))
