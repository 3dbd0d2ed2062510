"""A Ray actor imports the module of the role it hosts: the reward role's must not load
transformers' modeling (what the policy and rollout roles need, ~1.8 s of CPU per actor start)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

CODE = """
import pickle, sys
from posttrain.placement import ray_host  # the actor's own module
role = pickle.loads(sys.stdin.buffer.read())  # how the class reaches the actor: by reference
assert role.__name__ == "RewardRole", role
assert "transformers.modeling_utils" not in sys.modules
assert "posttrain.placement.roles" not in sys.modules
"""


def test_the_reward_actor_imports_no_model_code():
    from posttrain.placement.roles import RewardRole  # re-exported beside the other roles

    proc = subprocess.run([sys.executable, "-c", CODE], input=pickle.dumps(RewardRole),
                          capture_output=True, env={"PYTHONPATH": str(SRC)}, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
