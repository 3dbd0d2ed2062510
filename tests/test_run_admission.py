"""What a command does with the run directory it meets (run/admission.py), without a model:
the directories are laid out by hand as a run leaves them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from posttrain.config import load_config, to_dict, to_yaml
from posttrain.run.admission import admit, record_inputs
from posttrain.run.fingerprint import FULL_HASH_LIMIT, fingerprint
from posttrain.trainer.errors import ResumeError
from posttrain.trainer.manifest import write_manifest


def config(*opts: str):
    return load_config("arithmetic", ["--", "rl.max_steps=9", *opts])


def finished_run(tmp: Path, step: int = 9, *opts: str) -> Path:
    """A run directory as a run of ``config(*opts)`` leaves it after ``step`` steps."""
    run = tmp / "run"
    cfg = config(*opts)
    ckpt = run / "checkpoints" / f"step_{step:08d}"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": step, "config": to_dict(cfg)}))
    write_manifest(ckpt, step)  # verifies: a finished run's final checkpoint is checked
    (run / "config.yaml").write_text(to_yaml(cfg))
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in range(step + 1)))
    (run / "samples").mkdir()
    (run / "samples" / "step_000000.jsonl").write_text("{}\n")
    record_inputs(cfg, run)
    return run


def test_fewer_steps_than_done_is_refused_in_one_line(tmp_path):
    run = finished_run(tmp_path)
    with pytest.raises(ResumeError) as e:
        admit(config("rl.max_steps=2"), run)
    msg = str(e.value)
    assert msg.startswith("rl.max_steps=2 is below step 9, where the run in")
    assert "pass rl.max_steps=9 or more" in msg and "another job.name" in msg and "\n" not in msg


def test_the_same_command_after_the_last_step_is_already_complete(tmp_path):
    decision = admit(config(), finished_run(tmp_path))
    assert decision.complete and decision.start == 9


def test_a_longer_run_resumes_from_the_newest_checkpoint(tmp_path):
    run = finished_run(tmp_path)
    decision = admit(config("rl.max_steps=20", "placement.torch_threads_per_process=1"), run)
    assert (decision.start, decision.complete) == (9, False)
    assert decision.checkpoint == run / "checkpoints" / "step_00000009"


def test_a_different_config_over_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(ResumeError, match=r"resolved config differs in \['rl.lr'\]"):
        admit(config("rl.lr=0.5"), finished_run(tmp_path))
    with pytest.raises(ResumeError, match="rl.resume=off but .* already holds checkpoints"):
        admit(config("rl.resume=off"), finished_run(tmp_path / "b"))


def test_records_without_a_checkpoint_restart_the_same_config_and_move_them_aside(tmp_path, caplog):
    run = finished_run(tmp_path)
    old_metrics = (run / "metrics.jsonl").read_text()
    shutil.rmtree(run / "checkpoints")  # the case: checkpoints deleted
    decision = admit(config("rl.max_steps=2"), run)
    assert (decision.start, decision.checkpoint) == (0, None)
    aside = run / ".previous-1"
    assert (aside / "metrics.jsonl").read_text() == old_metrics  # the history is kept
    assert sorted(p.name for p in aside.iterdir()) == [
        "config.yaml", "inputs.json", "metrics.jsonl", "samples",
    ]  # fmt: skip
    assert not (run / "metrics.jsonl").exists() and not (run / "samples").exists()
    assert "starting from step 0, the old records" in caplog.text and str(aside) in caplog.text


def test_records_of_another_config_are_refused_unless_resume_is_off(tmp_path):
    run = finished_run(tmp_path)
    for p in (run / "checkpoints").iterdir():  # killed during the first save
        p.rename(p.with_name(f".tmp-{p.name}"))
        (p.with_name(f".tmp-{p.name}") / "COMPLETE").unlink()
    before = (run / "config.yaml").read_text()
    with pytest.raises(ResumeError) as e:
        admit(config("rl.lr=0.5"), run)
    msg = str(e.value)
    assert "but no checkpoint of a run whose config differs in rl.lr" in msg
    assert "pass rl.resume=off to start over" in msg and "\n" not in msg
    assert (run / "config.yaml").read_text() == before
    with pytest.raises(ResumeError, match="rl.resume=off but .* already holds checkpoints"):
        admit(config("rl.lr=0.5", "rl.resume=off"), run)  # a half-written one counts
    shutil.rmtree(run / "checkpoints")
    assert admit(config("rl.lr=0.5", "rl.resume=off"), run).start == 0  # explicit fresh start
    assert (run / ".previous-1" / "config.yaml").read_text() == before


def test_a_changed_data_file_refuses_resume(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(
        "".join(f'{{"question": "{i}+1?", "answer": "#### {i + 1}"}}\n' for i in range(50))
    )
    opts = ("data.task=jsonl", f"data.train_path={train}", "data.val_path=null",
            "data.digits=@default", "data.train_size=@default", "data.val_size=@default")  # fmt: skip
    run = finished_run(tmp_path, 9, *opts)
    assert admit(config("rl.max_steps=12", *opts), run).start == 9  # unchanged: resumes
    train.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    with pytest.raises(ResumeError) as e:
        admit(config("rl.max_steps=12", *opts), run)
    assert f"data.train_path ({train}) changed (" in str(e.value)
    assert "restore the file to continue the run" in str(e.value)


def test_large_files_are_fingerprinted_by_size_mtime_and_head(tmp_path):
    small, big = tmp_path / "s", tmp_path / "b"
    small.write_bytes(b"x" * 10)
    with big.open("wb") as f:
        f.truncate(FULL_HASH_LIMIT + 1)
    assert set(fingerprint(small)) == {"path", "size", "sha256"}
    assert set(fingerprint(big)) == {"path", "size", "mtime_ns", "head_sha256"}


def test_a_finished_run_whose_only_checkpoint_is_damaged_is_refused_in_one_line(tmp_path):
    run = finished_run(tmp_path)
    ckpt = run / "checkpoints" / "step_00000009"
    (ckpt / "meta.json").write_text((ckpt / "meta.json").read_text() + " ")
    with (
        pytest.warns(UserWarning, match="moved the damaged checkpoint"),
        pytest.raises(ResumeError) as e,
    ):
        admit(config(), run)
    msg = str(e.value)
    assert "final checkpoint under" in msg and "no earlier one is left" in msg
    assert "\n" not in msg and (run / "checkpoints" / ".corrupt-step_00000009").is_dir()


def test_placement_may_change_on_resume(tmp_path):
    """Rank count, sharding and backend are where the steps run: a checkpoint of 2 FSDP Ray
    ranks resumes on 1 local process, and one of 1 local process on 2 replicated Ray ranks."""
    ray2 = ("placement.backend=ray", "placement.policy_ranks=2", "placement.policy_sharding=fsdp")
    run = finished_run(tmp_path / "a", 9, *ray2)
    (run / "checkpoints" / "step_00000009" / "dcp").mkdir()  # a sharded checkpoint's layout
    assert admit(config("rl.max_steps=20"), run).start == 9
    run = finished_run(tmp_path / "b")
    replicated = ("placement.backend=ray", "placement.policy_ranks=2")
    assert admit(config("rl.max_steps=20", *replicated), run).start == 9


def test_a_replicated_checkpoint_into_sharded_ranks_is_refused_in_one_line(tmp_path):
    run = finished_run(tmp_path)
    sharded = ("placement.backend=ray", "placement.policy_sharding=fsdp")
    with pytest.raises(ResumeError) as e:
        admit(config("rl.max_steps=20", *sharded), run)
    msg = str(e.value)
    assert "step_00000009 is a replicated checkpoint" in msg and "cannot be resharded" in msg
    assert "resume it with placement.policy_sharding=none" in msg and "\n" not in msg


def test_a_refused_config_change_is_one_line_never_cut(tmp_path):
    """The refusal names the key and both values; with a long run path it still fits the one
    line a user error gets (it listed every allowed key before, and its end was cut)."""
    from posttrain.run.guard import one_line

    run = finished_run(tmp_path / ("deep" * 40))
    with pytest.raises(ResumeError) as e:
        admit(config("rl.lr=0.5"), run)
    msg = str(e.value)
    assert "rl.lr: checkpoint=" in msg and "now=0.5" in msg
    assert one_line(msg) == msg and "characters cut" not in one_line(msg)


def test_each_placement_change_that_can_round_differently_gets_its_note():
    """Resume's notes name each such placement key once, with why (not only the rank count)."""
    from posttrain.trainer.compat import resume_notes

    saved = to_dict(config("placement.backend=ray", "placement.policy_sharding=fsdp"))
    now = to_dict(config("placement.backend=ray", "placement.policy_ranks=2",
                         "placement.gpus_per_role=1"))  # fmt: skip
    notes = resume_notes(saved, now)
    assert [n.split(" changed")[0] for n in notes] == [
        "placement.gpus_per_role", "placement.policy_ranks", "placement.policy_sharding"
    ]  # fmt: skip
    assert "sharded and replicated ranks sum in another order" in notes[2]
    assert resume_notes(saved, saved) == []
