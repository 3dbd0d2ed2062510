"""The run session: everything between a command line and an entry's loop body, once.

An entry (``entrypoints/registry.py``) is a small spec: the settings it pins, its own refusals,
how it places its roles and what one step does. The session owns the rest, the same way for every
entry::

    resolve the config (once per process) -> entry checks -> preflight (once)
    -> run directory + lock -> admission (collisions, resume, records; run/admission.py)
    -> place roles -> resume -> config.yaml, inputs.json -> sinks
    -> [held-out evaluation at step 0] -> steps (eval / save timing, progress, signals)

so a signal, a collision or a truncated history is handled identically by all entries.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from posttrain.config import PosttrainConfig, load_config, to_dict
from posttrain.config.overrides import apply_overrides
from posttrain.control import run_preflight
from posttrain.metrics import open_sinks
from posttrain.metrics.sinks import METRICS_FILE, read_metrics
from posttrain.run.lock import RunLock, prepare_run_dir
from posttrain.run.progress import Progress
from posttrain.run.records import default_out_dir, refuse_driver_edits, write_resolved_config
from posttrain.run.signals import GracefulStop

if TYPE_CHECKING:
    from posttrain.trainer.checkpoint import ResumeState

log = logging.getLogger("posttrain")


def _no_check(config: PosttrainConfig) -> None:
    return None


@dataclass(frozen=True)
class EntrySpec:
    """What an entry declares. ``pinned_opts`` are appended after the user's overrides (every
    role re-resolves them too); ``check`` refuses a resolved config that belongs to another
    entry, before preflight and before anything touches the run directory."""

    name: str
    pinned_opts: tuple[str, ...] = ()
    check: Callable[[PosttrainConfig], None] = _no_check


def entry_spec(name: str) -> EntrySpec:
    """The session's spec of registered entry ``name``: its pinned label (appended after the
    user's overrides) and the check that refuses another entry's config."""
    from posttrain.control.entries import check_entry
    from posttrain.entrypoints.registry import entry

    pinned = entry(name).pinned_label
    return EntrySpec(
        name,
        (f"job.algorithm={pinned}",) if pinned else (),
        functools.partial(check_entry, name=name),
    )


class Placed(Protocol):
    """The roles an entry placed; the session needs the policy's resume and save."""

    policy: Any

    def close(self) -> None: ...


class LoopBody(Protocol):
    """One entry's step. ``evaluates``: whether held-out evaluation runs at all; ``evaluation``:
    what one runs on, for the line announcing it (``"20 held-out problems"``); ``shown``:
    progress label -> metric; ``data_state()``: what a checkpoint saved now records."""

    evaluates: bool
    evaluation: str
    shown: Mapping[str, str]

    def step(self, step: int) -> dict[str, Any]: ...
    def evaluate(self, step: int) -> dict[str, float]: ...
    def data_state(self) -> dict[str, Any]: ...


class RunSession:
    """One run of one entry in this process. ``config``, when given, is a caller's own resolved
    copy: it must equal what ``config_path`` + ``opts`` resolve to (roles in other processes
    rebuild the config from those), or it is refused."""

    def __init__(
        self,
        spec: EntrySpec,
        config_path: str,
        opts: Sequence[str],
        config: PosttrainConfig | None = None,
    ) -> None:
        self.spec, self.config_path = spec, config_path
        self.opts = [*opts, *spec.pinned_opts]  # what every role re-resolves
        resolved = load_config(config_path, ["--", *opts])
        if config is not None:
            refuse_driver_edits(config, resolved)
        spec.check(resolved)  # on the user's config: the pins below would mask another entry's
        self.config = apply_overrides(resolved, spec.pinned_opts)
        for message in run_preflight(self.config):
            log.warning("preflight: %s", message)

    def default_out_dir(self) -> Path:
        return default_out_dir(self.config)

    def run(
        self,
        out_dir: str | Path,
        place: Callable[[Path], Placed],
        body: Callable[[Placed, ResumeState | None, Path], LoopBody],
    ) -> dict[str, Any]:
        """Admit, place (``place(run_dir)``), resume, then run ``body(placed, state, run_dir)``'s
        steps; returns the summary ``report`` prints."""
        from posttrain.run.admission import admit, record_inputs  # torch: after the config checks

        run_dir = prepare_run_dir(out_dir)
        with RunLock(run_dir):  # one writer per run directory
            admission = admit(self.config, run_dir)
            if admission.complete:  # an export the earlier run did not finish is made now
                done = _summary(run_dir, admission.start, complete=True)
                return self._export(done, admission.checkpoint, run_dir, admission.start)
            placed = place(run_dir)
            try:
                state = placed.policy.resume()
                if state is not None:
                    log.info("resuming from step %d (checkpoint %s)", state.step, state.path)
                steps = body(placed, state, run_dir)  # may refuse the resumed state too
                # Written only once resume has accepted this config: a refused run leaves the
                # old record intact.
                write_resolved_config(self.config, run_dir)
                if state is None:
                    record_inputs(self.config, run_dir)
                summary = self._steps(placed, state, steps, run_dir)
            finally:
                placed.close()  # before the export: the roles' memory is free again
            return self._export(summary, summary.pop("checkpoint"), run_dir)

    def _export(self, summary: dict, checkpoint, run_dir: Path, current: int | None = None):
        """``checkpoint.export_final``: the final checkpoint as ``run_dir/final_model``
        (``current``: a finished run's step, whose export is redone only if missing or older)."""
        if not self.config.checkpoint.export_final or checkpoint is None:
            return summary
        from posttrain.run.records import FINAL_DIR
        from posttrain.trainer.export import export_final, exported_step

        if current is None or exported_step(run_dir / FINAL_DIR) != current:
            log.info("exporting %s to %s", checkpoint, run_dir / FINAL_DIR)
            export_final(checkpoint, run_dir)
        summary["final_model"] = str(run_dir / FINAL_DIR)
        return summary

    def _steps(self, placed: Placed, state, body: LoopBody, run_dir: Path) -> dict[str, Any]:
        config = self.config
        job, rl, lg = config.job, config.rl, config.logging
        start = state.step if state else 0
        evaluates = bool(rl.eval_every) and body.evaluates
        sink = open_sinks(
            run_dir, resume_step=start if state else None, tensorboard=lg.tensorboard,
            wandb=lg.wandb, wandb_project=lg.wandb_project, wandb_mode=lg.wandb_mode,
            run_name=job.name, config=to_dict(config),
        )  # fmt: skip
        summary = _summary(run_dir, start)
        saved = None
        try:
            if evaluates and start == 0:  # announced: on a large model it takes minutes
                log.info("evaluating on %s before training...", body.evaluation)
                summary["initial"] = first = body.evaluate(0)
                sink.write(0, first)
            elif evaluates:  # resumed: the evaluation before training is in the history
                summary.update(_initial_from_history(run_dir))
            progress = Progress(config, start, body.shown)
            began = time.perf_counter()
            stop = GracefulStop(
                config.checkpoint.save_on_signal,
                state.path if state else None,
                grace_s=config.checkpoint.signal_grace_s,
            )
            stop.install()
            try:
                for step in range(start + 1, rl.max_steps + 1):
                    record = body.step(step)
                    if evaluates and (step % rl.eval_every == 0 or step == rl.max_steps):
                        if step == rl.max_steps:
                            log.info("evaluating on %s after training...", body.evaluation)
                        summary["final"] = final = body.evaluate(step)
                        record.update(final)
                    sink.write(step, record)

                    def save(step: int = step) -> str:
                        return placed.policy.save(step, body.data_state())

                    due = (rl.save_every and step % rl.save_every == 0) or step == rl.max_steps
                    saved = save() if due else None
                    progress.advance(step, record)
                    stop.after_step(step, saved, save)  # a signal stops here, after a checkpoint
            finally:
                stop.uninstall()
                progress.close()
        finally:
            sink.close()
        summary["steps"] = rl.max_steps
        summary["wall_s"] = time.perf_counter() - began
        summary["checkpoint"] = saved  # the final step's (rl.max_steps always saves)
        return summary


def _initial_from_history(run_dir: Path) -> dict[str, Any]:
    """``{"initial": step 0's held-out metrics}`` from ``metrics.jsonl`` (empty when the run
    has no step-0 evaluation there), so a resumed run's summary still says where it began."""
    for record in read_metrics(run_dir / METRICS_FILE):
        if record["step"] == 0:
            held_out = {k: v for k, v in record.items() if k.startswith("val/")}
            return {"initial": held_out} if held_out else {}
    return {}


def _summary(run_dir: Path, start: int, complete: bool = False) -> dict[str, Any]:
    return {"run_dir": str(run_dir), "start_step": start, "steps": start, "wall_s": 0.0,
            "complete": complete}  # fmt: skip


def report_lines(summary: Mapping[str, Any]) -> list[str]:
    """The first lines a finished command prints: where it wrote and what it did."""
    lines = [f"run directory: {summary['run_dir']}"]
    if summary["complete"]:
        lines.append(
            f"already complete at step {summary['start_step']}: nothing to train (raise "
            "rl.max_steps to continue it, or start a new run under another job.name)"
        )
    else:
        done = summary["steps"] - summary["start_step"]
        lines.append(f"trained {done} steps in {summary['wall_s']:.0f} s")
    if "final_model" in summary:
        lines.append(f"final model (Hugging Face folder): {summary['final_model']}")
    return lines


__all__ = ["EntrySpec", "LoopBody", "Placed", "RunSession", "entry_spec", "report_lines"]
