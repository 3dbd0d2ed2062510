"""Tool-call demonstrations for SFT on the calculator_mix train problems (the RL cold start).

SmolLM2-135M-Instruct never writes a ``<tool_call>`` for the ``smollm2_calculator`` recipe, so
GRPO with the calculator has no signal (docs/guides/tools.md). A demonstration is what that
recipe's environment would render for one train problem if the policy called the tool at once
and copied its result:

* the environment's opening messages (``CalculatorEnv.reset``: the system message with the
  fallback tool description, the worked example, the question);
* the assistant's ``<tool_call>{"name": "calculator", "arguments": {"expression": ...}}</tool_call>``
  with the problem's expression;
* the environment's own answer to that turn (``CalculatorEnv.step``: the user turn
  ``<tool_response>VALUE</tool_response>``, from the real calculator);
* the assistant's answer ``EXPR = VALUE``, which the recipe's ``last_number`` verifier reads.

The worked example's two assistant turns carry ``"weight": 0`` (context, as in a rollout, where
they are part of the prompt), so the loss covers exactly the tokens a rollout's policy samples.
Rows come from ``train.jsonl`` only (its problems are disjoint from the held-out ``val.jsonl``)::

    python -m posttrain.data.tasks.calculator_demos examples/smollm2_calculator

writes ``sft_train.jsonl`` (the first :data:`TRAIN_ROWS` train problems) and ``sft_val.jsonl``
(the next :data:`VAL_ROWS`, for the held-out loss) beside the problem files.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.env.tools import CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN

#: Demonstrations for training and for the held-out loss (train problems, in file order).
TRAIN_ROWS, VAL_ROWS = 320, 32


def expression_of(question: str) -> str:
    """``Calculate EXPR.`` -> ``EXPR``."""
    return question.removeprefix("Calculate ").removesuffix(".")


def demonstration(env: Any, problem: dict[str, str]) -> dict[str, Any]:
    """One SFT row for a calculator_mix ``problem`` (``question``/``answer``), through ``env``
    (the recipe's environment) so the context is byte for byte what a rollout sees."""
    question = problem["question"]
    expr = expression_of(question)
    opening = env.reset({"prompt": question})
    args = {"name": "calculator", "arguments": {"expression": expr}}
    call = {"role": "assistant", "content": f"{CALL_OPEN}{json.dumps(args)}{CALL_CLOSE}"}
    step = env.step([*opening, call])
    reply = step.messages[0]["content"] if len(step.messages) == 1 else None
    if step.done or step.info.get("tool_errors") or reply is None:
        raise ValueError(f"the calculator did not answer the call for {question!r}: {step}")
    value = reply.removeprefix(RESPONSE_OPEN).removesuffix(RESPONSE_CLOSE)
    gold = problem["answer"].rsplit("####", 1)[-1].strip()
    if value != gold:
        raise ValueError(f"{question!r}: the calculator says {value}, the gold answer is {gold}")
    answer = {"role": "assistant", "content": f"{expr} = {value}"}
    # the worked example's turns are the rollout's prompt: context, not trained
    context = [{**m, "weight": 0} if m["role"] == "assistant" else m for m in opening]
    return {"messages": [*context, call, *step.messages, answer]}


def demonstrations(env: Any, problems: Sequence[dict[str, str]]) -> list[dict[str, Any]]:
    return [demonstration(env, p) for p in problems]


def read_problems(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def write_demonstrations(
    data_dir: Path, *, train_rows: int = TRAIN_ROWS, val_rows: int = VAL_ROWS, env: Any = None
) -> None:
    """``sft_train.jsonl`` and ``sft_val.jsonl`` under ``data_dir`` from its ``train.jsonl``;
    refuses if any of them is a held-out (``val.jsonl``) problem."""
    if env is None:
        from posttrain.configs.smollm2_calculator import calculator_environment

        env = calculator_environment()
    problems = read_problems(data_dir / "train.jsonl")
    if train_rows + val_rows > len(problems):
        raise ValueError(f"{data_dir / 'train.jsonl'} has {len(problems)} problems, asked for "
                         f"{train_rows} + {val_rows}")  # fmt: skip
    chosen = problems[: train_rows + val_rows]
    held = {p["question"] for p in read_problems(data_dir / "val.jsonl")}
    leaked = [p["question"] for p in chosen if p["question"] in held]
    if leaked:
        raise ValueError(f"held-out problems in {data_dir / 'train.jsonl'}: {leaked[:3]}")
    rows = demonstrations(env, chosen)
    for name, part in (
        ("sft_train.jsonl", rows[:train_rows]),
        ("sft_val.jsonl", rows[train_rows:]),
    ):
        text = "".join(json.dumps(r) + "\n" for r in part)
        (data_dir / name).write_text(text, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path, help="holds train.jsonl and val.jsonl")
    parser.add_argument("--train-rows", type=int, default=TRAIN_ROWS)
    parser.add_argument("--val-rows", type=int, default=VAL_ROWS)
    args = parser.parse_args(argv)
    write_demonstrations(args.data_dir, train_rows=args.train_rows, val_rows=args.val_rows)


if __name__ == "__main__":
    main()
