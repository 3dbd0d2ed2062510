"""`make demo-tools` with the calculator: ``tools_addition`` as one 2,000-step run, per-state
credit and a reference reset every 600 steps.

- ``rl.reference_reset_every=600`` with ``rl.reset_optimizer=true``: the KL anchor is the random
  init while the call is learned (it keeps the policy exploring), then the policy of step 600,
  1,200 and 1,800. Anchored to the random init the copy stalls (docs/guides/tools.md); a reset
  every 300 steps collapsed the answer's entropy (docs/guides/seeds.md).
- ``rl.credit=state``: the answer turn is judged only against the rows of its group that made the
  same call and saw the same result, so a failed call's row does not set the answer's baseline.
- 2,000 steps: the copy, once the call is right, is learned at a random step (measured: first at
  0.9 held-out at 1,000, 1,500 and 1,200 on seeds 0-2, docs/guides/seeds.md); 1,200 steps would
  get two seeds of three there.

The two-stage chain (``tools_addition`` then ``tools_addition_stage2``, the demo before) stays a
recipe pair; ``tools_addition_notool_reset`` is this run without the calculator.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.tools_addition import STAGE1_STEPS
from posttrain.configs.tools_addition import build_config as build_tools_config

#: Steps of the demo's one run, and how often the KL anchor becomes the current policy.
DEMO_STEPS, RESET_EVERY = 2000, STAGE1_STEPS


def build_config() -> PosttrainConfig:
    cfg = build_tools_config()
    cfg.job.name = "tools_addition_reset"
    cfg.rl.credit = "state"
    cfg.rl.max_steps = DEMO_STEPS
    cfg.rl.reference_reset_every = RESET_EVERY
    cfg.rl.reset_optimizer = True
    cfg.rl.save_every = RESET_EVERY
    return cfg
