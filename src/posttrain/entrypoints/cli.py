"""The ``posttrain`` command line.

Each subcommand registers itself with ``add_parser`` and a handler
``handler(args, overrides) -> int``; the override list is everything after the first ``--``.
Adding a command is a few lines::

    def _add_plot(sub):
        p = sub.add_parser("plot", help="plot runs' curves")
        p.add_argument("runs", nargs="+")
        p.set_defaults(handler=plot)   # plot(args, overrides) -> int

and appending ``_add_plot`` to :data:`COMMANDS`. The training entries are not written here: each
is a row of the entry registry (``entrypoints/registry.py``), from which its subcommand, help and
recipe listing are made.

User errors from any handler print one line to stderr and exit non-zero without a traceback
(:mod:`posttrain.run.guard`); ``--debug``, before or after the subcommand, shows it. Handlers
import what they need when they run, so ``posttrain --help`` answers without loading torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from posttrain import __version__
from posttrain.run.guard import EXIT_CONFIG_ERROR, EXIT_RUN_ERROR, run_guarded

__all__ = ["EXIT_CONFIG_ERROR", "EXIT_RUN_ERROR", "build_parser", "main", "run_guarded"]


def config_show(args: argparse.Namespace, overrides: list[str]) -> int:
    """Print the resolved config as YAML (stdout) and preflight warnings (stderr), after the
    same config and data checks a run makes before it loads a model."""
    from posttrain.config import load_config, to_yaml
    from posttrain.config.schema import objective_family
    from posttrain.control import run_preflight
    from posttrain.control.data_checks import check_data
    from posttrain.control.entries import refuse_unread_overrides
    from posttrain.entrypoints.registry import entry

    if args.objective:  # as the training entries record it
        overrides = [*overrides, f"rl.objective_builder={args.objective}"]
    config = load_config(args.config, ["--", *overrides])
    warnings = run_preflight(config)
    refuse_unread_overrides(overrides, config)  # what its entry refuses on its command line
    check_data(config)
    if config.env.name:  # the template and the opening prompt, with the tokenizer only
        from posttrain.control.data_checks import build_tasks
        from posttrain.control.env_inputs import check_environment_inputs

        check_environment_inputs(config, build_tasks(config))
    sys.stdout.write(to_yaml(config))
    if entry(objective_family(config)).memory_report:  # comment lines: the output loads as YAML
        from posttrain.control.memory import report

        print("\n".join(report(config)))
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
    _add_config_argument(show)
    _add_objective_argument(show)
    show.set_defaults(handler=config_show)


def recipes_of(entry: str) -> list[tuple[str, str]]:
    """(name, first docstring line) of the built-in recipes that ``posttrain <entry>`` trains
    (``entry`` is the recipe's ``objective_family``)."""
    from posttrain.config.loader import builtin_recipes, load_base, recipe_summary
    from posttrain.config.schema import objective_family  # torch-free, unlike posttrain.control

    return [
        (name, recipe_summary(name))
        for name in builtin_recipes()
        if objective_family(load_base(name)) == entry
    ]


def _recipes_epilog(entry: str) -> str:
    """The help text after an entry's arguments: its recipes (built when help is printed)."""
    recipes = recipes_of(entry)
    lines = [f"  {name:24s} {doc}" for name, doc in recipes]
    return (
        f"built-in {entry} recipes (or a recipe .py file, or a saved config.yaml):\n"
        + "\n".join(lines)
        + "\n\nconfig overrides follow `--` as section.key=value (`section.key=@default` resets one):"
        f"\n  posttrain {entry} --config {recipes[0][0]} -- rl.max_steps=200"
    )


def _add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        required=True,
        metavar="RECIPE",
        help="built-in recipe name (listed below), recipe .py file, or saved .yaml/.json config",
    )


def _add_objective_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--objective",
        metavar="MODULE:FUNCTION",
        default=None,
        help="your objective builder, build(rl, context) -> Objective, imported by name "
        "(the working directory is importable); sets rl.objective_builder, recorded in "
        "config.yaml; default: the entry's built-in objective",
    )


def _train(name: str) -> Callable[[argparse.Namespace, list[str]], int]:
    """The handler of entry ``name`` (``posttrain.entrypoints.<name>``), imported when run."""

    def handler(args: argparse.Namespace, overrides: list[str]) -> int:
        from posttrain.entrypoints.registry import entry, load

        e = entry(name)
        if e.cli:
            return load(e.cli).dispatch(args, overrides)
        objective = (args.objective,) if e.objective_flag else ()
        return load(e.module).train_from_cli(args.config, overrides, *objective)

    return handler


def _add_entry(sub: argparse._SubParsersAction, e) -> None:
    """``posttrain <entry>`` from its registry row: ``--config`` (and ``--objective``), or the
    arguments of its own ``cli`` module; the epilog lists its recipes."""
    p = sub.add_parser(
        e.name, help=e.help, description=e.description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.epilog_of = lambda: _recipes_epilog(e.name)
    if e.cli:
        from posttrain.entrypoints.registry import load

        load(e.cli).add_arguments(p)
    else:
        _add_config_argument(p)
        if e.objective_flag:
            _add_objective_argument(p)
    p.set_defaults(handler=_train(e.name))


def _add_entries(sub: argparse._SubParsersAction) -> None:
    """Every training entry of the registry (``entrypoints/registry.py``), in its order."""
    from posttrain.entrypoints.registry import ENTRIES

    for e in ENTRIES:
        _add_entry(sub, e)


def _add_rft(sub: argparse._SubParsersAction) -> None:
    """``posttrain rft``: not a training entry (it trains nothing and takes a GRPO or OPD
    recipe), so a command of its own beside them (``entrypoints/rft.py``)."""
    from posttrain.entrypoints.rft import add_arguments

    p = sub.add_parser(
        "rft",
        help="sample n answers per train prompt, score them, write SFT rows and DPO pairs",
        description="Rejection sampling: sample rollout.n answers to each train prompt of an "
        "online recipe with its rollout engine, score them with its reward stage, and write "
        "the correct ones as rows `posttrain sft` reads (sft.jsonl) and correct-vs-incorrect "
        "pairs `posttrain lmdpo` reads (pairs.jsonl), with summary.json (docs/guides/rft.md).",
        epilog="example: posttrain rft --config arithmetic_clipped --per-prompt 2 -- rollout.n=8",
    )
    add_arguments(p)
    p.set_defaults(handler=_rft)


def _rft(args: argparse.Namespace, overrides: list[str]) -> int:
    from posttrain.entrypoints.rft import dispatch

    return dispatch(args, overrides)


def plot(args: argparse.Namespace, overrides: list[str]) -> int:
    from posttrain.metrics.plot import plot_runs

    metrics = [m.strip() for arg in args.metrics or () for m in arg.split(",") if m.strip()]

    def note(line: str) -> None:
        print(f"posttrain plot: {line}", file=sys.stderr)

    print(plot_runs(args.runs, args.out, metrics=metrics, smooth=args.smooth, note=note))
    return 0


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="plot runs' curves (overlaid, with a legend) to PNG",
        description="Default panels: reward, held-out accuracy and the other val/* metrics, "
        "loss, KL, clip fractions, response length, then the objective's own "
        "train/<namespace>/* metrics; a default series constant over the run is left out "
        "(and named on stderr).",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directory (or its metrics.jsonl)")
    p.add_argument(
        "--metrics",
        action="append",
        metavar="KEYS",
        help="comma-separated metric names or globs over metrics.jsonl keys, e.g. "
        "'val/accuracy,train/pg/*' (repeatable)",
    )
    p.add_argument(
        "--smooth",
        metavar="SPEC",
        help="ema:A (0 <= A < 1, weight on the past) or window:N (mean of the last N points)",
    )
    p.add_argument(
        "--out", help="PNG path (default RUN/curves.png for one run, ./curves.png for several)"
    )
    p.set_defaults(handler=plot)


def _add_model(sub: argparse._SubParsersAction) -> None:
    from posttrain.model.cli import add_subcommands, dispatch

    p = sub.add_parser("model", help="build a tiny model or import SmolLM2 from GGUF")
    add_subcommands(p.add_subparsers(dest="model_command", required=True, metavar="ACTION"))
    p.set_defaults(handler=lambda args, overrides: dispatch(args))


#: Subcommand registrars, in help order.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_config,
    _add_entries,
    _add_rft,
    _add_model,
    _add_plot,
]


class _Parser(argparse.ArgumentParser):
    """argparse, plus ``--debug`` on every (sub)command, a help epilog built only when help is
    printed (``epilog_of``: listing recipes loads them), and a hint when config overrides were
    given without the `--` before them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.epilog_of: Callable[[], str] | None = None
        # SUPPRESS: a subcommand's flag is set only when given, so it never resets the top one
        self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                          help="show the traceback of a user error (or set POSTTRAIN_DEBUG=1)")  # fmt: skip

    def format_help(self) -> str:
        if self.epilog_of is not None:
            self.epilog = self.epilog_of()
        return super().format_help()

    def error(self, message: str):
        if message.startswith("unrecognized arguments") and any(
            "=" in a and "." in a.split("=")[0] for a in message.split(":", 1)[1].split()
        ):
            message += (
                "\nhint: config overrides go after `--`, e.g. "
                "posttrain grpo --config arithmetic_clipped -- rl.max_steps=100"
            )
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="posttrain",
        description="RL post-training. Config overrides follow `--` as section.key=value.",
        epilog="example: posttrain config show --config arithmetic -- rl.max_steps=10",
    )
    parser.set_defaults(debug=False)
    parser.add_argument("--version", action="version", version=f"posttrain {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
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
