"""The frameworks' compile caches: where each keeps what it compiled between processes, and the one rule of
every run.

TorchInductor (and Triton, its GPU kernels) keeps compiled graphs on disk by default, in one folder per user,
so a `--compile` run's warm-up would be warm after any earlier run, or from the second `--repeat` trial on;
JAX keeps nothing unless a folder is set. A warm-up is only comparable when every run starts from the same
state, so by default every run starts cold: the harness gives each run (each trial, each node) a fresh folder
of its own inside the run's staging folder, which the report does not keep, and unsets JAX's. With
`--compile-cache DIR` every framework that has a cache keeps it in DIR, shared by every run, trial and later
invocation (the user's choice, e.g. to measure steady state without paying compilation again); JAX is then
told to cache every program, however quick its compile. MXNet has no compile cache. Which caches a framework
keeps, and what its compiled code depends on, is its backend.toml's [framework] (common/manifest.py).

Compiled code is the machine's that made it, and the frameworks' cache keys do not say which: TorchInductor's C++
kernels built where AVX-512 is on fail to compile where the kernels are capped to SSE4 (`at::vec` undeclared). So
a shared DIR holds one folder per machine (`machine_folder`: the CPU's model and vector sets, and the caps of the
run's environment), and a cache made on another host of a cluster that shares DIR is never read here.

The harness sets these variables in the worker's environment before its framework is imported (`apply`), and
the worker records what it started with (`record`): the mode, the folder and the files already in it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path

from common import manifest, sysinfo

# The mode the harness ran the worker with, as the worker's record reads it.
MODE_ENV = "DPBENCH_COMPILE_CACHE"


def all_caches() -> list[manifest.Cache]:
    """Every framework's compile caches (each backend.toml's [framework.caches])."""
    return [cache for framework in manifest.frameworks() for cache in framework.caches]


def folders() -> dict[str, str]:
    """Each cache's variable and the subfolder it gets."""
    return {cache.variable: cache.folder for cache in all_caches()}


def unasked() -> list[manifest.Cache]:
    """The caches a cold run still gets a fresh folder for: the ones a framework keeps whether asked or not."""
    return [cache for cache in all_caches() if cache.unasked]


def shared_settings() -> dict[str, str]:
    """What the frameworks are told with a shared folder (JAX: cache every program, however quick its compile)."""
    return {k: v for framework in manifest.frameworks() for k, v in framework.shared_cache_env}


def caps(env: Mapping[str, str]) -> list[str | None]:
    """The caps in `env` that the compiled code depends on: the variables that cap the CPU kernels a framework
    compiles for (the portable test pass sets them), then the capping flags inside a variable (XLA's in
    XLA_FLAGS): code compiled under one cap is not code for another."""
    frameworks = manifest.frameworks()
    values = [env.get(name) for f in frameworks for name in f.compiled_for]
    flags = [
        flag
        for f in frameworks
        for variable, cap in f.compiled_for_flags
        for flag in env.get(variable, "").split()
        if flag.startswith(cap)
    ]
    return values + flags


def machine_folder(env: Mapping[str, str]) -> str:
    """The subfolder of a shared cache for code compiled here under `env`'s caps: the CPU's model name, readable,
    and a digest of its identity (model, vendor, family, vector sets), the architecture and the caps."""
    cpu = sysinfo.cpu_identity(sysinfo.read_cpuinfo())
    identity = json.dumps([cpu, platform.machine(), caps(env)], sort_keys=True)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9]+", "-", cpu["cpu"] or platform.machine() or "cpu").strip("-")
    return f"{name[:40]}-{digest}"


def apply(env: dict, shared: str | None, own: Path) -> dict:
    """The worker environment `env` with the run's compile caches: every one in this machine's folder of the
    shared one (machine_folder), or (None) the always-on ones in `own`, a folder no other run uses, and JAX's
    unset."""
    settings, subfolders = shared_settings(), folders()
    env = {k: v for k, v in env.items() if k not in subfolders and k not in settings}
    if shared:
        here = Path(shared) / machine_folder(env)
        return {
            **env,
            **{name: str(here / sub) for name, sub in subfolders.items()},
            **settings,
            MODE_ENV: "shared",
        }
    return {**env, **own_folders(own), MODE_ENV: "cold"}


def own_folders(own: Path) -> dict[str, str]:
    """The caches a framework keeps unasked, each in its subfolder of `own`, a folder no other run uses."""
    return {cache.variable: str(own / cache.folder) for cache in unasked()}


def record() -> dict:
    """What this process started with: {"mode": "cold" | "shared" | None (not set by the harness: a worker
    started by hand, with whatever the user's environment says), "folders": {variable: folder} (none for a cold run's),
    "files_at_start": files already in them (0 in a cold run)}."""
    folders_set = {name: os.environ[name] for name in folders() if os.environ.get(name)}
    mode = os.environ.get(MODE_ENV) or None
    return {
        "mode": mode,
        # A cold run's folders are staging ones, gone with the report: not worth a path in it.
        "folders": {} if mode == "cold" else folders_set,
        "files_at_start": sum(count_files(folder) for folder in set(folders_set.values())),
    }


def count_files(folder: str) -> int:
    """Files under `folder` (0 if it does not exist or cannot be read)."""
    return sum(len(files) for _, _, files in os.walk(folder))
