"""Facts about the host that every backend records the same way (no framework imports)."""

from __future__ import annotations

import os
import platform
import resource


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def host() -> dict:
    import numpy

    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpus": usable_cpus(),
    }


def peak_rss_mb() -> float:
    """Peak resident memory of this process, in MiB.

    Linux's VmHWM belongs to the process's current memory image. getrusage's ru_maxrss is not
    reset by exec, so a worker started by a large harness process would report the harness's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def environment(
    cfg,
    *,
    framework: str,
    version: str,
    libraries: dict[str, str],
    cuda: str | None,
    cudnn: str | None,
    devices: list[str],
    framework_gpus: int,
    processes: int,
    threads: int,
    precision: dict,
    compile: str | None,
    input_copies: str,
    sgd_update: str,
    collective: str | None,
    batchnorm: str,
    details: dict,
) -> dict:
    """A run's environment record, one shape for every backend (docs/ARCHITECTURE.md, Glossary):
    the host, the framework and the libraries it trains with, what it sees, how it runs, and
    `details`, the backend's own settings (a kvstore type, a memory format) under their own names.
    `precision` holds "mode" (the run's --precision) and the switches as the framework reads them back;
    `compile` is what --compile does here (None when off); `levers` the speed levers as they run."""
    return {
        **host(),
        "framework": framework,
        "framework_version": version,
        "libraries": libraries,
        "cuda": cuda,
        "cudnn": cudnn,
        "devices": devices,
        "framework_gpus": framework_gpus,  # what the framework itself sees, whatever the harness found
        "nodes": cfg.nodes,  # process groups / hosts (loopback_nodes: on this one host)
        "loopback_nodes": cfg.nodes > 1 and cfg.loopback_nodes,
        "processes": processes,  # every node's processes, every role (a kvstore's servers too)
        "threads_per_process": threads,
        "precision": {"mode": cfg.precision, **precision},
        "levers": {
            "precision": cfg.precision,
            "compile": bool(cfg.compile),
            "channels_last": bool(cfg.channels_last),
            "resident_data": bool(cfg.resident_data),
            "prefetch": cfg.prefetch,
        },
        "compile": compile,
        "input_copies": input_copies,
        "sgd_update": sgd_update,
        "collective": collective,
        "batchnorm": batchnorm,
        "details": details,
    }
