"""Keras's profiler and matrix product (profilers/__init__.py): those of the framework Keras runs on in this process,
which KERAS_BACKEND chose when Keras was imported: torch's in ddp's ranks and in the Keras idiom on torch, jax's for
the distribution and the idiom on jax."""

from __future__ import annotations

import importlib
from pathlib import Path

import keras

from common.config import RunConfig


def framework():
    """profilers/torch.py or profilers/jax.py, as Keras runs here; imported only now, so the other framework has no
    place in this process."""
    return importlib.import_module(f"profilers.{keras.backend.backend()}")


def record(cfg: RunConfig, folder: Path, rank: int):
    """The framework's profiler around the block, its trace in its own layout (torch's or jax's)."""
    return framework().record(cfg, folder, rank)


def matmul(cfg: RunConfig, n: int, dtype: str):
    """One n x n matrix product in `dtype` on this process's first device, waited for: a call to time."""
    return framework().matmul(cfg, n, dtype)
