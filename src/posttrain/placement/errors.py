"""The error a placed run raises when one of its role processes fails."""

from __future__ import annotations


class RoleFailedError(RuntimeError):
    """A role's process died or raised an unexpected error; ``str()`` is one line naming the role.

    The run stops at once (the other role processes are ended); checkpoints already marked
    complete are untouched, so ``rl.resume=auto`` continues from the last one.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class RoleCallTimeout(RoleFailedError):
    """An in-process role call ran past ``placement.role_call_timeout_s``; raised into the call
    by the watchdog (``placement/deadline.py``), so the code it interrupts lets it pass."""
