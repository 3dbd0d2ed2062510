"""The progress reporter every entry uses: a bar on a terminal only, plain lines elsewhere."""

from __future__ import annotations

import io
import logging

from posttrain.config import load_config
from posttrain.run.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def config(*opts: str):
    return load_config("arithmetic", ["--", "rl.max_steps=5", "job.name=p", *opts])


def drive(progress: Progress) -> None:
    for step in range(1, 6):
        progress.advance(step, {"train/reward_mean": 0.5, "time/step_s": 0.25})
    progress.close()


def test_a_file_gets_a_plain_line_at_the_first_step_every_log_every_steps_and_at_the_end(caplog):
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="posttrain"):
        drive(Progress(config("logging.log_every=2"), 0, {"reward": "train/reward_mean"}, stream))
    assert stream.getvalue() == ""  # no bar frames
    assert caplog.messages == [
        "p step 1/5 reward 0.5 step_s 0.25",  # a slow first step is not minutes of silence
        "p step 2/5 reward 0.5 step_s 0.25",
        "p step 4/5 reward 0.5 step_s 0.25",
        "p step 5/5 reward 0.5 step_s 0.25",
    ]


def test_progress_false_on_a_terminal_is_plain_lines_too_and_log_every_0_is_silent(caplog):
    with caplog.at_level(logging.INFO, logger="posttrain"):
        stream = Terminal()
        drive(Progress(config("logging.progress=false", "logging.log_every=5"), 0, {}, stream))
        assert stream.getvalue() == ""
        assert caplog.messages == ["p step 1/5 step_s 0.25", "p step 5/5 step_s 0.25"]
        drive(Progress(config("logging.progress=false", "logging.log_every=0"), 0, {}, stream))
    assert len(caplog.messages) == 2


def test_a_resumed_run_logs_its_own_first_step(caplog):
    with caplog.at_level(logging.INFO, logger="posttrain"):
        progress = Progress(config("logging.log_every=10"), 3, {}, io.StringIO())
        for step in (4, 5):
            progress.advance(step, {"time/step_s": 0.25})
    assert caplog.messages == ["p step 4/5 step_s 0.25", "p step 5/5 step_s 0.25"]


def test_a_terminal_gets_the_bar(caplog):
    stream = Terminal()
    with caplog.at_level(logging.INFO, logger="posttrain"):
        drive(Progress(config(), 2, {"reward": "train/reward_mean"}, stream))
    assert "\r" in stream.getvalue() and "reward=0.5" in stream.getvalue()
    assert caplog.messages == []
