"""The ``posttrain`` command line.

Each subcommand registers itself with ``add_parser`` and a handler
``handler(args, overrides) -> int``; the override list is everything after the first ``--``.
Adding a command is a few lines::

    def _add_grpo(sub):
        p = sub.add_parser("grpo", help="train with GRPO")
        p.add_argument("--config", required=True)
        p.set_defaults(handler=run_grpo)   # run_grpo(args, overrides) -> int

and appending ``_add_grpo`` to :data:`COMMANDS`.

User errors from any handler print one line to stderr and exit non-zero without a traceback
(see :mod:`posttrain.entrypoints.guard`); ``posttrain --debug ...`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from posttrain.config import load_config, to_yaml
from posttrain.control import run_preflight
from posttrain.entrypoints.guard import EXIT_CONFIG_ERROR, EXIT_RUN_ERROR, run_guarded

__all__ = ["EXIT_CONFIG_ERROR", "EXIT_RUN_ERROR", "build_parser", "main", "run_guarded"]


def config_show(args: argparse.Namespace, overrides: list[str]) -> int:
    """Print the resolved config as YAML (stdout) and preflight warnings (stderr)."""
    config = load_config(args.config, ["--", *overrides])
    warnings = run_preflight(config)
    sys.stdout.write(to_yaml(config))
    for message in warnings:
        print(f"warning: {message}", file=sys.stderr)
    return 0


def _add_config(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("config", help="inspect configurations")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser(
        "show",
        help="print the resolved config and preflight warnings; builds no model",
        description="Resolve RECIPE plus the overrides after `--`, run preflight, print YAML.",
    )
    show.add_argument(
        "--config",
        required=True,
        metavar="RECIPE",
        help="recipe .py file, saved .yaml/.json config, or built-in recipe name",
    )
    show.set_defaults(handler=config_show)


def grpo_train(args: argparse.Namespace, overrides: list[str]) -> int:
    from posttrain.entrypoints.grpo import train_from_cli

    return train_from_cli(args.config, overrides)


def _add_grpo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grpo", help="train with a GRPO-family objective")
    p.add_argument("--config", required=True, metavar="RECIPE",
                   help="recipe .py file, saved .yaml/.json config, or built-in recipe name")  # fmt: skip
    p.set_defaults(handler=grpo_train)


def plot(args: argparse.Namespace, overrides: list[str]) -> int:
    from posttrain.metrics.plot import plot_run

    print(plot_run(args.run_dir, args.out))
    return 0


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="render reward, accuracy and loss curves of a run to PNG")
    p.add_argument("run_dir", metavar="OUT_DIR", help="a run directory (holds metrics.jsonl)")
    p.add_argument("--out", default=None, help="PNG path (default OUT_DIR/curves.png)")
    p.set_defaults(handler=plot)


def _add_model(sub: argparse._SubParsersAction) -> None:
    from posttrain.model.cli import add_subcommands, dispatch

    p = sub.add_parser("model", help="build a tiny model or import SmolLM2 from GGUF")
    add_subcommands(p.add_subparsers(dest="model_command", required=True, metavar="ACTION"))
    p.set_defaults(handler=lambda args, overrides: dispatch(args))


#: Subcommand registrars, in help order.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_config,
    _add_grpo,
    _add_model,
    _add_plot,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain",
        description="RL post-training. Config overrides follow `--` as section.key=value.",
        epilog="example: posttrain config show --config arithmetic -- rl.max_steps=10",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a user error (or set POSTTRAIN_DEBUG=1)")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    return parser


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(arguments before the first ``--``, overrides after it)."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    args_part, overrides = split_argv(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(args_part)
    return run_guarded(lambda: args.handler(args, overrides), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
