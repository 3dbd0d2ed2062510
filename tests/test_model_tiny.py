import pytest
import torch
from transformers import LlamaForCausalLM

from posttrain.model.loading import load_policy
from posttrain.model.tiny import build_tiny_model, count_parameters, tiny_config
from posttrain.rollout import TorchRolloutEngine


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a busy 2-core box they stall."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_preset_parameter_counts():
    # the documented sizes: tiny ~100k, small ~25M (tied embeddings counted once)
    with torch.device("meta"):
        assert count_parameters(LlamaForCausalLM(tiny_config("tiny"))) == 101_856
        assert count_parameters(LlamaForCausalLM(tiny_config("small"))) == 25_356_288


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown tiny-model preset 'huge'"):
        tiny_config("huge")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("tiny"), seed=3)


def test_saved_folder_loads_back(tiny_dir, tmp_path):
    assert (tiny_dir / "model.safetensors").is_file()
    model, tok = load_policy(tiny_dir)
    assert not model.training and model.dtype == torch.float32
    assert model.config.eos_token_id == tok.eos_token_id == 2
    assert model.config.pad_token_id == tok.pad_token_id == 0
    assert model.config.vocab_size == len(tok)
    again = build_tiny_model("tiny", tmp_path / "again", seed=3)
    other = build_tiny_model("tiny", tmp_path / "other", seed=4)
    m2, _ = load_policy(again)
    m3, _ = load_policy(other)
    w = model.model.embed_tokens.weight
    assert torch.equal(w, m2.model.embed_tokens.weight)
    assert not torch.equal(w, m3.model.embed_tokens.weight)


def test_load_policy_dtype_and_errors(tiny_dir, tmp_path):
    model, _ = load_policy(tiny_dir, dtype="float64", device="cpu")
    assert model.dtype == torch.float64
    model, _ = load_policy(str(tiny_dir), tokenizer_path=tiny_dir, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="not a local directory"):
        load_policy("HuggingFaceTB/SmolLM2-135M")
    with pytest.raises(ValueError, match="has no config.json"):
        load_policy(tmp_path)
    with pytest.raises(ValueError, match="dtype 'fp8' is not supported"):
        load_policy(tiny_dir, dtype="fp8")
    with pytest.raises(ValueError, match="out' exists and is not a directory"):
        (tmp_path / "out").write_text("")
        build_tiny_model("tiny", tmp_path / "out")


def test_tiny_model_learns_arithmetic_and_rolls_out(tiny_dir):
    """The demo path: tokenizer, model and engine together fit "12+7=" -> "19"."""
    torch.manual_seed(0)
    model, tok = load_policy(tiny_dir)
    pairs = [(12, 7), (3, 4), (25, 30), (8, 9), (40, 2), (11, 11)]
    rows = [tok(f"{a}+{b}={a + b}")["input_ids"] + [tok.eos_token_id] for a, b in pairs]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    mask = (torch.arange(width)[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
    labels = ids.masked_fill(mask == 0, -100)
    for i, (a, b) in enumerate(pairs):  # learn only the answer and the EOS
        labels[i, : len(tok(f"{a}+{b}=")["input_ids"])] = -100
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(150):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    engine = TorchRolloutEngine(model, tok)
    prompts = [tok(f"{a}+{b}=")["input_ids"] for a, b in pairs]
    r = engine.generate(prompts, temperature=0.0, max_tokens=5)
    assert list(r.texts) == [str(a + b) for a, b in pairs]
    assert not r.truncated.any()
    assert r.batch.response_ids[0, :3].tolist() == [
        *tok("19", add_special_tokens=False)["input_ids"],
        2,
    ]


def test_arith_preset_has_the_small_alphabet(tmp_path):
    from posttrain.model.loading import load_policy
    from posttrain.model.tiny import build_tiny_model, count_parameters

    model, tok = load_policy(build_tiny_model("arith", tmp_path / "a"))
    assert model.config.vocab_size == 22 and not model.config.tie_word_embeddings
    assert count_parameters(model) == 34_336
    ids = tok("12+7=")["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "12+7=" and len(ids) == 6


def test_tiny_tools_preset_covers_printable_ascii_with_tool_markers_and_a_template(tmp_path):
    """``tiny`` has no tool markers and no chat template, so a multi-turn run cannot use it;
    ``tiny_tools`` is the small model for one's own tools."""
    import string

    from posttrain.env.render import check_template
    from posttrain.model.tokenizer import TOOL_MARKERS

    model, tok = load_policy(build_tiny_model("tiny_tools", tmp_path / "t"))
    assert count_parameters(model) == 102_144  # the module docstring's table
    printable = string.printable.translate({ord(c): None for c in "\r\x0b\x0c"})
    ids = tok(printable, add_special_tokens=False).input_ids
    assert len(ids) == len(printable) and tok.unk_token_id not in ids
    assert tok.decode(ids) == printable
    call = '<tool_call>{"name": "search", "arguments": {"q": "`x`"}}</tool_call>'
    ids = tok(call, add_special_tokens=False).input_ids
    assert (
        tok.unk_token_id not in ids and len(ids) == len(call) - sum(map(len, TOOL_MARKERS[:2])) + 2
    )
    schema = {"type": "function", "function": {"name": "calculator", "parameters": {}}}
    check_template(tok, [schema])  # prefix-stable, with a tool turn


def test_tiny_tools_preset_trains_a_multiturn_run(tmp_path, capsys):
    from posttrain.entrypoints.cli import main

    opts = {
        "model.init_preset": "tiny_tools", "model.name_or_path": str(tmp_path / "m"),
        "job.output_root": str(tmp_path / "out"), "env.name": "calculator", "env.max_turns": 2,
        "env.max_context": 120, "rl.max_steps": 1, "rl.eval_every": 1, "data.val_size": 4,
        "data.prompts_per_step": 2, "rollout.n": 2, "rollout.max_tokens": 8,
        "logging.progress": False,
    }  # fmt: skip
    argv = ["grpo", "--config", "arithmetic", "--", *(f"{k}={v}" for k, v in opts.items())]
    assert main(argv) == 0
    assert "held-out accuracy: 0.000 -> " in capsys.readouterr().out
