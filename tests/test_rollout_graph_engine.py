"""The static-buffer (CUDA-graph) engine: eager path against a full recompute on the CPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_rollout_engine import STOPS, _check_layout, _model

from posttrain.data.logprobs import response_logprobs
from posttrain.rollout import RolloutEngine, TorchRolloutEngine
from posttrain.rollout.graph_engine import GraphRolloutEngine

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model():
    return _model()


def test_implements_the_protocol(model):
    assert isinstance(GraphRolloutEngine(model, stop_token_ids=STOPS), RolloutEngine)


@settings(max_examples=10, deadline=None)
@given(
    lens=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    n=st.integers(1, 3),
    max_tokens=st.integers(1, 12),
    bucket=st.integers(1, 16),
    temperature=st.sampled_from([1.0, 0.7]),
    seed=st.integers(0, 1000),
)
def test_logprobs_equal_a_full_recompute(model, lens, n, max_tokens, bucket, temperature, seed):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 40, (k,), generator=g).tolist() for k in lens]
    engine = GraphRolloutEngine(model, stop_token_ids=STOPS, context_bucket=bucket, check_every=3)
    r = engine.generate(prompts, n=n, max_tokens=max_tokens, seed=seed, temperature=temperature)
    _check_layout(r, prompts, n, max_tokens, STOPS)
    with torch.no_grad():
        ref = response_logprobs(model, r.batch, temperature)
    m = r.batch.response_mask
    torch.testing.assert_close(r.batch.rollout_logprobs[m], ref[m], rtol=0, atol=1e-12)


def test_same_samples_as_the_torch_engine_while_no_row_stops(model):
    prompts = [[1, 7, 8, 9], [1, 12], [1, 3, 14, 15, 16]]
    kw = dict(n=3, max_tokens=10, seed=4, temperature=0.9)
    ours = GraphRolloutEngine(model, stop_token_ids=[], context_bucket=4).generate(prompts, **kw)
    base = TorchRolloutEngine(model, stop_token_ids=[]).generate(prompts, **kw)
    assert torch.equal(ours.batch.input_ids, base.batch.input_ids)
    torch.testing.assert_close(
        ours.batch.rollout_logprobs, base.batch.rollout_logprobs, rtol=0, atol=1e-12
    )


def test_buffers_are_reused_and_follow_weight_updates(model):
    m = _model(seed=1)
    engine = GraphRolloutEngine(m, stop_token_ids=STOPS)
    first = engine.generate([[1, 5]], n=2, max_tokens=4, seed=0)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1.5)
    second = engine.generate([[1, 5]], n=2, max_tokens=4, seed=0)
    assert len(engine._decoders) == 1
    with torch.no_grad():
        ref = response_logprobs(m, second.batch)
    mask = second.batch.response_mask
    torch.testing.assert_close(second.batch.rollout_logprobs[mask], ref[mask], rtol=0, atol=1e-12)
    assert not torch.equal(first.batch.rollout_logprobs, second.batch.rollout_logprobs)


def test_unsupported_models_are_refused_by_name():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20))
    with pytest.raises(ValueError, match="rollout.engine=static: GPT2LMHeadModel has no model"):
        GraphRolloutEngine(gpt2, stop_token_ids=[2])


def test_graphs_need_cuda(model):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    engine = GraphRolloutEngine(model, stop_token_ids=STOPS, cuda_graphs=True)
    with pytest.raises(ValueError, match="cuda_graphs=True needs the model on a CUDA device"):
        engine.generate([[1, 3]], n=1, max_tokens=3, seed=0)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_and_eager_paths_agree(dtype):
    m = _model(seed=2, dtype=dtype).cuda()
    prompts = [[1, 7, 8, 9], [1, 12], [1, 3, 14, 15, 16]]
    kw = dict(n=4, max_tokens=40, seed=3)
    graphs = GraphRolloutEngine(m, stop_token_ids=STOPS, cuda_graphs=True, context_bucket=8)
    eager = GraphRolloutEngine(m, stop_token_ids=STOPS, cuda_graphs=False, context_bucket=8)
    a, b = graphs.generate(prompts, **kw), eager.generate(prompts, **kw)
    assert torch.equal(a.batch.input_ids, b.batch.input_ids)
    torch.testing.assert_close(a.batch.rollout_logprobs, b.batch.rollout_logprobs)
    assert len(graphs._graphs) > 1  # several context buckets were captured


def test_a_grpo_run_samples_with_the_static_engine(tmp_path):
    import json

    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.entrypoints import grpo
    from posttrain.model.tiny import build_tiny_model

    model_dir = build_tiny_model("tiny", tmp_path / "m", seed=0)
    o = [
        f"model.name_or_path={model_dir}", f"job.output_root={tmp_path}", "rollout.engine=static",
        "data.train_size=40", "data.val_size=4", "data.prompts_per_step=2", "rollout.n=2",
        "rollout.max_tokens=3", "rl.max_steps=2", "rl.save_every=0", "rl.eval_every=2",
        "rl.micro_batch_size=4", "logging.progress=false",
    ]  # fmt: skip
    config = load_config("arithmetic", ["--", *o])
    summary = grpo.run(config, "arithmetic", o, grpo.default_out_dir(config), build_objective)
    rows = (tmp_path / "grpo" / "arithmetic_tiny" / "metrics.jsonl").read_text().splitlines()
    assert summary["steps"] == 2 and "val/accuracy" in json.loads(rows[-1])


def test_prompt_widths_within_a_bucket_share_buffers(model):
    engine = GraphRolloutEngine(model, stop_token_ids=STOPS, context_bucket=16)
    for width in (2, 3, 5):
        r = engine.generate([[1] * width], n=2, max_tokens=6, seed=width)
        with torch.no_grad():
            ref = response_logprobs(model, r.batch)
        m = r.batch.response_mask
        torch.testing.assert_close(r.batch.rollout_logprobs[m], ref[m], rtol=0, atol=1e-12)
    assert list(engine._decoders) == [(2, 16)]
