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
#: Exit status for another user error (a reward function that raises, a bad data row, ...).
EXIT_RUN_ERROR = 1


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


def dpo(args: argparse.Namespace, overrides: list[str]) -> int:
    from posttrain.entrypoints.dpo_cli import dispatch

    return dispatch(args, overrides)


def _add_dpo(sub: argparse._SubParsersAction) -> None:
    from posttrain.entrypoints.dpo_cli import add_arguments

    p = sub.add_parser("dpo", help="Diffusion DPO on preference pairs; tools: pretrain, make-pairs")
    add_arguments(p)
    p.set_defaults(handler=dpo)


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
    _add_dpo,
    _add_grpo,
    _add_model,
    _add_plot,
]


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by input a user controls: reported in one line, never with a traceback."""
    from posttrain.data.tasks import TaskDataError
    from posttrain.placement.errors import RoleFailedError
    from posttrain.reward import RewardError
    from posttrain.trainer import TrainerError

    return (RewardError, TaskDataError, TrainerError, RoleFailedError, FileNotFoundError)


def run_guarded(fn: Callable[[], int]) -> int:
    """Run ``fn``; a config error exits 2, another user error exits 1, each as one line."""
    try:
        return fn()
    except ConfigError as e:
        print(f"posttrain: error: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except user_errors() as e:
        print(f"posttrain: error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_RUN_ERROR


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
    return run_guarded(lambda: args.handler(args, overrides))


if __name__ == "__main__":
    sys.exit(main())
