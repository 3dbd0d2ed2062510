"""Arguments of ``posttrain dpo`` (train) and its tools ``pretrain`` and ``make-pairs``.

Only argparse here: the heavy modules load when a command runs, so building the ``posttrain``
parser stays cheap.
"""

from __future__ import annotations

import argparse

COLORS = ("red", "green", "blue", "yellow", "cyan", "magenta")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` for training, plus the ``pretrain`` and ``make-pairs`` tools."""
    parser.add_argument("--config", metavar="RECIPE",
                        help="recipe .py file, saved .yaml/.json config, or built-in recipe name")  # fmt: skip
    sub = parser.add_subparsers(dest="tool", metavar="TOOL")
    p = sub.add_parser("pretrain", help="train a tiny base UNet on the built-in shapes domain")
    p.add_argument("--out", required=True, help="model folder to write (DDPMPipeline layout)")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--ema-decay", type=float, default=0.995,
                   help="decay of the weight average that is saved (warmed up from 0.1)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("make-pairs", help="sample from a model, score, write preference pairs")
    m.add_argument("--model", required=True, help="model folder (DDPMPipeline layout)")
    m.add_argument("--out", required=True, help="directory for images/ and pairs.jsonl")
    m.add_argument("--pairs-per-class", type=int, default=64)
    m.add_argument("--candidates", type=int, default=4, help="samples per group (best vs worst)")
    m.add_argument("--target-color", default="red", choices=COLORS)
    m.add_argument("--sample-steps", type=int, default=25, help="DDIM steps per sample")
    m.add_argument("--eta", type=float, default=1.0,
                   help="DDIM eta: 0 deterministic, 1 DDPM-like noise per step")  # fmt: skip
    m.add_argument("--valid-only", action="store_true",
                   help="pair only candidates the validity detector accepts")  # fmt: skip
    m.add_argument("--seed", type=int, default=1)


def dispatch(args: argparse.Namespace, overrides: list[str]) -> int:
    """Run the tool named on the command line, else train with ``--config``."""
    from posttrain.config import ConfigError

    if args.tool is not None:
        if args.config or overrides:
            raise ConfigError(f"posttrain dpo {args.tool} takes no --config or overrides")
        from posttrain.entrypoints import dpo_tools

        return {"pretrain": dpo_tools.pretrain, "make-pairs": dpo_tools.make_pairs}[args.tool](args)
    if not args.config:
        raise ConfigError("posttrain dpo needs --config RECIPE (or a tool: pretrain, make-pairs)")
    from posttrain.entrypoints.dpo import train_from_cli

    return train_from_cli(args.config, overrides)
