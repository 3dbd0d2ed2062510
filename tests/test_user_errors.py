"""Every user mistake of issue 10 ends as one line naming the file, key, row or step and what to
do, with a non-zero exit and no traceback (``--debug`` / ``POSTTRAIN_DEBUG=1`` show it)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.config.sections import DataConfig
from posttrain.control.data_checks import load_tasks
from posttrain.control.input_checks import check_inputs
from posttrain.entrypoints.cli import main
from posttrain.model.tiny import build_tiny_model
from posttrain.run import lock as run_lock
from posttrain.run.guard import one_line


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return build_tiny_model("arith", root / "arith", seed=0), build_tiny_model(
        "tiny", root / "tiny", seed=0
    )


def cli(tmp: Path, model: Path, *extra: str) -> list[str]:
    return ["grpo", "--config", "arithmetic_clipped", "--", f"job.output_root={tmp / 'out'}",
            f"model.name_or_path={model}", "model.init_preset=null", "rl.max_steps=2",
            "rl.eval_every=0", "data.prompts_per_step=2", "rollout.n=2",
            "logging.progress=false", *extra]  # fmt: skip


def jsonl(tmp: Path, model: Path, rows: bytes) -> list[str]:
    path = tmp / "rows.jsonl"
    path.write_bytes(rows)
    d = DataConfig()  # the arithmetic recipe's knobs back to defaults: jsonl reads none of them
    return cli(tmp, model, "data.task=jsonl", f"data.train_path={path}", f"data.digits={d.digits}",
               f"data.train_size={d.train_size}", f"data.val_size={d.val_size}",
               "data.allow_repeats=true")  # one-row files: 2 prompts per step repeat it  # fmt: skip


def one_error(capsys, argv: list[str], code: int = 1) -> str:
    assert main(argv) == code
    err = [x for x in capsys.readouterr().err.strip().splitlines() if "warning" not in x]
    assert len(err) == 1 and err[0].startswith("posttrain: error: "), err
    assert len(err[0]) < 800
    return err[0]


def copy_model(src: Path, dst: Path, keep) -> Path:
    shutil.copytree(src, dst)
    for f in dst.iterdir():
        if not keep(f.name):
            f.unlink()
    return dst


def test_data_rows(tmp_path, models, capsys):
    arith, _ = models
    good = b'{"question": "1+1=", "answer": "#### 2"}\n'
    msg = one_error(capsys, jsonl(tmp_path, arith, good + b'{"question": "\xff", "answer": "1"}\n'))
    assert f"{tmp_path / 'rows.jsonl'}:2: not UTF-8" in msg
    big = json.dumps({"question": "1+1=", "answer": "#### " + "x" * 5_000_000}).encode()
    msg = one_error(capsys, jsonl(tmp_path, arith, big))
    assert "rows.jsonl:1" in msg and "more characters]" in msg
    long = json.dumps({"question": "1" * 5_000_000, "answer": "#### 2"}).encode()
    msg = one_error(capsys, jsonl(tmp_path, arith, long))
    assert "row rows.jsonl:1: the prompt is more than 61 tokens" in msg
    assert "data.prompt_truncation" in msg
    letters = b'{"question": "what is one plus one?", "answer": "#### 2"}\n'
    msg = one_error(capsys, jsonl(tmp_path, arith, letters))
    assert "row rows.jsonl:1" in msg and "unknown token" in msg


def test_model_and_tokenizer_folders(tmp_path, models, capsys):
    arith, tiny = models
    only_config = copy_model(arith, tmp_path / "cfg", lambda n: n == "config.json")
    msg = one_error(capsys, cli(tmp_path, only_config))
    assert "has a config.json but no weights" in msg
    truncated = copy_model(arith, tmp_path / "trunc", lambda n: True)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    msg = one_error(capsys, cli(tmp_path, truncated))
    assert "the weights do not load" in msg and "copy them again" in msg
    no_tok = copy_model(
        arith, tmp_path / "notok", lambda n: "token" not in n and "special" not in n
    )
    assert "holds no usable tokenizer" in one_error(capsys, cli(tmp_path, no_tok))
    msg = one_error(capsys, cli(tmp_path, arith, f"model.tokenizer_path={tmp_path / 'none'}"))
    assert "is not a directory" in msg
    msg = one_error(capsys, cli(tmp_path, arith, f"model.tokenizer_path={tiny}"), code=2)
    assert "model.tokenizer_path: the tokenizer has 99 tokens" in msg and "embeds only 22" in msg


def test_output_root(tmp_path, models, capsys, monkeypatch):
    arith, _ = models
    (tmp_path / "file").write_text("x")
    msg = one_error(capsys, cli(tmp_path, arith, f"job.output_root={tmp_path / 'file'}"), code=2)
    assert msg.startswith("posttrain: error: job.output_root: cannot create the run directory")
    monkeypatch.setattr(run_lock.os, "access", lambda path, mode: False)  # root ignores modes
    with pytest.raises(ConfigError, match="is not writable"):
        run_lock.prepare_run_dir(tmp_path / "ro")


def test_diverging_run_takes_the_nonfinite_path(tmp_path, models, capsys):
    argv = cli(tmp_path, models[0], "rl.lr=1e20", "rl.max_steps=10")
    with pytest.warns(UserWarning, match="non-finite") as record:
        assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "NonFiniteTrainingError: stopping at optimizer step" in err[-1], err
    assert "lower the learning rate" in err[-1] and "Traceback" not in "\n".join(err)
    texts = [str(w.message) for w in record if "non-finite" in str(w.message)]
    warned = [int(x.split("optimizer step ")[1].split(":")[0]) for x in texts]
    rows = (tmp_path / "out/grpo/arithmetic_clipped/metrics.jsonl").read_text().splitlines()
    skipped = [r["step"] for r in map(json.loads, rows) if r.get("train/skipped_nonfinite")]
    assert skipped and warned[: len(skipped)] == skipped  # numbered like metrics.jsonl


def exiting_reward(prompt, completion, answer, meta):
    sys.exit(0)


def test_reward_function_calling_sys_exit_is_not_success(tmp_path, models, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    argv = cli(tmp_path, models[0], "reward.functions=[test_user_errors:exiting_reward]")
    assert "called sys.exit(0)" in one_error(capsys, argv)


def test_debug_shows_the_traceback(tmp_path, models, capsys, monkeypatch):
    argv = cli(tmp_path, models[0], f"model.tokenizer_path={tmp_path / 'none'}")
    assert main(["--debug", *argv]) == 1
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("POSTTRAIN_DEBUG", "1")
    assert main(argv) == 1
    assert "Traceback" in capsys.readouterr().err


def test_one_line_cuts_the_middle_and_flattens():
    assert one_line("a\nb  c") == "a b c"
    assert one_line("a" * 500 + "b" * 500 + "c" * 500, limit=30) == (
        "a" * 20 + " ... [1470 characters cut] ... " + "c" * 10
    )


@pytest.mark.parametrize(("mode", "kept"), [("left", "1" * 57 + "+2="), ("right", "1" * 60)])
def test_long_prompts_are_cut_when_the_config_says_so(tmp_path, models, mode, kept, caplog):
    argv = jsonl(
        tmp_path,
        models[0],
        json.dumps({"question": "1" * 200 + "+2=", "answer": "#### 3"}).encode(),
    )
    config = load_config("arithmetic_clipped", ["--", *argv[4:], f"data.prompt_truncation={mode}"])
    tasks = check_inputs(config, load_tasks(config))
    assert tasks.item_at(0, 0).prompt == kept  # 61 tokens: <bos> and 60 characters
    assert "1 prompts were longer than the 61 tokens" in caplog.text


def test_failing_environment_is_one_line(capsys):
    """An environment that fails on an item is the user's error: one line, exit 1."""
    from posttrain.env.base import EnvironmentFailedError
    from posttrain.run.guard import EXIT_RUN_ERROR, run_guarded

    def fail() -> int:
        raise EnvironmentFailedError("environment 'mine:make' failed on item 3, turn 2: bad")

    assert run_guarded(fail) == EXIT_RUN_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "posttrain: error: EnvironmentFailedError: environment 'mine:make' failed on item 3, turn 2: bad"
    ]


def test_a_kept_list_of_choices_keeps_the_space_before_it():
    from posttrain.run.guard import one_line

    choices = "choices: a, b, c"
    assert one_line("no such thing; " + choices, keep=choices) == "no such thing; " + choices
    cut = one_line("x" * 900 + " " + choices, limit=60, keep=choices)
    assert cut.endswith(" " + choices) and "characters cut" in cut


def test_warnings_are_named_by_who_raised_them():
    """transformers' deprecation notices printed as `posttrain: warning:` and read as a problem
    with the run; posttrain's own keep that prefix, a library's carry the library's name."""
    import warnings

    import transformers

    import posttrain.run.guard as guard

    library = str(Path(transformers.__file__).parent / "modeling_utils.py")

    lines = []

    def warn() -> int:  # the one-line form run_guarded installs (pytest records the warnings)
        for args in [("checkpoint x: moved aside", UserWarning, guard.__file__, 10),
                     ("`torch_dtype` is deprecated! Use `dtype` instead!", FutureWarning,
                      library, 20),
                     ("old API", FutureWarning, guard.__file__, 30)]:  # fmt: skip
            lines.append(warnings.formatwarning(*args))
        return 0

    assert guard.run_guarded(warn) == 0
    origin = Path(transformers.__file__).parent.name
    assert lines == [
        "posttrain: warning: checkpoint x: moved aside\n",
        f"{origin}: FutureWarning: `torch_dtype` is deprecated! Use `dtype` instead!\n",
        "a library called from guard.py:30: FutureWarning: old API\n",
    ]
    assert origin == "transformers"
