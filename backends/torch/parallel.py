"""Devices, split and allreduce in PyTorch (d2l's split_batch and allreduce)."""

from __future__ import annotations

import numpy as np
import torch


def devices(n: int, kind: str = "cpu") -> list[torch.device]:
    """n data-parallel devices: cuda:0..n-1, or n simulated replicas on the one CPU device."""
    if kind == "gpu":
        return [torch.device(f"cuda:{i}") for i in range(n)]
    return [torch.device("cpu")] * n


def as_tensor(a) -> torch.Tensor:
    return a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))


def check_divisible(batch: int, n: int) -> None:
    """The documented behaviour for a batch the devices cannot split: refuse it."""
    if batch % n:
        raise ValueError(f"batch of {batch} examples cannot be split evenly across {n} devices")


def split(X, y, devs: list[torch.device]):
    """Shard a global batch into len(devs) equal parts along axis 0, part i on devs[i].

    Uneven shards would weight examples differently in the averaged gradient, so a
    batch that does not divide evenly is refused with ValueError (see check_divisible).
    """
    X, y = as_tensor(X), as_tensor(y)
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} examples but y has {y.shape[0]}")
    check_divisible(X.shape[0], len(devs))
    xs = [part.to(d, non_blocking=True) for part, d in zip(X.chunk(len(devs)), devs)]
    ys = [part.to(d, non_blocking=True).long() for part, d in zip(y.chunk(len(devs)), devs)]
    return xs, ys


def allreduce(data: list[torch.Tensor]) -> list[torch.Tensor]:
    """Hand-written allreduce, as d2l: sum onto the first device, then copy the sum back.

    In place: afterwards every tensor holds the elementwise sum. Returns the list.
    """
    with torch.no_grad():
        for i in range(1, len(data)):
            data[0] += data[i].to(data[0].device)
        for i in range(1, len(data)):
            data[i].copy_(data[0].to(data[i].device))
    return data
