"""The oversubscription check: injected loads decide; this machine's load is read without torch."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from posttrain.placement.threads import (
    NodeLoad,
    node_load,
    oversubscription,
    runs_posttrain,
    set_torch_threads,
)


@pytest.mark.parametrize(
    ("threads", "load", "fix"),
    [
        (2, NodeLoad(2, 2.3, 1, 0), 1),  # the case: another job on a 2-core machine
        (4, NodeLoad(4, 0.4, 0, 3), 1),  # three Ray workers on the node
        (8, NodeLoad(4, 0.2, 0, 0), 4),  # more threads than cores, nothing else running
        (4, NodeLoad(8, 6.0, 0, 0), 3),  # load average alone (5 busy besides this process)
        (3, NodeLoad(2, 9.0, 6, 0), 1),  # the fix never goes below one thread
    ],
)
def test_contended_threads_warn_in_one_line_with_the_fix(threads, load, fix):
    line = oversubscription(threads, load)
    assert line is not None and "\n" not in line
    assert line.startswith(f"placement.torch_threads_per_process={threads} on {load.cores} ")
    assert line.endswith(f"set placement.torch_threads_per_process={fix}")


@pytest.mark.parametrize(
    ("threads", "load"),
    [
        (1, NodeLoad(1, 40.0, 9, 9)),  # one thread never spins against a sibling
        (2, NodeLoad(2, 0.9, 0, 0)),  # this process's own start-up load
        (2, NodeLoad(4, 2.5, 1, 1)),  # 2 busy elsewhere, 2 cores free
        (16, NodeLoad(16, 0.0, 0, 0)),
    ],
)
def test_threads_that_fit_do_not_warn(threads, load):
    assert oversubscription(threads, load) is None


def test_the_actors_of_a_local_ray_instance_count_together():
    """Each Ray actor runs its own torch threads: 3 actors x 2 threads need 6 free cores."""
    line = oversubscription(2, NodeLoad(4, 0.0, 0, 0), processes=3)
    assert line is not None and "\n" not in line
    assert line.startswith("placement.torch_threads_per_process=2 x 3 Ray actors on 4 core(s)")
    assert line.endswith("set placement.torch_threads_per_process=1")
    assert oversubscription(2, NodeLoad(8, 0.5, 0, 0), processes=3) is None
    assert oversubscription(1, NodeLoad(2, 0.0, 0, 0), processes=5) is None


def test_set_torch_threads_logs_the_warning(caplog):
    import torch

    before = torch.get_num_threads()
    try:
        with caplog.at_level("WARNING", logger="posttrain"):
            line = set_torch_threads(2, NodeLoad(2, 3.0, 1, 0))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert [r.getMessage() for r in caplog.records] == [line]
    assert set_torch_threads(before, NodeLoad(64, 0.0, 0, 0)) is None


def test_node_load_reads_this_machine_without_torch():
    code = (
        "import sys; from posttrain.placement.threads import node_load; l = node_load(); "
        "assert l.cores >= 1 and l.load_average >= 0 and l.posttrain_processes >= 0; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert node_load().cores >= 1


@pytest.mark.parametrize(
    "line, counted",
    [
        ("/venv/bin/python /venv/bin/posttrain grpo --config arithmetic", True),
        ("/venv/bin/posttrain sft --config sft_tools_tiny", True),
        ("python3 -m posttrain grpo", True),
        ("python -u -m posttrain.cli grpo", True),
        ("python -X importtime -m posttrain grpo", True),
        ("python -W ignore -m posttrain.entrypoints.cli grpo", True),
        ("python -mposttrain grpo", True),
        ("/venv-vllm/bin/python -m posttrain_vllm_worker --port 1", True),
        ("VLLM::EngineCore", True),
        ("python -c 'import posttrain'", True),
        ("python -c 'import torch'", False),
        ("python -X importtime -m pytest", False),
        # a command line that merely mentions posttrain runs no torch threads of ours
        ("flock -x /tmp/posttrain-heavy.lock ./run.sh", False),
        ("/bin/bash -c cd /work/posttrain && make test", False),
        ("vim src/posttrain/placement/threads.py", False),
        ("python benchmarks/posttrain_notes.py", False),
        ("python -m pytest tests/test_posttrain.py", False),
    ],
)
def test_only_processes_running_posttrain_count_as_posttrain(line, counted):
    """A sleeping shell or a lock path containing the word once made a quiet machine look
    loaded (measured: `flock ... /tmp/posttrain-heavy.lock` and its shell counted as 2)."""
    assert runs_posttrain(shlex.split(line)) is counted
