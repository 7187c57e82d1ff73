"""MXNet's profiler around the profiled steps (--profile; common/profiling.py reads its trace), and MXNet's
matrix-multiply peak on this host (the report's measured limit): profilers/mxnet.py's, for this backend's runs."""

from __future__ import annotations

from pathlib import Path

from backends.mxnet.parallel import devices
from profilers import mxnet as profiler


def record(cfg, folder: Path, rank: int):
    """MXNet's profiler around the block; its trace as rank<r>.trace.json.gz."""
    return profiler.record(folder, rank)


def matmul(cfg, n: int, dtype: str):
    """One n x n matrix product in `dtype` on this process's first device, waited for: a call to time."""
    return profiler.matmul(n, dtype, devices(1, cfg.device_kind, cfg.first_gpu)[0])
