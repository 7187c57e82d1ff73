"""The batches, in numpy, so that every backend and strategy sees the same batches in the same order: one
seeded permutation per epoch, global batches of `batch_size` images, the last partial batch dropped (so every
batch splits evenly across the devices)."""

from __future__ import annotations

import hashlib

import numpy as np

from common.data.dataset import Dataset


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of training examples in one epoch: a function of (seed, epoch) only."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def check_divisible(batch: int, n: int) -> None:
    """The documented behaviour for a batch the devices cannot split, in every backend: refuse it."""
    if batch % n:
        raise ValueError(f"batch of {batch} examples cannot be split evenly across {n} devices")


def steps_per_epoch(n: int, batch_size: int) -> int:
    return n // batch_size


def train_batches(
    data: Dataset, batch_size: int, seed: int, epoch: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """One epoch's (x, y) global batches, assembled now: the shuffled copy (a gather of the whole epoch)
    is made here, before the caller starts its timer, and each batch is a contiguous slice of it."""
    order = epoch_permutation(len(data.y_train), seed, epoch)
    x, y = data.x_train[order], data.y_train[order]
    return [
        (x[i * batch_size : (i + 1) * batch_size], y[i * batch_size : (i + 1) * batch_size])
        for i in range(steps_per_epoch(len(y), batch_size))
    ]


def test_batches(data: Dataset, batch_size: int):
    for i in range(0, len(data.y_test), batch_size):
        yield data.x_test[i : i + batch_size], data.y_test[i : i + batch_size]


def batch_sequence_hash(data: Dataset, batch_size: int, seed: int, epochs: int) -> str:
    """Fingerprint of the training examples in the order they are consumed (content and order;
    the batch size matters only through the examples a dropped partial batch leaves out)."""
    h = hashlib.sha256()
    h.update(f"{data.name}|{data.x_train.shape}|{epochs}".encode())
    h.update(np.ascontiguousarray(data.x_train).tobytes())
    h.update(data.y_train.tobytes())
    n_used = steps_per_epoch(len(data.y_train), batch_size) * batch_size
    for epoch in range(epochs):
        h.update(
            epoch_permutation(len(data.y_train), seed, epoch)[:n_used].astype(np.int64).tobytes()
        )
    return h.hexdigest()
