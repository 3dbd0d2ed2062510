"""A Ray actor imports the module of the role it hosts and the modules its config names: the
reward actor, hosting the reward role with the tests' reward functions (``role_fixtures``), must
load neither transformers (what the policy and rollout roles need: ~4 s of CPU per actor start
with its modeling) nor pytest and the test modules."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"

CODE = """
import os, pickle, sys
from posttrain.placement import ray_host  # the actor's own module
role = pickle.loads(sys.stdin.buffer.read())  # how the class reaches the actor: by reference
assert role.__name__ == "RewardRole", role
host = ray_host.RewardHost(1, os.getcwd())
host.start(role, "arithmetic", ["reward.functions=[role_fixtures:digit_reward]"], {})
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "pytest"))
assert not loaded, loaded[:5]
assert "posttrain.placement.roles" not in sys.modules
assert "role_fixtures" in sys.modules  # the reward function was resolved here
from transformers.utils import logging  # what a model role loads after the host's start
assert not logging.is_progress_bar_enabled()  # the host turned the loading bars off
"""


def test_the_reward_actor_imports_no_model_code(tmp_path):
    from posttrain.placement.roles import RewardRole  # re-exported beside the other roles

    path = os.pathsep.join([str(SRC), str(TESTS)])
    proc = subprocess.run([sys.executable, "-c", CODE], input=pickle.dumps(RewardRole), cwd=tmp_path,
                          capture_output=True, env={"PYTHONPATH": path}, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
