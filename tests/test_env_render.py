"""Token-in-token-out rendering: sampled ids kept, segments rendered alone, exact policy mask."""

from __future__ import annotations

import pytest

from posttrain.env.chat_template import TOOLS_CHAT_TEMPLATE, build_tools_tokenizer
from posttrain.env.render import (
    TemplateError,
    TokenTrajectory,
    check_template,
    decode,
    encode,
    observation_segment,
    render,
    template_supports_tools,
)
from posttrain.env.tools import CALCULATOR, calculator_environment
from posttrain.model.tokenizer import TOOL_MARKERS, build_char_tokenizer, load_tokenizer

TOOLS = [CALCULATOR.schema]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12+7"}}</tool_call>'


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """The tools tokenizer, saved and loaded back as any tokenizer folder is."""
    from posttrain.model.tokenizer import save_char_tokenizer

    path = tmp_path_factory.mktemp("tok")
    save_char_tokenizer(build_tools_tokenizer(), path)
    return load_tokenizer(path)


def sampled(tok, text: str) -> list[int]:
    """Ids a policy may sample for ``text``: one per character (markers spelled out) + EOS."""
    return [tok.convert_tokens_to_ids(c) for c in text] + [tok.eos_token_id]


def test_tool_markers_are_single_tokens(tok) -> None:
    for marker in TOOL_MARKERS:
        assert len(encode(tok, marker)) == 1
        assert decode(tok, encode(tok, marker)) == marker
    assert tok.decode(encode(tok, "<tool_call>1</tool_call>"), skip_special_tokens=True) == (
        "<tool_call>1</tool_call>"
    )  # not special: kept by the rollout's decode
    plain = build_char_tokenizer()
    assert len(plain) + len(TOOL_MARKERS) == len(tok)
    assert plain.get_vocab().items() <= tok.get_vocab().items()  # existing ids unchanged


def _two_turn(tok):
    """Prompt, a sampled tool call, the calculator's answer, a sampled final answer."""
    env = calculator_environment()
    traj = TokenTrajectory()
    messages = env.reset({"prompt": "What is 12+7?"})
    prompt = render(tok, messages, TOOLS, generation_prompt=True)
    traj.add(encode(tok, prompt), policy=False)
    first = sampled(tok, CALL)
    traj.add(first, policy=True)
    messages.append({"role": "assistant", "content": decode(tok, first[:-1])})
    step = env.step(messages)
    seg = observation_segment(
        tok, messages, step.messages, prompt_text=prompt, stop_text=tok.eos_token, tools=TOOLS
    )
    traj.add(seg.ids, policy=False)
    messages.extend(step.messages)
    second = sampled(tok, "19")
    traj.add(second, policy=True)
    messages.append({"role": "assistant", "content": "19"})
    return traj, messages, first, second, seg


def test_ids_decode_to_the_template_text(tok) -> None:
    traj, messages, _, _, seg = _two_turn(tok)
    assert messages[2] == {"role": "tool", "name": "calculator", "content": "19"}
    # the episode ends at the sampled stop token; the template's closer after it is not context
    assert decode(tok, traj.ids) + "\n" == render(tok, messages, TOOLS)
    assert decode(tok, seg.ids) == "\nU:<tool_response>19</tool_response><eos>\nA:"


def test_history_is_never_retokenised(tok) -> None:
    traj, _, first, second, _ = _two_turn(tok)
    # the policy spelled "<tool_call>" in 11 character tokens; re-encoding makes it one token,
    # so any re-tokenisation of the history would change these ids
    assert encode(tok, decode(tok, first)) != first
    assert encode(tok, decode(tok, traj.ids)) != traj.ids
    start = traj.mask.index(1)
    assert traj.ids[start : start + len(first)] == first
    assert traj.ids[-len(second) :] == second


def test_mask_covers_exactly_the_sampled_tokens(tok) -> None:
    traj, _, first, second, seg = _two_turn(tok)
    ones = [i for i, m in enumerate(traj.mask) if m]
    start = traj.mask.index(1)
    expected = list(range(start, start + len(first)))
    expected += list(range(len(traj.ids) - len(second), len(traj.ids)))
    assert ones == expected
    assert [traj.ids[i] for i in ones] == first + second
    assert traj.policy_tokens == len(first) + len(second)
    assert traj.env_tokens == len(traj.ids) - len(first) - len(second)
    assert len(traj.mask) == len(traj.ids)


def test_consecutive_tool_responses_share_one_turn(tok) -> None:
    env = calculator_environment()
    messages = env.reset({"prompt": "q"})
    prompt = render(tok, messages, TOOLS, generation_prompt=True)
    messages.append({"role": "assistant", "content": CALL + CALL.replace("12+7", "2*3")})
    step = env.step(messages)
    assert len(step.messages) == 2
    seg = observation_segment(
        tok, messages, step.messages, prompt_text=prompt, stop_text=tok.eos_token, tools=TOOLS
    )
    assert decode(tok, seg.ids) == (
        "\nU:<tool_response>19</tool_response><tool_response>6</tool_response><eos>\nA:"
    )


def test_turn_cut_by_its_limit_is_closed_by_the_segment(tok) -> None:
    messages = [{"role": "user", "content": "q"}]
    prompt = render(tok, messages, generation_prompt=True)
    messages.append({"role": "assistant", "content": "abc"})  # no stop token sampled
    new = [{"role": "user", "content": "go on"}]
    seg = observation_segment(tok, messages, new, prompt_text=prompt, stop_text="")
    assert decode(tok, seg.ids) == "<eos>\nU:go on<eos>\nA:"


def test_the_tools_template_passes_the_probe(tok) -> None:
    check_template(tok, TOOLS)
    check_template(tok)
    assert template_supports_tools(tok)


def _with_template(template: str):
    tok = build_tools_tokenizer()
    tok.chat_template = template
    return tok


def test_trimming_template_is_refused_in_one_line() -> None:
    tok = _with_template(
        TOOLS_CHAT_TEMPLATE.replace(
            "{{ m.content }}{{ eos_token }}", "{{ m.content | trim }}{{ eos_token }}"
        )
    )
    with pytest.raises(TemplateError) as e:
        check_template(tok)
    assert str(e.value).startswith(
        "chat template (probe turn 1) is not prefix-stable: the assistant"
    )
    assert "\n" not in str(e.value)


def test_template_rewriting_history_is_refused() -> None:
    # renders only the last assistant turn in full (as reasoning-stripping templates do)
    template = (
        "{% for m in messages %}{{ m.role[0] | upper }}:"
        "{% if m.role == 'assistant' and not loop.last %}...{% else %}{{ m.content }}{% endif %}"
        "{{ eos_token }}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    )
    with pytest.raises(TemplateError, match="appending messages changes the text of earlier turns"):
        check_template(_with_template(template))


def test_stop_token_not_closing_the_turn_is_refused(tok) -> None:
    with pytest.raises(TemplateError, match="the policy stopped with '<pad>'"):
        check_template(tok, stop_text="<pad>")


def test_no_chat_template_is_refused() -> None:
    with pytest.raises(TemplateError, match="has no chat template"):
        check_template(build_char_tokenizer())


def test_template_without_tools_is_detected() -> None:
    template = "{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}"
    assert not template_supports_tools(_with_template(template))
