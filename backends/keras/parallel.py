"""Devices, split and allreduce in Keras's own vocabulary: device names as keras.distribution lists them
("cpu:0", "gpu:1"), tensors made on a device inside `keras.device(name)`. They run on the framework this process
imported Keras with (jax outside the ddp ranks, whose devices are torch's: distributed.py).

Keras has no copy of a tensor between devices, so the from-scratch allreduce goes through the host, as d2l's
first version does: every part to device 0, summed there, the sum copied back to every device.
"""

from __future__ import annotations

import keras
import numpy as np

from common.data import check_divisible
from common.errors import Unsupported


def devices(n: int, kind: str = "cpu") -> list[str]:
    """The first n devices of the platform Keras lists: real GPUs, or simulated CPU devices (__init__.py)."""
    try:
        found = keras.distribution.list_devices("gpu" if kind == "gpu" else "cpu")
    except RuntimeError:  # no such platform
        found = []
    if len(found) < n:
        what = "GPU(s)" if kind == "gpu" else "CPU devices"
        raise Unsupported(
            f"{n} {what} requested, Keras ({keras.backend.backend()}) sees {len(found)}"
        )
    return found[:n]


def gpu_count() -> int:
    """The GPUs Keras's framework sees in this process (0 without a CUDA build)."""
    try:
        return len(keras.distribution.list_devices("gpu"))
    except RuntimeError:
        return 0


def split(X, y, devs: list[str]):
    """Shard a global batch into len(devs) equal parts along axis 0, part i on devs[i] (d2l's split_batch)."""
    X, y = np.asarray(X), np.asarray(y)
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} examples but y has {y.shape[0]}")
    check_divisible(X.shape[0], len(devs))
    xs, ys = np.split(X, len(devs)), np.split(y, len(devs))
    return [array(a, d) for a, d in zip(xs, devs)], [array(a, d) for a, d in zip(ys, devs)]


def allreduce(data: list) -> list:
    """Every part copied to device 0 and summed there, the sum copied back: each device holds the elementwise sum."""
    devs = [device_of(a) for a in data]
    with keras.device(devs[0]):
        total = sum(keras.ops.convert_to_tensor(to_numpy(a)) for a in data)
    host = to_numpy(total)
    return [array(host, d) for d in devs]


# Tensors as the tests make and read them (common/backend.py's Parallel), and as split and allreduce make them.


def array(values, device: str):
    """A tensor holding numpy `values` on `device`."""
    with keras.device(device):
        return keras.ops.convert_to_tensor(np.asarray(values))


def to_numpy(a) -> np.ndarray:
    return keras.ops.convert_to_numpy(a)


def device_of(a) -> str:
    """The name of the one device a single-device tensor lives on."""
    if keras.backend.backend() == "jax":
        (device,) = a.devices()
        return f"{device.platform}:{device.id}"
    return f"{a.device.type}:{a.device.index or 0}"
