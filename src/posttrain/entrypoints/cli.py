"""The ``posttrain`` command line.

Each subcommand registers itself with ``add_parser`` and a handler
``handler(args, overrides) -> int``; the override list is everything after the first ``--``.
Adding a command is a few lines::

    def _add_grpo(sub):
        p = sub.add_parser("grpo", help="train with GRPO")
        p.add_argument("--config", required=True)
        p.set_defaults(handler=run_grpo)   # run_grpo(args, overrides) -> int

and appending ``_add_grpo`` to :data:`COMMANDS`.

A :class:`~posttrain.config.ConfigError` from any handler prints one line to stderr and exits 2,
without a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from posttrain.config import ConfigError, load_config, to_yaml
from posttrain.control import run_preflight

#: Exit status for a user error in the config or the overrides.
EXIT_CONFIG_ERROR = 2


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


#: Subcommand registrars, in help order.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_config]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain",
        description="RL post-training. Config overrides follow `--` as section.key=value.",
        epilog="example: posttrain config show --config arithmetic -- rl.max_steps=10",
    )
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
    try:
        return args.handler(args, overrides)
    except ConfigError as e:
        print(f"posttrain: error: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR


if __name__ == "__main__":
    sys.exit(main())
