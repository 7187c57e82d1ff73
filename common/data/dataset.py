"""What every source of images gives a run: a Dataset, or a DataError that says what to do."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class DataError(Exception):
    """The dataset is missing, corrupt or cannot be fetched. The message says what to do."""


@dataclass(frozen=True)
class Dataset:
    """Images as float32 NCHW (Fashion-MNIST in [0, 1] as d2l's ToTensor, ImageNet normalised as torchvision's
    reference scripts do), labels as int32."""

    name: str
    source: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
