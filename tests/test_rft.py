"""``posttrain rft`` end to end on a tiny random arithmetic model: the right samples land in the
SFT rows and the pairs, both load with their readers and train, runs are deterministic, and
every refusal is one line with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.data.lmdpo import load_pairs
from posttrain.data.sft import load_sft
from posttrain.entrypoints import lmdpo, rft, sft
from posttrain.entrypoints.cli import main as cli_main
from posttrain.model.loading import load_tokenizer

RECIPE = "arithmetic_clipped"
#: Correct = a total reward >= 1: the verifier's exact answer, or a first character that is a
#: digit (tests/rft_fixtures.py), which half a random model's samples have.
RULE = ["--threshold", "1"]


def opts_for(root: Path, **extra) -> list[str]:
    opts = {
        "job.output_root": str(root / "runs"),
        "model.name_or_path": str(root / "model"),
        "data.train_size": 12,
        "data.val_size": 4,
        "data.prompts_per_step": 5,  # three chunks, the last one short
        "rollout.n": 4,
        "reward.functions": "[rft_fixtures:digit_first]",
    }
    opts.update(extra)
    return [f"{k}={v}" for k, v in opts.items()]


def sample(root: Path, out: Path, settings: dict | None = None, **extra) -> dict:
    """``posttrain rft`` with the test's rule (``--threshold 1``) unless ``settings`` say else."""
    chosen = rft.Settings(out=str(out), **{"threshold": 1.0, **(settings or {})})
    return rft.run(RECIPE, opts_for(root, **extra), chosen)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def by_prompt(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["prompt"], []).append(r)
    return out


def test_the_right_samples_land_in_the_rows_and_the_pairs(tmp_path, capsys):
    out = tmp_path / "rft"
    code, printed, _ = cli(capsys, "rft", "--config", RECIPE, "--out", str(out), *RULE, "--",
                           *opts_for(tmp_path))  # fmt: skip
    assert code == 0 and "rft: 12 prompts x 4 samples" in printed
    assert f"sft rows: {len(rows(out / 'sft.jsonl'))} -> {out}/sft.jsonl" in printed
    summary = json.loads((out / "summary.json").read_text())
    samples = rows(out / "samples.jsonl")
    assert len(samples) == summary["samples"] == 48 and summary["prompts"] == 12
    for r in samples:  # the scores are the reward stage's: verifier + the fixture's rule
        digit = r["completion"][:1].isdigit()
        assert r["reward"] == r["verifier"] + digit
        assert r["correct"] == (r["reward"] >= 1)
    groups = by_prompt(samples)
    want_rows, want_pairs = [], []
    for prompt, group in groups.items():  # the documented rule, by hand
        right = list(dict.fromkeys(r["completion"] for r in group if r["correct"]))
        wrong = list(dict.fromkeys(r["completion"] for r in group if not r["correct"]))
        want_rows += [{"prompt": prompt, "completion": c} for c in right]
        want_pairs += [{"prompt": prompt, "chosen": c, "rejected": w}
                       for c, w in zip(right, wrong, strict=False)]  # fmt: skip
    assert rows(out / "sft.jsonl") == want_rows and rows(out / "pairs.jsonl") == want_pairs
    assert 0 < len(want_pairs) < len(want_rows)
    assert summary["sft_rows"] == len(want_rows) and summary["pairs"] == len(want_pairs)
    correct = [sum(r["correct"] for r in g) for g in groups.values()]
    assert summary["correct"] == sum(correct)
    assert summary["pass_at_k"]["4"] == sum(c > 0 for c in correct) / 12
    assert summary["pass_at_k"]["1"] == pytest.approx(sum(correct) / 48)
    assert [p["correct"] for p in summary["per_prompt"]] == correct
    tokenizer = load_tokenizer(tmp_path / "model")
    assert summary["sft_rows_as_sampled"] == as_sampled(tokenizer, samples, want_rows) > 0
    val = rows(out / "val_samples.jsonl")
    assert len(val) == summary["val"]["problems"] == 4
    assert summary["val"]["accuracy"] == sum(r["correct"] for r in val) / 4
    assert load_config(str(out / "config.yaml")).rollout.n == 4
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".old-"))]


def as_sampled(tokenizer, samples: list[dict], written: list[dict]) -> int:
    """How many rows should render token for token as sampled: those whose (first) sample
    stopped at its EOS and whose text re-encodes to as many tokens as were sampled before it
    (a sampled special token the decoded text drops, or a truncated sample, does not)."""
    count = 0
    for row in written:
        prompt, text = (row["prompt"], row["completion"]) if "prompt" in row else (
            row["messages"][0]["content"], row["messages"][-1]["content"])  # fmt: skip
        first = next(r for r in samples if (r["prompt"], r["completion"]) == (prompt, text))
        encoded = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        count += not first["truncated"] and encoded + 1 == first["tokens"]
    return count


def test_the_cap_and_kept_duplicates(tmp_path):
    capped = sample(tmp_path, tmp_path / "capped", {"per_prompt": 1})
    assert all(p["sft_rows"] <= 1 and p["pairs"] <= 1 for p in capped["per_prompt"])
    kept = sample(tmp_path, tmp_path / "kept", {"dedup": False})
    assert kept["sft_rows"] == kept["correct"] and kept["duplicates_dropped"] == 0


def test_the_rows_and_pairs_load_with_their_readers_and_train(tmp_path):
    out = tmp_path / "rft"
    sample(tmp_path, out)
    tokenizer = load_tokenizer(tmp_path / "model")
    data = load_sft(str(out / "sft.jsonl"), tokenizer, 16, "error")
    assert len(data.rows) == len(rows(out / "sft.jsonl"))
    assert len(load_pairs(str(out / "pairs.jsonl"), tokenizer, 16, "error").pairs) == len(
        rows(out / "pairs.jsonl")
    )
    common = {"job.output_root": tmp_path / "runs", "model.name_or_path": tmp_path / "model",
              "model.init_preset": "null", "rl.max_steps": 2, "rl.eval_every": 0,
              "rl.save_every": 0, "logging.progress": False}  # fmt: skip
    opts = [f"{k}={v}" for k, v in {**common, "sft.train_path": out / "sft.jsonl",
                                    "sft.val_path": "null", "sft.max_tokens": 16}.items()]  # fmt: skip
    done = sft.run(load_config("sft_tools_tiny", ["--", *opts]), "sft_tools_tiny", opts)
    assert done["steps"] == 2 and done["rows"] == len(data.rows)
    opts = [f"{k}={v}" for k, v in {**common, "lmdpo.train_path": out / "pairs.jsonl",
                                    "lmdpo.val_path": "null", "lmdpo.max_tokens": 16}.items()]  # fmt: skip
    done = lmdpo.run(load_config("lmdpo_tools_tiny", ["--", *opts]), "lmdpo_tools_tiny", opts)
    assert done["steps"] == 2


def test_chat_rows_render_the_prompt_that_was_sampled(tmp_path):
    """A chat template: the rows are messages, and the reader renders the sampled tokens."""
    out = tmp_path / "rft"
    summary = sample(tmp_path, out, None, **{"model.init_preset": "arith_tools",
                                       "data.prompt_template": "chat",
                                       "data.system_prompt": "null"})  # fmt: skip
    written = rows(out / "sft.jsonl")
    assert written and all([m["role"] for m in r["messages"]] == ["user", "assistant"]
                           for r in written)  # fmt: skip
    tokenizer = load_tokenizer(tmp_path / "model")
    samples = rows(out / "samples.jsonl")
    assert summary["sft_rows_as_sampled"] == as_sampled(tokenizer, samples, written) > 0
    pairs = rows(out / "pairs.jsonl")
    assert all(set(p) == {"messages", "chosen", "rejected"} for p in pairs)
    assert len(load_pairs(str(out / "pairs.jsonl"), tokenizer, 32, "error").pairs) == len(pairs)


def test_the_same_seed_writes_the_same_files(tmp_path):
    a = sample(tmp_path, tmp_path / "a")
    b = sample(tmp_path, tmp_path / "b")
    for name in ("sft.jsonl", "pairs.jsonl", "samples.jsonl", "val_samples.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert {k: v for k, v in a.items() if k != "out"} == {k: v for k, v in b.items() if k != "out"}
    other = sample(tmp_path, tmp_path / "c", None, **{"job.seed": 1})
    assert rows(tmp_path / "c" / "samples.jsonl") != rows(tmp_path / "a" / "samples.jsonl")
    assert other["samples"] == a["samples"]


def test_a_rerun_replaces_its_own_folder(tmp_path):
    out = tmp_path / "rft"
    sample(tmp_path, out)
    again = sample(tmp_path, out, {"per_prompt": 1})
    assert json.loads((out / "summary.json").read_text())["per_prompt_cap"] == 1
    assert again["sft_rows"] == len(rows(out / "sft.jsonl"))


@pytest.mark.parametrize(
    ("argv", "extra", "fragment"),
    [
        ([], ["rl.lr=0.1"], "rl.lr=0.1: posttrain rft never reads it (it samples and scores"),
        ([], ["rollout.nn=3"], "rollout.nn"),
        (["--per-prompt", "0"], [], "--per-prompt 0: must be at least 1"),
        (["--prompts", "13"], [], "--prompts 13: the train split holds 12 prompts"),
        (["--threshold", "5"], [], "no sample of the 48 was correct (--threshold 5.0)"),
        ([], ["model.init_preset=arith_tools"],
         "data.prompt_template=plain, but the tokenizer has a chat template"),
        ([], ["reward.functions=[rft_fixtures:raises]"],
         "reward function 'rft_fixtures:raises' raised ValueError: the scorer is broken"),
    ],
)  # fmt: skip
def test_refusals_are_one_line_and_write_nothing(tmp_path, capsys, argv, extra, fragment):
    out = tmp_path / "rft"
    code, _, err = cli(capsys, "rft", "--config", RECIPE, "--out", str(out), *argv, "--",
                     *opts_for(tmp_path), *extra)  # fmt: skip
    assert code != 0 and fragment in err and "\n" not in err, err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".old-"))]


def test_a_failing_reward_function_names_the_prompt(tmp_path, capsys):
    code, _, err = cli(capsys, "rft", "--config", RECIPE, "--out", str(tmp_path / "rft"), "--",
                     *opts_for(tmp_path), "reward.functions=[rft_fixtures:raises]")  # fmt: skip
    assert code == 1 and "row 0 (sample_id 0, item arithmetic/" in err and "prompt '" in err, err


@pytest.mark.parametrize(
    ("recipe", "extra", "fragment"),
    [
        ("tools_addition", [], "env.name=posttrain.env.arithmetic:"),
        ("sft_tools_tiny", [], "job.algorithm=sft is supervised fine-tuning (offline, on "
         "demonstrations), with no prompts to sample"),
        (RECIPE, ["reward.functions=[no_such_module:f]"],
         "reward.functions entry 'no_such_module:f': cannot import module 'no_such_module'"),
        (RECIPE, ["data.prompt_template=chat"], "data.prompt_template=chat needs a chat template"),
    ],
)  # fmt: skip
def test_configs_it_cannot_sample_are_refused_before_any_model(tmp_path, capsys, recipe, extra,
                                                               fragment):  # fmt: skip
    code, _, err = cli(capsys, "rft", "--config", recipe, "--out", str(tmp_path / "rft"), "--",
                       f"model.name_or_path={tmp_path / 'model'}", *extra)  # fmt: skip
    assert code == 2 and fragment in err and "\n" not in err, err
    assert not (tmp_path / "model").exists() and not (tmp_path / "rft").exists()


def test_a_folder_with_other_files_is_not_replaced(tmp_path, capsys):
    out = tmp_path / "rft"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = cli(capsys, "rft", "--config", RECIPE, "--out", str(out), "--",
                     *opts_for(tmp_path))  # fmt: skip
    assert code == 2 and "holds files posttrain rft did not write (notes.txt)" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "model").exists()
