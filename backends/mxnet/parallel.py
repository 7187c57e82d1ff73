"""Devices, split and allreduce in MXNet (Gluon's split_and_load and d2l's allreduce)."""

from __future__ import annotations

import numpy as np

from backends.mxnet.compat import mx
from mxnet import gluon


def devices(n: int, kind: str = "cpu") -> list:
    """n data-parallel contexts: gpu(0..n-1), or n simulated devices cpu(0..n-1) on the host."""
    if kind == "gpu":
        return [mx.gpu(i) for i in range(n)]
    return [mx.cpu(i) for i in range(n)]


def as_ndarray(a, ctx) -> mx.nd.NDArray:
    """An NDArray on ctx, keeping the dtype (mx.nd.array alone would make int labels float32)."""
    if isinstance(a, mx.nd.NDArray):
        return a.as_in_context(ctx)
    a = np.asarray(a)
    return mx.nd.array(a, ctx=ctx, dtype=a.dtype)


def check_divisible(batch: int, n: int) -> None:
    """The documented behaviour for a batch the devices cannot split: refuse it."""
    if batch % n:
        raise ValueError(f"batch of {batch} examples cannot be split evenly across {n} devices")


def split(X, y, devs: list):
    """Shard a global batch into len(devs) equal parts along axis 0, part i on devs[i].

    gluon.utils.split_and_load, with the batch checked first: uneven shards would weight
    examples differently in the averaged gradient, so such a batch is refused.
    """
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} examples but y has {len(y)}")
    check_divisible(len(y), len(devs))
    xs = gluon.utils.split_and_load(as_ndarray(X, devs[0]), devs, even_split=True)
    ys = gluon.utils.split_and_load(as_ndarray(y, devs[0]), devs, even_split=True)
    return xs, ys


def allreduce(data: list) -> list:
    """Hand-written allreduce, as d2l: sum onto the first device, then copy the sum back.

    In place: afterwards every array holds the elementwise sum. Returns the list.
    """
    for i in range(1, len(data)):
        data[0][:] += data[i].copyto(data[0].context)
    for i in range(1, len(data)):
        data[0].copyto(data[i])
    return data
