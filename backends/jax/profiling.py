"""jax's profiler around the profiled steps (--profile; common/profiling.py reads its trace), and jax's
matrix-multiply peak on this host (the report's measured limit): profilers/jax.py's, for this backend's runs."""

from __future__ import annotations

from pathlib import Path

from profilers import jax as profiler


def record(cfg, folder: Path, rank: int):
    """jax.profiler around the block; TensorBoard's layout under rank<r>/, with a Chrome trace."""
    return profiler.record(folder, rank)


def matmul(cfg, n: int, dtype: str):
    """One n x n matrix product in `dtype` on this process's first device, waited for: a call to time."""
    return profiler.matmul(n, dtype)
