"""torch's profiler around the profiled steps (--profile; common/profiling.py reads its trace), and torch's
matrix-multiply peak on this host (the report's measured limit): profilers/torch.py's, for this backend's runs."""

from __future__ import annotations

from pathlib import Path

from profilers import torch as profiler


def record(cfg, folder: Path, rank: int):
    """torch.profiler around the block (with the CUDA kernels on a GPU); its trace as rank<r>.trace.json.gz."""
    return profiler.record(folder, rank, cfg.device_kind == "gpu")


def matmul(cfg, n: int, dtype: str):
    """One n x n matrix product in `dtype` on this process's device, waited for: a call to time."""
    return profiler.matmul(n, dtype, cfg.device_kind == "gpu")
