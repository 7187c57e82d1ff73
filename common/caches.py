"""The frameworks' compile caches: where each keeps what it compiled between processes, and the one rule of
every run.

TorchInductor (and Triton, its GPU kernels) keeps compiled graphs on disk by default, in one folder per user,
so a `--compile` run's warm-up would be warm after any earlier run, or from the second `--repeat` trial on;
JAX keeps nothing unless a folder is set. A warm-up is only comparable when every run starts from the same
state, so by default every run starts cold: the harness gives each run (each trial, each node) a fresh folder
of its own inside the run's staging folder, which the report does not keep, and unsets JAX's. With
`--compile-cache DIR` every framework that has a cache keeps it in DIR, shared by every run, trial and later
invocation (the user's choice, e.g. to measure steady state without paying compilation again); JAX is then
told to cache every program, however quick its compile. MXNet has no compile cache.

The harness sets these variables in the worker's environment before its framework is imported (`apply`), and
the worker records what it started with (`record`): the mode, the folder and the files already in it.
"""

from __future__ import annotations

import os
from pathlib import Path

# Each framework's variable for its cache folder, and the subfolder it gets.
FOLDERS = {
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
    "JAX_COMPILATION_CACHE_DIR": "jax",
}
# The caches a cold run still gets a fresh folder for: the ones a framework keeps whether asked or not.
ALWAYS_ON = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# With a shared folder, JAX caches every program (by default only those that took a second to compile).
JAX_SHARED_SETTINGS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
# The mode the harness ran the worker with, as the worker's record reads it.
MODE_ENV = "DPBENCH_COMPILE_CACHE"


def apply(env: dict, shared: str | None, own: Path) -> dict:
    """The worker environment `env` with the run's compile caches: every one in the shared folder, or (None)
    the always-on ones in `own`, a folder no other run uses, and JAX's unset."""
    env = {k: v for k, v in env.items() if k not in FOLDERS and k not in JAX_SHARED_SETTINGS}
    if shared:
        return {
            **env,
            **{name: str(Path(shared) / sub) for name, sub in FOLDERS.items()},
            **JAX_SHARED_SETTINGS,
            MODE_ENV: "shared",
        }
    return {**env, **{name: str(own / FOLDERS[name]) for name in ALWAYS_ON}, MODE_ENV: "cold"}


def record() -> dict:
    """What this process started with: {"mode": "cold" | "shared" | None (not set by the harness: a worker
    started by hand, with whatever the user's environment says), "folders": {variable: folder} (none for a cold run's),
    "files_at_start": files already in them (0 in a cold run)}."""
    folders = {name: os.environ[name] for name in FOLDERS if os.environ.get(name)}
    mode = os.environ.get(MODE_ENV) or None
    return {
        "mode": mode,
        # A cold run's folders are staging ones, gone with the report: not worth a path in it.
        "folders": {} if mode == "cold" else folders,
        "files_at_start": sum(count_files(folder) for folder in set(folders.values())),
    }


def count_files(folder: str) -> int:
    """Files under `folder` (0 if it does not exist or cannot be read)."""
    return sum(len(files) for _, _, files in os.walk(folder))
