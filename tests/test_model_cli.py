import argparse

import torch

from posttrain.entrypoints.cli import main as posttrain_main
from posttrain.model.cli import add_subcommands, dispatch, main
from posttrain.model.loading import load_policy


def test_tiny_subcommand_writes_a_loadable_folder(tmp_path, capsys):
    assert main(["tiny", "--preset", "tiny", "--out", str(tmp_path / "m"), "--seed", "5"]) == 0
    assert "101,856 parameters, seed 5" in capsys.readouterr().out
    model, tok = load_policy(tmp_path / "m")
    assert tok.decode(tok("12+7=")["input_ids"], skip_special_tokens=True) == "12+7="
    assert isinstance(model.model.embed_tokens.weight, torch.Tensor)


def test_subcommands_attach_to_another_parser(tmp_path):
    parser = argparse.ArgumentParser(prog="posttrain")
    model_cmd = parser.add_subparsers(dest="cmd").add_parser("model")
    add_subcommands(model_cmd.add_subparsers(dest="model_command", required=True))
    args = parser.parse_args(["model", "tiny", "--preset", "tiny", "--out", str(tmp_path)])
    assert dispatch(args) == 0
    assert (tmp_path / "config.json").is_file()


def test_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["import-gguf", "--out", str(tmp_path), "--gguf", str(tmp_path / "no.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posttrain: error: GGUF file") and err.count("\n") == 1
    assert posttrain_main(["model", "tiny", "--preset", "huge", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "posttrain: error: unknown tiny-model preset 'huge'; choose one of "
        "['arith', 'arith_h32', 'arith_tools', 'small', 'tiny', 'tiny_tools']\n"
    )


def test_tiny_help_lists_every_preset_of_the_registry(capsys):
    import pytest

    from posttrain.model.presets import PRESETS

    with pytest.raises(SystemExit):
        posttrain_main(["model", "tiny", "--help"])
    listed = " ".join(capsys.readouterr().out.split())  # argparse wraps the line
    assert f"a preset of posttrain.model.presets: {', '.join(PRESETS)}" in listed
    assert "arith_tools" in listed and "tiny_tools" in listed
