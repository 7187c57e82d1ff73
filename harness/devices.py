"""Which GPUs are present, found without importing a framework (nvidia-smi)."""

from __future__ import annotations

import os
import shutil
import subprocess

MAX_SIMULATED = 16


def visible_gpus() -> list[str]:
    """Names of the GPUs this process may use (CUDA_VISIBLE_DEVICES respected)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode:
        return []
    gpus = {}
    for line in out.stdout.strip().splitlines():
        index, _, name = line.partition(",")
        gpus[index.strip()] = name.strip()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(gpus.values())
    return [gpus[i.strip()] for i in visible.split(",") if i.strip() in gpus]
