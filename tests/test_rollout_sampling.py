import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.data.logprobs import token_logprobs
from posttrain.rollout.sampling import check_sampling_args, sample_tokens, sampling_logprobs


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a busy 2-core box they stall."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()


def test_top_p_one_is_tempered_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(5, 11, dtype=torch.float64)
    for temp in (1.0, 0.6, 1.7):
        got = sampling_logprobs(logits, temp, 1.0)
        torch.testing.assert_close(got, torch.log_softmax(logits / temp, -1), rtol=0, atol=1e-14)
        targets = torch.arange(5)
        torch.testing.assert_close(
            got.gather(-1, targets[:, None]).squeeze(-1),
            token_logprobs(logits, targets, temp),
            rtol=0,
            atol=1e-14,
        )


def test_top_p_nucleus_hand_computed():
    # probs sorted 0.5, 0.3, 0.15, 0.05 (shuffled positions); mass before each: 0, .5, .8, .95
    logits = _logits_of([0.15, 0.5, 0.05, 0.3])
    got = sampling_logprobs(logits, 1.0, 0.8).exp()
    torch.testing.assert_close(got, torch.tensor([0, 0.625, 0, 0.375], dtype=torch.float64))
    got = sampling_logprobs(logits, 1.0, 0.81).exp()
    expected = torch.tensor([0.15, 0.5, 0, 0.3], dtype=torch.float64) / 0.95
    torch.testing.assert_close(got, expected)
    # the top token alone reaches 0.5, so top_p=0.5 keeps only it
    got = sampling_logprobs(logits, 1.0, 0.5).exp()
    torch.testing.assert_close(got, torch.tensor([0, 1.0, 0, 0], dtype=torch.float64))
    # a tiny top_p still keeps the most likely token
    got = sampling_logprobs(logits, 1.0, 1e-6).exp()
    torch.testing.assert_close(got, torch.tensor([0, 1.0, 0, 0], dtype=torch.float64))


def test_sample_frequencies_match_distribution():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    logits = probs.log().expand(40_000, 4)
    g = torch.Generator().manual_seed(3)
    tokens, lp = sample_tokens(logits, 1.0, 1.0, g)
    freq = torch.bincount(tokens, minlength=4).double() / tokens.numel()
    torch.testing.assert_close(freq, probs, rtol=0, atol=0.01)  # ~4 sigma at 40k draws
    torch.testing.assert_close(lp, probs.log()[tokens])


def test_sample_respects_temperature():
    logits = _logits_of([0.1, 0.9]).expand(40_000, 2)
    g = torch.Generator().manual_seed(1)
    tokens, lp = sample_tokens(logits, 2.0, 1.0, g)
    p = torch.softmax(logits[0] / 2.0, -1)
    assert abs(tokens.double().mean().item() - p[1].item()) < 0.01
    torch.testing.assert_close(lp, p.log()[tokens])


def test_greedy_is_argmax_with_zero_logprob():
    logits = torch.tensor([[0.1, 3.0, -1.0], [5.0, 0.0, 4.9]])
    tokens, lp = sample_tokens(logits, 0.0, 1.0, None)
    assert tokens.tolist() == [1, 0]
    assert lp.tolist() == [0.0, 0.0]


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(64, 30, generator=torch.Generator().manual_seed(0))
    a = sample_tokens(logits, 1.0, 0.9, torch.Generator().manual_seed(7))
    b = sample_tokens(logits, 1.0, 0.9, torch.Generator().manual_seed(7))
    c = sample_tokens(logits, 1.0, 0.9, torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.integers(2, 50),
    top_p=st.floats(0.05, 1.0),
    temp=st.floats(0.2, 3.0),
)
def test_samples_stay_in_nucleus_and_logprobs_normalise(seed, vocab, top_p, temp):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(8, vocab, generator=g, dtype=torch.float64) * 3
    logp = sampling_logprobs(logits, temp, top_p)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(8, dtype=torch.float64))
    full = torch.softmax(logits / temp, -1)
    kept = logp > float("-inf")
    # the kept set reaches top_p and every kept token is at least as likely as every dropped one
    assert bool(((full * kept).sum(-1) >= min(top_p, 1.0) - 1e-12).all())
    min_kept = torch.where(kept, full, math.inf).min(-1).values
    max_dropped = torch.where(kept, -math.inf, full).max(-1).values
    assert bool((min_kept >= max_dropped).all())
    tokens, lp = sample_tokens(logits, temp, top_p, g)
    assert bool(kept.gather(-1, tokens[:, None]).all())
    torch.testing.assert_close(lp, logp.gather(-1, tokens[:, None]).squeeze(-1))


@pytest.mark.parametrize(
    ("temperature", "top_p", "field"),
    [(-0.1, 1.0, "temperature"), (1.0, 0.0, "top_p"), (1.0, 1.5, "top_p"), (True, 1.0, "temp")],
)
def test_bad_sampling_args(temperature, top_p, field):
    with pytest.raises(ValueError, match=field):
        check_sampling_args(temperature, top_p)
