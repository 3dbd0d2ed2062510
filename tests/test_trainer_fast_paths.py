"""Speed paths of the trainer: model.compile gives the eager step's update; fused AdamW on CUDA."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from trainer_support import VOCAB, pg_objective, tiny_llama

from posttrain.testing import synthetic_batch
from posttrain.trainer import LLMTrainer
from posttrain.trainer.optim import build_optimizer

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _step(model, compile: bool):
    trainer = LLMTrainer(
        model, pg_objective("token-mean"), lr=1e-2, micro_batch_size=3, compile=compile
    )
    trainer.train_on_batch(synthetic_batch(VOCAB, 6, seed=1, dtype=torch.float32))
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.slow  # inductor compiles C++ for the CPU: minutes on a 2-core machine
def test_compiled_step_matches_the_eager_step():
    torch._dynamo.reset()
    base = tiny_llama(seed=0, dtype=torch.float32)
    compiled = _step(copy.deepcopy(base), compile=True)
    eager = _step(copy.deepcopy(base), compile=False)
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_adamw_is_not_fused_on_the_cpu():
    opt = build_optimizer(list(tiny_llama().parameters()), "adamw", 1e-3, 0.0, (0.9, 0.99), 1e-8)
    assert not opt.defaults.get("fused")


@cuda
def test_adamw_is_fused_on_cuda():
    params = list(tiny_llama(dtype=torch.float32).cuda().parameters())
    opt = build_optimizer(params, "adamw", 1e-3, 0.0, (0.9, 0.99), 1e-8)
    assert opt.defaults["fused"] is True
