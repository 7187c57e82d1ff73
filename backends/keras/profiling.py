"""The profiler of the framework Keras runs on around the profiled steps (--profile; common/profiling.py reads its
trace): torch's in ddp's ranks, jax's for the distribution; and that framework's matrix-multiply peak on this host
(the report's measured limit): profilers/torch.py's and profilers/jax.py's."""

from __future__ import annotations

from pathlib import Path

from backends.keras.environment import FRAMEWORK
from profilers import jax as jax_profiler
from profilers import torch as torch_profiler


def record(cfg, folder: Path, rank: int):
    """The framework's profiler around the block, its trace in its own layout (torch's or jax's)."""
    if FRAMEWORK[cfg.strategy] == "torch":
        return torch_profiler.record(folder, rank, cfg.device_kind == "gpu")
    return jax_profiler.record(folder, rank)


def matmul(cfg, n: int, dtype: str):
    """One n x n matrix product in `dtype` on this process's first device, waited for: a call to time."""
    if FRAMEWORK[cfg.strategy] == "torch":
        return torch_profiler.matmul(n, dtype, cfg.device_kind == "gpu")
    return jax_profiler.matmul(n, dtype)
