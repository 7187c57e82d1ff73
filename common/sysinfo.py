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
                    return int(line.split()[1]) / 1024.0   # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
