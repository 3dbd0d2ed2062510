# xdist: vllm unit (tests/conftest.py: the files that start vLLM engines share one worker)
"""The engine contract (``rollout/base.py``): what every registered engine must satisfy.

Each engine in ``rollout.registry.ENGINES`` is run here through ``UNDER_TEST``: adding an engine
is one line there (how to build it over a model's weights, and the log-prob bound its precision
holds); an engine in the registry without that line fails ``test_every_registered_engine_is_
under_test``. The checks are the traps a new backend falls into silently: log-probs of another
distribution than the one sampled (before temperature, or not renormalised over the top-p
nucleus), a stop token left out or without its log-prob, prompt ids changed on the way, weights
that a sync leaves stale.

The log-probs are recomputed here from a plain full-sequence forward and the definition of the
processed distribution (temperature, then the top-p nucleus renormalised), not with the engine's
own sampling code.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM

from posttrain.config import load_config
from posttrain.control.external import environment_loads
from posttrain.data.logprobs import position_ids_from_mask
from posttrain.env.episode import TurnRequest
from posttrain.rollout import registry
from posttrain.rollout.base import Rollout, RolloutEngine, WeightReceiver
from posttrain.rollout.capabilities import EngineCapabilities

STOPS = [2, 3, 4, 5]  # several stop ids so a random model stops at varied lengths
PROMPTS = [[1, 7, 8, 9], [1, 12], [1, 3, 14, 15, 16, 17, 18, 19], [1, 7, 8, 9]]


@dataclass(frozen=True)
class UnderTest:
    """How the contract builds an engine over ``model``'s weights, and its log-prob bound."""

    build: Callable[[nn.Module], RolloutEngine]
    atol: float


def _registered(name: str) -> Callable[[nn.Module], RolloutEngine]:
    return lambda model: registry.build_engine(name, model, None, stop_token_ids=STOPS)


class _SharedVllm:
    """vLLM in its own process (``rollout.engine=vllm``): one engine for the module, since a
    start costs ~35 s. The first build starts it from the model's weights (float32: vLLM has no
    float64); each later build sends the model's weights through the engine's own receiver (a
    full reload), so every check runs on the weights it names. ``test_vllm_engine.py`` compares
    a synced engine with a freshly started one. Without ``.venv-vllm`` the checks skip, except
    in CI, where they fail."""

    def __init__(self) -> None:
        self.engine: RolloutEngine | None = None

    def __call__(self, model: nn.Module) -> RolloutEngine:
        from posttrain.rollout.vllm_engine import VllmOptions
        from posttrain.rollout.vllm_process import missing_vllm_message, vllm_python

        if vllm_python() is None:
            (pytest.fail if os.environ.get("CI") else pytest.skip)(missing_vllm_message())
        if self.engine is None:
            options = VllmOptions(dtype="float32", kv_cache_space_gib=1.0, max_model_len=128)
            self.engine = registry.build_engine(
                "vllm", model, None, stop_token_ids=STOPS, options=options
            )
            return self.engine
        receiver = self.engine.weight_receiver()
        state, names = model.state_dict(), receiver.names()
        receiver.begin()
        receiver.load({k: state[k] for k in names if names[k] == k})
        receiver.end()
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()  # type: ignore[attr-defined]
            self.engine = None


_VLLM = _SharedVllm()

#: One line per engine (float64 models: the in-process engines agree with a recompute to
#: rounding; vLLM samples in float32 from float32 copies of the weights, and 1e-5 holds here:
#: test_vllm_engine.py measures its gap to a float32 forward, 4.8e-7 at most).
UNDER_TEST: dict[str, UnderTest] = {
    "torch": UnderTest(_registered("torch"), atol=1e-9),
    "static": UnderTest(_registered("static"), atol=1e-9),
    "vllm": UnderTest(_VLLM, atol=1e-5),
}


@pytest.fixture(autouse=True, scope="module")
def _close_vllm():
    yield
    _VLLM.close()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _model(seed: int) -> LlamaForCausalLM:
    # head_dim 32: the smallest head size vLLM's CPU attention takes
    cfg = LlamaConfig(
        vocab_size=40, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(torch.float64).eval()


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return _model(0)


def processed(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """Log-probs of the distribution sampled: softmax of ``logits / temperature``, restricted
    to the nucleus (the most likely tokens until their mass reaches ``top_p``) and
    renormalised; -inf outside it."""
    logp = torch.log_softmax(logits.double() / temperature, -1)
    if top_p >= 1:
        return logp
    probs, order = logp.exp().sort(-1, descending=True)
    inside_sorted = probs.cumsum(-1) - probs < top_p  # mass before a token not yet reached
    inside = torch.zeros_like(inside_sorted).scatter(-1, order, inside_sorted)
    kept = logp.masked_fill(~inside, float("-inf"))
    return kept - torch.logsumexp(kept, -1, keepdim=True)


def _recompute(model, ids: Tensor, mask: Tensor) -> Tensor:
    """``[B, T-1, V]`` next-token logits of a full-sequence forward (left padding skipped)."""
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    return out.logits[:, :-1]


def _response_logprobs(model, r: Rollout, temperature: float, top_p: float) -> Tensor:
    """``[B, R]`` processed log-probs of the rollout's response ids, recomputed."""
    b, p = r.batch, r.batch.prompt_width
    logits = _recompute(model, b.input_ids, b.attention_mask)[:, p - 1 :]
    if temperature == 0:
        return torch.zeros(b.response_ids.shape, dtype=torch.float64)
    logp = processed(logits, temperature, top_p)
    return logp.gather(-1, b.response_ids[..., None])[..., 0]


@pytest.fixture(params=sorted(UNDER_TEST))
def under_test(request) -> tuple[str, UnderTest]:
    return request.param, UNDER_TEST[request.param]


def test_every_registered_engine_is_under_test():
    assert sorted(UNDER_TEST) == sorted(registry.ENGINES)


def test_engine_declares_the_interface(under_test, model):
    name, spec = under_test
    engine = spec.build(model)
    assert isinstance(engine, RolloutEngine)
    assert isinstance(engine.weight_receiver(), WeightReceiver)
    assert type(engine).capabilities == registry.engine_capabilities(name)
    assert engine.capabilities.logprobs == "processed"
    assert engine.stop_token_ids == tuple(STOPS)
    assert isinstance(engine.weight_version, int)
    assert not engine.shares(_model(1))


@pytest.mark.parametrize(
    ("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (1.0, 0.8), (0.6, 0.9), (0.0, 1.0)]
)
def test_logprobs_are_those_of_the_processed_distribution(under_test, model, temperature, top_p):
    _, spec = under_test
    engine = spec.build(model)
    r = engine.generate(PROMPTS, n=4, temperature=temperature, top_p=top_p, max_tokens=10, seed=1)
    b = r.batch
    want = _response_logprobs(model, r, temperature, top_p)
    got = b.rollout_logprobs.double()
    assert bool(torch.isfinite(want[b.response_mask]).all())  # every sampled id is in the nucleus
    assert torch.allclose(got[b.response_mask], want[b.response_mask], atol=spec.atol, rtol=0)
    assert bool((got[~b.response_mask] == 0).all())
    if temperature not in (0.0, 1.0) or top_p < 1:  # the raw distribution would not pass
        raw = _response_logprobs(model, r, 1.0, 1.0)
        assert float((raw - got)[b.response_mask].abs().max()) > 100 * spec.atol


def test_token_ids_come_back_unchanged_and_the_stop_token_has_its_logprob(under_test, model):
    _, spec = under_test
    engine = spec.build(model)
    r = engine.generate(PROMPTS, n=3, temperature=1.0, max_tokens=12, seed=2)
    b, p = r.batch, r.batch.prompt_width
    want = _response_logprobs(model, r, 1.0, 1.0)
    assert r.n == 3 and b.batch_size == len(PROMPTS) * 3
    stopped = 0
    for row in range(b.batch_size):
        prompt = PROMPTS[row // 3]
        assert b.input_ids[row, p - len(prompt) : p].tolist() == prompt
        resp = b.response_ids[row, : int(r.response_lengths[row])].tolist()
        stops = [i for i, t in enumerate(resp) if t in STOPS]
        if bool(r.truncated[row]):
            assert len(resp) == 12 and not stops
            continue
        stopped += 1
        assert stops == [len(resp) - 1]  # the stop token is the last response id, in the mask
        last = len(resp) - 1
        assert bool(b.response_mask[row, last]) and b.rollout_logprobs[row, last] < 0
        assert abs(float(b.rollout_logprobs[row, last] - want[row, last])) <= spec.atol
    assert stopped > 0


def test_same_seed_gives_the_same_samples(under_test, model):
    _, spec = under_test
    engine = spec.build(model)
    one, two = (engine.generate(PROMPTS, n=2, max_tokens=8, seed=5) for _ in range(2))
    assert torch.equal(one.batch.input_ids, two.batch.input_ids)
    assert torch.equal(one.batch.rollout_logprobs, two.batch.rollout_logprobs)


def test_weight_receiver_gives_the_samples_of_a_fresh_engine_with_the_new_weights(under_test):
    _, spec = under_test
    old, new = _model(0), _model(7)
    engine = spec.build(copy.deepcopy(old))
    engine.generate(PROMPTS, n=2, max_tokens=8, seed=3)  # whatever it holds from the old weights
    receiver = engine.weight_receiver()
    names = receiver.names()
    state = new.state_dict()
    sent = [k for k in names if names[k] == k]  # tied weights travel once
    version = engine.weight_version
    receiver.begin()
    half = len(sent) // 2
    for bucket in (sent[:half], sent[half:]):
        receiver.load({k: state[k].clone() for k in bucket})
    assert receiver.end() == engine.weight_version == version + 1
    fresh = spec.build(copy.deepcopy(new))
    got, want = (e.generate(PROMPTS, n=2, max_tokens=8, seed=3) for e in (engine, fresh))
    assert torch.equal(got.batch.input_ids, want.batch.input_ids)
    assert torch.equal(got.batch.rollout_logprobs, want.batch.rollout_logprobs)


def test_a_load_under_a_foreign_name_is_one_line(under_test, model):
    _, spec = under_test
    receiver = spec.build(copy.deepcopy(model)).weight_receiver()
    receiver.begin()
    with pytest.raises(ValueError, match=r"'module.x' \(3,\) does not fit the engine's model"):
        receiver.load({"module.x": torch.zeros(3)})


def test_turns_continue_with_processed_logprobs_or_are_refused(under_test, model):
    _, spec = under_test
    engine = spec.build(model)
    first = [TurnRequest(i, list(p), list(p), 6) for i, p in enumerate(PROMPTS)]
    if not engine.capabilities.multi_turn:
        with pytest.raises(ValueError, match="no multi-turn"):
            engine.generate_turns(first, temperature=0.7, top_p=0.9, seed=3)
        return
    outs = engine.generate_turns(first, temperature=0.7, top_p=0.9, seed=3)
    obs = [7, 8]
    second = [
        TurnRequest(i, obs, list(PROMPTS[i]) + ids + obs, 5)
        for i, (ids, _) in enumerate(outs)
        if ids[-1] in STOPS
    ]
    assert second, "no trajectory stopped in its first turn"
    outs2 = dict(
        zip(
            [r.key for r in second],
            engine.generate_turns(second, temperature=0.7, top_p=0.9, seed=3),
            strict=True,
        )  # fmt: skip
    )
    engine.end_turns()
    for r in second:
        ids1, lp1 = outs[r.key]
        ids2, lp2 = outs2[r.key]
        seq = list(PROMPTS[r.key]) + ids1 + obs + ids2
        ids = torch.as_tensor([seq])
        logp = processed(_recompute(model, ids, torch.ones_like(ids))[0], 0.7, 0.9)
        start1, start2 = len(PROMPTS[r.key]), len(PROMPTS[r.key]) + len(ids1) + len(obs)
        want = [float(logp[start1 - 1 + i, t]) for i, t in enumerate(ids1)]
        want += [float(logp[start2 - 1 + i, t]) for i, t in enumerate(ids2)]
        assert torch.allclose(torch.tensor(lp1 + lp2), torch.tensor(want), atol=spec.atol, rtol=0)


def test_preflight_reads_the_declared_multi_turn_capability(monkeypatch):
    overrides = ["env.name=calculator", "rollout.engine=static"]
    cfg = load_config("arithmetic", ["--", *overrides])
    assert "needs rollout.engine=torch" in environment_loads.check(cfg)
    entry = registry.ENGINES["static"]
    able = EngineCapabilities(multi_turn=True, logprobs="processed")
    monkeypatch.setitem(registry.ENGINES, "static", registry.EngineEntry(entry.target, able))
    assert "needs rollout.engine" not in (environment_loads.check(cfg) or "")


def test_an_engine_that_declares_other_capabilities_than_its_entry_is_refused(monkeypatch):
    entry = registry.ENGINES["static"]
    monkeypatch.setitem(
        registry.ENGINES, "static", registry.EngineEntry(entry.target, registry.caps.TORCH)
    )
    with pytest.raises(TypeError, match="declares other capabilities than rollout.engine=static"):
        registry.engine_class("static")


def test_rollout_engine_offers_exactly_the_registered_engines():
    from typing import get_args

    from posttrain.config.sections import RolloutConfig

    assert sorted(get_args(RolloutConfig.model_fields["engine"].annotation)) == sorted(
        registry.ENGINES
    )
