"""What runs inside a Ray worker process: one role, hosted by a small generic actor.

The host keeps role classes free of Ray: it sets the process up (torch threads, working
directory, the policy ranks' ``torch.distributed`` group), then constructs the very class that
``placement.local`` constructs in-process, and forwards plain method calls to it. It imports
nothing from Ray at module level, so this module loads wherever posttrain does.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from posttrain.config import load_config, to_dict


@dataclass(frozen=True)
class GroupSpec:
    """How a policy rank joins the data-parallel group (a TCP rendezvous at rank 0's node)."""

    backend: str
    address: str
    port: int
    rank: int
    world_size: int
    timeout_s: float


def free_address() -> tuple[str, int]:
    """This node's IP and a port free right now, for the group's rendezvous."""
    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port


def worker_pythonpath() -> str:
    """PYTHONPATH for role processes: the dirs this driver imports project code from.

    The directory holding the ``posttrain`` package, the driver's PYTHONPATH, and every other
    ``sys.path`` directory outside the interpreter's own tree (a test runner's ``pythonpath``, a
    user's module of reward functions or builders). Installed packages come from the workers'
    own interpreter; on other nodes a listed directory that does not exist is simply skipped.
    """
    import posttrain

    own = {Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}}
    dirs = [str(Path(posttrain.__file__).resolve().parents[1])]
    dirs += [d for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d]
    for entry in sys.path:
        path = Path(entry or os.getcwd()).resolve()
        if path.is_dir() and not any(path.is_relative_to(root) for root in own):
            dirs.append(str(path))
    return os.pathsep.join(dict.fromkeys(dirs))


class RoleHost:
    """Hosts one role in a Ray actor process; ``start`` builds it, ``call`` forwards to it."""

    def __init__(self, threads: int, cwd: str) -> None:
        torch.set_num_threads(threads)
        # Per-file loading bars from every actor are noise. Said through the variable that
        # transformers and the hub read when they load: the reward actor never loads transformers
        # (~0.2 s of CPU per actor start), the model roles load it after this.
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        # Relative paths in the config (model folder, outputs) mean the same as on the driver.
        if os.path.isdir(cwd):
            os.chdir(cwd)
        self.role: Any = None

    def rendezvous(self) -> tuple[str, int]:
        return free_address()

    def start(
        self,
        role_cls: type,
        config_path: str,
        opts: Sequence[str],
        kwargs: Mapping[str, Any],
        group: GroupSpec | None = None,
    ) -> dict[str, Any]:
        """Join the policy group if any, resolve the config in this process, construct the
        role with it; return the config it resolved (the driver compares)."""
        if group is not None:
            import torch.distributed as dist

            dist.init_process_group(
                group.backend,
                init_method=f"tcp://{group.address}:{group.port}",
                rank=group.rank,
                world_size=group.world_size,
                timeout=timedelta(seconds=group.timeout_s),
            )
        config = load_config(config_path, ["--", *opts])
        self.role = role_cls(config, **kwargs)
        return to_dict(config)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.role, method)(*args, **kwargs)

    def put(self, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Call ``method`` and leave its (large) result in the object store, once.

        ``method`` returns a dict of tensors (or their ``weight_sync.to_wire`` form). Returns
        small metadata only: ``{"ref": [ObjectRef], "bytes": ..., "tensors": ...}`` (the ref
        sits in a list so the caller receives the reference, not the value).
        """
        import ray

        from posttrain.placement.weight_sync import wire_bytes

        value = getattr(self.role, method)(*args, **kwargs)
        sizes = [wire_bytes(v) for v in value.values()]
        return {"ref": [ray.put(value)], "bytes": sum(sizes), "tensors": len(sizes)}


# One class per role, so process titles (``ray::PolicyHost``) and Ray's actor table name it.
class PolicyHost(RoleHost):
    """Hosts one data-parallel rank of the policy role."""


class RolloutHost(RoleHost):
    """Hosts the rollout role (sampling with its own copy of the weights)."""


class RewardHost(RoleHost):
    """Hosts the reward role."""


class DeclaredRoleHost(RoleHost):
    """Hosts a declared role (``placement/specs.py``), e.g. the OPD teacher."""
