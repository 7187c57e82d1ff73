"""jax's profiler around the profiled steps (--profile; common/profiling.py reads its trace), and jax's
matrix-multiply peak on this host (the report's measured limit): what Keras's distribution uses too, in
backends/xla.py."""

from __future__ import annotations

from pathlib import Path

from backends import xla


def record(cfg, folder: Path, rank: int):
    """jax.profiler around the block; TensorBoard's layout under rank<r>/, with a Chrome trace."""
    return xla.record_trace(folder, rank)


def matmul(cfg, n: int, dtype: str):
    """One n x n matrix product in `dtype` on this process's first device, waited for: a call to time."""
    return xla.matmul(n, dtype)
