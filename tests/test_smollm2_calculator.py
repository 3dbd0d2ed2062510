"""The SmolLM2 calculator recipe, its problems and its evaluation script, without SmolLM2 files.

The recipe is checked by config and preflight; the evaluation script runs end to end on a tiny
random tools model (the same roles, environment and verifier as a SmolLM2 run).
"""

from __future__ import annotations

import json
import random
import runpy
from pathlib import Path

import pytest
from multiturn_fixtures import build_tools_model

from posttrain.config import load_config
from posttrain.configs.smollm2_calculator import (
    ENVIRONMENT,
    EXAMPLE,
    SYSTEM,
    calculator_environment,
)
from posttrain.control import run_preflight
from posttrain.data.tasks.calculator_demos import (
    TRAIN_ROWS,
    VAL_ROWS,
    demonstration,
    write_demonstrations,
)
from posttrain.data.tasks.calculator_mix import KINDS, expression, kind_of, problems, write_splits
from posttrain.env.tools import (
    CALL_CLOSE,
    CALL_OPEN,
    RESPONSE_CLOSE,
    RESPONSE_OPEN,
    fallback_system_prompt,
)
from posttrain.reward.extract import last_number

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "examples" / "smollm2_calculator"
EVAL = REPO / "examples" / "smollm2_calculator_eval.py"


def test_recipe_names_the_fallback_calculator_and_the_held_out_file():
    cfg = load_config("smollm2_calculator")
    assert run_preflight(cfg) == []
    assert cfg.env.name == ENVIRONMENT and cfg.data.task == "jsonl"
    assert cfg.data.system_prompt == SYSTEM and cfg.model.lora_rank == 16
    assert cfg.model.name_or_path == load_config("smollm2_reasoning_gym").model.name_or_path
    env = calculator_environment()
    assert env.tools == []  # nothing for tools=, which SmolLM2's template drops
    opening = env.reset({"prompt": "Calculate 1 + 2."})
    system = f"{SYSTEM}\n{fallback_system_prompt(env.inner.tool_list)}"
    assert opening[0] == {"role": "system", "content": system}
    assert opening[1:-1] == EXAMPLE and opening[-1] == {
        "role": "user",
        "content": "Calculate 1 + 2.",
    }
    assert EXAMPLE[1]["content"].startswith(CALL_OPEN) and EXAMPLE[1]["content"].endswith(
        CALL_CLOSE
    )
    assert EXAMPLE[2]["content"] == f"{RESPONSE_OPEN}413{RESPONSE_CLOSE}"
    # the example's call is one the environment parses and answers as the example says
    answered = env.step([*opening[:3]])
    assert answered.info["tool_errors"] == 0 and answered.messages[0] == EXAMPLE[2]


def test_the_shipped_problem_files_are_the_generators_and_disjoint(tmp_path):
    write_splits(tmp_path)
    for name in ("val.jsonl", "train.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
    val = [json.loads(line) for line in (DATA / "val.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (DATA / "train.jsonl").read_text().splitlines()]
    assert len(val) == 200 and len(train) == 2000
    assert not {r["question"] for r in val} & {r["question"] for r in train}
    assert [kind_of(r["question"]) for r in val[:4]] == list(KINDS)
    assert sum(kind_of(r["question"]) == "*" for r in val) == 50
    # the 100 held-out problems of the first measurements are the first 100 of the 200
    assert val[:100] == problems(0, 100)
    assert val[0]["question"] == "Calculate 874 + 404 + 786 + 921."
    write_splits(tmp_path / "small", val=8, train=12)
    assert [
        len((tmp_path / "small" / n).read_text().splitlines()) for n in ("val.jsonl", "train.jsonl")
    ] == [8, 12]


def test_gold_answers_follow_precedence():
    rows = problems(3, 8)
    for row in rows:
        expr = row["question"].removeprefix("Calculate ").removesuffix(".")
        assert row["answer"].endswith(f"#### {eval(expr)}")  # plain Python arithmetic here
    assert kind_of("Calculate 50 + 83 * 6.") == "mixed" and kind_of("Calculate 5 - 9.") == "-"


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_has_its_shape(kind):
    rng = random.Random(1)
    for _ in range(50):
        expr = expression(kind, rng)
        terms, ops = expr.split()[::2], set(expr.split()[1::2])
        assert kind_of(f"Calculate {expr}.") == kind
        if kind == "+":
            assert len(terms) == 4 and all(10 <= int(t) <= 999 for t in terms)
        elif kind == "-":
            assert len(terms) == 2 and all(100 <= int(t) <= 999 for t in terms)
        elif kind == "*":
            assert 100 <= int(terms[0]) <= 999 and 10 <= int(terms[1]) <= 999
        else:
            assert len(terms) == 3 and len(ops) == 2


def _row(kind, tool, plain, calls=0, errors=0, turns=1):
    return {"kind": kind, "tool_correct": tool, "plain_correct": plain, "tool_calls": calls,
            "tool_errors": errors, "turns": turns}  # fmt: skip


def test_summary_counts_by_hand():
    summarize = runpy.run_path(str(EVAL))["summarize"]
    rows = [_row("+", True, False, 1, 0, 2), _row("+", False, False, 2, 1, 3),
            _row("*", True, True), _row("-", False, True, 1, 1, 2)]  # fmt: skip
    s = summarize(rows)
    assert (s["accuracy_tool"], s["accuracy_no_tool"]) == (0.5, 0.5)
    assert (s["tool_call_rate"], s["tool_calls_mean"], s["tool_error_rate"]) == (0.75, 1.0, 0.5)
    assert s["turns_mean"] == 2.0
    assert s["per_kind"]["+"] == {"problems": 2, "accuracy_tool": 0.5, "accuracy_no_tool": 0.0,
                                  "tool_call_rate": 1.0}  # fmt: skip
    assert s["per_kind"]["mixed"]["problems"] == 0


def _tiny_model(tmp_path: Path) -> Path:
    model = build_tools_model(tmp_path / "tiny", eos_logit=0.0)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 2048  # rotary positions: the system message is long
    (model / "config.json").write_text(json.dumps(config))
    return model


def _val(tmp_path: Path, n: int = 40) -> Path:
    """The first ``n`` held-out problems (``n / 4`` of each kind): the scripts' paths, fast."""
    path = tmp_path / "val.jsonl"
    lines = (DATA / "val.jsonl").read_text().splitlines(keepends=True)[:n]
    path.write_text("".join(lines))
    return path


def test_eval_script_runs_on_a_tiny_model(tmp_path, capsys):
    model = _tiny_model(tmp_path)
    out = tmp_path / "eval"
    summary = runpy.run_path(str(EVAL))["main"](
        ["--out", str(out), "--", f"model.name_or_path={model}", "rollout.max_tokens=8",
         f"data.train_path={DATA / 'train.jsonl'}", f"data.val_path={_val(tmp_path)}"]
    )  # fmt: skip
    assert "| all | 40 |" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == summary["problems"] == 40
    assert json.loads((out / "summary.json").read_text())["step"] == 0
    assert summary["model"] == str(model)
    assert all(r["turns"] >= 1 and r["tool_transcript"] for r in rows)
    assert summary["turns_mean"] == summary["env_metrics"]["env/turns_mean"]
    assert all(r["plain_text"] is not None for r in rows)


def test_eval_script_reads_a_runs_newest_checkpoint(tmp_path, capsys):
    from posttrain.entrypoints.cli import main as cli

    model = _tiny_model(tmp_path)
    run = tmp_path / "grpo" / "smollm2_135m_calculator"
    overrides = [f"job.output_root={tmp_path}", f"model.name_or_path={model}", "rollout.max_tokens=8", "rollout.n=2",
                 "data.prompts_per_step=2", "rl.max_steps=2", "rl.save_every=1",
                 "rl.eval_every=0", f"data.train_path={DATA / 'train.jsonl'}",
                 f"data.val_path={_val(tmp_path)}"]  # fmt: skip
    assert cli(["grpo", "--config", "smollm2_calculator", "--", *overrides]) == 0
    summary = runpy.run_path(str(EVAL))["main"](["--run", str(run), "--out", str(tmp_path / "e")])
    assert summary["step"] == 2 and summary["problems"] == 40
    assert "step 2, 40 held-out problems" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # --run and --model: which policy is meant is unclear
        runpy.run_path(str(EVAL))["main"](["--run", str(run), "--model", str(model), "--out", "x"])


def test_sft_recipe_trains_on_the_demonstrations_and_its_export_evaluates(tmp_path, capsys):
    """The documented pipeline on a tiny tools model: ``posttrain sft --config
    sft_smollm2_calculator`` (2 steps), then the evaluation of its ``final_model`` by
    ``--model``, as SmolLM2's SFT result is evaluated and handed to GRPO."""
    from posttrain.entrypoints.cli import main as cli

    cfg = load_config("sft_smollm2_calculator")
    assert run_preflight(cfg) == []
    rl = load_config("smollm2_calculator")
    assert cfg.model == rl.model and cfg.job.algorithm == "sft"
    assert cfg.sft.train_path == "examples/smollm2_calculator/sft_train.jsonl"
    model = _tiny_model(tmp_path)
    overrides = [f"job.output_root={tmp_path}", f"model.name_or_path={model}",
                 "sft.max_tokens=1024",  # the tiny tokenizer is one token a character
                 "rl.max_steps=2", "rl.eval_every=2", "rl.save_every=2",
                 f"sft.train_path={DATA / 'sft_train.jsonl'}",
                 f"sft.val_path={DATA / 'sft_val.jsonl'}"]  # fmt: skip
    assert cli(["sft", "--config", "sft_smollm2_calculator", "--", *overrides]) == 0
    final = tmp_path / "sft" / "smollm2_135m_calculator_sft" / "final_model"
    assert (final / "config.json").exists() and (final / "tokenizer_config.json").exists()
    summary = runpy.run_path(str(EVAL))["main"](
        ["--model", str(final), "--out", str(tmp_path / "e"), "--", "rollout.max_tokens=8",
         f"data.val_path={_val(tmp_path, 8)}"]
    )  # fmt: skip
    assert summary["model"] == str(final) and summary["problems"] == 8


def _episode(tok, row):
    """The recipe environment's episode for ``row``'s problem, the policy sampling the row's
    trained assistant turns (each ended by EOS, as a rollout's turn is)."""
    from posttrain.env import EpisodeLimits, run_episodes
    from posttrain.env.render import encode

    turns = [
        m["content"] for m in row["messages"] if m["role"] == "assistant" and m.get("weight", 1)
    ]
    question = [m["content"] for m in row["messages"] if m["role"] == "user"][-2]

    def generate(requests):
        return [encode(tok, turns.pop(0)) + [tok.eos_token_id] for _ in requests]

    (episode,) = run_episodes([{"prompt": question}], calculator_environment, tok, generate,
                              EpisodeLimits(3, 200, 4000))  # fmt: skip
    assert not turns and episode.info["tool_calls"] == 1 and episode.info["tool_errors"] == 0
    return episode


def test_a_demonstration_renders_as_the_environments_episode(tmp_path):
    """The SFT row's ids are the ids of the recipe's episode for the same problem and turns,
    and the loss mask is the episode's policy mask: the call and the answer, each with EOS."""
    from posttrain.data.sft import load_sft
    from posttrain.env.chat_template import build_tools_tokenizer

    tok = build_tools_tokenizer()
    problem = problems(0, 3)[2]  # a product
    row = demonstration(calculator_environment(), problem)
    messages = row["messages"]
    assert messages[:-3] == [{**m, "weight": 0} if m["role"] == "assistant" else m
                             for m in calculator_environment().reset({"prompt": problem["question"]})]  # fmt: skip
    expr = problem["question"].removeprefix("Calculate ").removesuffix(".")
    value = problem["answer"].split("#### ")[-1]
    call = json.dumps({"name": "calculator", "arguments": {"expression": expr}})
    assert [m["content"] for m in messages[-3:]] == [
        f"{CALL_OPEN}{call}{CALL_CLOSE}", f"{RESPONSE_OPEN}{value}{RESPONSE_CLOSE}", f"{expr} = {value}"
    ]  # fmt: skip
    path = tmp_path / "row.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (sft_row,) = load_sft(str(path), tok, 2000, "error").rows
    episode = _episode(tok, row)
    assert sft_row.ids == episode.ids
    assert sft_row.mask == [bool(m) for m in episode.mask]
    trained = tok.decode([i for i, m in zip(sft_row.ids, sft_row.mask, strict=True) if m])
    assert trained == f"{CALL_OPEN}{call}{CALL_CLOSE}<eos>{expr} = {value}<eos>"
    assert last_number(messages[-1]["content"]) == value


def test_the_shipped_demonstrations_are_the_builders_from_train_problems(tmp_path):
    for name in ("train.jsonl", "val.jsonl"):
        (tmp_path / name).write_bytes((DATA / name).read_bytes())
    write_demonstrations(tmp_path)
    for name in ("sft_train.jsonl", "sft_val.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
    held = {json.loads(line)["question"] for line in (DATA / "val.jsonl").read_text().splitlines()}
    train = [
        json.loads(line)["question"] for line in (DATA / "train.jsonl").read_text().splitlines()
    ]
    asked = [
        json.loads(line)["messages"][-4]["content"]
        for name in ("sft_train.jsonl", "sft_val.jsonl")
        for line in (DATA / name).read_text().splitlines()
    ]
    assert len(asked) == TRAIN_ROWS + VAL_ROWS and asked == train[: len(asked)]
    assert not held & set(asked)
    # a held-out problem in the train file is refused
    (tmp_path / "val.jsonl").write_text((DATA / "train.jsonl").read_text().splitlines()[5] + "\n")
    with pytest.raises(ValueError, match="held-out problems in"):
        write_demonstrations(tmp_path)
