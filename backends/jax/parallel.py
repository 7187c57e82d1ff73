"""Devices, split and allreduce in JAX: a leading device axis, as pmap takes it, and lax.psum.

Every array that spans the devices is one jax.Array with a NamedSharding over a 1-d
Mesh whose axis is AXIS; `split` and `allreduce` hand back its per-device pieces.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from common.data import check_divisible
from common.errors import Unsupported

AXIS = "devices"  # the mesh / pmap axis name collectives refer to


def devices(n: int, kind: str = "cpu") -> list:
    """The first n devices of the platform: real GPUs, or simulated CPU devices (see __init__.py)."""
    platform = "gpu" if kind == "gpu" else "cpu"
    try:
        found = jax.devices(platform)
    except RuntimeError:
        found = []
    if len(found) < n:
        if kind == "gpu":
            hint = " (this jaxlib has no CUDA plugin: install jax[cuda12])" if not found else ""
            raise Unsupported(f"{n} GPU(s) requested, JAX sees {len(found)}{hint}")
        raise Unsupported(
            f"{n} CPU devices requested, JAX sees {len(found)} "
            "(the XLA flag --xla_force_host_platform_device_count sets how many)"
        )
    return found[:n]


def gpu_count() -> int:
    """The GPUs JAX itself sees (0 without a CUDA plugin)."""
    try:
        return len(jax.devices("gpu"))
    except RuntimeError:
        return 0


def mesh(devs: list) -> Mesh:
    return Mesh(np.asarray(devs), (AXIS,))


def device_axis_sharding(devs: list) -> NamedSharding:
    """Axis 0 split over the devices: row i (or the i-th block of rows) lives on devs[i]."""
    return NamedSharding(mesh(devs), P(AXIS))


def replicated_sharding(devs: list) -> NamedSharding:
    """The whole array on every device."""
    return NamedSharding(mesh(devs), P())


def check_batch(X, y, n: int) -> None:
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} examples but y has {y.shape[0]}")
    check_divisible(X.shape[0], n)


def stack_on_devices(X, y, devs: list, dtype=np.float32):
    """The global batch reshaped to (devices, batch / devices, ...), slice i placed on devs[i] (pmap's input);
    the images as `dtype` (float64 only for the float64 equivalence runs).

    Uneven shards would weight examples differently in the averaged gradient, so a
    batch that does not divide evenly is refused with ValueError (common.data.check_divisible).
    """
    check_batch(X, y, len(devs))
    k = len(devs)
    X = np.asarray(X, dtype=dtype).reshape(k, -1, *X.shape[1:])
    y = np.asarray(y, dtype=np.int32).reshape(k, -1)
    return jax.device_put((X, y), device_axis_sharding(devs))


def per_device(a: jax.Array, devs: list) -> list[jax.Array]:
    """The slices along the device axis, slice i as an array on devs[i] (no copy between devices)."""
    on = {shard.device: shard.data for shard in a.addressable_shards}
    return [on[d][0] for d in devs]


def split(X, y, devs: list):
    """Shard a global batch into len(devs) equal parts along axis 0, part i on devs[i] (d2l's split_batch)."""
    xs, ys = stack_on_devices(X, y, devs)
    return per_device(xs, devs), per_device(ys, devs)


def stacked(tree, devs: list):
    """One copy of every leaf of a (numpy) tree per device, along a leading device axis."""
    k = len(devs)
    return jax.device_put(
        jax.tree.map(lambda a: np.broadcast_to(a, (k, *np.shape(a))), tree),
        device_axis_sharding(devs),
    )


def on_device(a: jax.Array, device) -> jax.Array:
    """The copy of a replicated array that lives on `device`."""
    return next(shard.data for shard in a.addressable_shards if shard.device == device)


def from_per_device(arrays: list[jax.Array], devs: list) -> jax.Array:
    """One array with a leading device axis made of per-device arrays, without moving them."""
    shape = (len(arrays), *arrays[0].shape)
    return jax.make_array_from_single_device_arrays(
        shape,
        device_axis_sharding(devs),
        [jax.device_put(a, d)[None] for a, d in zip(arrays, devs)],
    )


def allreduce(data: list[jax.Array]) -> list[jax.Array]:
    """lax.psum across the devices: afterwards every device holds the elementwise sum.

    JAX arrays are immutable, so the sums come back as a new list, one array per device.
    """
    devs = [next(iter(a.devices())) for a in data]
    summed = _psum_over(tuple(devs))(from_per_device(data, devs))
    return per_device(summed, devs)


@functools.cache
def _psum_over(devs: tuple):
    """A jitted psum over `devs`, built once per device set."""
    return jax.jit(
        jax.shard_map(
            lambda a: lax.psum(a, AXIS), mesh=mesh(list(devs)), in_specs=P(AXIS), out_specs=P(AXIS)
        )
    )


# Arrays as the tests make and read them (common/backend.py's Parallel).


def array(values: np.ndarray, device) -> jax.Array:
    return jax.device_put(values, device)


def to_numpy(a: jax.Array) -> np.ndarray:
    return np.asarray(a)


def device_of(a: jax.Array):
    """The one device a single-device array lives on."""
    (device,) = a.devices()
    return device


def node_rows(X, y, cfg):
    """This node's rows of a global batch: the shards of its devices, node_rank * local_devices onwards."""
    rows = len(y) // cfg.nodes.count
    start = cfg.nodes.rank * rows
    return np.asarray(X)[start : start + rows], np.asarray(y)[start : start + rows]


def local_sum(a) -> float:
    """The sum (float64) of the parts of `a` this process holds: every row of a per-device array."""
    return float(
        sum(np.sum(np.asarray(shard.data), dtype=np.float64) for shard in a.addressable_shards)
    )
