"""The data a run trains on, one module per concern:

  dataset.py        Dataset and DataError: what every source of images gives a run
  fashion_mnist.py  Fashion-MNIST's IDX files (found, verified, read) and its synthetic stand-in
  imagenet.py       ImageNet-shaped images for ResNet-50: synthetic, or a local folder prepared once
  batches.py        the seeded permutation per epoch and the global batches every backend takes

`load(cfg)` is the dataset a run config asks for. The names the backends and the harness read are here too.
"""

from __future__ import annotations

from pathlib import Path

from common.config import imagenet_shaped
from common.data import fashion_mnist, imagenet
from common.data.batches import (
    batch_sequence_hash,
    check_divisible,
    epoch_permutation,
    steps_per_epoch,
    test_batches,
    train_batches,
)
from common.data.dataset import DataError, Dataset
from common.data.fashion_mnist import SYNTHETIC_SIZES, load_fashion_mnist, locate, synthetic, verify

__all__ = [
    "DataError",
    "Dataset",
    "load",
    "fashion_mnist",
    "imagenet",
    "synthetic",
    "load_fashion_mnist",
    "locate",
    "verify",
    "train_batches",
    "test_batches",
    "check_divisible",
    "steps_per_epoch",
    "epoch_permutation",
    "batch_sequence_hash",
]


def load(cfg) -> Dataset:
    """The dataset a run config asks for."""
    if cfg.dataset == "synthetic":
        return synthetic(
            cfg.train_size or SYNTHETIC_SIZES[0], cfg.test_size or SYNTHETIC_SIZES[1], cfg.seed
        )
    if imagenet_shaped(cfg.dataset):
        return imagenet.load(cfg)
    return load_fashion_mnist(Path(cfg.data_dir), cfg.train_size, cfg.test_size)
