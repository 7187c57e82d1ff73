"""Devices, split and allreduce in MXNet (Gluon's split_and_load and d2l's allreduce), and NDArrays as the tests
read them; batches staged on the contexts; reductions across nodes through a dist kvstore."""

from __future__ import annotations

import numpy as np

from backends.mxnet.compat import mx
from common.data import check_divisible

from mxnet import gluon


def devices(n: int, kind: str = "cpu", first: int = 0) -> list:
    """n data-parallel contexts: gpu(first..first+n-1), or n simulated devices cpu(0..n-1) on the host."""
    if kind == "gpu":
        return [mx.gpu(first + i) for i in range(n)]
    return [mx.cpu(i) for i in range(n)]


def as_ndarray(a, ctx) -> mx.nd.NDArray:
    """An NDArray on ctx, keeping the dtype (mx.nd.array alone would make int labels float32)."""
    if isinstance(a, mx.nd.NDArray):
        return a.as_in_context(ctx)
    a = np.asarray(a)
    return mx.nd.array(a, ctx=ctx, dtype=a.dtype)


class Shards(tuple):
    """A global batch already split_and_load-ed: one NDArray per context, shard i on context i
    (what stage() makes for --resident-data; split() hands it on without copying)."""

    @property
    def examples(self) -> int:
        return sum(int(s.shape[0]) for s in self)


def examples(y) -> int:
    """The examples in a global batch of labels, numpy or staged."""
    return y.examples if isinstance(y, Shards) else len(y)


def split(X, y, devs: list, host=None):
    """Shard a global batch into len(devs) equal parts along axis 0, part i on devs[i].

    gluon.utils.split_and_load, with the batch checked first: uneven shards would weight
    examples differently in the averaged gradient, so such a batch is refused. A batch
    stage()d onto these contexts already is split: its shards are returned as they are. `host`: the
    context the numpy batch is loaded into first (default: the first device).
    """
    if isinstance(X, Shards) or isinstance(y, Shards):
        if not (isinstance(X, Shards) and isinstance(y, Shards)):
            raise TypeError("X and y must both be staged, or neither")
        wanted = list(devs)
        if [s.context for s in X] != wanted or [s.context for s in y] != wanted:
            raise ValueError("the batch was staged onto other contexts")
        return list(X), list(y)
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} examples but y has {len(y)}")
    check_divisible(len(y), len(devs))
    host = host or devs[0]
    xs = gluon.utils.split_and_load(as_ndarray(X, host), devs, even_split=True)
    ys = gluon.utils.split_and_load(as_ndarray(y, host), devs, even_split=True)
    return xs, ys


def stage(X, y, devs: list) -> tuple[Shards, Shards]:
    """A numpy batch split and loaded onto devs (as split() does in a step), for step() to take as it is.

    On GPUs the batch goes through pinned host memory: each shard's copy to its GPU is then an
    asynchronous engine operation, which overlaps the steps queued before it (--prefetch)."""
    host = mx.cpu_pinned(0) if devs[0].device_type == "gpu" else None
    xs, ys = split(X, y, devs, host)
    return Shards(xs), Shards(ys)


def allreduce(data: list) -> list:
    """Hand-written allreduce, as d2l: sum onto the first device, then copy the sum back.

    In place: afterwards every array holds the elementwise sum. Returns the list.
    """
    for i in range(1, len(data)):
        data[0][:] += data[i].copyto(data[0].context)
    for i in range(1, len(data)):
        data[0].copyto(data[i])
    return data


# NDArrays as the tests make and read them (common/backend.py's Parallel).


def array(values, device) -> mx.nd.NDArray:
    values = np.asarray(values)
    return mx.nd.array(values, ctx=device, dtype=values.dtype)


def to_numpy(a: mx.nd.NDArray) -> np.ndarray:
    return a.asnumpy()


def device_of(a: mx.nd.NDArray):
    return a.context


class Reduction:
    """A strategy's gradient reduction as one call on `buffers` made ahead (what allreduce_op returns):
    calling it reduces them in place, queued on the engine, without waiting."""

    def __init__(self, buffers: list, call):
        self.buffers, self._call = buffers, call

    def __call__(self) -> None:
        self._call()


def average(arrays: list) -> None:
    """Every array becomes the mean of them all (the hand-written allreduce, then / k)."""
    for a in allreduce(arrays):
        a[:] /= len(arrays)


def zeros_per_context(values: int, devs: list) -> list:
    """One float32 buffer of `values` zeros per context, allocated before anything is timed."""
    buffers = [mx.nd.zeros((values,), ctx=ctx, dtype="float32") for ctx in devs]
    mx.nd.waitall()
    return buffers


# ----------------------------------------------------------------------- across nodes (a dist kvstore)


def node_shard(X, y, nodes: int, rank: int):
    """This node's consecutive share of a global numpy batch (node r: shards r*L .. (r+1)*L-1)."""
    check_divisible(len(y), nodes)
    size = len(y) // nodes
    return X[rank * size : (rank + 1) * size], y[rank * size : (rank + 1) * size]


class AcrossNodes:
    """Small reductions over every node's worker through a dist kvstore (a KeyedKVStore view): the server
    sums what each worker pushes. Every worker must make the same calls in the same order."""

    def __init__(self, kv, nodes: int, rank: int):
        self.kv, self.nodes, self.rank = kv, nodes, rank
        self._keys: set[str] = set()

    def gather(self, values) -> np.ndarray:
        """Every node's `values` (float64), row r node r's: each pushes its row, zeros elsewhere; the sum."""
        values = np.asarray(values, dtype=np.float64).ravel()
        rows = np.zeros((self.nodes, len(values)))
        rows[self.rank] = values
        buffer = mx.nd.array(rows.ravel(), dtype="float64")
        self.kv.pushpull(self._ready(f"gather{len(values)}", buffer), buffer, out=buffer)
        return buffer.asnumpy().reshape(self.nodes, len(values))

    def average(self, name: str, arrays: list) -> None:
        """Arrays equal on every context of a node become the mean of every node's: arrays[0] pushed, / nodes."""
        self.kv.pushpull(self._ready(name, arrays[0]), arrays[0], out=arrays)
        for a in arrays:
            a[:] /= self.nodes

    def _ready(self, key: str, like) -> str:
        """`key`, initialised on the servers on first use (every worker calls it, worker 0's value is kept)."""
        if key not in self._keys:
            self.kv.init(key, mx.nd.zeros(like.shape, dtype=like.dtype))
            self._keys.add(key)
        return key
