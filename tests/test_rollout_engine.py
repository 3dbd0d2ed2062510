import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from posttrain.data.logprobs import position_ids_from_mask, response_logprobs
from posttrain.rollout import Rollout, RolloutEngine, TorchRolloutEngine, sampling_logprobs

STOPS = [2, 3, 4, 5]  # several stop ids so a random model stops at varied lengths


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a busy 2-core box they stall."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _model(seed: int = 0, dtype=torch.float64) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(dtype).eval()


@pytest.fixture(scope="module")
def model():
    return _model()


PROMPTS = [[1, 7, 8, 9], [1, 12], [1, 3, 14, 15, 16, 17, 18, 19], [1]]


def _check_layout(r: Rollout, prompts, n, max_tokens, stops, goff=0, soff=0):
    b = r.batch
    assert b.batch_size == len(prompts) * n
    p = max(len(x) for x in prompts)
    assert b.prompt_width == p
    lengths = r.response_lengths
    assert b.response_width == int(lengths.max())
    assert int(lengths.min()) >= 1 and int(lengths.max()) <= max_tokens
    # response mask is a prefix; padding after it; attention = prompt mask ++ response mask
    ar = torch.arange(b.response_width)
    assert torch.equal(b.response_mask, ar[None] < lengths[:, None])
    assert torch.equal(b.attention_mask[:, p:].bool(), b.response_mask)
    assert bool((b.response_ids[~b.response_mask] == 0).all())
    assert bool((b.rollout_logprobs[~b.response_mask] == 0).all())
    assert b.rollout_logprobs.dtype == torch.float64
    for row in range(b.batch_size):
        x = prompts[row // n]
        assert b.input_ids[row, p - len(x) : p].tolist() == x
        assert b.attention_mask[row, :p].tolist() == [0] * (p - len(x)) + [1] * len(x)
        resp = b.response_ids[row, : lengths[row]].tolist()
        stop_at = [i for i, t in enumerate(resp) if t in stops]
        if r.truncated[row]:
            assert len(resp) == max_tokens and not stop_at
        else:
            assert stop_at == [len(resp) - 1]  # the stop token is included and is last
    assert b.group_ids.tolist() == [goff + i // n for i in range(b.batch_size)]
    assert b.sample_ids.tolist() == list(range(soff, soff + b.batch_size))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_equal_full_forward(model, temperature):
    engine = TorchRolloutEngine(model, stop_token_ids=STOPS)
    r = engine.generate(PROMPTS, n=6, temperature=temperature, max_tokens=12, seed=1)
    _check_layout(r, PROMPTS, 6, 12, STOPS)
    assert r.truncated.any() and not r.truncated.all()  # both kinds of ending are exercised
    with torch.no_grad():
        ref = response_logprobs(model, r.batch, temperature)
    m = r.batch.response_mask
    torch.testing.assert_close(r.batch.rollout_logprobs[m], ref[m], rtol=0, atol=1e-12)


def test_top_p_logprobs_are_renormalised_nucleus(model):
    engine = TorchRolloutEngine(model, stop_token_ids=STOPS)
    r = engine.generate(PROMPTS, n=3, temperature=0.9, top_p=0.7, max_tokens=12, seed=5)
    b = r.batch
    with torch.no_grad():
        logits = model(
            input_ids=b.input_ids,
            attention_mask=b.attention_mask,
            position_ids=position_ids_from_mask(b.attention_mask),
        ).logits[:, b.prompt_width - 1 : -1]
    ref = sampling_logprobs(logits, 0.9, 0.7).gather(-1, b.response_ids[..., None]).squeeze(-1)
    m = b.response_mask
    assert bool(torch.isfinite(ref[m]).all())  # every sampled token lies in its nucleus
    torch.testing.assert_close(b.rollout_logprobs[m], ref[m], rtol=0, atol=1e-12)


@settings(max_examples=12, deadline=None)
@given(
    lens=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    n=st.integers(1, 4),
    max_tokens=st.integers(1, 12),
    max_rows=st.none() | st.integers(1, 7),
    seed=st.integers(0, 1000),
    offsets=st.tuples(st.integers(0, 50), st.integers(0, 500)),
)
def test_layout_and_exactness_property(model, lens, n, max_tokens, max_rows, seed, offsets):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 40, (k,), generator=g).tolist() for k in lens]
    engine = TorchRolloutEngine(model, stop_token_ids=STOPS, max_rows=max_rows)
    r = engine.generate(
        prompts,
        n=n,
        max_tokens=max_tokens,
        seed=seed,
        group_id_offset=offsets[0],
        sample_id_offset=offsets[1],
    )
    stops = STOPS
    _check_layout(r, prompts, n, max_tokens, stops, *offsets)
    with torch.no_grad():
        ref = response_logprobs(model, r.batch, 1.0)
    m = r.batch.response_mask
    torch.testing.assert_close(r.batch.rollout_logprobs[m], ref[m], rtol=0, atol=1e-12)


def test_first_token_frequencies_follow_the_model(model):
    engine = TorchRolloutEngine(model, stop_token_ids=[])
    r = engine.generate([[1, 7, 8]], n=6000, max_tokens=1, seed=0, temperature=0.5)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 7, 8]])).logits[0, -1]
    p = torch.softmax(logits / 0.5, -1)
    freq = torch.bincount(r.batch.response_ids[:, 0], minlength=40).double() / 6000
    assert float((freq - p).abs().max()) < 0.025  # > 4 sigma for every p at 6000 draws


def test_seed_reproducibility_and_generator(model):
    engine = TorchRolloutEngine(model, stop_token_ids=STOPS)
    a = engine.generate(PROMPTS, n=2, max_tokens=10, seed=3)
    b = engine.generate(PROMPTS, n=2, max_tokens=10, seed=3)
    c = engine.generate(PROMPTS, n=2, max_tokens=10, seed=4)
    d = engine.generate(PROMPTS, n=2, max_tokens=10, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.batch.input_ids, b.batch.input_ids)
    assert torch.equal(a.batch.rollout_logprobs, b.batch.rollout_logprobs)
    assert torch.equal(a.batch.input_ids, d.batch.input_ids)
    assert not torch.equal(a.batch.response_ids, c.batch.response_ids)


def test_greedy_samples_agree_and_have_zero_logprob(model):
    engine = TorchRolloutEngine(model, stop_token_ids=STOPS)
    r = engine.generate(PROMPTS, n=3, temperature=0.0, max_tokens=8)
    ids = r.batch.response_ids.view(len(PROMPTS), 3, -1)
    assert bool((ids == ids[:, :1]).all())
    assert bool((r.batch.rollout_logprobs == 0).all())


def test_explicit_group_ids_and_training_mode_restored(model):
    engine = TorchRolloutEngine(model, stop_token_ids=STOPS)
    model.train()
    try:
        r = engine.generate([[1, 5], [1, 6]], n=2, max_tokens=3, group_ids=[10, 20], seed=0)
        assert model.training
    finally:
        model.eval()
    assert r.batch.group_ids.tolist() == [10, 10, 20, 20]
    assert r.prompt_index.tolist() == [0, 0, 1, 1]


def test_sync_weights(model):
    other = _model(seed=1)
    engine = TorchRolloutEngine(other, stop_token_ids=STOPS)
    assert isinstance(engine, RolloutEngine)
    engine.sync_weights(other)  # same module: nothing to copy
    assert engine.weight_version == 1
    engine.sync_weights(model)
    assert engine.weight_version == 2
    ref = TorchRolloutEngine(model, stop_token_ids=STOPS).generate(PROMPTS, max_tokens=6, seed=2)
    got = engine.generate(PROMPTS, max_tokens=6, seed=2)
    assert torch.equal(got.batch.input_ids, ref.batch.input_ids)
    assert torch.equal(got.batch.rollout_logprobs, ref.batch.rollout_logprobs)
    sd = {f"module.{k}": v for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="'module.model.embed_tokens.weight' .* does not fit"):
        engine.sync_weights(sd)


def test_float32_model_gives_float32_logprobs():
    m = _model(dtype=torch.float32)
    r = TorchRolloutEngine(m, stop_token_ids=STOPS).generate(PROMPTS, n=2, max_tokens=5, seed=0)
    assert r.batch.rollout_logprobs.dtype == torch.float32
    with torch.no_grad():
        ref = response_logprobs(m, r.batch, 1.0)
    mask = r.batch.response_mask
    torch.testing.assert_close(r.batch.rollout_logprobs[mask], ref[mask], rtol=0, atol=1e-4)


def test_default_stop_and_pad_ids_come_from_config(model):
    engine = TorchRolloutEngine(model)
    assert engine.stop_token_ids == (2,) and engine.pad_token_id == 0


@pytest.mark.parametrize(
    ("prompts", "kwargs", "match"),
    [
        ([], {}, "no prompts"),
        ([[1], []], {}, "prompt 1 is empty"),
        ([[1, 40]], {}, "prompt 0 has token ids outside"),
        ([[1]], {"n": 0}, "rollout.n"),
        ([[1]], {"max_tokens": 0}, "rollout.max_tokens"),
        ([[1]], {"max_tokens": 2.0}, "rollout.max_tokens"),
        ([[1]], {"temperature": -1.0}, "rollout.temperature"),
        ([[1]], {"top_p": 0.0}, "rollout.top_p"),
        ([[1]], {"group_ids": [1, 2]}, "group_ids has 2 entries"),
        ([[1]], {"group_ids": [1], "group_id_offset": 3}, "either group_ids or group_id_offset"),
    ],
)
def test_bad_generate_arguments(model, prompts, kwargs, match):
    engine = TorchRolloutEngine(model, stop_token_ids=STOPS)
    args = {"max_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        engine.generate(prompts, **args)


def test_rollout_validates_its_fields(model):
    r = TorchRolloutEngine(model, stop_token_ids=STOPS).generate([[1]], n=2, max_tokens=2, seed=0)
    with pytest.raises(ValueError, match="truncated"):
        Rollout(batch=r.batch, truncated=torch.zeros(3, dtype=torch.bool), texts=None, n=2)
    with pytest.raises(ValueError, match="texts"):
        Rollout(batch=r.batch, truncated=r.truncated, texts=("a",), n=2)
    with pytest.raises(ValueError, match="n=3"):
        Rollout(batch=r.batch, truncated=r.truncated, texts=None, n=3)
